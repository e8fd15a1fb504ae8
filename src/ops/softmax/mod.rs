//! Softmax and log-softmax in FP32 only: the policy table's `Fp32Op` row as a type rule.
//!
//! A softmax sums exponentials along a row. In FP16 that sum overflows long before any single
//! term does (1,000 logits of 11: each `e^11 ≈ 59,874` fits FP16, whose largest value is 65,504,
//! their sum does not), and in FP16 or BF16 it loses the small terms next to a large one. So
//! [`softmax`] and [`log_softmax`] take FP32 only (rule [`SoftmaxPrecision`]); a 16-bit input is
//! a compile error that names the rule and the fix, `.to_f32()`:
//!
//! ```rust
//! # use typed_amp::prelude::*;
//! let dev = Cpu::default();
//! let scores: Tensor<Rank2<1, 1000>, f16, _> = dev.ones();
//! let scores = scores * 11.0;
//! let probs = softmax(scores.clone().to_f32()); // FP32; `.to_f16()` after, if the next op is 16-bit
//! assert!((probs.as_vec()[0] - 1e-3).abs() < 1e-9);
//! // The same row's sum of exponentials in FP16:
//! assert!(scores.exp().sum::<Rank1<1>, _>().as_vec()[0].is_infinite());
//! ```
//!
//! ```compile_fail
//! # use typed_amp::prelude::*;
//! let dev = Cpu::default();
//! let scores: Tensor<Rank2<2, 3>, f16, _> = dev.zeros();
//! let probs = softmax(scores); // softmax is computed in FP32, but these values are `F16`
//! ```
//!
//! dfdx's own tensor methods (`t.softmax::<Axis<1>>()`, `t.log_softmax::<_>()`), its
//! `Softmax`/`LogSoftmax` modules and its cross-entropy and KL losses carry the same rule
//! (typed-amp's fork: `dfdx::tensor_ops::SoftmaxDtype`, f32 and f64 only), with the same
//! message. O3's deliberate 16-bit softmax names dfdx's 16-bit form
//! (`t.softmax_16bit::<Axis<1>>()`, `log_softmax_16bit`): an `#[amp]` model's
//! `Softmax`/`LogSoftmax` layers and typed-amp's attention ([`crate::nn`]) run the row by the
//! policy table, FP32 except under O3.
//!
//! ```compile_fail
//! # use typed_amp::prelude::*;
//! let dev = Cpu::default();
//! let scores: Tensor<Rank2<2, 3>, f16, _> = dev.zeros();
//! let probs = scores.softmax::<Axis<1>>(); // dfdx's method: the same rule
//! ```

use dfdx::prelude::{Device, ReduceShape, Shape, Tape, Tensor};

use crate::precision::{AmpElem, Precision, F32};

/// The precisions softmax and log-softmax are computed in: FP32 only.
#[diagnostic::on_unimplemented(
    message = "softmax and log-softmax are computed in FP32, but these values are `{Self}`",
    label = "a softmax over {Self} values",
    note = "cast the scores with `.to_f32()` first (and back with `.to_f16()`/`.to_bf16()` after, if the next op is 16-bit): a 16-bit sum of exponentials overflows FP16 (1,000 terms of e^11 exceed 65,504) or loses the small terms"
)]
pub trait SoftmaxPrecision: Precision {
    /// Views a tensor of this precision as an FP32 tensor (the identity: only FP32 qualifies).
    fn into_f32<S: Shape, D: Device<Self::Elem> + Device<f32>, T>(
        t: Tensor<S, Self::Elem, D, T>,
    ) -> Tensor<S, f32, D, T>;
}

impl SoftmaxPrecision for F32 {
    fn into_f32<S: Shape, D: Device<f32>, T>(t: Tensor<S, f32, D, T>) -> Tensor<S, f32, D, T> {
        t
    }
}

/// Softmax along the last axis, in FP32 (rule [`SoftmaxPrecision`]).
pub fn softmax<S, E, D, T>(t: Tensor<S, E, D, T>) -> Tensor<S, f32, D, T>
where
    S: Shape + ReduceShape<S::LastAxis>,
    E: AmpElem,
    E::Precision: SoftmaxPrecision,
    D: Device<E> + Device<f32>,
    T: Tape<f32, D>,
{
    try_softmax(t).unwrap()
}

/// Fallible [`softmax`].
pub fn try_softmax<S, E, D, T>(t: Tensor<S, E, D, T>) -> Result<Tensor<S, f32, D, T>, D::Err>
where
    S: Shape + ReduceShape<S::LastAxis>,
    E: AmpElem,
    E::Precision: SoftmaxPrecision,
    D: Device<E> + Device<f32>,
    T: Tape<f32, D>,
{
    <E::Precision as SoftmaxPrecision>::into_f32(t).try_softmax::<S::LastAxis>()
}

/// Log-softmax along the last axis, in FP32 (rule [`SoftmaxPrecision`]).
pub fn log_softmax<S, E, D, T>(t: Tensor<S, E, D, T>) -> Tensor<S, f32, D, T>
where
    S: Shape + ReduceShape<S::LastAxis>,
    E: AmpElem,
    E::Precision: SoftmaxPrecision,
    D: Device<E> + Device<f32>,
    T: Tape<f32, D>,
{
    try_log_softmax(t).unwrap()
}

/// Fallible [`log_softmax`].
pub fn try_log_softmax<S, E, D, T>(t: Tensor<S, E, D, T>) -> Result<Tensor<S, f32, D, T>, D::Err>
where
    S: Shape + ReduceShape<S::LastAxis>,
    E: AmpElem,
    E::Precision: SoftmaxPrecision,
    D: Device<E> + Device<f32>,
    T: Tape<f32, D>,
{
    <E::Precision as SoftmaxPrecision>::into_f32(t).try_log_softmax::<S::LastAxis>()
}

#[cfg(test)]
mod tests;
