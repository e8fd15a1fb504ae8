//! The step protocol of one process: a [`GradScaler`] (one loss) and [`LossScalers`] (one scaler
//! per loss, their gradients summed for one step).

use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::master::TrainTarget;
use crate::optim::MasterOptimizer;
use crate::scaler::{GradScaler, LossScalers, ScalerState};
use crate::step::{scaled_backward, sealed, ForwardOutput, ScaleState, StepOptions, StepProtocol};
use crate::tape::MixedGradients;

impl sealed::Sealed for GradScaler {}

impl<D: AmpDevice> StepProtocol<D> for GradScaler {
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
        let scaled = scaled_backward(self, target, grads, options, 0, &mut forward)?;
        let mut unscaled = self.unscale(target, scaled)?;
        options.clip_grads(&mut unscaled)?;
        let outcome = self.step(optimizer, unscaled)?;
        Ok(self.update(outcome)?)
    }
}

impl ScaleState for GradScaler {
    fn state(&self) -> ScalerState {
        GradScaler::state(self)
    }

    fn load_state(&mut self, state: ScalerState) -> Result<(), AmpError> {
        GradScaler::load_state(self, state)
    }

    fn check_no_step_in_flight(&self) -> Result<(), AmpError> {
        GradScaler::check_no_step_in_flight(self)
    }

    fn get_scale(&self) -> f32 {
        GradScaler::get_scale(self)
    }

    fn growth_tracker(&self) -> u32 {
        GradScaler::growth_tracker(self)
    }

    fn skipped_steps(&self) -> u64 {
        GradScaler::skipped_steps(self)
    }
}

impl sealed::Sealed for LossScalers {}

impl<D: AmpDevice> StepProtocol<D> for LossScalers {
    fn losses(&self) -> usize {
        self.len()
    }

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
        // Each loss is traced into gradients of its own, scaled and backward by its own scaler.
        let mut scaled = Vec::with_capacity(self.len());
        let mut first = Some(grads);
        for (index, scaler) in self.iter().enumerate() {
            let grads = match first.take() {
                Some(grads) => grads,
                None => target.alloc_grads()?,
            };
            let first_index = index * options.micro_batches();
            scaled.push(scaled_backward(
                scaler,
                target,
                grads,
                options,
                first_index,
                &mut forward,
            )?);
        }
        // Unscaled into one sum, each by its own scaler; one step.
        let mut scalers = self.iter();
        let mut scaled = scaled.into_iter();
        let (Some(scaler), Some(grads)) = (scalers.next(), scaled.next()) else {
            return Err(AmpError::InvalidScalerConfig("no losses to step on".to_string()).into());
        };
        let mut total = scaler.unscale(target, grads)?;
        for (other, grads) in scalers.zip(scaled) {
            total.merge(other, grads)?;
        }
        options.clip_grads(&mut total)?;
        let outcome = scaler.step(optimizer, total)?;
        // Each scaler backs off only if its own loss overflowed.
        Ok(self.update(outcome)?)
    }
}
