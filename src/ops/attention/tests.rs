//! The fused attention against an f64 reference and against the composed computation.
//!
//! # Tolerances
//!
//! Inputs are values of the working precision `E`, so the reference (f64, on the same values)
//! sees exactly what the kernels see. With `u` the unit roundoff of `E`, `u₃₂ = 2⁻²⁴`, `d` the
//! head width and `T` the tokens:
//!
//! - a score `s = scale·q·k` is a `d`-term f32 dot product: `|ŝ − s| ≤ γ_d·scale·Σ|q||k| ≤
//!   d·u₃₂·S`, where `S = max scale·Σ|q||k|`;
//! - a probability `p = exp(s − lse)` then carries a relative error of at most `2·d·u₃₂·S`
//!   (its score's error and the log-sum-exp's) plus `exp_f32`'s 1.5 ulp and a few roundings
//!   (`3u₃₂` for exp, `u₃₂` each for the subtraction, the log, the division by the sum, counted
//!   as `8u₃₂`); a `T`-term f32 sum of such terms adds `T·u₃₂`;
//! - before each product with 16-bit operands, the probabilities (forward, and `Pᵀ·dy`) or the
//!   scores' gradient (`dS·K`, `dSᵀ·Q`) are rounded to `E`: `u` relative, once (the blocked
//!   kernels', whose products run on the 16-bit GEMM; the short heads' products are FP32);
//! - each output element is rounded to `E` once: `u·|value|`.
//!
//! So every element obeys `|x̂ − x| ≤ u·|x| + ε·mass + η·(1 + T·A)` with
//! `ε = 2u + (d + T + 8)·u₃₂·(2 + 2S)`, where `mass` is the same sum taken over absolute values
//! (`Σ p·|v|` for an output, and for the gradients the absolute terms of `dS = p·(dP − Σdy·y)` and
//! of the products that use it), which the reference computes beside each value. The last term
//! is underflow: a value rounded to `E` below its normal range is off by up to `η`, half its
//! smallest subnormal (2⁻²⁵ for FP16; negligible for BF16 and FP32), absolutely; that happens to
//! the output itself, and to each of the `T` probabilities (or scores' gradients) of a row, each
//! multiplied by an input of magnitude at most `A` (the largest `|q|`, `|k|`, `|v|`, `|dy|`).

use dfdx::prelude::*;

use super::{try_attention, try_attention_composed, AttentionDims, AttentionKernel};
use crate::loss::Loss;
use crate::precision::{dtype_of, AmpElem};
use crate::tape::TraceMixed;

const U32: f64 = 1.0 / 16_777_216.0;

/// A small deterministic generator (no dependence on dfdx's RNG), normal-ish values.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Sum of four uniforms, centred and scaled to unit variance.
    fn normal(&mut self) -> f64 {
        ((0..4).map(|_| self.next()).sum::<f64>() - 2.0) * 3f64.sqrt()
    }

    /// `n` values of `E`, as f64, with standard deviation `sd`.
    fn values<E: AmpElem>(&mut self, n: usize, sd: f64) -> Vec<f64> {
        (0..n)
            .map(|_| {
                f64::from(AmpElem::to_f32(<E as AmpElem>::from_f32(
                    (self.normal() * sd) as f32,
                )))
            })
            .collect()
    }
}

fn unit<E: AmpElem>() -> f64 {
    f64::from(dtype_of::<E>().unit_roundoff())
}

fn to_e<E: AmpElem>(v: &[f64]) -> Vec<E> {
    v.iter()
        .map(|x| <E as AmpElem>::from_f32(*x as f32))
        .collect()
}

fn to_f64<E: AmpElem>(v: &[E]) -> Vec<f64> {
    v.iter().map(|x| f64::from(AmpElem::to_f32(*x))).collect()
}

/// The reference's outputs, each with its mass (the sum over absolute values).
struct Reference {
    y: Vec<f64>,
    y_mass: Vec<f64>,
    dqkv: Vec<f64>,
    dqkv_mass: Vec<f64>,
    /// `max scale·Σ|q||k|` over every pair of tokens.
    score_mass: f64,
}

