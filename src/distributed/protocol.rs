//! The step protocol across ranks: [`DataParallel`]'s stages (scale, backward, unscale,
//! all-reduce, step, update) as one [`StepProtocol`] iteration.

use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::master::TrainTarget;
use crate::optim::MasterOptimizer;
use crate::scaler::ScalerState;
use crate::step::{scaled_backward, sealed, ForwardOutput, ScaleState, StepOptions, StepProtocol};
use crate::tape::MixedGradients;

use super::collective::{AllReduce, Collective};
use super::data_parallel::DataParallel;
use super::digest::scaler_digest;

impl<C> sealed::Sealed for DataParallel<C> {}

impl<D: AmpDevice, C: AllReduce<D>> StepProtocol<D> for DataParallel<C> {
    fn train_step_with<T, O, R, F>(
        &mut self,
        target: &mut T,
        optimizer: &mut O,
        grads: MixedGradients<D>,
        options: &StepOptions,
        mut forward: F,
    ) -> Result<MixedGradients<D>, R::Error>
    where
        T: TrainTarget<D>,
        O: MasterOptimizer<T::Master, D>,
        R: ForwardOutput<D>,
        F: FnMut(&mut T, usize, MixedGradients<D>) -> R,
    {
        options.check()?;
        let scaled = scaled_backward(&self.scaler, target, grads, options, 0, &mut forward)?;
        let local = self.unscale(target, scaled)?;
        let mut averaged = self.all_reduce(local)?;
        options.clip_grads(&mut averaged)?;
        let outcome = self.step(optimizer, averaged)?;
        Ok(self.update(outcome)?)
    }

    fn sync_model<T: TrainTarget<D>>(&self, target: &mut T) -> Result<(), AmpError> {
        self.broadcast_master(target)
    }

    fn sync_buffers<T: TrainTarget<D>>(&self, target: &mut T) -> Result<(), AmpError> {
        DataParallel::sync_buffers(self, target)
    }

    fn check_in_sync<T: TrainTarget<D>>(&self, target: &T) -> Result<(), AmpError> {
        DataParallel::check_in_sync(self, target)
    }
}

/// The scale state of the one scaler every rank keeps alike. The scaler itself stays inside
/// the `DataParallel`: its own typed step would take gradients never reduced across ranks.
impl<C: Collective> ScaleState for DataParallel<C> {
    const DATA_PARALLEL: bool = true;

    fn state(&self) -> ScalerState {
        self.scaler.state()
    }

    /// Collective: every rank must load the same state (checked: [`AmpError::RanksDiverged`]).
    fn load_state(&mut self, state: ScalerState) -> Result<(), AmpError> {
        self.scaler.load_state(state)?;
        self.check_same(&scaler_digest(&self.scaler.state()), "loss-scaler state")
    }

    fn check_no_step_in_flight(&self) -> Result<(), AmpError> {
        self.scaler.check_no_step_in_flight()
    }
}
