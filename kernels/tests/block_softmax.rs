//! The blocked attention's softmax passes (`typed_amp_kernels::attention::{shift_block,
//! finish_block, probabilities_block, score_grads_block}`): the same bits at every
//! instruction-set level, and values against an f64 reference with bounds from f32's unit
//! roundoff, `exp_f32`'s error and the row length. (The whole blocked attention is tested
//! against an f64 reference through `typed_amp`'s `ops::attention` tests.)

use std::sync::Mutex;

use typed_amp_kernels::attention::{
    finish_block, probabilities_block, score_grads_block, shift_block,
};
use typed_amp_kernels::{detected_level, force_level, Level};

/// `force_level` is process-wide: one test at a time changes it.
static LOCK: Mutex<()> = Mutex::new(());

/// f32's unit roundoff.
const U: f64 = f32::EPSILON as f64 / 2.0;
/// `exp_f32`'s relative error bound (`math`'s accuracy note: 9.1·10⁻⁸).
const EXP_ERR: f64 = 9.1e-8;
/// `exp_f32`'s smallest result (its argument is clamped at −87, so e⁻⁸⁷ ≈ 1.65·10⁻³⁸ rather
/// than 0), absolute.
const TINY: f64 = 1.7e-38;

/// `exp(arg)` and the bound on `exp_f32` of `arg` computed with one more rounding (at most
/// u·|arg| absolute in the argument, so relative in the exponential), for an `arg` the kernel
/// forms by one f32 subtraction; a −∞ argument gives 0 within [`TINY`].
fn probability(arg: f64) -> (f64, f64) {
    let want = arg.exp();
    if arg.is_finite() {
        (want, want * (EXP_ERR + U * arg.abs() * 1.01) + TINY)
    } else {
        (want, TINY)
    }
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u32 ^ seed).wrapping_mul(2_654_435_761) >> 8) as f32 / 1.1e6 - 7.6)
        .collect()
}

/// A tile of 37 rows × 70 keys (neither a multiple of the lanes), rows seeing 0, 1, a few, and
/// all of the keys; row 3 holds a NaN score, row 5 only −∞ scores, row 6 a running maximum of
/// −∞ (its first block), row 7 a running maximum above every score.
struct Case {
    rows: usize,
    cols: usize,
    scores: Vec<f32>,
    visible: Vec<usize>,
    running_max: Vec<f32>,
    sum: Vec<f32>,
    o: Vec<f32>,
    hd: usize,
}

fn case() -> Case {
    let (rows, cols, hd) = (37, 70, 9);
    let mut scores = values(rows * cols, 7);
    scores[3 * cols + 2] = f32::NAN;
    scores[5 * cols..6 * cols].fill(f32::NEG_INFINITY);
    let visible = (0..rows)
        .map(|r| [0, 1, 17, cols][r % 4].max(r.min(cols)))
        .collect();
    let mut running_max: Vec<f32> = values(rows, 11).iter().map(|x| x * 0.1).collect();
    running_max[6] = f32::NEG_INFINITY;
    running_max[7] = 30.0;
    let sum = values(rows, 13).iter().map(|x| x.abs() + 1.0).collect();
    let o = values(rows * hd, 17);
    Case {
        rows,
        cols,
        scores,
        visible,
        running_max,
        sum,
        o,
        hd,
    }
}

/// The forward's two passes on the case; everything they write.
fn forward(c: &Case, scale: f32) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut s = c.scores.clone();
    let mut next = vec![0.0; c.rows];
    let (mut max, mut sum, mut o) = (c.running_max.clone(), c.sum.clone(), c.o.clone());
    shift_block(&mut s, c.cols, &c.visible, scale, &c.running_max, &mut next);
    finish_block(
        &mut s,
        c.cols,
        &c.visible,
        &next,
        &mut max,
        &mut sum,
        (&mut o, c.hd),
    );
    (s, max, sum, o)
}

fn bits(v: &[f32]) -> Vec<u32> {
    // NaN's sign and payload are not specified: one pattern for all.
    v.iter()
        .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
        .collect()
}

#[test]
fn block_softmax_passes_give_the_same_bits_at_every_level() {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let c = case();
    let lse = values(c.rows, 19);
    let dp0 = values(c.rows * c.cols, 23);
    let delta = values(c.rows, 29);
    let mut first = None;
    for lvl in [Level::Portable, Level::Avx2, Level::Avx512] {
        if lvl > detected_level() {
            continue;
        }
        force_level(Some(lvl));
        let (s, max, sum, o) = forward(&c, 0.125);
        let mut p = c.scores.clone();
        probabilities_block(&mut p, c.cols, &c.visible, 0.125, &lse);
        let mut dp = dp0.clone();
        score_grads_block(&mut dp, &p, c.cols, &delta);
        let all: Vec<Vec<u32>> = [s, max, sum, o, p, dp].iter().map(|v| bits(v)).collect();
        match &first {
            None => first = Some(all),
            Some(want) => assert!(&all == want, "{lvl:?} differs from the portable bits"),
        }
    }
    force_level(None);
}