fn reference(d: &AttentionDims, qkv: &[f64], dy: &[f64]) -> Reference {
    let (t, hd, w) = (d.tokens, d.head_dim, d.width());
    let scale = 1.0 / (hd as f64).sqrt();
    let mut r = Reference {
        y: vec![0.0; d.rows() * w],
        y_mass: vec![0.0; d.rows() * w],
        dqkv: vec![0.0; d.rows() * 3 * w],
        dqkv_mass: vec![0.0; d.rows() * 3 * w],
        score_mass: 0.0,
    };
    for b in 0..d.batch {
        for h in 0..d.heads {
            let at = |i: usize, part: usize, c: usize| (b * t + i) * 3 * w + part * w + h * hd + c;
            let out = |i: usize, c: usize| (b * t + i) * w + h * hd + c;
            let sees = |i: usize, j: usize| !d.causal || j <= i;
            let mut p = vec![vec![0.0; t]; t];
            for i in 0..t {
                let s: Vec<f64> = (0..t)
                    .map(|j| {
                        let dot: f64 = (0..hd).map(|c| qkv[at(i, 0, c)] * qkv[at(j, 1, c)]).sum();
                        let mass: f64 = (0..hd)
                            .map(|c| (qkv[at(i, 0, c)] * qkv[at(j, 1, c)]).abs())
                            .sum();
                        r.score_mass = r.score_mass.max(scale * mass);
                        scale * dot
                    })
                    .collect();
                let max = (0..t)
                    .filter(|&j| sees(i, j))
                    .map(|j| s[j])
                    .fold(f64::MIN, f64::max);
                let sum: f64 = (0..t)
                    .filter(|&j| sees(i, j))
                    .map(|j| (s[j] - max).exp())
                    .sum();
                for j in (0..t).filter(|&j| sees(i, j)) {
                    p[i][j] = (s[j] - max).exp() / sum;
                }
                for c in 0..hd {
                    r.y[out(i, c)] = (0..t).map(|j| p[i][j] * qkv[at(j, 2, c)]).sum();
                    r.y_mass[out(i, c)] = (0..t).map(|j| p[i][j] * qkv[at(j, 2, c)].abs()).sum();
                }
            }
            for i in 0..t {
                let delta: f64 = (0..hd).map(|c| dy[out(i, c)] * r.y[out(i, c)]).sum();
                let delta_mass: f64 = (0..hd)
                    .map(|c| (dy[out(i, c)] * r.y[out(i, c)]).abs())
                    .sum();
                for j in (0..t).filter(|&j| sees(i, j)) {
                    let dp: f64 = (0..hd).map(|c| dy[out(i, c)] * qkv[at(j, 2, c)]).sum();
                    let dp_mass: f64 = (0..hd)
                        .map(|c| (dy[out(i, c)] * qkv[at(j, 2, c)]).abs())
                        .sum();
                    let ds = p[i][j] * (dp - delta);
                    let ds_mass = p[i][j] * (dp_mass + delta_mass + (dp - delta).abs());
                    for c in 0..hd {
                        r.dqkv[at(i, 0, c)] += scale * ds * qkv[at(j, 1, c)];
                        r.dqkv_mass[at(i, 0, c)] += scale * ds_mass * qkv[at(j, 1, c)].abs();
                        r.dqkv[at(j, 1, c)] += scale * ds * qkv[at(i, 0, c)];
                        r.dqkv_mass[at(j, 1, c)] += scale * ds_mass * qkv[at(i, 0, c)].abs();
                        r.dqkv[at(j, 2, c)] += p[i][j] * dy[out(i, c)];
                        r.dqkv_mass[at(j, 2, c)] += p[i][j] * dy[out(i, c)].abs();
                    }
                }
            }
        }
    }
    r
}

/// The module's bound's coefficients for one precision and case.
struct Bound {
    u: f64,
    eps: f64,
    /// `η·(1 + T·A)`.
    underflow: f64,
}

