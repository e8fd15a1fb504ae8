//! The CPU kernels of the convolutional network (dfdx's convolution, pooling, batch norm and
//! broadcast arithmetic, rewritten in typed-amp's vendored dfdx) against naive references
//! computed in `f64`, for odd sizes, forward and every gradient, in FP32 and FP16.
//!
//! # Tolerances
//!
//! Inputs are drawn in `f64`, rounded to the element type, and the references use those rounded
//! values exactly, so the only error is the kernels' own arithmetic. Every kernel computes in
//! `f32` (unit roundoff `u = 2⁻²⁴`), also for FP16, whose values are converted to `f32` exactly.
//!
//! A sum of `n` products computed in floating point, in any order and with or without fused
//! multiply-adds, satisfies `|ŝ − s| ≤ γ_n · Σ|terms|` with `γ_n = n·u / (1 − n·u)` (Higham,
//! *Accuracy and Stability of Numerical Algorithms*, §3.1), where `n` bounds the number of
//! roundings any one term goes through. For each kernel, `n` is the accumulation length:
//!
//! - convolution output: `C/G · K²` (one dot product per output; zero padding adds exact zeros);
//! - input gradient: `O/G` (the product `Wᵀ·dY`) plus `K²` (col2im adds up to `K²` of those),
//!   at most `O/G · K² + 1`;
//! - filter gradient: `B · OH · OW` terms, accumulated image after image, then at most 16
//!   partial sums (one per piece of the batch) added;
//! - pooling: the `T ≤ K²` taps of a window, plus the multiplication by `1/K²` for averages;
//! - broadcast reductions (the bias gradient): the `B·H·W` terms summed in 8 lanes, then the lanes.
//!
//! Each bound below uses `γ_(n+32)`: 32 more roundings than the accumulation length covers the
//! combination of lanes, pieces and partial sums, which no kernel exceeds.
//!
//! FP16 results are stored in FP16: one more rounding of the result, `|fl₁₆(v) − v| ≤
//! 2⁻¹¹·|v|` (and `≤ 2⁻²⁵` absolute below FP16's normal range), and for the input and filter
//! gradients one more of an intermediate (the GEMM's FP16 output, whose terms sum to at most
//! `Σ|terms|`). Hence FP16's bound `(γ_(n+32) + 2·2⁻¹¹)·(1 + 2·2⁻¹¹)·Σ|terms| + 2⁻²³`.
//!
//! Batch norm's bounds are derived next to its test.
//!
//! Each test prints its worst error as a fraction of its bound (`cargo test -p typed-amp-dfdx
//! --features f16 --test fork conv_kernels -- --nocapture`).

use num_traits::Float;
use typed_amp_dfdx::dtypes::f16;
use typed_amp_dfdx::nn::builders::{BatchNorm1D, BatchNorm2D};
use typed_amp_dfdx::prelude::*;
use typed_amp_dfdx::tensor_ops::{ConvDevice, Pool2DKind, TryPool2D};

/// FP32's unit roundoff, the precision every kernel computes in.
const U: f64 = 1.0 / 16_777_216.0;
/// FP16's unit roundoff.
const U16: f64 = 1.0 / 2048.0;

fn gamma(n: usize) -> f64 {
    let nu = n as f64 * U;
    assert!(nu < 0.5, "accumulation too long for a useful bound");
    nu / (1.0 - nu)
}

/// The element types under test.
trait El: Dtype + Float + std::fmt::Debug {
    const NAME: &'static str;
    /// The unit roundoff of storing a result (0 for FP32: the rounding is part of `γ`).
    const STORE: f64;
    /// The unit roundoff of the type's own arithmetic.
    const ARITH: f64;
}
impl El for f32 {
    const NAME: &'static str = "FP32";
    const STORE: f64 = 0.0;
    const ARITH: f64 = U;
}
impl El for f16 {
    const NAME: &'static str = "FP16";
    const STORE: f64 = U16;
    const ARITH: f64 = U16;
}

/// The bound on a sum of products of `n` terms whose absolute values sum to `abs`, computed in
/// FP32 and stored (with up to one intermediate) in `E`.
fn sum_bound<E: El>(n: usize, abs: f64) -> f64 {
    if E::STORE == 0.0 {
        gamma(n + 32) * abs
    } else {
        (gamma(n + 32) + 2.0 * E::STORE) * (1.0 + 2.0 * E::STORE) * abs + 2f64.powi(-23)
    }
}

/// Deterministic pseudo-random values in `[lo, hi)`, rounded to `E`.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    fn vec<E: El>(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n)
            .map(|_| round::<E>(lo + (hi - lo) * self.next()))
            .collect()
    }
}

fn round<E: El>(v: f64) -> f64 {
    E::from_f64(v).unwrap().to_f64().unwrap()
}

fn to_e<E: El>(v: &[f64]) -> Vec<E> {
    v.iter().map(|x| E::from_f64(*x).unwrap()).collect()
}

fn to_f64<E: El>(v: &[E]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64().unwrap()).collect()
}

/// The largest `|got − want| / bound` over the elements; panics naming the first element out
/// of bound.
fn check(what: &str, got: &[f64], want: &[f64], bound: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let mut worst: f64 = 0.0;
    for (i, ((g, w), b)) in got.iter().zip(want).zip(bound).enumerate() {
        let err = (g - w).abs();
        assert!(
            err <= *b,
            "{what}[{i}]: got {g}, want {w}, error {err:e} over the bound {b:e}"
        );
        if *b > 0.0 {
            worst = worst.max(err / b);
        }
    }
    worst
}

// ---------------------------------------------------------------------------------------------
// Convolution

#[derive(Debug, Clone, Copy)]
struct ConvCase {
    batch: usize,
    chan_in: usize,
    chan_out: usize,
    h: usize,
    w: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
    groups: usize,
}

impl ConvCase {
    fn out_dim(&self, len: usize) -> Option<usize> {
        let span = self.dilation * (self.kernel - 1) + 1;
        (len + 2 * self.padding)
            .checked_sub(span)
            .map(|v| v / self.stride + 1)
    }
}

