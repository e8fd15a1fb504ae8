//! The short-head attention kernels (`typed_amp_kernels::attention`): the same bits at every
//! instruction-set level, and a clear panic on buffers of the wrong size. Their values against
//! an f64 reference (with bounds from the unit roundoff, the head width and the tokens) are
//! tested through the op that uses them, in `typed_amp`'s `ops::attention` tests.

use std::sync::Mutex;

use typed_amp_kernels::attention::{
    short_head_backward, short_head_forward, HeadGradsMut, HeadRows, ShortHead, ShortHeadScratch,
};
use typed_amp_kernels::{detected_level, force_level, Level};

/// `force_level` is process-wide: one test at a time changes it.
static LOCK: Mutex<()> = Mutex::new(());

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u32 ^ seed).wrapping_mul(2_654_435_761) >> 8) as f32 / 8.4e6 - 1.0)
        .collect()
}

/// Every output of one head's forward and backward, as bits (the lanes past the head's width
/// are unspecified and left out).
fn run(h: &ShortHead) -> Vec<u32> {
    let (len, st) = (h.matrix_len(), h.stride());
    // Q, K and V packed in one sequence's rows (with a spare vector a row), as the op lays
    // them out; y and dy in matrices of their own.
    let ld = 3 * st + 8;
    let qkv = values(h.tokens * ld, 1);
    let dy = values(len, 4);
    let rows = |at: usize| HeadRows {
        data: &qkv[at..],
        ld,
    };
    let mut scratch = ShortHeadScratch::new();
    let mut y = vec![0.0; len];
    let mut lse = vec![0.0; h.tokens];
    let qkv_rows = [rows(0), rows(st), rows(2 * st)];
    short_head_forward(h, qkv_rows, (&mut y, st), &mut lse, &mut scratch);
    let mut grads = vec![f32::NAN; h.tokens * ld];
    short_head_backward(
        h,
        qkv_rows,
        [y.as_slice(), &dy].map(|data| HeadRows { data, ld: st }),
        &lse,
        HeadGradsMut {
            data: &mut grads,
            ld,
            at: [0, st, 2 * st],
        },
        &mut scratch,
    );
    let columns = |m: &[f32], ld: usize, at: usize| -> Vec<u32> {
        m.chunks(ld)
            .flat_map(|r| r[at..at + h.head_dim].iter().map(|x| x.to_bits()))
            .collect()
    };
    let mut bits = columns(&y, st, 0);
    bits.extend(lse.iter().map(|x| x.to_bits()));
    for at in [0, st, 2 * st] {
        bits.extend(columns(&grads, ld, at));
    }
    assert!(
        bits.iter().all(|&b| f32::from_bits(b).is_finite()),
        "{h:?}: a non-finite result from finite inputs"
    );
    bits
}

#[test]
fn short_heads_give_the_same_bits_at_every_level() {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // Heads on eight lanes at every vector level, and (16, 16), (30, 32), (48, 16), (64, 64)
    // on sixteen at AVX-512's (widths of whole sixteens, queries that pad no further to
    // sixteen than to eight): a last vector of queries whole or part-filled, causal or not.
    let heads = [
        (1, 1),
        (7, 16),
        (8, 8),
        (9, 13),
        (16, 16),
        (17, 16),
        (30, 32),
        (33, 32),
        (48, 16),
        (64, 64),
    ];
    let mut ran = Vec::new();
    for (tokens, head_dim) in heads {
        for causal in [false, true] {
            let h = ShortHead {
                tokens,
                head_dim,
                causal,
                scale: 1.0 / (head_dim as f32).sqrt(),
            };
            force_level(Some(Level::Portable));
            let want = run(&h);
            for lvl in Level::ALL.into_iter().filter(|&l| l <= detected_level()) {
                force_level(Some(lvl));
                assert!(run(&h) == want, "{h:?}: other bits at {}", lvl.name());
                ran.push(lvl.name());
            }
        }
    }
    force_level(None);
    ran.sort_unstable();
    ran.dedup();
    println!("ran levels {ran:?}");
}

#[test]
fn a_head_that_does_not_fit_or_a_short_buffer_panics_with_its_reason() {
    let h = ShortHead {
        tokens: 65,
        head_dim: 8,
        causal: true,
        scale: 1.0,
    };
    assert!(!h.fits());
    let message = |f: &mut dyn FnMut()| -> String {
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_err();
        err.downcast_ref::<String>().cloned().unwrap_or_default()
    };
    let mut scratch = ShortHeadScratch::new();
    // The head of 65 tokens, then one of 5 with a log-sum-exp buffer a row short, then one
    // whose operand is a row short.
    for (h, lse_len, short_by, reason) in [
        (h, h.tokens, 0, "does not fit"),
        (ShortHead { tokens: 5, ..h }, 4, 0, "expected"),
        (ShortHead { tokens: 5, ..h }, 5, 1, "do not fit in"),
    ] {
        let m = vec![0.0; h.matrix_len()];
        let (mut o, mut lse) = (m.clone(), vec![0.0; lse_len]);
        let text = message(&mut || {
            let rows = HeadRows {
                data: &m[short_by..],
                ld: h.stride(),
            };
            let st = h.stride();
            short_head_forward(&h, [rows; 3], (&mut o, st), &mut lse, &mut scratch)
        });
        assert!(text.contains(reason), "{h:?}: {text}");
    }
    // Gradients whose columns overlap.
    let h = ShortHead { tokens: 5, ..h };
    let m = vec![0.0; 3 * h.matrix_len()];
    let rows = HeadRows {
        data: &m,
        ld: h.stride(),
    };
    let mut grads = m.clone();
    let st = h.stride();
    let text = message(&mut || {
        let grads = HeadGradsMut {
            data: &mut grads,
            ld: 3 * st,
            at: [0, st, st + 1],
        };
        short_head_backward(&h, [rows; 3], [rows; 2], &[0.0; 5], grads, &mut scratch)
    });
    assert!(text.contains("overlap"), "{text}");
}
