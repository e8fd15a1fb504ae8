//! Gradient accumulation: a window of micro-batches at one scale.

use std::marker::PhantomData;

use dfdx::prelude::{Device, Shape, Tensor};

use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::loss::Loss;
use crate::precision::AmpElem;
use crate::scaler::{GradScaler, ScalerTag};
use crate::tape::MixedGradients;

use super::backward::{backward_seeded, check_in_flight, stamp_fresh, ScaledGrads};

/// A gradient-accumulation window: the scaled gradients of several micro-batches (or of several
/// losses, backward one after another) add up in one store at one scale, then are unscaled and
/// stepped once.
///
/// The window borrows the scaler, so the scale cannot change inside it: `scaler.update(..)`
/// needs the scaler mutably and does not compile until the window is finished.
///
/// ```rust
/// # use typed_amp::prelude::*;
/// # fn main() -> Result<(), AmpError> {
/// # let dev = Cpu::default();
/// # let mut model = MasterWeights::build::<(Linear<4, 2>,)>(&dev)?;
/// # let mut opt = typed_amp::optim::sgd(model.master(), SgdConfig::default());
/// # let mut scaler = GradScaler::default();
/// let mut window = scaler.accumulate(model.alloc_grads()?);
/// for _ in 0..4 {
///     let x: Tensor<Rank2<8, 4>, f16, _> = dev.zeros();
///     let logits = model.working().forward(window.trace(x)?);
///     let loss = mse_loss(logits.to_f32(), dev.zeros());
///     window.backward(loss * 0.25)?; // the mean over four micro-batches
/// }
/// let scaled = window.finish()?;
/// let unscaled = scaler.unscale(&mut model, scaled)?;
/// let outcome = scaler.step(&mut opt, unscaled)?;
/// let grads = scaler.update(outcome)?; // for the next window
/// # let _ = grads;
/// # Ok(())
/// # }
/// ```
#[must_use = "an accumulation window does nothing until `finish()` hands its gradients on"]
#[derive(Debug)]
pub struct Accumulation<'s, D: AmpDevice> {
    scaler: PhantomData<&'s GradScaler>,
    tag: ScalerTag,
    scale: f32,
    grads: Option<MixedGradients<D>>,
    micro_batches: usize,
}

impl<D: AmpDevice> Accumulation<'_, D> {
    /// Starts a micro-batch: `x` carries the window's gradients. Each traced micro-batch needs
    /// its [`Accumulation::backward`] before the next is traced.
    pub fn trace<S: Shape, E: AmpElem>(
        &mut self,
        x: Tensor<S, E, D>,
    ) -> Result<Tensor<S, E, D, crate::tape::MixedTape<D>>, AmpError>
    where
        D: Device<E>,
    {
        let grads = self.grads.take().ok_or(AmpError::AccumulationOrder(
            "a micro-batch was traced before the previous one's backward",
        ))?;
        Ok(crate::tape::TraceMixed::traced_mixed(x, grads))
    }

    /// Starts a micro-batch whose forward pass traces the window's gradients itself
    /// (`x.traced_mixed(grads)`), as the one-call step's forward closure does: [`trace`](Self::trace)
    /// without the input.
    pub(crate) fn take_grads(&mut self) -> Result<MixedGradients<D>, AmpError> {
        self.grads.take().ok_or(AmpError::AccumulationOrder(
            "a micro-batch was traced before the previous one's backward",
        ))
    }

    /// Backward of a micro-batch's loss at the window's scale; its gradients add to the
    /// window's. Weigh the loss (e.g. `loss * 0.25` for four micro-batches) for a mean.
    ///
    /// Errors with [`AmpError::OutcomeNotUpdated`] if the model of the window's gradients took
    /// a step with this scaler whose outcome never reached the scaler's update, with
    /// [`AmpError::ForeignForward`] if the micro-batch ran through another model, and with
    /// [`AmpError::StaleGradients`] if the window was opened over a copy of gradients kept
    /// from before the scaler's last update.
    pub fn backward(&mut self, loss: Loss<D>) -> Result<(), AmpError> {
        if self.grads.is_some() {
            return Err(AmpError::AccumulationOrder(
                "backward was called without a traced micro-batch (trace inputs with `window.trace(x)`)",
            ));
        }
        let mut grads = backward_seeded(loss, self.scale)?;
        check_in_flight(&self.tag, &grads)?;
        stamp_fresh(&self.tag, &mut grads)?;
        self.grads = Some(grads);
        self.micro_batches += 1;
        Ok(())
    }

    /// Micro-batches accumulated so far.
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// The scale every micro-batch was scaled with.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// Ends the window: the accumulated gradients, still scaled, for [`GradScaler::unscale`].
    pub fn finish(self) -> Result<ScaledGrads<D>, AmpError> {
        let grads = self.grads.ok_or(AmpError::AccumulationOrder(
            "the window ended with a traced micro-batch whose backward never ran",
        ))?;
        Ok(ScaledGrads {
            grads,
            scale: self.scale,
            scaler: self.tag,
        })
    }
}

impl GradScaler {
    /// Opens a gradient-accumulation window over `grads` (usually a model's zeroed gradients,
    /// or what the last [`GradScaler::update`] returned) at the current scale. See
    /// [`Accumulation`].
    pub fn accumulate<D: AmpDevice>(&self, grads: MixedGradients<D>) -> Accumulation<'_, D> {
        Accumulation {
            scaler: PhantomData,
            tag: self.tag(),
            scale: self.get_scale(),
            grads: Some(grads),
            micro_batches: 0,
        }
    }
}
