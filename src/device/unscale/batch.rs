//! Unscaling a parameter set's gradients in as few launches as possible (Apex's
//! `multi_tensor_apply`): a walk over the parameters queues each gradient's unscale and check,
//! and one flush runs them all. CUDA runs one kernel per pair of precisions over a table of the
//! tensors (and one memset of the flags); the CPU runs each unscale as it is queued.

use dfdx::prelude::Storage;

use crate::device::utilities::StatsDevice;

/// Queued unscales ([`UnscaleKernel::try_queue_unscale_in_place`](super::UnscaleKernel::try_queue_unscale_in_place),
/// [`UnscaleKernel::try_queue_unscale_to_f32`](super::UnscaleKernel::try_queue_unscale_to_f32): each the unqueued op's arithmetic and check, one
/// flag per tensor), run together by [`UnscaleBatchKernel::try_flush_unscale`].
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait UnscaleBatchKernel: StatsDevice + Storage<f32> {
    /// The unscales queued and not yet run, with the buffers they read kept alive.
    type Batch: Default;

    /// Runs every unscale `batch` queued (each flag reset first), in stream order before
    /// anything queued after it.
    fn try_flush_unscale(
        &self,
        batch: Self::Batch,
        stats: &mut Self::Stats,
    ) -> Result<(), Self::Err>;
}

/// The CPU runs each unscale as it is queued (each is parallel on its own): nothing is left to
/// flush.
impl UnscaleBatchKernel for dfdx::prelude::Cpu {
    type Batch = ();

    fn try_flush_unscale(&self, (): (), _: &mut Vec<f32>) -> Result<(), Self::Err> {
        Ok(())
    }
}