impl Bound {
    fn new<E: AmpElem>(d: &AttentionDims, score_mass: f64, largest: f64, extra_u: f64) -> Self {
        let u = unit::<E>();
        // Half the smallest subnormal of E: 2^-(bias + mantissa bits) / 2.
        let eta = match dtype_of::<E>() {
            crate::precision::DType::F16 => 2f64.powi(-25),
            crate::precision::DType::BF16 => 2f64.powi(-134),
            _ => 2f64.powi(-150),
        };
        Bound {
            u,
            eps: (2.0 + extra_u) * u
                + (d.head_dim + d.tokens + 8) as f64 * U32 * (2.0 + 2.0 * score_mass),
            underflow: eta * (1.0 + d.tokens as f64 * largest),
        }
    }
}

fn largest(values: &[&[f64]]) -> f64 {
    values
        .iter()
        .flat_map(|v| v.iter())
        .fold(0.0, |m, x| m.max(x.abs()))
}

/// Checks `got` against `want` element by element with the module's bound.
fn assert_within(what: &str, got: &[f64], want: &[f64], mass: &[f64], b: &Bound) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((g, w), m)) in got.iter().zip(want).zip(mass).enumerate() {
        let bound = b.u * w.abs() + b.eps * m + b.underflow;
        assert!(
            (g - w).abs() <= bound,
            "{what}[{i}]: {g} against {w}, off by {} > bound {bound}",
            (g - w).abs()
        );
    }
}

/// The forward kernel on host vectors: the output and the log-sum-exps.
fn forward<E: AmpElem>(d: AttentionDims, qkv: &[E]) -> Result<(Vec<E>, Vec<f32>), CpuError>
where
    Cpu: crate::device::Kernels<E>,
{
    let dev = Cpu::default();
    let qkv: Tensor<(usize,), E, Cpu> = dev.tensor_from_vec(qkv.to_vec(), (qkv.len(),));
    let mut y: Tensor<(usize,), E, Cpu> = dev.zeros_like(&(d.rows() * d.width(),));
    let lse = AttentionKernel::<E>::try_attention_forward(&dev, d, qkv.storage(), y.storage_mut())?;
    Ok((y.as_vec(), lse.to_vec()))
}

/// The backward kernel on host vectors: `dqkv` written, or added to `old`.
fn backward<E: AmpElem>(
    d: AttentionDims,
    (qkv, y, dy): (&[E], &[E], &[E]),
    lse: &[f32],
    old: Option<&[E]>,
) -> Result<Vec<E>, CpuError>
where
    Cpu: crate::device::Kernels<E>,
{
    let dev = Cpu::default();
    let t = |v: &[E]| -> Tensor<(usize,), E, Cpu> { dev.tensor_from_vec(v.to_vec(), (v.len(),)) };
    let lse: Tensor<(usize,), f32, Cpu> = dev.tensor_from_vec(lse.to_vec(), (lse.len(),));
    let mut dqkv = t(old.unwrap_or(&vec![E::default(); qkv.len()]));
    AttentionKernel::<E>::try_attention_backward(
        &dev,
        d,
        t(qkv).storage(),
        t(y).storage(),
        t(dy).storage(),
        lse.storage(),
        (dqkv.storage_mut(), old.is_some()),
    )?;
    Ok(dqkv.as_vec())
}

fn cases() -> Vec<AttentionDims> {
    let dims = |batch, tokens, heads, head_dim, causal| AttentionDims {
        batch,
        tokens,
        heads,
        head_dim,
        causal,
    };
    // Up to 64 tokens (heads up to 64 wide) the short-head kernels run, beyond it the blocked
    // ones: each of the cases below is on one side, and both sides have every kind of case.
    vec![
        // More tokens than one block, not a multiple of it.
        dims(2, 67, 3, 5, true),
        dims(2, 67, 3, 5, false),
        // One token.
        dims(3, 1, 2, 4, true),
        // Heads of width 1 and of width 64.
        dims(2, 9, 4, 1, true),
        dims(1, 70, 1, 64, true),
        dims(2, 17, 4, 16, false),
        // Two full blocks.
        dims(1, 128, 2, 8, true),
        // The short heads' bounds: 64 tokens, heads of 64 (short) and 65 (blocked), widths that
        // are not a multiple of a vector, tokens one past a vector.
        dims(2, 64, 2, 32, true),
        dims(1, 64, 1, 64, false),
        dims(1, 33, 1, 65, true),
        dims(2, 41, 3, 12, true),
        dims(1, 8, 2, 8, false),
        dims(1, 1, 1, 1, false),
    ]
}

