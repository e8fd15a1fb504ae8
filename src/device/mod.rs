//! The devices typed-amp trains on, and the few buffer-level kernels that mixed precision needs
//! beyond dfdx's ops: differentiable casts, the fused unscale + non-finite check, the
//! master→working refresh and the gradient-norm reductions used by clipping.
//!
//! Each kernel works on a whole gradient or parameter buffer and records per-tensor results in a
//! small [`AmpDevice::Stats`] buffer that stays on the device, so a training step reads results
//! back once rather than once per tensor.

use dfdx::prelude::Device;
use half::f16;

use crate::precision::{AnyBuf, AnyBufMut};

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;

mod sealed {
    pub trait Sealed {}
    impl Sealed for dfdx::prelude::Cpu {}
    #[cfg(feature = "cuda")]
    impl Sealed for dfdx::prelude::Cuda {}
}

/// A dfdx device that can run both precisions and typed-amp's bookkeeping kernels.
///
/// Implemented for [`dfdx::prelude::Cpu`] and, with the `cuda` feature, for
/// `dfdx::prelude::Cuda`, whose kernels run on dfdx's own stream and keep [`AmpDevice::Stats`]
/// in GPU memory until [`AmpDevice::try_read_stats`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a device typed-amp can train on",
    note = "train on `dfdx::prelude::Cpu`, or on `dfdx::prelude::Cuda` with typed-amp's `cuda` feature"
)]
pub trait AmpDevice:
    Device<f32>
    + Device<f16>
    + dfdx::tensor_ops::ConvDevice<f32>
    + dfdx::tensor_ops::ConvDevice<f16>
    + sealed::Sealed
{
    /// One `f32` per tensor, kept on the device: non-finite flags or sums of squares.
    type Stats: 'static;

    /// Allocates a stats buffer of `slots` zeros.
    fn try_alloc_stats(&self, slots: usize) -> Result<Self::Stats, Self::Err>;

    /// Reads a stats buffer back to the host (the one device→host transfer of a step).
    fn try_read_stats(&self, stats: &Self::Stats) -> Result<Vec<f32>, Self::Err>;

    /// Copies a buffer of either precision to the host, as FP32.
    fn try_read_f32(&self, buf: AnyBuf<'_, Self>) -> Result<Vec<f32>, Self::Err>;

    /// Overwrites a buffer of either precision with host values (converted to its precision).
    /// `values` has the buffer's length.
    fn try_write_f32(&self, buf: AnyBufMut<'_, Self>, values: &[f32]) -> Result<(), Self::Err>;

    /// Sets every element of a buffer of either precision to `value` (rounded to the buffer's
    /// precision).
    fn try_fill(&self, buf: AnyBufMut<'_, Self>, value: f32) -> Result<(), Self::Err>;

    /// `dst += convert(src)`, converting between precisions (FP32→FP16 rounds and overflows to
    /// ±inf as a hardware conversion does). Both buffers have the same length.
    fn try_add_cast(
        &self,
        src: AnyBuf<'_, Self>,
        dst: AnyBufMut<'_, Self>,
    ) -> Result<(), Self::Err>;

    /// `dst = convert(src)`, in place in `dst`. Both buffers have the same length.
    fn try_copy_cast(
        &self,
        src: AnyBuf<'_, Self>,
        dst: AnyBufMut<'_, Self>,
    ) -> Result<(), Self::Err>;

    /// `dst = src * inv_scale` computed in FP32 and stored in `dst`'s precision, and
    /// `stats[slot] = 1.0` if any element of `src` is inf or NaN (else `0.0`). Both buffers have
    /// the same length.
    fn try_unscale(
        &self,
        src: AnyBuf<'_, Self>,
        dst: AnyBufMut<'_, Self>,
        inv_scale: f32,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), Self::Err>;

    /// `buf *= inv_scale` in place, with the same non-finite flag as [`AmpDevice::try_unscale`].
    fn try_unscale_in_place(
        &self,
        buf: AnyBufMut<'_, Self>,
        inv_scale: f32,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), Self::Err>;

    /// `stats[slot] = Σ x²`, accumulated in FP32 (inf or NaN if any element is).
    fn try_sum_squares(
        &self,
        buf: AnyBuf<'_, Self>,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), Self::Err>;

    /// `stats[slot] = max |x|` (NaN if any element is).
    fn try_max_abs(
        &self,
        buf: AnyBuf<'_, Self>,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), Self::Err>;

    /// `buf *= factor` in place.
    fn try_scale(&self, buf: AnyBufMut<'_, Self>, factor: f32) -> Result<(), Self::Err>;

    /// Clamps every element of `buf` to `[-limit, limit]` in place (NaN stays NaN).
    fn try_clamp(&self, buf: AnyBufMut<'_, Self>, limit: f32) -> Result<(), Self::Err>;
}
