//! Backward: the gradients a loss's backward pass gives, scaled ([`ScaledLoss`] ->
//! [`ScaledGrads`]) or not ([`Loss::backward`] -> [`RawGrads`]).

use dfdx::prelude::SplitTape;

use crate::device::AmpDevice;
use crate::device::FillKernel;
use crate::error::AmpError;
use crate::loss::Loss;
use crate::master::TrainTarget;
use crate::precision::FullRange;
use crate::scaler::ScalerTag;
use crate::tape::{MixedGradients, ScaledAt};

use super::kind::ScaleFree;
use super::unscaled::{into_master, UnscaledGrads};

/// A loss multiplied, for backward, by the scale current when it was made.
#[must_use = "a scaled loss does nothing until `backward()` is called"]
#[derive(Debug)]
pub struct ScaledLoss<D: AmpDevice> {
    pub(crate) loss: Loss<D>,
    pub(crate) scale: f32,
    pub(crate) scaler: ScalerTag,
}

impl<D: AmpDevice> ScaledLoss<D> {
    /// The scale backward is seeded with.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// The unscaled loss value.
    pub fn value(&self) -> f32 {
        self.loss.value()
    }

    /// Runs backward, seeding the loss's gradient with the scale (rather than multiplying the
    /// loss, which would round it once more). Every parameter's gradient lands in that
    /// parameter's own precision, multiplied by the scale.
    ///
    /// Errors with [`AmpError::OutcomeNotUpdated`] if the model these gradients belong to took
    /// a step with this scaler whose outcome never reached the scaler's update (dropped, or
    /// forgotten): that step's verdict would be lost.
    ///
    /// Errors with [`AmpError::ForeignForward`] if the forward pass ran through a model other
    /// than the one the traced gradients were allocated for, and with
    /// [`AmpError::StaleGradients`] if the traced gradients are a copy kept from before this
    /// scaler's last update (an earlier iteration's).
    pub fn backward(self) -> Result<ScaledGrads<D>, AmpError> {
        let mut grads = backward_seeded(self.loss, self.scale)?;
        check_in_flight(&self.scaler, &grads)?;
        stamp_fresh(&self.scaler, &mut grads)?;
        Ok(ScaledGrads {
            grads,
            scale: self.scale,
            scaler: self.scaler,
        })
    }
}

/// Errors if the model `grads` belong to has a step with `scaler` whose outcome never reached
/// the scaler's update: the next iteration of a model starts only after the last one's verdict
/// was counted.
pub(crate) fn check_in_flight<D: AmpDevice>(
    scaler: &ScalerTag,
    grads: &MixedGradients<D>,
) -> Result<(), AmpError> {
    match grads.owner {
        Some(owner) => scaler.ledger.check_target(owner.key()),
        None => Ok(()),
    }
}

/// Errors with [`AmpError::StaleGradients`] if `scaler`'s backward pass last wrote `grads`
/// before the scaler's latest update: they are a copy kept from an earlier iteration (the
/// gradients an update returns, or a model's `alloc_grads`, carry no such record).
pub(crate) fn check_fresh<D: AmpDevice>(
    scaler: &ScalerTag,
    grads: &MixedGradients<D>,
) -> Result<(), AmpError> {
    let updates = scaler.ledger.updates();
    match grads.scaled_at {
        Some(at) if at.scaler == scaler.id.key() && at.updates != updates => {
            Err(AmpError::StaleGradients {
                scaled_after: at.updates,
                updates,
            })
        }
        _ => Ok(()),
    }
}

/// [`check_fresh`], then records that `scaler`'s backward pass wrote `grads` now.
pub(crate) fn stamp_fresh<D: AmpDevice>(
    scaler: &ScalerTag,
    grads: &mut MixedGradients<D>,
) -> Result<(), AmpError> {
    check_fresh(scaler, grads)?;
    grads.scaled_at = Some(ScaledAt {
        scaler: scaler.id.key(),
        updates: scaler.ledger.updates(),
    });
    Ok(())
}

