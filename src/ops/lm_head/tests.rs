//! The fused head and loss against an f64 reference and against the composed ops.
//!
//! # Tolerances
//!
//! Inputs are values of `E`, so the f64 reference sees what the kernels see. With `u` the unit
//! roundoff of `E`, `u₃₂ = 2⁻²⁴`, `C` the width, `V` the vocabulary and `N` the rows:
//!
//! - a logit is a `C`-term f32 dot product: `|δℓ| ≤ C·u₃₂·Σ|h||w|` (`Lᵢⱼ`, per logit; `δᵢ` the
//!   largest in row `i`). The composed path also rounds each logit to `E`: `+ u·|ℓ|`;
//! - a row's log-sum-exp is off by at most `δᵢ + (V + 8)·u₃₂·(1 + |lse|)` (its logits, the
//!   exponentials' 1.5 ulp, a `V`-term sum, the log), and its loss term by twice that; the
//!   loss is their f64 mean, rounded once: `u₃₂·|loss|`;
//! - a probability's relative error is at most `2δᵢ + (V + 8)·u₃₂`, and the logits' gradient
//!   `g/N·(p − onehot)` is rounded to `E` once (`u` relative, and below `E`'s normal range `η`,
//!   half its smallest subnormal, absolutely);
//! - `dh = dℓ·W` and `dW = dℓᵀ·h` sum `V` and `N` such terms in f32 (`V·u₃₂`, `N·u₃₂` times
//!   the absolute sums), and `dh` is rounded to `E` once.

use dfdx::prelude::*;

use super::{try_lm_head_loss, try_lm_head_loss_composed, LmHeadKernel};
use crate::precision::{dtype_of, AmpElem, DType};
use crate::tape::TraceMixed;

const U32: f64 = 1.0 / 16_777_216.0;
const V: usize = 29;
const C: usize = 24;

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    fn values<E: AmpElem>(&mut self, n: usize, sd: f64) -> Vec<f64> {
        (0..n)
            .map(|_| {
                let x = ((0..4).map(|_| self.next()).sum::<f64>() - 2.0) * 3f64.sqrt() * sd;
                f64::from(AmpElem::to_f32(<E as AmpElem>::from_f32(x as f32)))
            })
            .collect()
    }
}

fn to_e<E: AmpElem>(v: &[f64]) -> Vec<E> {
    v.iter()
        .map(|x| <E as AmpElem>::from_f32(*x as f32))
        .collect()
}

fn to_f64<E: AmpElem>(v: &[E]) -> Vec<f64> {
    v.iter().map(|x| f64::from(AmpElem::to_f32(*x))).collect()
}

fn eta<E: AmpElem>() -> f64 {
    match dtype_of::<E>() {
        DType::F16 => 2f64.powi(-25),
        DType::BF16 => 2f64.powi(-134),
        _ => 2f64.powi(-150),
    }
}

/// Values and error bounds of the reference.
struct Reference {
    loss: f64,
    loss_bound: f64,
    dh: Vec<f64>,
    dh_bound: Vec<f64>,
    dw: Vec<f64>,
    dw_bound: Vec<f64>,
}

