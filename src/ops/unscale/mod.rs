//! Dividing gradients by the loss scale, fused with the check for inf and NaN: one pass over
//! each gradient, and one flag per tensor kept on the device until the step reads them all back
//! at once.

mod cpu_kernel;
#[cfg(feature = "cuda")]
mod cuda_kernel;

use dfdx::prelude::Storage;

use crate::ops::utilities::StatsDevice;
use crate::precision::AmpElem;

/// Unscaling gradients of element type `E`, computed in FP32.
///
/// The check looks at the result, after the division: that is what the optimizer would
/// receive, so a scale whose reciprocal overflows (below 2^-126, where `1/scale` is inf in
/// FP32) turns a zero gradient into NaN, which is caught, rather than letting it through.
pub trait UnscaleKernel<E: AmpElem>: Storage<E> + Storage<f32> + StatsDevice {
    /// `dst = src * inv_scale` into an FP32 buffer of the same length, and `stats[slot] = 1.0`
    /// if any element of `src` or of the result is inf or NaN (else `0.0`).
    fn try_unscale_to_f32(
        &self,
        src: &<Self as Storage<E>>::Vec,
        dst: &mut <Self as Storage<f32>>::Vec,
        inv_scale: f32,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), Self::Err>;

    /// `buf *= inv_scale` in place, with the same non-finite flag as
    /// [`UnscaleKernel::try_unscale_to_f32`].
    fn try_unscale_in_place(
        &self,
        buf: &mut <Self as Storage<E>>::Vec,
        inv_scale: f32,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), Self::Err>;
}