/// The worst error/bound ratios of (output, input gradient, filter gradient).
fn conv_case<E: El>(case: ConvCase, rng: &mut Rng) -> [f64; 3]
where
    Cpu: Device<E> + ConvDevice<E>,
{
    let dev = Cpu::default();
    let ConvCase {
        batch: b,
        chan_in: c,
        chan_out: o,
        h,
        w,
        kernel: k,
        stride: s,
        padding: p,
        dilation: d,
        groups: g,
    } = case;
    let (oh, ow) = (case.out_dim(h).unwrap(), case.out_dim(w).unwrap());
    let (cg, og) = (c / g, o / g);
    let x = rng.vec::<E>(b * c * h * w, -1.0, 1.0);
    let wt = rng.vec::<E>(o * cg * k * k, -1.0, 1.0);
    let gy = rng.vec::<E>(b * o * oh * ow, -1.0, 1.0);

    let xt = dev.tensor_from_vec(to_e::<E>(&x), (b, c, h, w));
    let wtt = dev.tensor_from_vec(to_e::<E>(&wt), (o, cg, k, k));
    let gyt = dev.tensor_from_vec(to_e::<E>(&gy), (b, o, oh, ow));
    let y = (xt.leaky_trace(), wtt.clone()).conv2d(s, p, d, g);
    assert_eq!(*y.shape(), (b, o, oh, ow), "{case:?}");
    let y_got = to_f64(&y.retaped::<NoneTape>().as_vec());
    let grads = (y * gyt).sum().backward();
    let dx_got = to_f64(&grads.get(&xt).as_vec());
    let dw_got = to_f64(&grads.get(&wtt).as_vec());

    // The reference, with Σ|terms| of each result.
    let mut y_ref = vec![0.0; b * o * oh * ow];
    let mut y_abs = y_ref.clone();
    let mut dx_ref = vec![0.0; b * c * h * w];
    let mut dx_abs = dx_ref.clone();
    let mut dw_ref = vec![0.0; o * cg * k * k];
    let mut dw_abs = dw_ref.clone();
    for bi in 0..b {
        for oc in 0..o {
            let grp = oc / og;
            for i in 0..oh {
                for j in 0..ow {
                    let yi = ((bi * o + oc) * oh + i) * ow + j;
                    for cc in 0..cg {
                        let ci = grp * cg + cc;
                        for ki in 0..k {
                            for kj in 0..k {
                                let yy = (i * s + ki * d) as isize - p as isize;
                                let xx = (j * s + kj * d) as isize - p as isize;
                                if yy < 0 || xx < 0 || yy >= h as isize || xx >= w as isize {
                                    continue;
                                }
                                let xi = ((bi * c + ci) * h + yy as usize) * w + xx as usize;
                                let wi = ((oc * cg + cc) * k + ki) * k + kj;
                                y_ref[yi] += x[xi] * wt[wi];
                                y_abs[yi] += (x[xi] * wt[wi]).abs();
                                dx_ref[xi] += gy[yi] * wt[wi];
                                dx_abs[xi] += (gy[yi] * wt[wi]).abs();
                                dw_ref[wi] += gy[yi] * x[xi];
                                dw_abs[wi] += (gy[yi] * x[xi]).abs();
                            }
                        }
                    }
                }
            }
        }
    }
    let y_bound: Vec<f64> = y_abs
        .iter()
        .map(|a| sum_bound::<E>(cg * k * k, *a))
        .collect();
    let dx_bound: Vec<f64> = dx_abs
        .iter()
        .map(|a| sum_bound::<E>(og * k * k + 1, *a))
        .collect();
    let dw_bound: Vec<f64> = dw_abs
        .iter()
        .map(|a| sum_bound::<E>(b * oh * ow, *a))
        .collect();
    let name = format!("{} conv {case:?}", E::NAME);
    [
        check(&format!("{name}: output"), &y_got, &y_ref, &y_bound),
        check(
            &format!("{name}: input gradient"),
            &dx_got,
            &dx_ref,
            &dx_bound,
        ),
        check(
            &format!("{name}: filter gradient"),
            &dw_got,
            &dw_ref,
            &dw_bound,
        ),
    ]
}

fn conv_cases() -> Vec<ConvCase> {
    let mut cases = vec![];
    for &(chan_in, chan_out) in &[(1, 4), (3, 5), (16, 6)] {
        for &kernel in &[1, 3, 5] {
            for &stride in &[1, 2] {
                for &padding in &[0, 1, 2] {
                    for &batch in &[1, 3] {
                        cases.push(ConvCase {
                            batch,
                            chan_in,
                            chan_out,
                            h: 7,
                            w: 9,
                            kernel,
                            stride,
                            padding,
                            dilation: 1,
                            groups: 1,
                        });
                    }
                }
            }
        }
    }
    // Dilation and groups, and the CNN's own shapes.
    let base = ConvCase {
        batch: 3,
        chan_in: 4,
        chan_out: 6,
        h: 9,
        w: 7,
        kernel: 3,
        stride: 1,
        padding: 1,
        dilation: 2,
        groups: 1,
    };
    cases.push(base);
    cases.push(ConvCase { groups: 2, ..base });
    cases.push(ConvCase {
        groups: 2,
        dilation: 1,
        stride: 2,
        ..base
    });
    cases.push(ConvCase {
        batch: 3,
        chan_in: 1,
        chan_out: 16,
        h: 28,
        w: 28,
        dilation: 1,
        ..base
    });
    cases.push(ConvCase {
        batch: 3,
        chan_in: 16,
        chan_out: 32,
        h: 14,
        w: 14,
        dilation: 1,
        ..base
    });
    cases
}

fn conv_all<E: El>()
where
    Cpu: Device<E> + ConvDevice<E>,
{
    let mut rng = Rng(1);
    let mut worst = [0.0f64; 3];
    let cases = conv_cases();
    for case in &cases {
        let w = conv_case::<E>(*case, &mut rng);
        for i in 0..3 {
            worst[i] = worst[i].max(w[i]);
        }
    }
    println!(
        "{} conv2d, {} cases: worst error / bound: output {:.3}, input gradient {:.3}, filter gradient {:.3}",
        E::NAME,
        cases.len(),
        worst[0],
        worst[1],
        worst[2]
    );
}