#[test]
fn forward_passes_match_the_f64_online_softmax() {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let c = case();
    let scale = 0.37f32;
    let (s, max, sum, o) = forward(&c, scale);
    for r in 0..c.rows {
        let row = &c.scores[r * c.cols..(r + 1) * c.cols];
        let live = &row[..c.visible[r]];
        let got = &s[r * c.cols..(r + 1) * c.cols];
        assert!(
            got[c.visible[r]..].iter().all(|&x| x == 0.0),
            "row {r}: masked keys"
        );
        if live.iter().any(|x| x.is_nan()) {
            // A NaN score reaches its probability (and so the output).
            assert!(
                got[..live.len()].iter().any(|x| x.is_nan()),
                "row {r}: NaN lost"
            );
            continue;
        }
        // The scaled scores are f32 products (one rounding each), as the kernel forms them.
        let scaled: Vec<f64> = live.iter().map(|&x| (x * scale) as f64).collect();
        let old = c.running_max[r] as f64;
        let new_max = scaled.iter().copied().fold(old, f64::max);
        if new_max == f64::NEG_INFINITY {
            assert!(got.iter().all(|&x| x == 0.0), "row {r}: no finite maximum");
            assert_eq!(max[r], c.running_max[r]);
            assert_eq!(sum[r], c.sum[r]);
            assert_eq!(o[r * c.hd..(r + 1) * c.hd], c.o[r * c.hd..(r + 1) * c.hd]);
            continue;
        }
        assert_eq!(max[r] as f64, new_max, "row {r}: maximum");
        // Each probability: exp_f32 of one rounded subtraction.
        let (mut mass, mut terms_err) = (0.0, 0.0);
        for (j, &x) in scaled.iter().enumerate() {
            let (want, bound) = probability(x - new_max);
            assert!(
                (got[j] as f64 - want).abs() <= bound,
                "row {r} key {j}: {} vs {want} ± {bound}",
                got[j]
            );
            mass += want;
            terms_err += bound;
        }
        // The rescale: exp_f32 of one rounded subtraction, as for a probability.
        let (rescale, rescale_err) = if old == f64::NEG_INFINITY {
            (0.0, 0.0)
        } else {
            let arg = old - new_max;
            (arg.exp(), EXP_ERR + U * arg.abs() * 1.01)
        };
        // The sum: the terms' errors, `visible` additions (at most n·u of the terms' sum), and
        // the old sum times the rescale (its error, one rounding) plus one last addition.
        let carried = c.sum[r] as f64 * rescale;
        let want = carried + mass;
        let n = live.len() as f64;
        let bound = terms_err + n * U * 1.01 * mass + carried * (rescale_err + U) + U * want * 1.01;
        assert!(
            (sum[r] as f64 - want).abs() <= bound,
            "row {r}: sum {} vs {want} ± {bound}",
            sum[r]
        );
        for k in 0..c.hd {
            let want = c.o[r * c.hd + k] as f64 * rescale;
            let bound = want.abs() * (rescale_err + U * 1.01);
            let got = o[r * c.hd + k] as f64;
            assert!(
                (got - want).abs() <= bound,
                "row {r}: o[{k}] {got} vs {want}"
            );
        }
    }
}

#[test]
fn backward_passes_match_their_formulas() {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let c = case();
    let (scale, lse) = (0.29f32, values(c.rows, 31));
    let mut p = c.scores.clone();
    probabilities_block(&mut p, c.cols, &c.visible, scale, &lse);
    let dp0 = values(c.rows * c.cols, 37);
    let delta = values(c.rows, 41);
    let mut ds = dp0.clone();
    score_grads_block(&mut ds, &p, c.cols, &delta);
    for r in 0..c.rows {
        for j in 0..c.cols {
            let at = r * c.cols + j;
            if j >= c.visible[r] {
                assert_eq!(p[at], 0.0, "row {r} key {j}: masked");
            } else if c.scores[at].is_nan() {
                assert!(p[at].is_nan(), "row {r} key {j}: NaN lost");
            } else {
                // `x·scale` rounded (as the reference forms it), then `− lse` rounded.
                let (want, bound) = probability((c.scores[at] * scale) as f64 - lse[r] as f64);
                assert!(
                    (p[at] as f64 - want).abs() <= bound,
                    "row {r} key {j}: {} vs {want} ± {bound}",
                    p[at]
                );
            }
            // dS = P·(dP − δ): exactly the two f32 operations.
            let want = p[at] * (dp0[at] - delta[r]);
            assert!(
                ds[at].to_bits() == want.to_bits() || (ds[at].is_nan() && want.is_nan()),
                "row {r} key {j}: dS"
            );
        }
    }
}

#[test]
#[should_panic]
fn a_visible_count_past_the_row_panics() {
    let mut s = vec![0.0; 4 * 8];
    let mut next = vec![0.0; 4];
    shift_block(&mut s, 8, &[1, 2, 9, 3], 1.0, &[0.0; 4], &mut next);
}
