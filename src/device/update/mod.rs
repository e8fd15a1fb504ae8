//! One pass for the optimizer and the refresh (Apex's fused Adam with its master → model copy):
//! each element of an FP32 master weight is updated with its optimizer state and written,
//! rounded, into the 16-bit working copy in the same loop.
//!
//! The arithmetic is dfdx's own optimizer's, operation for operation, so a fused update gives
//! the master weights and the state of the unfused one bit for bit (tested); the working copy
//! is the master rounded to nearest-even, as the separate refresh gives it. The CPU and CUDA fuse
//! it (CUDA: one thread per element, the CPU's arithmetic without contractions, so the same
//! bits); the trait's default, for a device without fused kernels, runs the two passes: dfdx's
//! update, then the refresh copy. A walk over the parameters queues each update and one flush runs
//! them ([`UpdateBatchKernel`]): CUDA in one launch per working precision.

mod cpu_kernel;
#[cfg(feature = "cuda")]
mod cuda_kernel;

use dfdx::prelude::{AdamConfig, Device, SgdConfig, Shape, Storage, Tensor};

use crate::device::CastKernel;
use crate::precision::AmpElem;

/// Queued updates ([`UpdateKernel::try_queue_adam_refresh`],
/// [`UpdateKernel::try_queue_sgd_refresh`]) run together by
/// [`UpdateBatchKernel::try_flush_update`] (Apex's `multi_tensor_apply`): CUDA runs one kernel
/// per working precision over a table of the tensors; other devices run each update as it is
/// queued.
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait UpdateBatchKernel: Device<f32> {
    /// The updates queued and not yet run.
    type Batch: Default;

    /// Runs every update `batch` queued, in stream order before anything queued after it.
    fn try_flush_update(&self, batch: Self::Batch) -> Result<(), Self::Err>;
}

/// The CPU runs each update as it is queued (each is parallel on its own).
impl UpdateBatchKernel for dfdx::prelude::Cpu {
    type Batch = ();

    fn try_flush_update(&self, (): ()) -> Result<(), Self::Err> {
        Ok(())
    }
}

/// The optimizer's update of an FP32 master tensor fused with the refresh of its working copy
/// of element type `E`.
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait UpdateKernel<E: AmpElem>: Device<f32> + CastKernel<f32, E> + UpdateBatchKernel {
    /// Adam (AdamW with decoupled weight decay) at step `t` on `param`, its moments and its
    /// unscaled gradient, then `working = round(param)`.
    #[allow(clippy::too_many_arguments)]
    fn try_adam_refresh<S: Shape>(
        &self,
        t: i32,
        cfg: &AdamConfig,
        param: &mut Tensor<S, f32, Self>,
        moment1: &mut <Self as Storage<f32>>::Vec,
        moment2: &mut <Self as Storage<f32>>::Vec,
        grad: &<Self as Storage<f32>>::Vec,
        working: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), Self::Err> {
        cfg.try_update(t, param, moment1, moment2, grad)?;
        CastKernel::<f32, E>::try_copy_cast(self, param.storage(), working)
    }

    /// SGD (with momentum and weight decay as configured) on `param`, its velocity and its
    /// unscaled gradient, then `working = round(param)`.
    fn try_sgd_refresh<S: Shape>(
        &self,
        cfg: &SgdConfig,
        param: &mut Tensor<S, f32, Self>,
        velocity: &mut <Self as Storage<f32>>::Vec,
        grad: &<Self as Storage<f32>>::Vec,
        working: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), Self::Err> {
        cfg.try_update(param, velocity, grad)?;
        CastKernel::<f32, E>::try_copy_cast(self, param.storage(), working)
    }

    /// Queues [`UpdateKernel::try_adam_refresh`] into `batch` for
    /// [`UpdateBatchKernel::try_flush_update`] to run; the default runs it now.
    ///
    /// # Safety
    /// Every buffer must stay where it is, neither dropped, moved out of its owner, read nor
    /// written by anything else, until the batch is flushed: the device may read and write
    /// them only then.
    #[allow(clippy::too_many_arguments)]
    unsafe fn try_queue_adam_refresh<S: Shape>(
        &self,
        batch: &mut <Self as UpdateBatchKernel>::Batch,
        t: i32,
        cfg: &AdamConfig,
        param: &mut Tensor<S, f32, Self>,
        moment1: &mut <Self as Storage<f32>>::Vec,
        moment2: &mut <Self as Storage<f32>>::Vec,
        grad: &<Self as Storage<f32>>::Vec,
        working: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), Self::Err> {
        let _ = batch;
        self.try_adam_refresh(t, cfg, param, moment1, moment2, grad, working)
    }

    /// Queues [`UpdateKernel::try_sgd_refresh`], as [`UpdateKernel::try_queue_adam_refresh`].
    ///
    /// # Safety
    /// As [`UpdateKernel::try_queue_adam_refresh`].
    unsafe fn try_queue_sgd_refresh<S: Shape>(
        &self,
        batch: &mut <Self as UpdateBatchKernel>::Batch,
        cfg: &SgdConfig,
        param: &mut Tensor<S, f32, Self>,
        velocity: &mut <Self as Storage<f32>>::Vec,
        grad: &<Self as Storage<f32>>::Vec,
        working: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), Self::Err> {
        let _ = batch;
        self.try_sgd_refresh(cfg, param, velocity, grad, working)
    }
}