#[test]
fn conv2d_matches_a_direct_convolution_fp32() {
    conv_all::<f32>();
}

#[test]
fn conv2d_matches_a_direct_convolution_fp16() {
    conv_all::<f16>();
}

/// The convolution with its bias fused, `(x, w, b).conv2d(..)` (typed-amp's `Conv2D`), against
/// the convolution followed by a broadcast add: the output and the input and filter gradients
/// are the same bits (the same kernels on the same values, then the same single rounding of
/// the addition); the bias gradient sums `B·OH·OW` values of the output gradient.
fn conv_bias_case<E: El>(case: ConvCase, rng: &mut Rng) -> f64
where
    Cpu: Device<E> + ConvDevice<E>,
{
    let dev = Cpu::default();
    let ConvCase {
        batch: b,
        chan_in: c,
        chan_out: o,
        h,
        w,
        kernel: k,
        stride: s,
        padding: p,
        ..
    } = case;
    let (oh, ow) = (case.out_dim(h).unwrap(), case.out_dim(w).unwrap());
    let x = to_e::<E>(&rng.vec::<E>(b * c * h * w, -1.0, 1.0));
    let wt = to_e::<E>(&rng.vec::<E>(o * c * k * k, -1.0, 1.0));
    let bias = to_e::<E>(&rng.vec::<E>(o, -1.0, 1.0));
    let gy = rng.vec::<E>(b * o * oh * ow, -1.0, 1.0);
    let run = |fused: bool| {
        let xt = dev.tensor_from_vec(x.clone(), (b, c, h, w));
        let wtt = dev.tensor_from_vec(wt.clone(), (o, c, k, k));
        let bt = dev.tensor_from_vec(bias.clone(), (o,));
        let y = if fused {
            (xt.leaky_trace(), wtt.clone(), bt.clone()).conv2d(s, p, 1, 1)
        } else {
            let y = (xt.leaky_trace(), wtt.clone()).conv2d(s, p, 1, 1);
            let shape = *y.shape();
            y + bt.leaky_trace().broadcast_like::<_, Axes3<0, 2, 3>>(&shape)
        };
        let y_vec = y.retaped::<NoneTape>().as_vec();
        let gyt = dev.tensor_from_vec(to_e::<E>(&gy), (b, o, oh, ow));
        let grads = (y * gyt).sum().backward();
        (
            y_vec,
            grads.get(&xt).as_vec(),
            grads.get(&wtt).as_vec(),
            to_f64(&grads.get(&bt).as_vec()),
        )
    };
    let (y_f, dx_f, dw_f, db_f) = run(true);
    let (y_u, dx_u, dw_u, _) = run(false);
    let name = format!("{} conv with fused bias {case:?}", E::NAME);
    assert_eq!(y_f, y_u, "{name}: output");
    assert_eq!(dx_f, dx_u, "{name}: input gradient");
    assert_eq!(dw_f, dw_u, "{name}: filter gradient");
    let mut db = vec![0.0; o];
    let mut db_abs = vec![0.0; o];
    for (i, g) in gy.iter().enumerate() {
        db[(i / (oh * ow)) % o] += g;
        db_abs[(i / (oh * ow)) % o] += g.abs();
    }
    let bound: Vec<f64> = db_abs
        .iter()
        .map(|a| sum_bound::<E>(b * oh * ow, *a))
        .collect();
    check(&format!("{name}: bias gradient"), &db_f, &db, &bound)
}

fn conv_bias_all<E: El>()
where
    Cpu: Device<E> + ConvDevice<E>,
{
    let mut rng = Rng(6);
    let mut worst: f64 = 0.0;
    let cases = conv_cases();
    let cases: Vec<_> = cases
        .iter()
        .filter(|c| c.groups == 1 && c.dilation == 1)
        .collect();
    for case in &cases {
        worst = worst.max(conv_bias_case::<E>(**case, &mut rng));
    }
    println!(
        "{} conv2d with fused bias, {} cases: output and input/filter gradients equal to the unfused op; worst bias-gradient error / bound {worst:.3}",
        E::NAME,
        cases.len()
    );
}

#[test]
fn conv2d_with_fused_bias_matches_conv2d_then_add_fp32() {
    conv_bias_all::<f32>();
}

#[test]
fn conv2d_with_fused_bias_matches_conv2d_then_add_fp16() {
    conv_bias_all::<f16>();
}

// ---------------------------------------------------------------------------------------------
// Pooling

#[derive(Debug, Clone, Copy)]
struct PoolCase {
    kind: Kind,
    batch: usize,
    chan: usize,
    h: usize,
    w: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Max,
    Min,
    Avg,
}