fn kernel_against_reference<E: AmpElem>()
where
    Cpu: crate::device::Kernels<E>,
{
    let mut rng = Lcg(7);
    for d in cases() {
        let qkv = rng.values::<E>(d.rows() * 3 * d.width(), 1.0);
        let dy = rng.values::<E>(d.rows() * d.width(), 1.0);
        let old = rng.values::<E>(qkv.len(), 0.5);
        let r = reference(&d, &qkv, &dy);
        let b = Bound::new::<E>(&d, r.score_mass, largest(&[&qkv, &dy]), 0.0);
        let qkv_e = to_e::<E>(&qkv);
        let (y, lse) = forward(d, &qkv_e).unwrap();
        assert_within(&format!("{d:?} y"), &to_f64(&y), &r.y, &r.y_mass, &b);
        for accumulate in [false, true] {
            let old_e = to_e::<E>(&old);
            let dqkv = backward(
                d,
                (&qkv_e, &y, &to_e::<E>(&dy)),
                &lse,
                accumulate.then_some(&old_e[..]),
            )
            .unwrap();
            let want: Vec<f64> = r
                .dqkv
                .iter()
                .zip(&old)
                .map(|(g, o)| if accumulate { g + o } else { *g })
                .collect();
            // The old value enters the one rounding: add its magnitude to the mass.
            let mass: Vec<f64> = r
                .dqkv_mass
                .iter()
                .zip(&old)
                .map(|(m, o)| if accumulate { m + o.abs() * U32 } else { *m })
                .collect();
            assert_within(
                &format!("{d:?} dqkv (accumulate {accumulate})"),
                &to_f64(&dqkv),
                &want,
                &mass,
                &b,
            );
        }
    }
}

#[test]
fn fused_kernels_match_the_f64_reference_in_every_precision() {
    kernel_against_reference::<f32>();
    kernel_against_reference::<half::f16>();
    kernel_against_reference::<half::bf16>();
}

#[test]
fn a_future_token_leaves_earlier_outputs_bit_identical() {
    // 80 tokens on the blocked kernels, 50 on the short-head ones.
    for (tokens, changed) in [(80, [79, 64, 40]), (50, [49, 33, 8])] {
        future_token_case(tokens, changed);
    }
}

fn future_token_case(tokens: usize, changed: [usize; 3]) {
    let mut rng = Lcg(11);
    let d = AttentionDims {
        batch: 1,
        tokens,
        heads: 2,
        head_dim: 8,
        causal: true,
    };
    let qkv = to_e::<half::bf16>(&rng.values::<half::bf16>(d.rows() * 3 * d.width(), 1.0));
    let (y0, _) = forward(d, &qkv).unwrap();
    for changed in changed {
        let mut other = qkv.clone();
        for v in &mut other[changed * 3 * d.width()..(changed + 1) * 3 * d.width()] {
            *v = half::bf16::from_f32(v.to_f32() * -3.0 + 0.5);
        }
        let (y1, _) = forward(d, &other).unwrap();
        let before = changed * d.width();
        assert_eq!(
            y0[..before].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            y1[..before].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "token {changed} changed an earlier output"
        );
        assert_ne!(
            y0[before..],
            y1[before..],
            "token {changed}'s own output did not change"
        );
    }
}

#[test]
fn nan_in_a_query_key_or_value_reaches_the_gradients() {
    // 5 tokens on the short-head kernels, 70 on the blocked ones.
    for tokens in [5, 70] {
        nan_case(tokens);
    }
}