/// The reference for `rows` rows; `extra_logit_u` is the relative rounding of the logits
/// themselves (0 for the fused op, `u` for the composed one).
fn reference<E: AmpElem>(h: &[f64], w: &[f64], t: &[usize], extra_logit_u: f64) -> Reference {
    let n = t.len();
    let u = f64::from(dtype_of::<E>().unit_roundoff());
    let (mut loss, mut loss_bound) = (0.0, 0.0);
    let mut dl = vec![0.0; n * V];
    let mut dl_err = vec![0.0; n * V];
    for i in 0..n {
        let row: Vec<(f64, f64)> = (0..V)
            .map(|j| {
                let dot: f64 = (0..C).map(|c| h[i * C + c] * w[j * C + c]).sum();
                let abs: f64 = (0..C).map(|c| (h[i * C + c] * w[j * C + c]).abs()).sum();
                (dot, C as f64 * U32 * abs + extra_logit_u * dot.abs())
            })
            .collect();
        let delta = row.iter().fold(0.0f64, |m, r| m.max(r.1));
        let max = row.iter().fold(f64::MIN, |m, r| m.max(r.0));
        let sum: f64 = row.iter().map(|r| (r.0 - max).exp()).sum();
        let lse = max + sum.ln();
        loss += lse - row[t[i]].0;
        loss_bound += 2.0 * (delta + (V + 8) as f64 * U32 * (1.0 + lse.abs()));
        for j in 0..V {
            let p = (row[j].0 - lse).exp();
            let g = (p - if j == t[i] { 1.0 } else { 0.0 }) / n as f64;
            dl[i * V + j] = g;
            dl_err[i * V + j] =
                p / n as f64 * (2.0 * delta + (V + 8) as f64 * U32) + u * g.abs() + eta::<E>();
        }
    }
    loss /= n as f64;
    loss_bound = loss_bound / n as f64 + U32 * loss.abs();
    let mut r = Reference {
        loss,
        loss_bound,
        dh: vec![0.0; n * C],
        dh_bound: vec![0.0; n * C],
        dw: vec![0.0; V * C],
        dw_bound: vec![0.0; V * C],
    };
    for i in 0..n {
        for c in 0..C {
            let (mut v, mut err, mut abs) = (0.0, 0.0, 0.0);
            for j in 0..V {
                v += dl[i * V + j] * w[j * C + c];
                err += dl_err[i * V + j] * w[j * C + c].abs();
                abs += (dl[i * V + j] * w[j * C + c]).abs();
            }
            r.dh[i * C + c] = v;
            r.dh_bound[i * C + c] = err + V as f64 * U32 * abs + u * v.abs() + eta::<E>();
        }
    }
    for j in 0..V {
        for c in 0..C {
            let (mut v, mut err, mut abs) = (0.0, 0.0, 0.0);
            for i in 0..n {
                v += dl[i * V + j] * h[i * C + c];
                err += dl_err[i * V + j] * h[i * C + c].abs();
                abs += (dl[i * V + j] * h[i * C + c]).abs();
            }
            r.dw[j * C + c] = v;
            r.dw_bound[j * C + c] = err + n as f64 * U32 * abs;
        }
    }
    r
}

fn assert_within(what: &str, got: &[f64], want: &[f64], bound: &[f64]) {
    for (i, ((g, w), b)) in got.iter().zip(want).zip(bound).enumerate() {
        assert!(
            (g - w).abs() <= *b,
            "{what}[{i}]: {g} against {w}, off by {} > {b}",
            (g - w).abs()
        );
    }
}

/// The loss, `h`'s gradient and `w`'s (FP32) from the op (`fused`) or the composed ops.
fn run<E: AmpElem>(h: &[f64], w: &[f64], t: &[usize], fused: bool) -> (f64, Vec<f64>, Vec<f64>)
where
    Cpu: crate::device::Kernels<E>,
{
    let dev = Cpu::default();
    let (b, s) = (2, t.len() / 2);
    let h: Tensor<(usize, usize, Const<C>), E, Cpu> = dev.tensor_from_vec(to_e(h), (b, s, Const));
    let w: Tensor<(Const<V>, Const<C>), E, Cpu> = dev.tensor_from_vec(to_e(w), (Const, Const));
    let targets: Tensor<(usize, usize), usize, Cpu> = dev.tensor_from_vec(t.to_vec(), (b, s));
    let traced = h.clone().leaky_traced_mixed();
    let loss = if fused {
        try_lm_head_loss(traced, &w, &targets).unwrap()
    } else {
        crate::loss::Loss::new(try_lm_head_loss_composed(traced, &w, &targets).unwrap())
    };
    let value = f64::from(loss.value());
    let grads = loss.backward().unwrap().grads().clone();
    let dh = to_f64(&grads.get(&h).unwrap().as_vec());
    let dw = if fused {
        // The fused op writes w's gradient in FP32, never rounded to E.
        grads
            .param_grad(w.id())
            .unwrap()
            .iter()
            .map(|x| f64::from(*x))
            .collect()
    } else {
        to_f64(&grads.get(&w).unwrap().as_vec())
    };
    (value, dh, dw)
}