/// Runs a loss's tape with its gradient seeded with `scale`.
pub(crate) fn backward_seeded<D: AmpDevice>(
    loss: Loss<D>,
    scale: f32,
) -> Result<MixedGradients<D>, AmpError> {
    let (loss, tape) = loss.into_tensor().split_tape();
    tape.execute(|grads| {
        let seed = grads.store_mut::<f32>().get_or_alloc_mut(&loss)?;
        FillKernel::<f32>::try_fill(loss.device(), seed, scale)
    })
}

/// Gradients straight from a backward pass without a loss scale ([`Loss::backward`]).
///
/// Only a model whose working copy has FP32's exponent range (BF16 or FP32) may step on them:
/// [`RawGrads::check`] is where that rule is a bound.
#[must_use = "gradients do nothing until checked into a model (`grads.check(&mut model)`)"]
#[derive(Debug)]
pub struct RawGrads<D: AmpDevice> {
    pub(crate) grads: MixedGradients<D>,
}

impl<D: AmpDevice> RawGrads<D> {
    pub(crate) fn new(grads: MixedGradients<D>) -> Self {
        Self { grads }
    }

    /// The gradients, per precision (for inspection).
    pub fn grads(&self) -> &MixedGradients<D> {
        &self.grads
    }

    /// The gradients, mutably (for gradient hooks, or to inject faults in tests).
    pub fn grads_mut(&mut self) -> &mut MixedGradients<D> {
        &mut self.grads
    }

    /// Writes these gradients into `target`'s master gradients, checking every one for inf and
    /// NaN, for clipping and [`UnscaledGrads::step`]. Only models whose working precision has
    /// FP32's exponent range qualify (rule [`FullRange`]); an FP16 model needs a
    /// [`GradScaler`](crate::scaler::GradScaler).
    ///
    /// Errors with [`AmpError::NotAllReduced`] if `target` trains across ranks (a
    /// `DataParallel` synced it): this step would never average its gradients across ranks; with
    /// [`AmpError::Fp16GradientsNeedALossScale`] if the backward pass computed gradients in FP16
    /// although the model declares BF16 or FP32 (an FP16 layer, `ToF16` layer or `.to_f16()`
    /// cast on the tape): the rule is decided by the precision the gradients were computed in.
    pub fn check<T>(self, target: &mut T) -> Result<UnscaledGrads<'_, T, D, ScaleFree>, AmpError>
    where
        T: TrainTarget<D>,
        T::Precision: FullRange,
    {
        if target.is_data_parallel() {
            return Err(AmpError::NotAllReduced);
        }
        into_master(target, self.grads, 1.0, Vec::new())
    }
}

/// Gradients of the working model, still multiplied by the loss scale of the scaler that made
/// them.
///
/// No optimizer takes these: pass them to [`GradScaler::unscale`](crate::scaler::GradScaler::unscale).
#[must_use = "scaled gradients must be unscaled (`scaler.unscale(..)`) before a step"]
#[derive(Debug)]
pub struct ScaledGrads<D: AmpDevice> {
    pub(crate) grads: MixedGradients<D>,
    pub(crate) scale: f32,
    pub(crate) scaler: ScalerTag,
}

impl<D: AmpDevice> ScaledGrads<D> {
    /// The scale these gradients are multiplied by.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// The scaled gradients, per precision (for inspection).
    pub fn grads(&self) -> &MixedGradients<D> {
        &self.grads
    }

    /// The scaled gradients, mutably (for gradient hooks, or to inject faults in tests).
    pub fn grads_mut(&mut self) -> &mut MixedGradients<D> {
        &mut self.grads
    }
}

impl<D: AmpDevice> Loss<D> {
    /// Runs backward without a loss scale: every parameter's gradient lands in that
    /// parameter's own precision. For models whose working precision has FP32's exponent range
    /// (BF16, FP32), which [`RawGrads::check`] requires.
    pub fn backward(self) -> Result<RawGrads<D>, AmpError> {
        Ok(RawGrads::new(backward_seeded(self, 1.0)?))
    }
}
