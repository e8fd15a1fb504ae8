//! [`TrainTarget`]: what the typed training step trains.

use super::optimizer::MasterOptimizer;
use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::params::{ParamInfo, Parameters};
use crate::precision::Precision;
use crate::tape::{MixedGradients, TargetId};

use super::working_copy::WorkingCopy;

/// The seal of [`TrainTarget`]: a trait public in a private module, which no other crate can
/// name or implement.
pub(crate) mod sealed {
    /// Only the library's training targets implement [`TrainTarget`](super::TrainTarget).
    pub trait Sealed {}
}

/// Something the typed training step can train: it holds the master module the optimizer
/// updates (FP32, except for O3), turns the working gradients into master gradients, and
/// refreshes its working copy after an update.
///
/// Sealed: implemented by [`MasterWeights`](crate::master::MasterWeights) and
/// [`SinglePrecision`](crate::master::SinglePrecision) (`Fp32Weights`, `Fp16Weights`, `Bf16Weights`)
/// only, whose precision and pairing the step's rules rely on. (Its hidden methods stay
/// callable: they reach nothing [`TrainTarget::master_mut`] does not already give.)
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no FP32 master weights for an optimizer to update",
    label = "not a `MasterWeights` or `Fp32Weights`",
    note = "optimizers update FP32 master weights only: wrap a 16-bit model as `MasterWeights::build::<Arch>(&dev)` (or `MasterWeights::from_parts`), and an FP32 model as `Fp32Weights::new(model, &dev)`"
)]
pub trait TrainTarget<D: AmpDevice>: sealed::Sealed {
    /// The module the optimizer updates: FP32, except for O3's 16-bit models
    /// ([`Fp16Weights`](crate::master::Fp16Weights)).
    type Master: Parameters<D>;

    /// The module forward and backward run on.
    type Working: Parameters<D>;

    /// The narrowest precision of the working copy's parameters: [`F16`](crate::precision::F16) needs a
    /// loss scaler, [`BF16`](crate::precision::BF16) and [`F32`](crate::precision::F32) do not (rule
    /// [`FullRange`](crate::precision::FullRange)).
    type Precision: Precision;

    /// The master module.
    fn master(&self) -> &Self::Master;

    /// The master module, mutably (for the optimizer).
    fn master_mut(&mut self) -> &mut Self::Master;

    /// The working module, which runs forward passes but which no optimizer updates
    /// ([`WorkingCopy`]).
    fn working(&self) -> &WorkingCopy<Self::Working>;

    /// The working module, mutably: for training forwards that update buffers (`forward_mut`
    /// of batch norm). Still a [`WorkingCopy`].
    fn working_mut(&mut self) -> &mut WorkingCopy<Self::Working>;

    /// This target's identity: the gradients it allocates carry it, and unscaling gradients of
    /// another target is refused.
    fn id(&self) -> TargetId;

    /// Zeroed gradients for the working module's parameters, each in its own precision, marked
    /// as this target's.
    fn alloc_grads(&self) -> Result<MixedGradients<D>, AmpError> {
        let mut grads = MixedGradients::for_params(self.working())?;
        grads.owner = Some(self.id());
        Ok(grads)
    }

    /// Every parameter of the master module, in visiting order.
    fn layout(&self) -> &[ParamInfo];

    /// Writes `working / scale` into master gradients and flags non-finite values per
    /// parameter. Returns the master gradients and, per trainable parameter in
    /// [`TrainTarget::layout`] order, whether it held inf or NaN (before or after the
    /// division).
    #[doc(hidden)]
    fn unscale_into_master(
        &mut self,
        working: &mut MixedGradients<D>,
        inv_scale: f32,
    ) -> Result<(MixedGradients<D>, Vec<bool>), AmpError>;

    /// Takes back master gradients after a step, and readies the working gradients for the
    /// next iteration.
    #[doc(hidden)]
    fn recycle(
        &mut self,
        master_grads: MixedGradients<D>,
        working: MixedGradients<D>,
    ) -> Result<MixedGradients<D>, AmpError>;

    /// Applies `optimizer` to the master with `grads` and refreshes the working copy. A
    /// target with a separate working copy does both in one pass where the optimizer and the
    /// device can ([`MasterOptimizer::try_update_paired`]).
    #[doc(hidden)]
    fn update_with<O: MasterOptimizer<Self::Master, D>>(
        &mut self,
        optimizer: &mut O,
        grads: &MixedGradients<D>,
    ) -> Result<(), AmpError> {
        optimizer.try_update(self.master_mut(), grads)?;
        self.refresh()
    }

    /// Marks this target as trained across ranks: a data-parallel run made it rank 0's
    /// (`DataParallel::broadcast_master`, `StepProtocol::sync_model`). From then on it is stepped
    /// only through the data-parallel step, which averages its gradients across ranks.
    #[doc(hidden)]
    fn mark_data_parallel(&mut self);

    /// Whether this target trains across ranks ([`TrainTarget::mark_data_parallel`]).
    #[doc(hidden)]
    fn is_data_parallel(&self) -> bool;

    /// Copies the updated master weights into the working copy (and the working copy's buffers,
    /// such as batch norm running statistics, back into the master).
    fn refresh(&mut self) -> Result<(), AmpError>;

    /// Copies the working copy's buffers (batch norm running statistics, updated by training
    /// forwards) into the master, so that the master is complete, e.g. before a checkpoint.
    fn sync_buffers_to_master(&mut self) -> Result<(), AmpError>;

    /// Sets the whole working copy, buffers included, from the master: after the master was
    /// loaded from a checkpoint, and after a skipped step, when the master still holds the
    /// working copy as of the last step taken. So a batch whose gradients were inf or NaN leaves
    /// no trace in batch norm's running statistics (PyTorch keeps it), and a non-finite value
    /// written into a working weight between steps costs one skipped step instead of every
    /// later one. A model that is its own master ([`SinglePrecision`](crate::master::SinglePrecision))
    /// has no earlier copy.
    fn reload_working(&mut self) -> Result<(), AmpError>;
}
