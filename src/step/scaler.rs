//! The scaler's step-time behaviour: a loss is scaled with the current scale, its gradients are
//! unscaled with its reciprocal and stepped, and the step's verdict (inf/NaN or not) comes back
//! to the scaler that scaled it ([`GradScaler::update`], [`LossScalers::update`]).

use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::loss::Loss;
use crate::master::TrainTarget;
use crate::optim::MasterOptimizer;
use crate::scaler::{inverse, GradScaler, LossScalers, ScalerId, ScalerTag, StepVerdict};
use crate::step::{
    check_fresh, into_master, verdicts, FromScaler, Scaled, ScaledGrads, ScaledLoss, StepKind,
    StepOutcome, StepOutcomes, Unscaled, UnscaledGrads,
};

impl GradScaler {
    /// Scales a loss for backward by the current scale (1 when the scaler is disabled).
    pub fn scale<D: AmpDevice>(&self, loss: Loss<D>) -> ScaledLoss<D> {
        ScaledLoss {
            loss,
            scale: self.get_scale(),
            scaler: self.tag(),
        }
    }

    /// Divides the working gradients by the scale they were made with, into master gradients of
    /// `target`, checking every gradient of every precision for inf and NaN (after the
    /// division, so that a scale whose reciprocal overflows is caught too). As in PyTorch, all
    /// gradients are unscaled even when one overflowed.
    ///
    /// Errors, before anything changes, if the gradients were scaled by another scaler or
    /// allocated by another model, with [`AmpError::StaleGradients`] if they are a copy kept
    /// from before this scaler's last update, or with [`AmpError::OutcomeNotUpdated`] if that model took a
    /// step with this scaler whose outcome never reached [`GradScaler::update`]; with
    /// [`AmpError::NotAllReduced`] if the model trains across ranks (a `DataParallel` synced
    /// it), whose gradients `DataParallel::unscale` and `all_reduce` take instead; with
    /// [`AmpError::Fp16GradientsNeedALossScale`] if this scaler is disabled and the gradients
    /// are FP16 (the model's working precision is F16, or the backward pass computed them in
    /// FP16 whatever the model declares).
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
        if target.is_data_parallel() {
            return Err(AmpError::NotAllReduced);
        }
        self.unscale_as(target, grads)
    }

    /// Updates the master weights with `optimizer` and refreshes the working copy, unless a
    /// gradient was inf or NaN, in which case master weights and optimizer state are left
    /// exactly as they were, and the working copy's buffers (batch norm running statistics) are
    /// put back as they were after the last step taken ([`TrainTarget::reload_working`]). Pass the outcome to [`GradScaler::update`].
    ///
    /// Errors, before anything changes, if the gradients were unscaled by another scaler, or,
    /// for a scaler of [`LossScalers`], with [`AmpError::LossNotMerged`] unless they hold every
    /// loss of the group.
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
        let holds = |id: ScalerId| grads.scalers.iter().any(|(tag, _)| tag.id == id);
        if !holds(self.id()) {
            return Err(AmpError::ScalerMismatch(
                "these gradients were unscaled by another scaler",
            ));
        }
        if let Some(loss) = self.group.iter().position(|id| !holds(*id)) {
            return Err(AmpError::LossNotMerged {
                loss,
                losses: self.group.len(),
            });
        }
        grads.take_step(optimizer)
    }

    /// Ends the iteration: backs the scale off (once) if any step of the iteration found inf
    /// or NaN, else counts a clean step towards growth, and returns the zeroed gradients for
    /// the next iteration, one per outcome.
    ///
    /// Errors, before the scale changes, if an outcome came from another scaler, with
    /// [`AmpError::NoOutcomes`] if there are none (an empty `Vec` or array), and with
    /// [`AmpError::OutcomeNotUpdated`] if a step taken with this scaler since the last update is
    /// missing from them (its outcome was dropped or forgotten); with [`AmpError::ScaleFloor`]
    /// when the scale is stuck at its floor (see [`GradScaler::with_min_scale`]).
    pub fn update<D: AmpDevice, O: StepOutcomes<D>>(
        &mut self,
        outcomes: O,
    ) -> Result<O::Grads, AmpError> {
        self.count(&verdicts(&outcomes))?;
        Ok(outcomes.into_grads())
    }

    /// The update's verdict: every check first, then the ledger and the scale.
    pub(crate) fn count(&mut self, verdicts: &[StepVerdict]) -> Result<(), AmpError> {
        if verdicts.is_empty() {
            return Err(AmpError::NoOutcomes);
        }
        if verdicts.iter().any(|v| v.scaler != self.id()) {
            return Err(AmpError::ScalerMismatch(
                "an outcome of another scaler was passed to this one's update",
            ));
        }
        let steps: Vec<u64> = verdicts.iter().map(|v| v.step).collect();
        self.ledger.check_settled(&steps)?;
        self.ledger.settle(&steps);
        self.record(verdicts.iter().any(|v| v.found_inf))
    }

    /// What the step's values carry of this scaler.
    pub(crate) fn tag(&self) -> ScalerTag {
        ScalerTag {
            id: self.id(),
            ledger: self.ledger.clone(),
            scaling: self.is_enabled(),
        }
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

impl LossScalers {
    /// Ends an iteration of one-scaler-per-loss training: each scaler backs off if its own
    /// loss's gradients held inf or NaN, and counts a clean step otherwise. Every scaler must
    /// have a loss in the outcomes.
    ///
    /// Errors, before any scale changes, with [`AmpError::NoOutcomes`] if there are no outcomes,
    /// [`AmpError::ScalerMismatch`] if a scaler has no loss in them or they hold a loss of
    /// another scaler, and [`AmpError::OutcomeNotUpdated`] if a step taken with one of these
    /// scalers since the last update is missing from them.
    pub fn update<D: AmpDevice, O: StepOutcomes<D>>(
        &mut self,
        outcomes: O,
    ) -> Result<O::Grads, AmpError> {
        let verdicts = verdicts(&outcomes);
        if verdicts.is_empty() {
            return Err(AmpError::NoOutcomes);
        }
        let mut found = Vec::with_capacity(self.len());
        let mut steps = Vec::with_capacity(self.len());
        for scaler in self.iter() {
            let own: Vec<&StepVerdict> = verdicts
                .iter()
                .filter(|v| v.scaler == scaler.id())
                .collect();
            if own.is_empty() {
                return Err(AmpError::ScalerMismatch(
                    "a scaler of these losses has no loss in the outcomes: each loss is unscaled (or merged) before the step",
                ));
            }
            found.push(own.iter().any(|v| v.found_inf));
            steps.push(own.iter().map(|v| v.step).collect::<Vec<u64>>());
        }
        if verdicts
            .iter()
            .any(|v| !self.iter().any(|s| s.id() == v.scaler))
        {
            return Err(AmpError::ScalerMismatch(
                "an outcome holds a loss of a scaler that is not one of these",
            ));
        }
        for (scaler, steps) in self.iter().zip(&steps) {
            scaler.ledger.check_settled(steps)?;
        }
        for (scaler, steps) in self.iter().zip(&steps) {
            scaler.ledger.settle(steps);
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
        self.check_tag(scaler.id)?;
        self.ledger.check_target(target.id().key())?;
        check_fresh(&scaler, &grads)?;
        into_master(target, grads, inverse(scale), vec![scaler])
    }
}