fn against_reference<E: AmpElem>()
where
    Cpu: crate::device::Kernels<E>,
{
    let mut rng = Lcg(19);
    for rows in [2, 38, 130] {
        let h = rng.values::<E>(rows * C, 1.0);
        let w = rng.values::<E>(V * C, 0.5);
        let t: Vec<usize> = (0..rows).map(|i| (i * 7 + 3) % V).collect();
        let r = reference::<E>(&h, &w, &t, 0.0);
        let (loss, dh, dw) = run::<E>(&h, &w, &t, true);
        assert_within("loss", &[loss], &[r.loss], &[r.loss_bound]);
        assert_within("dh", &dh, &r.dh, &r.dh_bound);
        assert_within("dw", &dw, &r.dw, &r.dw_bound);
        // The composed ops round the logits to E, and the weight's gradient too.
        let u = f64::from(dtype_of::<E>().unit_roundoff());
        let rc = reference::<E>(&h, &w, &t, u);
        let (loss, dh, dw) = run::<E>(&h, &w, &t, false);
        let dw_bound: Vec<f64> = rc
            .dw_bound
            .iter()
            .zip(&rc.dw)
            .map(|(b, v)| b + u * v.abs() + eta::<E>())
            .collect();
        assert_within("composed loss", &[loss], &[rc.loss], &[rc.loss_bound]);
        assert_within("composed dh", &dh, &rc.dh, &rc.dh_bound);
        assert_within("composed dw", &dw, &rc.dw, &dw_bound);
    }
}

#[test]
fn the_fused_head_matches_the_f64_reference_and_the_composed_ops() {
    against_reference::<f32>();
    against_reference::<half::f16>();
    against_reference::<half::bf16>();
}

#[test]
fn a_target_outside_the_vocabulary_is_an_error() {
    let dev = Cpu::default();
    let h: Tensor<(usize, usize, Const<C>), f32, Cpu> = dev.zeros_like(&(1, 2, Const));
    let w: Tensor<(Const<V>, Const<C>), f32, Cpu> = dev.zeros();
    let targets: Tensor<(usize, usize), usize, Cpu> = dev.tensor_from_vec(vec![1, V], (1, 2));
    assert!(try_lm_head_loss(h.leaky_traced_mixed(), &w, &targets).is_err());
}

#[test]
fn a_nan_hidden_state_makes_the_loss_and_the_weight_gradient_nan() {
    let dev = Cpu::default();
    let mut rng = Lcg(2);
    let mut hv = rng.values::<half::f16>(4 * C, 1.0);
    hv[C + 3] = f64::NAN;
    let h: Tensor<(usize, usize, Const<C>), half::f16, Cpu> =
        dev.tensor_from_vec(to_e(&hv), (2, 2, Const));
    let w: Tensor<(Const<V>, Const<C>), half::f16, Cpu> =
        dev.tensor_from_vec(to_e(&rng.values::<half::f16>(V * C, 0.5)), (Const, Const));
    let targets: Tensor<(usize, usize), usize, Cpu> = dev.tensor_from_vec(vec![1, 2, 3, 4], (2, 2));
    let loss = try_lm_head_loss(h.leaky_traced_mixed(), &w, &targets).unwrap();
    assert!(loss.value().is_nan());
    let grads = loss.backward().unwrap().grads().clone();
    assert!(grads.param_grad(w.id()).unwrap().iter().any(|x| x.is_nan()));
}

#[test]
fn the_kernels_refuse_buffers_of_the_wrong_size() {
    let dev = Cpu::default();
    let d = super::LmHeadDims {
        rows: 2,
        width: C,
        vocab: V,
    };
    let h: Tensor<(usize,), f32, Cpu> = dev.zeros_like(&(2 * C + 1,));
    let w: Tensor<(usize,), f32, Cpu> = dev.zeros_like(&(V * C,));
    let mut logits: Tensor<(usize,), f32, Cpu> = dev.zeros_like(&(2 * V,));
    assert!(LmHeadKernel::<f32>::try_head_logits(
        &dev,
        d,
        h.storage(),
        w.storage(),
        logits.storage_mut()
    )
    .is_err());
}
