//! What FP8 tensors are quantised from ([`Fp8Source`]: f32, bf16, f16) and its amax.

use half::{bf16, f16};
use typed_amp_kernels::convert;

/// An element type FP8 tensors are quantised from: `f32`, `bf16` or `f16` (widened to FP32
/// exactly before it is scaled), the kernels' quantisation sources.
#[doc(hidden)] // a bound of quantisation's element type: users pass `f32`, `bf16` or `f16`.
pub trait Fp8Source: convert::QuantizeSource {
    /// The value in FP32 (exact).
    fn to_f32(self) -> f32;
}

impl Fp8Source for f32 {
    fn to_f32(self) -> f32 {
        self
    }
}

impl Fp8Source for bf16 {
    fn to_f32(self) -> f32 {
        convert::widen_bf16(self)
    }
}

impl Fp8Source for f16 {
    fn to_f32(self) -> f32 {
        convert::widen_f16(self)
    }
}

/// The largest magnitude of `data` (NaN if it holds one; 0 for an empty slice): the kernels'
/// vectorised pass, split over threads for large tensors.
pub(crate) fn amax<T: Fp8Source>(data: &[T]) -> f32 {
    convert::amax(data)
}
