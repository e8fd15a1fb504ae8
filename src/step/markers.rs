//! The marker traits of the stage order: [`Scaled`] gradients are unscaled once, only
//! [`Unscaled`] ones are clipped and stepped.

use crate::device::AmpDevice;
use crate::master::TrainTarget;

use super::backward::ScaledGrads;
use super::kind::StepKind;
use super::unscaled::UnscaledGrads;

/// Marks gradients that are still multiplied by the loss scale.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not scaled: gradients are unscaled exactly once",
    label = "already unscaled",
    note = "`scaler.unscale(..)` takes the `ScaledGrads` from `scaled_loss.backward()`; these gradients were unscaled already and can be clipped or passed to `scaler.step(..)`"
)]
pub trait Scaled<D: AmpDevice>: Sized {
    /// The scaled gradients.
    fn into_scaled(self) -> ScaledGrads<D>;
}

impl<D: AmpDevice> Scaled<D> for ScaledGrads<D> {
    fn into_scaled(self) -> ScaledGrads<D> {
        self
    }
}

/// Marks gradients divided by the loss scale again, the only ones that may be clipped or used
/// for an update.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is still multiplied by the loss scale",
    label = "scaled gradients",
    note = "clip and step only unscaled gradients: call `scaler.unscale(&mut model, grads)?` first, then clip or `scaler.step(..)` what it returns"
)]
pub trait Unscaled<'t, D: AmpDevice>: Sized {
    /// The model the gradients belong to.
    type Target: TrainTarget<D> + 't;
    /// Where they came from.
    type Kind: StepKind;
    /// The unscaled gradients.
    fn into_unscaled(self) -> UnscaledGrads<'t, Self::Target, D, Self::Kind>;
    /// The unscaled gradients, mutably.
    fn as_unscaled_mut(&mut self) -> &mut UnscaledGrads<'t, Self::Target, D, Self::Kind>;
}

impl<'t, T: TrainTarget<D>, D: AmpDevice, K: StepKind> Unscaled<'t, D>
    for UnscaledGrads<'t, T, D, K>
{
    type Target = T;
    type Kind = K;
    fn into_unscaled(self) -> UnscaledGrads<'t, T, D, K> {
        self
    }
    fn as_unscaled_mut(&mut self) -> &mut UnscaledGrads<'t, T, D, K> {
        self
    }
}
