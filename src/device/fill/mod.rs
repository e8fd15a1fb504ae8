//! Filling, scaling and clamping a buffer in place: zeroing gradients, clipping by norm and by
//! value.

mod cpu_kernel;
#[cfg(feature = "cuda")]
mod cuda_kernel;

use dfdx::prelude::Storage;

use crate::precision::AmpElem;

/// In-place elementwise kernels on a buffer of element type `E`, computed in FP32 and stored
/// in `E` (rounded to nearest-even).
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait FillKernel<E: AmpElem>: Storage<E> {
    /// Sets every element to `value` (rounded to `E`).
    fn try_fill(&self, buf: &mut Self::Vec, value: f32) -> Result<(), Self::Err>;

    /// `buf *= factor`.
    fn try_scale(&self, buf: &mut Self::Vec, factor: f32) -> Result<(), Self::Err>;

    /// Clamps every element to `[-limit, limit]` (NaN stays NaN).
    fn try_clamp(&self, buf: &mut Self::Vec, limit: f32) -> Result<(), Self::Err>;
}