/// The worst error/bound ratios of (output, input gradient); max and min pooling's outputs
/// must be exact.
fn pool_case<E: El>(case: PoolCase, rng: &mut Rng) -> [f64; 2]
where
    Cpu: Device<E> + ConvDevice<E>,
{
    let dev = Cpu::default();
    let PoolCase {
        kind,
        batch: b,
        chan: c,
        h,
        w,
        kernel: k,
        stride: s,
        padding: p,
        dilation: d,
    } = case;
    let span = d * (k - 1) + 1;
    let (oh, ow) = ((h + 2 * p - span) / s + 1, (w + 2 * p - span) / s + 1);
    let x = rng.vec::<E>(b * c * h * w, -1.0, 1.0);
    let gy = rng.vec::<E>(b * c * oh * ow, -1.0, 1.0);
    let xt = dev.tensor_from_vec(to_e::<E>(&x), (b, c, h, w));
    let gyt = dev.tensor_from_vec(to_e::<E>(&gy), (b, c, oh, ow));
    let dkind = match kind {
        Kind::Max => Pool2DKind::Max,
        Kind::Min => Pool2DKind::Min,
        Kind::Avg => Pool2DKind::Avg,
    };
    let y = xt.leaky_trace().pool2d(dkind, k, s, p, d);
    assert_eq!(*y.shape(), (b, c, oh, ow), "{case:?}");
    let y_got = to_f64(&y.retaped::<NoneTape>().as_vec());
    let grads = (y * gyt).sum().backward();
    let dx_got = to_f64(&grads.get(&xt).as_vec());

    let mut y_ref = vec![0.0; b * c * oh * ow];
    let mut y_bound = y_ref.clone();
    let mut dx_ref = vec![0.0; b * c * h * w];
    let mut dx_abs = dx_ref.clone();
    let mut dx_n = vec![0usize; b * c * h * w];
    let inv = 1.0 / (k * k) as f64;
    for plane in 0..b * c {
        for i in 0..oh {
            for j in 0..ow {
                let taps: Vec<usize> = (0..k * k)
                    .filter_map(|t| {
                        let yy = (i * s + (t / k) * d) as isize - p as isize;
                        let xx = (j * s + (t % k) * d) as isize - p as isize;
                        (yy >= 0 && xx >= 0 && yy < h as isize && xx < w as isize)
                            .then(|| (plane * h + yy as usize) * w + xx as usize)
                    })
                    .collect();
                let yi = (plane * oh + i) * ow + j;
                let v = match kind {
                    Kind::Max => taps.iter().map(|t| x[*t]).fold(f64::NEG_INFINITY, f64::max),
                    Kind::Min => taps.iter().map(|t| x[*t]).fold(f64::INFINITY, f64::min),
                    Kind::Avg => taps.iter().map(|t| x[*t]).sum::<f64>() * inv,
                };
                y_ref[yi] = v;
                if kind == Kind::Avg {
                    // T taps summed, times fl(1/K²): T + 1 roundings.
                    let abs: f64 = taps.iter().map(|t| x[*t].abs()).sum::<f64>() * inv;
                    y_bound[yi] = sum_bound::<E>(taps.len() + 1, abs);
                }
                for t in &taps {
                    let gi = match kind {
                        Kind::Avg => gy[yi] * inv,
                        _ if x[*t] == v => gy[yi],
                        _ => continue,
                    };
                    dx_ref[*t] += gi;
                    dx_abs[*t] += gi.abs();
                    dx_n[*t] += 1;
                }
            }
        }
    }
    let dx_bound: Vec<f64> = dx_abs
        .iter()
        .zip(&dx_n)
        .map(|(a, n)| sum_bound::<E>(n + 1, *a))
        .collect();
    let name = format!("{} pool {case:?}", E::NAME);
    [
        check(&format!("{name}: output"), &y_got, &y_ref, &y_bound),
        check(
            &format!("{name}: input gradient"),
            &dx_got,
            &dx_ref,
            &dx_bound,
        ),
    ]
}

fn pool_all<E: El>()
where
    Cpu: Device<E> + ConvDevice<E>,
{
    let mut rng = Rng(2);
    let mut worst = [0.0f64; 2];
    let mut n = 0;
    for kind in [Kind::Max, Kind::Min, Kind::Avg] {
        for &(batch, chan) in &[(1, 1), (3, 3), (1, 16)] {
            for kernel in 1..=3 {
                for stride in 1..=3 {
                    for padding in 0..kernel.min(2) {
                        for dilation in [1, 2] {
                            let case = PoolCase {
                                kind,
                                batch,
                                chan,
                                h: 7,
                                w: 9,
                                kernel,
                                stride,
                                padding,
                                dilation,
                            };
                            let w = pool_case::<E>(case, &mut rng);
                            worst[0] = worst[0].max(w[0]);
                            worst[1] = worst[1].max(w[1]);
                            n += 1;
                        }
                    }
                }
            }
        }
    }
    // The CNN's 2×2 pooling, even and odd sizes.
    for (h, w) in [(28, 28), (7, 9)] {
        let case = PoolCase {
            kind: Kind::Max,
            batch: 3,
            chan: 16,
            h,
            w,
            kernel: 2,
            stride: 2,
            padding: 0,
            dilation: 1,
        };
        let w = pool_case::<E>(case, &mut rng);
        worst[0] = worst[0].max(w[0]);
        worst[1] = worst[1].max(w[1]);
        n += 1;
    }
    println!(
        "{} pool2d, {n} cases: worst error / bound: average output {:.3}, input gradient {:.3} (max and min outputs exact)",
        E::NAME,
        worst[0],
        worst[1]
    );
}

#[test]
fn pool2d_matches_a_direct_pooling_fp32() {
    pool_all::<f32>();
}

#[test]
fn pool2d_matches_a_direct_pooling_fp16() {
    pool_all::<f16>();
}

