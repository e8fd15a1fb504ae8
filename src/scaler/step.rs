//! The scaler's step-time behaviour: a loss is scaled with the current scale, its gradients are
//! unscaled with its reciprocal and stepped, and the step's verdict (inf/NaN or not) comes back
//! to the scaler that scaled it ([`GradScaler::update`], [`LossScalers::update`]).

use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::loss::Loss;
use crate::master::TrainTarget;
use crate::optim::MasterOptimizer;
use crate::step::{
    into_master, FromScaler, Scaled, ScaledGrads, ScaledLoss, StepKind, StepOutcome, StepOutcomes,
    Unscaled, UnscaledGrads,
};

use super::grad_scaler::{inverse, GradScaler, ScalerId};

impl GradScaler {
    /// Scales a loss for backward by the current scale (1 when the scaler is disabled).
    pub fn scale<D: AmpDevice>(&self, loss: Loss<D>) -> ScaledLoss<D> {
        ScaledLoss {
            loss,
            scale: self.get_scale(),
            scaler: self.id(),
        }
    }

    /// Divides the working gradients by the scale they were made with, into master gradients of
    /// `target`, checking every gradient of every precision for inf and NaN (after the
    /// division, so that a scale whose reciprocal overflows is caught too). As in PyTorch, all
    /// gradients are unscaled even when one overflowed.
    ///
    /// Errors, before anything changes, if the gradients were scaled by another scaler or
    /// allocated by another model.
    pub fn unscale<'t, D, T, G>(
        &self,
        target: &'t mut T,
        grads: G,
    ) -> Result<UnscaledGrads<'t, T, D, FromScaler>, AmpError>
    where
        D: AmpDevice,
        T: TrainTarget<D>,
        G: Scaled<D>,
    {
        self.unscale_as(target, grads)
    }

    /// Updates the master weights with `optimizer` and refreshes the working copy, unless a
    /// gradient was inf or NaN, in which case master weights and optimizer state are left
    /// exactly as they were, and the working copy's buffers (batch norm running statistics) are
    /// put back as they were after the last step taken ([`TrainTarget::reload_working`]). Pass the outcome to [`GradScaler::update`].
    pub fn step<'t, D, O, G>(
        &self,
        optimizer: &mut O,
        grads: G,
    ) -> Result<StepOutcome<D, FromScaler>, AmpError>
    where
        D: AmpDevice,
        G: Unscaled<'t, D, Kind = FromScaler>,
        O: MasterOptimizer<<G::Target as TrainTarget<D>>::Master, D>,
    {
        let grads = grads.into_unscaled();
        if !grads.scalers.iter().any(|(id, _)| *id == self.id()) {
            return Err(AmpError::ScalerMismatch(
                "these gradients were unscaled by another scaler",
            ));
        }
        grads.take_step(optimizer)
    }

    /// Ends the iteration: backs the scale off (once) if any step of the iteration found inf
    /// or NaN, else counts a clean step towards growth, and returns the zeroed gradients for
    /// the next iteration, one per outcome.
    ///
    /// Errors if an outcome came from another scaler, or with [`AmpError::ScaleFloor`] when
    /// the scale is stuck at its floor (see [`GradScaler::with_min_scale`]).
    pub fn update<D: AmpDevice, O: StepOutcomes<D>>(
        &mut self,
        outcomes: O,
    ) -> Result<O::Grads, AmpError> {
        let mut found_inf = false;
        let mut foreign = false;
        let id = self.id();
        outcomes.for_each_flag(&mut |scaler, found| {
            foreign |= scaler != id;
            found_inf |= found;
        });
        if foreign {
            return Err(AmpError::ScalerMismatch(
                "an outcome of another scaler was passed to this one's update",
            ));
        }
        self.record(found_inf)?;
        Ok(outcomes.into_grads())
    }

    /// Errors unless gradients tagged `id` were scaled by this scaler.
    pub(crate) fn check_tag(&self, id: ScalerId) -> Result<(), AmpError> {
        if id == self.id() {
            Ok(())
        } else {
            Err(AmpError::ScalerMismatch(
                "these gradients were scaled by another scaler: unscale them with the scaler that scaled the loss",
            ))
        }
    }
}

impl crate::scaler::LossScalers {
    /// Ends an iteration of one-scaler-per-loss training: each scaler backs off if its own
    /// loss's gradients held inf or NaN, and counts a clean step otherwise. Every scaler must
    /// have a loss in the outcomes.
    pub fn update<D: AmpDevice, O: StepOutcomes<D>>(
        &mut self,
        outcomes: O,
    ) -> Result<O::Grads, AmpError> {
        let mut flags: Vec<(ScalerId, bool)> = Vec::new();
        outcomes.for_each_flag(&mut |id, found| flags.push((id, found)));
        let mut found = Vec::with_capacity(self.len());
        for scaler in self.iter() {
            let flag = flags
                .iter()
                .filter(|(id, _)| *id == scaler.id())
                .fold(None, |acc: Option<bool>, (_, f)| Some(acc.unwrap_or(false) | f))
                .ok_or(AmpError::ScalerMismatch(
                    "a scaler of these losses has no loss in the outcomes: each loss is unscaled (or merged) before the step",
                ))?;
            found.push(flag);
        }
        if flags
            .iter()
            .any(|(id, _)| !self.iter().any(|s| s.id() == *id))
        {
            return Err(AmpError::ScalerMismatch(
                "an outcome holds a loss of a scaler that is not one of these",
            ));
        }
        self.record(&found)?;
        Ok(outcomes.into_grads())
    }
}

impl GradScaler {
    /// [`GradScaler::unscale`], giving gradients of kind `K`.
    pub(crate) fn unscale_as<'t, D, T, G, K>(
        &self,
        target: &'t mut T,
        grads: G,
    ) -> Result<UnscaledGrads<'t, T, D, K>, AmpError>
    where
        D: AmpDevice,
        T: TrainTarget<D>,
        G: Scaled<D>,
        K: StepKind,
    {
        let ScaledGrads {
            grads,
            scale,
            scaler,
        } = grads.into_scaled();
        self.check_tag(scaler)?;
        into_master(target, grads, inverse(scale), vec![(scaler, false)])
    }
}