fn nan_case(tokens: usize) {
    let mut rng = Lcg(3);
    let d = AttentionDims {
        batch: 2,
        tokens,
        heads: 2,
        head_dim: 4,
        causal: true,
    };
    for part in 0..3 {
        let mut qkv = to_e::<half::f16>(&rng.values::<half::f16>(d.rows() * 3 * d.width(), 1.0));
        // Token 0 of sequence 1, head 1, in the query, key or value part.
        let at = (d.tokens) * 3 * d.width() + part * d.width() + d.head_dim + 2;
        qkv[at] = half::f16::NAN;
        let (y, lse) = forward(d, &qkv).unwrap();
        assert!(
            y.iter().any(|v| v.is_nan()),
            "part {part}: the output hides the NaN"
        );
        let dy = vec![half::f16::ONE; y.len()];
        let dqkv = backward(d, (&qkv, &y, &dy), &lse, None).unwrap();
        assert!(
            dqkv.iter().any(|v| v.is_nan()),
            "part {part}: the gradients hide the NaN"
        );
    }
}

#[test]
fn buffers_of_the_wrong_size_are_errors() {
    let d = AttentionDims {
        batch: 2,
        tokens: 3,
        heads: 2,
        head_dim: 2,
        causal: true,
    };
    assert!(forward::<f32>(d, &[0.0; 5]).is_err());
    let no_heads = AttentionDims { heads: 0, ..d };
    assert!(forward::<f32>(no_heads, &[0.0; 4]).is_err());
    let good = vec![0f32; d.rows() * 3 * d.width()];
    let (y, lse) = forward(d, &good).unwrap();
    assert!(backward(d, (&good, &y, &y[1..]), &lse, None).is_err());
    assert!(backward(d, (&good, &y, &y), &lse[1..], None).is_err());
}

/// The op on tensors: the fused path against the composed one (values and the gradient of the
/// packed input), both on a mixed tape.
fn fused_against_composed<E: AmpElem>(t: usize)
where
    Cpu: crate::device::Kernels<E>,
{
    const M: usize = 12;
    const H: usize = 3;
    let dev = Cpu::default();
    let mut rng = Lcg(5);
    let b = 2;
    let qkv = rng.values::<E>(b * t * 3 * M, 1.0);
    let w = rng.values::<E>(b * t * M, 1.0);
    let make = |v: &[f64]| -> Tensor<(usize, usize, Const<{ 3 * M }>), E, Cpu> {
        dev.tensor_from_vec(to_e::<E>(v), (b, t, Const))
    };
    let weights: Tensor<(usize, usize, Const<M>), E, Cpu> =
        dev.tensor_from_vec(to_e::<E>(&w), (b, t, Const));
    let run = |fused: bool| {
        let x = make(&qkv);
        let traced = x.clone().leaky_traced_mixed();
        let y = if fused {
            try_attention::<M, { 3 * M }, H, _, _, E, f32, _, _>(traced, true).unwrap()
        } else {
            try_attention_composed::<M, { 3 * M }, H, _, _, E, f32, _, _>(traced, true).unwrap()
        };
        let values = to_f64(&y.retaped::<NoneTape>().as_vec());
        let loss = Loss::new(crate::ops::cast::Cast::to_f32(y * weights.clone()).sum());
        let grads = loss.backward().unwrap().grads().clone();
        (values, to_f64(&grads.get(&x).unwrap().as_vec()))
    };
    let (yf, gf) = run(true);
    let (yc, gc) = run(false);
    // Both are within the f64 reference's bound (the composed path rounds its scores,
    // probabilities and gradients to E between ops: 4u more), so within twice it of each other.
    let d = AttentionDims {
        batch: b,
        tokens: t,
        heads: H,
        head_dim: M / H,
        causal: true,
    };
    let r = reference(&d, &qkv, &w);
    let b = Bound::new::<E>(&d, r.score_mass, largest(&[&qkv, &w]), 4.0);
    assert_within("fused y", &yf, &r.y, &r.y_mass, &b);
    assert_within("composed y", &yc, &r.y, &r.y_mass, &b);
    assert_within("fused dqkv", &gf, &r.dqkv, &r.dqkv_mass, &b);
    assert_within("composed dqkv", &gc, &r.dqkv, &r.dqkv_mass, &b);
}

#[test]
fn the_fused_op_and_the_composed_one_compute_the_same_function() {
    // 70 tokens on the blocked kernels, 33 on the short-head ones.
    for tokens in [70, 33] {
        fused_against_composed::<f32>(tokens);
        fused_against_composed::<half::bf16>(tokens);
    }
}