// ---------------------------------------------------------------------------------------------
// Batch norm
//
// Reference, per channel over its N values: μ = Σx/N, v = Σ(x−μ)²/N, σ = √(v+ε), x̂ = (x−μ)/σ,
// y = γ·x̂ + β; backward dβ = Σdy, dγ = Σdy·x̂, dx = (γ/σ)·(dy − Σdy/N − x̂·Σdy·x̂/N).
//
// The kernel sums runs of L contiguous values of a channel (L = H·W, the length, or 1) in 16
// f32 lanes, so each term goes through at most d = ⌈L/16⌉ + 32 roundings before the run sums are
// added in f64 (whose error, about 2⁻⁵³ per addition, is covered by the slack below). To first
// order, with u = 2⁻²⁴ and M₁ = Σ|x|/N:
//
// - mean (rounded to f32): e_μ = γ_d·M₁ + u·|μ|;
// - variance, from d' = fl(x − μ̂) squared and summed, rounded to f32: e_v = γ_(d+4)·v + 2·e_μ²
//   (Σ(x−μ̂)² = Σ(x−μ)² + N·(μ−μ̂)²);
// - σ̂ = fl(√fl(v̂ + ε)): relative error r_σ = e_v / (2(v+ε)) + 2u; a = fl(γ/σ̂): r_a = r_σ + u;
// - y = fl(fl(fl(x − μ̂)·a) + β): |Δy| ≤ |a|·e_μ + |x−μ|·|a|·(r_a + 2u) + u·(|x−μ|·|a| + |β|);
// - Σdy: e_s = γ_d·Σ|dy|; Σdy·(x−μ̂): e_p = e_μ·|Σdy| + γ_(d+2)·(Σ|dy·(x−μ)| + e_μ·Σ|dy|);
// - dβ = Σdy: e_s + u·|dβ|; dγ = Σdy·(x−μ̂)/σ̂: e_p/σ + |dγ|·(r_σ + u);
// - dx = k₁·(dy − m − (x−μ̂)·k₂) with k₁ = fl(γ/σ̂), m = fl(Σdy/N), k₂ = fl(Σdy·(x−μ̂)/(N·σ̂²)):
//   e_m = e_s/N + u·|m|, e_k₂ = e_p/(N·σ²) + |k₂|·(2r_σ + u),
//   e_t = e_m + e_μ·|k₂| + |x−μ|·e_k₂ + 2u·(|dy| + |m| + |x−μ|·|k₂|),
//   |Δdx| ≤ |k₁|·e_t + |dx|·(r_σ + 2u);
// - running statistics r' = r·(1−m) + s·m in the element type's arithmetic (unit roundoff u_E):
//   |Δr'| ≤ m·e_s + 4u_E·(|r|(1−m) + m·|s|), with s the batch mean (e_μ) or the unbiased
//   variance (e_v·N/(N−1)).
//
// Each bound is doubled to cover the second-order terms; FP16 adds u₁₆·|result| for storing
// the result, and 2⁻²³ absolute for results below FP16's normal range.

/// Per-channel statistics and the first-order error terms above.
struct BnStats {
    n: usize,
    mean: f64,
    var: f64,
    e_mean: f64,
    e_var: f64,
    sigma: f64,
    r_sigma: f64,
}

fn bn_stats(values: &[f64], run: usize, eps: f64) -> BnStats {
    let n = values.len();
    let mean = values.iter().sum::<f64>() / n as f64;
    let var = values.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
    let m1 = values.iter().map(|x| x.abs()).sum::<f64>() / n as f64;
    let d = run.div_ceil(16) + 32;
    let e_mean = gamma(d) * m1 + U * mean.abs();
    let e_var = gamma(d + 4) * var + 2.0 * e_mean * e_mean;
    let sigma = (var + eps).sqrt();
    let r_sigma = e_var / (2.0 * (var + eps)) + 2.0 * U;
    BnStats {
        n,
        mean,
        var,
        e_mean,
        e_var,
        sigma,
        r_sigma,
    }
}

fn store_bound<E: El>(first_order: f64, value: f64) -> f64 {
    2.0 * first_order + E::STORE * value.abs() + if E::STORE > 0.0 { 2f64.powi(-23) } else { 0.0 }
}

/// Batch norm over `(outer, C, inner)` data, forward and backward, checked against the
/// reference; returns the worst ratios of (y, dx, dγ, dβ, running statistics).
#[allow(clippy::too_many_arguments)]
fn bn_check<E: El>(
    name: &str,
    outer: usize,
    chan: usize,
    inner: usize,
    x: &[f64],
    gy: &[f64],
    scale: &[f64],
    bias: &[f64],
    got: [&[f64]; 6],
) -> [f64; 5] {
    let [y_got, dx_got, ds_got, db_got, rm_got, rv_got] = got;
    let eps = 1e-5;
    let momentum = 0.1;
    let idx = |o: usize, c: usize, i: usize| (o * chan + c) * inner + i;
    let len = x.len();
    let (mut y_ref, mut y_b, mut dx_ref, mut dx_b) = (
        vec![0.0; len],
        vec![0.0; len],
        vec![0.0; len],
        vec![0.0; len],
    );
    let (mut ds_ref, mut ds_b, mut db_ref, mut db_b) = (
        vec![0.0; chan],
        vec![0.0; chan],
        vec![0.0; chan],
        vec![0.0; chan],
    );
    let (mut rm_ref, mut rm_b, mut rv_ref, mut rv_b) = (
        vec![0.0; chan],
        vec![0.0; chan],
        vec![0.0; chan],
        vec![0.0; chan],
    );
    for c in 0..chan {
        let ids: Vec<usize> = (0..outer)
            .flat_map(|o| (0..inner).map(move |i| idx(o, c, i)))
            .collect();
        let xs: Vec<f64> = ids.iter().map(|i| x[*i]).collect();
        let st = bn_stats(&xs, inner, eps);
        let nf = st.n as f64;
        let d = inner.div_ceil(16) + 32;
        let (g, be) = (scale[c], bias[c]);
        let a = g / st.sigma;
        let r_a = st.r_sigma + U;
        let sdy: f64 = ids.iter().map(|i| gy[*i]).sum();
        let sdy_abs: f64 = ids.iter().map(|i| gy[*i].abs()).sum();
        let sdyx: f64 = ids.iter().map(|i| gy[*i] * (x[*i] - st.mean)).sum();
        let sdyx_abs: f64 = ids.iter().map(|i| (gy[*i] * (x[*i] - st.mean)).abs()).sum();
        let e_s = gamma(d) * sdy_abs;
        let e_p = st.e_mean * sdy.abs() + gamma(d + 2) * (sdyx_abs + st.e_mean * sdy_abs);
        let k1 = g / st.sigma;
        let m = sdy / nf;
        let k2 = sdyx / (nf * st.sigma * st.sigma);
        let e_m = e_s / nf + U * m.abs();
        let e_k2 = e_p / (nf * st.sigma * st.sigma) + k2.abs() * (2.0 * st.r_sigma + U);
        for &i in &ids {
            let xc = x[i] - st.mean;
            y_ref[i] = xc * a + be;
            let e_y = a.abs() * st.e_mean
                + xc.abs() * a.abs() * (r_a + 2.0 * U)
                + U * (xc.abs() * a.abs() + be.abs());
            y_b[i] = store_bound::<E>(e_y, y_ref[i]);
            dx_ref[i] = k1 * (gy[i] - m - xc * k2);
            let e_t = e_m
                + st.e_mean * k2.abs()
                + xc.abs() * e_k2
                + 2.0 * U * (gy[i].abs() + m.abs() + xc.abs() * k2.abs());
            let e_dx = k1.abs() * e_t + dx_ref[i].abs() * (st.r_sigma + 2.0 * U);
            dx_b[i] = store_bound::<E>(e_dx, dx_ref[i]);
        }
        db_ref[c] = sdy;
        db_b[c] = store_bound::<E>(e_s + U * sdy.abs(), sdy);
        ds_ref[c] = sdyx / st.sigma;
        let e_ds = e_p / st.sigma + ds_ref[c].abs() * (st.r_sigma + U);
        ds_b[c] = store_bound::<E>(e_ds, ds_ref[c]);
        // Running statistics from their initial 0 and 1.
        let unbiased = nf / (nf - 1.0);
        rm_ref[c] = st.mean * momentum;
        rm_b[c] = 2.0 * (momentum * st.e_mean + 4.0 * E::ARITH * momentum * st.mean.abs());
        rv_ref[c] = (1.0 - momentum) + st.var * momentum * unbiased;
        rv_b[c] = 2.0
            * (momentum * unbiased * st.e_var
                + 4.0 * E::ARITH * ((1.0 - momentum) + momentum * unbiased * st.var));
    }
    let mut running_got = rm_got.to_vec();
    running_got.extend_from_slice(rv_got);
    let mut running_ref = rm_ref;
    running_ref.extend(rv_ref);
    let mut running_b = rm_b;
    running_b.extend(rv_b);
    [
        check(&format!("{name}: output"), y_got, &y_ref, &y_b),
        check(&format!("{name}: input gradient"), dx_got, &dx_ref, &dx_b),
        check(&format!("{name}: scale gradient"), ds_got, &ds_ref, &ds_b),
        check(&format!("{name}: bias gradient"), db_got, &db_ref, &db_b),
        check(
            &format!("{name}: running statistics"),
            &running_got,
            &running_ref,
            &running_b,
        ),
    ]
}

