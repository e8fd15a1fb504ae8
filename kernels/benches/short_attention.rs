//! One short head's fused attention (`typed_amp_kernels::attention::short_head_forward` and
//! `short_head_backward`) at the CPU's detected level, one thread: nanoseconds per head and
//! the GFLOP/s of its products (`QKᵀ` and `PV` forward; `QKᵀ`, `dy·Vᵀ`, `dSᵀ·Q`, `dS·K` and
//! `Pᵀ·dy` backward, causal heads counted at their visible keys). The heads are the ViT's (17
//! tokens, 16 wide, no mask) and the small GPT's (64 tokens, 32 wide, causal): the step bench's
//! attention rows come from these loops (in FP32 under every policy).
//!
//! ```text
//! cargo bench -p typed-amp-kernels --bench short_attention
//! ```
//! `TYPED_AMP_KERNELS` applies (e.g. `=portable` for the scalar build).

use std::time::Instant;

use typed_amp_kernels::attention::{
    short_head_backward, short_head_forward, HeadGradsMut, HeadRows, ShortHead, ShortHeadScratch,
};

/// Heads per timed pass (each on its own operands, as a step's are).
const HEADS: usize = 256;
const RUNS: usize = 31;

fn main() {
    println!(
        "level {:?} (detected {:?}); median of {RUNS} passes over {HEADS} heads, one thread",
        typed_amp_kernels::level(),
        typed_amp_kernels::detected_level()
    );
    println!(
        "{:<34} {:>10} {:>8} {:>10} {:>8}",
        "head", "fwd ns", "GFLOP/s", "bwd ns", "GFLOP/s"
    );
    for (name, tokens, head_dim, causal) in [
        ("ViT: 17 tokens, 16 wide", 17, 16, false),
        ("small GPT: 64 tokens, 32 wide, causal", 64, 32, true),
    ] {
        let h = ShortHead {
            tokens,
            head_dim,
            causal,
            scale: (head_dim as f32).sqrt().recip(),
        };
        let (fwd, bwd) = time_head(&h);
        // Multiply-adds of one `tokens × keys × head_dim` product, over the visible keys.
        let visible: usize = (0..tokens)
            .map(|i| if causal { i + 1 } else { tokens })
            .sum();
        let product = 2.0 * (visible * head_dim) as f64;
        println!(
            "{name:<34} {fwd:>10.0} {:>8.1} {bwd:>10.0} {:>8.1}",
            2.0 * product / fwd,
            5.0 * product / bwd
        );
    }
}

/// Median nanoseconds per head of the forward and of the backward.
fn time_head(h: &ShortHead) -> (f64, f64) {
    let len = h.matrix_len();
    let values = |seed: usize| -> Vec<f32> {
        (0..HEADS * len)
            .map(|i| (((i * 7919 + seed * 104_729) % 2001) as f32 - 1000.0) * 1e-3)
            .collect()
    };
    let (q, k, v, dy) = (values(1), values(2), values(3), values(4));
    let mut y = vec![0f32; HEADS * len];
    let mut lse = vec![0f32; HEADS * h.tokens];
    let st = h.stride();
    let mut grads = vec![0f32; 3 * len];
    let mut scratch = ShortHeadScratch::new();
    let (mut fwd, mut bwd) = (Vec::with_capacity(RUNS), Vec::with_capacity(RUNS));
    for _ in 0..RUNS {
        let t = Instant::now();
        for (i, (y, lse)) in y
            .chunks_exact_mut(len)
            .zip(lse.chunks_exact_mut(h.tokens))
            .enumerate()
        {
            let qkv = [head(h, &q, i), head(h, &k, i), head(h, &v, i)];
            short_head_forward(h, qkv, (y, st), lse, &mut scratch);
        }
        fwd.push(t.elapsed().as_secs_f64() * 1e9 / HEADS as f64);
        let t = Instant::now();
        for i in 0..HEADS {
            let qkv = [head(h, &q, i), head(h, &k, i), head(h, &v, i)];
            let lse = &lse[i * h.tokens..(i + 1) * h.tokens];
            let into = HeadGradsMut {
                data: &mut grads,
                ld: 3 * st,
                at: [0, st, 2 * st],
            };
            short_head_backward(
                h,
                qkv,
                [head(h, &y, i), head(h, &dy, i)],
                lse,
                into,
                &mut scratch,
            );
            std::hint::black_box(&grads);
        }
        bwd.push(t.elapsed().as_secs_f64() * 1e9 / HEADS as f64);
    }
    (bench_timing::median(&fwd), bench_timing::median(&bwd))
}

/// Head `i`'s matrix (`tokens × stride`, rows `stride` apart).
fn head<'a>(h: &ShortHead, m: &'a [f32], i: usize) -> HeadRows<'a> {
    let len = h.matrix_len();
    HeadRows {
        data: &m[i * len..(i + 1) * len],
        ld: h.stride(),
    }
}
