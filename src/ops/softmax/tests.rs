use dfdx::prelude::*;
use half::f16;

use super::{log_softmax, softmax};
use crate::ops::cast::Cast;
use crate::tape::TraceMixed;

/// FP32's unit roundoff.
const U32: f64 = f32::EPSILON as f64 / 2.0;

/// f64 softmax of one row: the reference.
fn softmax_f64(row: &[f64]) -> Vec<f64> {
    let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = row.iter().map(|x| (x - max).exp()).sum();
    row.iter().map(|x| (x - max).exp() / sum).collect()
}

#[test]
fn a_row_of_a_thousand_elevens_is_exact_in_fp32_and_overflows_fp16() {
    let dev = Cpu::default();
    // 16-bit scores, as attention's QKᵀ produces them.
    let elevens: Tensor<Rank2<1, 1000>, f32, _> = dev.ones() * 11.0;
    let scores = elevens.to_dtype::<f16>();

    // Under the rule: cast to FP32, then softmax. Each probability is 1/1000; the row's sum of
    // 1,000 terms carries at most ~1000·u relative error, the division one more rounding.
    let probs = softmax(scores.clone().to_f32()).as_vec();
    let bound = (1000.0 + 4.0) * U32 / 1000.0;
    for p in &probs {
        assert!(p.is_finite());
        assert!((*p as f64 - 1e-3).abs() <= bound, "{p}");
    }
    let log_probs = log_softmax(scores.clone().to_f32()).as_vec();
    for lp in &log_probs {
        assert!(((*lp as f64) + 1000f64.ln()).abs() <= (1000.0 + 8.0) * U32 * 1000f64.ln());
    }

    // Computed in FP16: each e^11 ≈ 59,874 fits (FP16's largest value is 65,504) ...
    let exps = scores.clone().exp();
    assert!(exps.as_vec().iter().all(|e| e.is_finite()));
    assert_eq!(exps.as_vec()[0], f16::from_f32(11f32.exp()));
    // ... their sum does not: inf after two terms, so the probabilities are e^11/inf = 0 (a row
    // that no longer sums to 1), the log-probabilities 11 − ln(inf) = −inf, and their
    // normalisation 0/0 = NaN.
    let sum = exps.clone().sum::<Rank1<1>, Axis<1>>();
    assert_eq!(sum.as_vec()[0], f16::INFINITY);
    let fp16_probs = exps.clone() / sum.clone().broadcast::<Rank2<1, 1000>, Axis<1>>();
    assert!(fp16_probs.as_vec().iter().all(|p| *p == f16::ZERO));
    let fp16_log_probs = scores - sum.ln().broadcast::<Rank2<1, 1000>, Axis<1>>();
    assert!(fp16_log_probs
        .as_vec()
        .iter()
        .all(|lp| *lp == f16::NEG_INFINITY));
    let renormalised = fp16_probs.clone() / fp16_probs.sum::<Rank1<1>, Axis<1>>().broadcast();
    assert!(renormalised.as_vec().iter().all(|p| p.is_nan()));
}

#[test]
fn matches_an_f64_reference_on_odd_rows() {
    let dev = Cpu::default();
    let x: Tensor<Rank2<3, 37>, f32, _> = dev.sample_normal() * 4.0;
    let got = softmax(x.clone()).as_vec();
    let got_log = log_softmax(x.clone()).as_vec();
    let xs = x.as_vec();
    for r in 0..3 {
        let row: Vec<f64> = xs[r * 37..(r + 1) * 37].iter().map(|v| *v as f64).collect();
        let want = softmax_f64(&row);
        for c in 0..37 {
            let p = got[r * 37 + c] as f64;
            // exp of a shifted value (a few ulps), the row's sum (37 terms), one division.
            assert!(
                (p - want[c]).abs() <= (37.0 + 8.0) * U32 * want[c] + 1e-30,
                "{p} vs {}",
                want[c]
            );
            let lp = got_log[r * 37 + c] as f64;
            let scale = row.iter().map(|v| v.abs()).fold(1.0, f64::max);
            assert!((lp - want[c].ln()).abs() <= (37.0 + 8.0) * U32 * scale * 4.0);
        }
    }
}

#[test]
fn non_finite_scores_propagate() {
    let dev = Cpu::default();
    let x: Tensor<Rank2<2, 3>, f32, _> =
        dev.tensor([[1.0, f32::NAN, 0.0], [f32::INFINITY, 0.0, 1.0]]);
    let p = softmax(x.clone()).as_vec();
    assert!(p[..3].iter().all(|v| v.is_nan()), "{p:?}");
    // inf − max(inf) = NaN: an infinite score is not silently a probability of 1.
    assert!(p[3..].iter().any(|v| !v.is_finite()), "{p:?}");
    let lp = log_softmax(x).as_vec();
    assert!(lp[..3].iter().all(|v| v.is_nan()), "{lp:?}");
}

#[test]
fn gradients_flow_through_the_cast_into_the_16_bit_scores() {
    let dev = Cpu::default();
    let x: Tensor<Rank2<1, 5>, f32, _> = dev.tensor([[0.5, -1.0, 2.0, 0.0, 1.5]]);
    let x16 = x.clone().to_dtype::<f16>();
    // d/dx of Σ w·softmax(x) = p ⊙ (w − p·w).
    let w = [1.0f64, -2.0, 0.5, 3.0, -1.0];
    let probs = softmax(x16.clone().leaky_traced_mixed().to_f32());
    let weights: Tensor<Rank2<1, 5>, f32, _> = dev.tensor([[1.0, -2.0, 0.5, 3.0, -1.0]]);
    let loss = crate::loss::Loss::new((probs * weights).sum());
    let raw = loss.backward().unwrap();
    let g = raw
        .grads()
        .get(&x16)
        .expect("the input's gradient")
        .as_vec();
    let row: Vec<f64> = x16.as_vec().iter().map(|v| v.to_f64()).collect();
    let p = softmax_f64(&row);
    let pw: f64 = p.iter().zip(&w).map(|(a, b)| a * b).sum();
    for c in 0..5 {
        let want = p[c] * (w[c] - pw);
        // The gradient is rounded once into FP16 (u = 2^-11) after an FP32 computation.
        assert!(
            (g[c].to_f64() - want).abs() <= want.abs() * 2f64.powi(-11) + 1e-6,
            "{c}"
        );
    }
}
