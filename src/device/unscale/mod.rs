//! Dividing gradients by the loss scale, fused with the check for overflow (inf, NaN, or a
//! magnitude above [`GRADIENT_LIMIT`]): one pass over each gradient, and one flag per tensor
//! kept on the device until the step reads them all back at once.

mod batch;
mod cpu_kernel;
#[cfg(feature = "cuda")]
mod cuda_kernel;

pub use batch::UnscaleBatchKernel;

use dfdx::prelude::Storage;

use crate::device::utilities::StatsDevice;
use crate::precision::AmpElem;

/// The largest gradient magnitude a step takes: 2^62. A larger gradient (or inf, or NaN) is an
/// overflow, and its step is skipped like that of an inf gradient.
///
/// A finite FP32 gradient can still overflow what the optimizer computes from it: Adam's
/// second moment and a gradient norm hold its square, which is inf above 2^64 (≈1.8e19). Below
/// 2^62 a square is at most 2^124, and Adam's second moment (a weighted average of squares)
/// stays a factor of 16 below FP32's largest value (≈2^128), rounding included: every state a
/// step writes is finite, so every checkpoint a run saves loads again.
pub const GRADIENT_LIMIT: f32 = 4_611_686_018_427_387_904.0; // 2^62

/// The bits of [`GRADIENT_LIMIT`]: a magnitude's bits above these are a larger value, inf or
/// NaN (the order of non-negative FP32 bit patterns is the order of their values).
pub(crate) const GRADIENT_LIMIT_BITS: u32 = 0x5e80_0000;

/// Unscaling gradients of element type `E`, computed in FP32.
///
/// The check looks at the result, after the division: that is what the optimizer would
/// receive, so a scale whose reciprocal overflows (below 2^-126, where `1/scale` is inf in
/// FP32) turns a zero gradient into NaN, which is caught, rather than letting it through.
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait UnscaleKernel<E: AmpElem>:
    Storage<E> + Storage<f32> + StatsDevice + UnscaleBatchKernel
{
    /// `dst = src * inv_scale` into an FP32 buffer of the same length, and `stats[slot] = 1.0`
    /// if any element of `src` or of the result is inf or NaN, or of the result larger than
    /// [`GRADIENT_LIMIT`] in magnitude (else `0.0`).
    fn try_unscale_to_f32(
        &self,
        src: &<Self as Storage<E>>::Vec,
        dst: &mut <Self as Storage<f32>>::Vec,
        inv_scale: f32,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), Self::Err>;

    /// `buf *= inv_scale` in place, with the same overflow flag as
    /// [`UnscaleKernel::try_unscale_to_f32`].
    fn try_unscale_in_place(
        &self,
        buf: &mut <Self as Storage<E>>::Vec,
        inv_scale: f32,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), Self::Err>;

    /// Queues [`UnscaleKernel::try_unscale_in_place`] of `buf` by `inv_scale` into `batch`,
    /// its flag in `stats[slot]`, for [`UnscaleBatchKernel::try_flush_unscale`] to run (or runs
    /// it now, where the device does not batch).
    ///
    /// # Safety
    /// `buf` must stay where it is, neither dropped, moved out of its owner nor written, and
    /// `stats` too, until the batch is flushed: the device may read and write them only then.
    unsafe fn try_queue_unscale_in_place(
        &self,
        batch: &mut <Self as UnscaleBatchKernel>::Batch,
        buf: &mut <Self as Storage<E>>::Vec,
        inv_scale: f32,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), Self::Err>;

    /// Queues [`UnscaleKernel::try_unscale_to_f32`] of `src` (which the batch keeps until it
    /// runs) into `dst`, as [`UnscaleKernel::try_queue_unscale_in_place`].
    ///
    /// # Safety
    /// As [`UnscaleKernel::try_queue_unscale_in_place`], for `dst` and `stats`.
    unsafe fn try_queue_unscale_to_f32(
        &self,
        batch: &mut <Self as UnscaleBatchKernel>::Batch,
        src: <Self as Storage<E>>::Vec,
        dst: &mut <Self as Storage<f32>>::Vec,
        inv_scale: f32,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), Self::Err>;
}
