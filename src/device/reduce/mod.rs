//! Per-tensor reductions into a stats slot: the sum of squares (for the global gradient norm of
//! clipping) and the largest magnitude (for layer probes).

mod cpu_kernel;
#[cfg(feature = "cuda")]
mod cuda_kernel;

use dfdx::prelude::Storage;

use crate::device::utilities::StatsDevice;
use crate::precision::AmpElem;

/// Reductions of a buffer of element type `E`, accumulated in FP32, written to one slot of a
/// stats buffer (which stays on the device).
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait ReduceKernel<E: AmpElem>: Storage<E> + StatsDevice {
    /// `stats[slot] = Σ x²` (inf or NaN if any element is).
    fn try_sum_squares(
        &self,
        buf: &Self::Vec,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), Self::Err>;

    /// `stats[slot] = max |x|` (NaN if any element is).
    fn try_max_abs(
        &self,
        buf: &Self::Vec,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), Self::Err>;
}