/// BatchNorm2D<C> in training on `(batch, C, h, w)`; returns the worst ratios.
fn bn2d_case<E: El, const C: usize>(batch: usize, h: usize, w: usize, rng: &mut Rng) -> [f64; 5]
where
    Cpu: Device<E> + ConvDevice<E>,
{
    let dev = Cpu::default();
    let len = batch * C * h * w;
    // Off-centre inputs, so that the mean matters.
    let x = rng.vec::<E>(len, 1.0, 4.0);
    let gy = rng.vec::<E>(len, -1.0, 1.0);
    let scale = rng.vec::<E>(C, 0.5, 2.0);
    let bias = rng.vec::<E>(C, -1.0, 1.0);
    let mut bn = dev.build_module::<BatchNorm2D<C>, E>();
    bn.scale = dev.tensor_from_vec(to_e::<E>(&scale), (Const::<C>,));
    bn.bias = dev.tensor_from_vec(to_e::<E>(&bias), (Const::<C>,));
    let xt = dev.tensor_from_vec(to_e::<E>(&x), (batch, Const::<C>, h, w));
    let gyt = dev.tensor_from_vec(to_e::<E>(&gy), (batch, Const::<C>, h, w));
    let y = bn.forward_mut(xt.leaky_trace());
    let y_got = to_f64(&y.retaped::<NoneTape>().as_vec());
    let grads = (y * gyt).sum().backward();
    let got = [
        y_got,
        to_f64(&grads.get(&xt).as_vec()),
        to_f64(&grads.get(&bn.scale).as_vec()),
        to_f64(&grads.get(&bn.bias).as_vec()),
        to_f64(&bn.running_mean.as_vec()),
        to_f64(&bn.running_var.as_vec()),
    ];
    let name = format!("{} BatchNorm2D<{C}> ({batch}, {C}, {h}, {w})", E::NAME);
    bn_check::<E>(
        &name,
        batch,
        C,
        h * w,
        &x,
        &gy,
        &scale,
        &bias,
        got.each_ref().map(|v| v.as_slice()),
    )
}

/// BatchNorm1D<C> in training on `(batch, C)` (`len == 0`) or `(batch, C, len)`.
fn bn1d_case<E: El, const C: usize>(batch: usize, len: usize, rng: &mut Rng) -> [f64; 5]
where
    Cpu: Device<E> + ConvDevice<E>,
{
    let dev = Cpu::default();
    let inner = len.max(1);
    let n = batch * C * inner;
    let x = rng.vec::<E>(n, -3.0, 1.0);
    let gy = rng.vec::<E>(n, -1.0, 1.0);
    let scale = rng.vec::<E>(C, 0.5, 2.0);
    let bias = rng.vec::<E>(C, -1.0, 1.0);
    let mut bn = dev.build_module::<BatchNorm1D<C>, E>();
    bn.scale = dev.tensor_from_vec(to_e::<E>(&scale), (Const::<C>,));
    bn.bias = dev.tensor_from_vec(to_e::<E>(&bias), (Const::<C>,));
    let (got, name) = if len == 0 {
        let xt = dev.tensor_from_vec(to_e::<E>(&x), (batch, Const::<C>));
        let gyt = dev.tensor_from_vec(to_e::<E>(&gy), (batch, Const::<C>));
        let y = bn.forward_mut(xt.leaky_trace());
        let y_got = to_f64(&y.retaped::<NoneTape>().as_vec());
        let grads = (y * gyt).sum().backward();
        let dx = to_f64(&grads.get(&xt).as_vec());
        let ds = to_f64(&grads.get(&bn.scale).as_vec());
        let db = to_f64(&grads.get(&bn.bias).as_vec());
        (
            [y_got, dx, ds, db],
            format!("{} BatchNorm1D<{C}> ({batch}, {C})", E::NAME),
        )
    } else {
        let xt = dev.tensor_from_vec(to_e::<E>(&x), (batch, Const::<C>, len));
        let gyt = dev.tensor_from_vec(to_e::<E>(&gy), (batch, Const::<C>, len));
        let y = bn.forward_mut(xt.leaky_trace());
        let y_got = to_f64(&y.retaped::<NoneTape>().as_vec());
        let grads = (y * gyt).sum().backward();
        let dx = to_f64(&grads.get(&xt).as_vec());
        let ds = to_f64(&grads.get(&bn.scale).as_vec());
        let db = to_f64(&grads.get(&bn.bias).as_vec());
        (
            [y_got, dx, ds, db],
            format!("{} BatchNorm1D<{C}> ({batch}, {C}, {len})", E::NAME),
        )
    };
    let [y, dx, ds, db] = got;
    let rm = to_f64(&bn.running_mean.as_vec());
    let rv = to_f64(&bn.running_var.as_vec());
    bn_check::<E>(
        &name,
        batch,
        C,
        inner,
        &x,
        &gy,
        &scale,
        &bias,
        [&y, &dx, &ds, &db, &rm, &rv],
    )
}

