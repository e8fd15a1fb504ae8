//! The optimizer step on unscaled gradients: update the master weights and refresh the working
//! copy, or skip on inf/NaN.

use std::marker::PhantomData;

use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::master::TrainTarget;
use crate::optim::MasterOptimizer;
use crate::scaler::StepVerdict;

use super::kind::{ScaleFree, StepKind};
use super::outcome::StepOutcome;
use super::unscaled::UnscaledGrads;

impl<'t, T: TrainTarget<D>, D: AmpDevice, K: StepKind> UnscaledGrads<'t, T, D, K> {
    /// Updates the master weights with `optimizer` and refreshes the working copy, unless a
    /// gradient was inf or NaN, in which case master weights and optimizer state are left
    /// exactly as they were, and the working copy's buffers (batch norm running statistics) are
    /// put back as they were after the last step taken ([`TrainTarget::reload_working`]).
    pub(crate) fn take_step<O>(self, optimizer: &mut O) -> Result<StepOutcome<D, K>, AmpError>
    where
        O: MasterOptimizer<T::Master, D>,
    {
        let UnscaledGrads {
            target,
            master,
            working,
            found_inf,
            non_finite,
            layers,
            scalers,
            ..
        } = self;
        let _timing =
            typed_amp_kernels::timing::scope(typed_amp_kernels::timing::Kind::OptimizerRefresh);
        if found_inf {
            // The forward that produced these gradients also moved the working copy's batch
            // norm statistics (by a NaN batch, perhaps); the master still holds the last good ones.
            target.reload_working()?;
        } else {
            target.update_with(optimizer, &master)?;
        }
        // The step's amaxes enter the FP8 recipe's histories (a skipped step's too: only its
        // finite ones were recorded), so that the next step's scales come from them; under
        // data parallelism `DataParallel::all_reduce` reduced them across ranks first.
        target
            .working()
            .fp8_scaling()
            .commit(target.is_data_parallel())?;
        let mut grads = target.recycle(master, working)?;
        // Zeroed for the next iteration: no backward pass has written them yet.
        grads.scaled_at = None;
        // Each scaler whose loss the step held writes it down until the outcome reaches its
        // update: an outcome dropped or forgotten is found at that model's next backward.
        let model = target.id().key();
        let verdicts = scalers
            .into_iter()
            .map(|(tag, found_inf)| StepVerdict {
                scaler: tag.id,
                step: tag.ledger.record_step(model),
                found_inf,
            })
            .collect();
        Ok(StepOutcome {
            only_a_step_makes_outcomes: PhantomData,
            found_inf,
            non_finite_params: non_finite,
            overflow: crate::watch::overflowing_layer(&layers),
            layers,
            verdicts,
            grads,
        })
    }
}

impl<'t, T: TrainTarget<D>, D: AmpDevice> UnscaledGrads<'t, T, D, ScaleFree> {
    /// Updates the master weights with `optimizer` and refreshes the working copy, unless a
    /// gradient was inf or NaN, in which case master weights and optimizer state are left
    /// exactly as they were, and the working copy's buffers (batch norm running statistics) are
    /// put back as they were after the last step taken ([`TrainTarget::reload_working`]). There is no scaler to update: the outcome gives the next
    /// iteration's gradients ([`StepOutcome::into_grads`]).
    pub fn step<O>(self, optimizer: &mut O) -> Result<StepOutcome<D, ScaleFree>, AmpError>
    where
        O: MasterOptimizer<T::Master, D>,
    {
        self.take_step(optimizer)
    }
}