fn bn_all<E: El>()
where
    Cpu: Device<E> + ConvDevice<E>,
{
    let mut rng = Rng(3);
    let mut worst = [0.0f64; 5];
    let mut n = 0;
    let mut take = |w: [f64; 5]| {
        for i in 0..5 {
            worst[i] = worst[i].max(w[i]);
        }
        n += 1;
    };
    for batch in [1, 3] {
        for (h, w) in [(7, 9), (1, 5)] {
            take(bn2d_case::<E, 1>(batch, h, w, &mut rng));
            take(bn2d_case::<E, 3>(batch, h, w, &mut rng));
            take(bn2d_case::<E, 16>(batch, h, w, &mut rng));
        }
    }
    // The CNN's shapes at a smaller batch, and a long run (more than one conversion block).
    take(bn2d_case::<E, 16>(4, 28, 28, &mut rng));
    take(bn2d_case::<E, 3>(2, 40, 41, &mut rng));
    take(bn1d_case::<E, 3>(5, 0, &mut rng));
    take(bn1d_case::<E, 16>(3, 0, &mut rng));
    take(bn1d_case::<E, 3>(3, 7, &mut rng));
    println!(
        "{} batch norm (training), {n} cases: worst error / bound: output {:.3}, input gradient {:.3}, scale gradient {:.3}, bias gradient {:.3}, running statistics {:.3}",
        E::NAME, worst[0], worst[1], worst[2], worst[3], worst[4]
    );
}

#[test]
fn batchnorm_training_matches_the_reference_fp32() {
    bn_all::<f32>();
}

#[test]
fn batchnorm_training_matches_the_reference_fp16() {
    bn_all::<f16>();
}

/// Inference: `y = (x − running_mean) · scale / √(running_var + ε) + bias`. In FP32 the fused
/// kernel performs upstream's operations in upstream's order, so it must give the same bits as
/// those operations composed; both precisions are checked against the `f64` reference, whose
/// bound is six roundings of `|x − μ|·|a| + |β|` (ε's and the sum's, the square root's, the
/// division's, the subtraction's, the product's, the addition's), doubled, plus FP16's storing.
fn bn_eval<E: El>()
where
    Cpu: Device<E> + ConvDevice<E>,
{
    const C: usize = 3;
    let dev = Cpu::default();
    let mut rng = Rng(4);
    let (b, h, w) = (3, 7, 9);
    let x = rng.vec::<E>(b * C * h * w, -2.0, 2.0);
    let mut bn = dev.build_module::<BatchNorm2D<C>, E>();
    let (rm, rv) = (rng.vec::<E>(C, -1.0, 1.0), rng.vec::<E>(C, 0.5, 2.0));
    let (sc, bi) = (rng.vec::<E>(C, 0.5, 2.0), rng.vec::<E>(C, -1.0, 1.0));
    bn.running_mean = dev.tensor_from_vec(to_e::<E>(&rm), (Const::<C>,));
    bn.running_var = dev.tensor_from_vec(to_e::<E>(&rv), (Const::<C>,));
    bn.scale = dev.tensor_from_vec(to_e::<E>(&sc), (Const::<C>,));
    bn.bias = dev.tensor_from_vec(to_e::<E>(&bi), (Const::<C>,));
    let xt = dev.tensor_from_vec(to_e::<E>(&x), (b, Const::<C>, h, w));
    let y = bn.forward(xt.clone());
    let got = to_f64(&y.as_vec());

    let shape = *xt.shape();
    let eps = E::from_f64(1e-5).unwrap();
    let a = bn.scale.clone() / (bn.running_var.clone() + eps).sqrt();
    let composed = (xt
        - bn.running_mean
            .clone()
            .broadcast_like::<_, Axes3<0, 2, 3>>(&shape))
        * a.broadcast_like::<_, Axes3<0, 2, 3>>(&shape)
        + bn.bias.clone().broadcast_like::<_, Axes3<0, 2, 3>>(&shape);
    if E::STORE == 0.0 {
        assert_eq!(y.as_vec(), composed.as_vec(), "FP32 inference: bit for bit");
    }
    let (mut want, mut bound) = (vec![], vec![]);
    for (i, xv) in x.iter().enumerate() {
        let c = (i / (h * w)) % C;
        let a = sc[c] / (rv[c] + 1e-5).sqrt();
        let v = (xv - rm[c]) * a + bi[c];
        want.push(v);
        let e = 6.0 * U * ((xv - rm[c]).abs() * a.abs() + bi[c].abs());
        bound.push(store_bound::<E>(e, v));
    }
    let worst = check(
        &format!("{} batch norm inference", E::NAME),
        &got,
        &want,
        &bound,
    );
    println!(
        "{} batch norm (inference): worst error / bound {worst:.3}",
        E::NAME
    );
}

#[test]
fn batchnorm_inference_matches_the_reference() {
    bn_eval::<f32>();
    bn_eval::<f16>();
}

// ---------------------------------------------------------------------------------------------
// Broadcast arithmetic: the convolution's bias add, and strided operands.

/// `y = x + bias` broadcast over `(batch, C, h, w)`: each sum is one rounding, so the forward
/// and the input gradient (`dy` itself) are exact, and equal bit for bit to the element type's
/// own scalar addition; the bias gradient sums `batch·h·w` values (in 8 lanes).
fn bias_case<E: El>(batch: usize, chan: usize, h: usize, w: usize, rng: &mut Rng) -> f64
where
    Cpu: Device<E> + ConvDevice<E>,
{
    let dev = Cpu::default();
    let n = batch * chan * h * w;
    let x = to_e::<E>(&rng.vec::<E>(n, -4.0, 4.0));
    let b = to_e::<E>(&rng.vec::<E>(chan, -1.0, 1.0));
    let gy = rng.vec::<E>(n, -1.0, 1.0);
    let xt = dev.tensor_from_vec(x.clone(), (batch, chan, h, w));
    let bt = dev.tensor_from_vec(b.clone(), (chan,));
    let shape = *xt.shape();
    let y = xt.leaky_trace() + bt.leaky_trace().broadcast_like::<_, Axes3<0, 2, 3>>(&shape);
    let want: Vec<E> = x
        .iter()
        .enumerate()
        .map(|(i, v)| *v + b[(i / (h * w)) % chan])
        .collect();
    assert_eq!(y.retaped::<NoneTape>().as_vec(), want, "bias add forward");
    let grads = (y * dev.tensor_from_vec(to_e::<E>(&gy), shape))
        .sum()
        .backward();
    assert_eq!(
        to_f64(&grads.get(&xt).as_vec()),
        gy,
        "bias add: input gradient"
    );
    let mut db = vec![0.0; chan];
    let mut db_abs = vec![0.0; chan];
    for (i, g) in gy.iter().enumerate() {
        db[(i / (h * w)) % chan] += g;
        db_abs[(i / (h * w)) % chan] += g.abs();
    }
    let bound: Vec<f64> = db_abs
        .iter()
        .map(|a| sum_bound::<E>(batch * h * w, *a))
        .collect();
    check(
        &format!(
            "{} bias add ({batch}, {chan}, {h}, {w}): bias gradient",
            E::NAME
        ),
        &to_f64(&grads.get(&bt).as_vec()),
        &db,
        &bound,
    )
}

/// `z = xᵀ · b` with `x` permuted (strided) and `b` broadcast along a middle axis; forward and
/// `dx = dz · b` are single roundings (exact as scalar operations), `db` sums 4·6 products.
fn strided_case<E: El>(rng: &mut Rng) -> f64
where
    Cpu: Device<E> + ConvDevice<E>,
{
    let dev = Cpu::default();
    let x = rng.vec::<E>(5 * 4 * 6, -2.0, 2.0);
    let b = rng.vec::<E>(5, -2.0, 2.0);
    let gz = rng.vec::<E>(4 * 5 * 6, -1.0, 1.0);
    let xt: Tensor<Rank3<5, 4, 6>, E, Cpu> = dev.tensor_from_vec(to_e::<E>(&x), Default::default());
    let bt: Tensor<Rank1<5>, E, Cpu> = dev.tensor_from_vec(to_e::<E>(&b), Default::default());
    let xp = xt.leaky_trace().permute::<Rank3<4, 5, 6>, _>();
    let z = xp * bt.leaky_trace().broadcast::<Rank3<4, 5, 6>, _>();
    let (xe, be) = (to_e::<E>(&x), to_e::<E>(&b));
    // z[i][j][k] = x[j][i][k] · b[j]
    let mut want = vec![];
    for i in 0..4 {
        for j in 0..5 {
            for k in 0..6 {
                want.push(xe[(j * 4 + i) * 6 + k] * be[j]);
            }
        }
    }
    assert_eq!(
        z.retaped::<NoneTape>().as_vec(),
        want,
        "strided mul forward"
    );
    let gzt: Tensor<Rank3<4, 5, 6>, E, Cpu> =
        dev.tensor_from_vec(to_e::<E>(&gz), Default::default());
    let grads = (z * gzt).sum().backward();
    let mut dx_want = vec![E::default(); 5 * 4 * 6];
    let mut db = [0.0; 5];
    let mut db_abs = [0.0; 5];
    let gze = to_e::<E>(&gz);
    for i in 0..4 {
        for j in 0..5 {
            for k in 0..6 {
                let zi = (i * 5 + j) * 6 + k;
                let xi = (j * 4 + i) * 6 + k;
                dx_want[xi] = gze[zi] * be[j];
                db[j] += gz[zi] * x[xi];
                db_abs[j] += (gz[zi] * x[xi]).abs();
            }
        }
    }
    if E::STORE == 0.0 {
        assert_eq!(grads.get(&xt).as_vec(), dx_want, "strided mul: dx");
    } else {
        // FP16: dx = fl(0 + dz·b), the product exact in f32 and rounded once: equal to the
        // scalar FP16 product.
        assert_eq!(grads.get(&xt).as_vec(), dx_want, "strided mul: dx (FP16)");
    }
    let bound: Vec<f64> = db_abs.iter().map(|a| sum_bound::<E>(24, *a)).collect();
    check(
        &format!("{} strided mul: broadcast gradient", E::NAME),
        &to_f64(&grads.get(&bt).as_vec()),
        &db,
        &bound,
    )
}

fn broadcast_all<E: El>()
where
    Cpu: Device<E> + ConvDevice<E>,
{
    let mut rng = Rng(5);
    let mut worst: f64 = 0.0;
    for &(b, c, h, w) in &[(1, 1, 7, 9), (3, 3, 7, 9), (3, 16, 5, 5), (2, 16, 28, 28)] {
        worst = worst.max(bias_case::<E>(b, c, h, w, &mut rng));
    }
    worst = worst.max(strided_case::<E>(&mut rng));
    println!(
        "{} broadcast add/mul: forward and elementwise gradients exact; worst broadcast-gradient error / bound {worst:.3}",
        E::NAME
    );
}

#[test]
fn broadcast_arithmetic_is_exact_where_it_rounds_once_fp32() {
    broadcast_all::<f32>();
}

#[test]
fn broadcast_arithmetic_is_exact_where_it_rounds_once_fp16() {
    broadcast_all::<f16>();
}
