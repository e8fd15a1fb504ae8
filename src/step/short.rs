//! The short form of the typed step: one call per iteration
//! ([`StepProtocol::train_step_with`](super::StepProtocol::train_step_with),
//! [`NoScaler::train_step_with`]), with gradient clipping and gradient accumulation as options
//! of it ([`StepOptions`]).
//!
//! The call runs the typed stages of the module documentation in order, so every rule of the
//! stage-by-stage loop holds for it too: with a scaler, scale → backward (once per micro-batch,
//! in one [`Accumulation`](super::Accumulation) window) → unscale → [all-reduce] → clip → step →
//! update; without one ([`NoScaler`], BF16 and FP32 models only, rule [`FullRange`]),
//! backward → check → clip → step.

use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::loss::Loss;
use crate::master::TrainTarget;
use crate::optim::MasterOptimizer;
use crate::precision::FullRange;
use crate::scaler::GradScaler;
use crate::tape::MixedGradients;

use super::backward::ScaledGrads;
use super::clip::{clip_grad_norm, clip_grad_value};
use super::kind::ReadyForStep;
use super::markers::Unscaled;

/// How the one-call step ([`StepOptions`]) clips the unscaled gradients before the step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Clip {
    /// [`clip_grad_norm`]: scale all master gradients so that their global 2-norm is at most
    /// this (PyTorch's `clip_grad_norm_`).
    Norm(f32),
    /// [`clip_grad_value`]: clamp every master gradient element to `[-v, v]` (PyTorch's
    /// `clip_grad_value_`).
    Value(f32),
}

/// The options of the one-call step
/// ([`StepProtocol::train_step_with`](super::StepProtocol::train_step_with),
/// [`NoScaler::train_step_with`]): gradient clipping on the unscaled gradients, and gradient
/// accumulation over micro-batches. The default is neither: one forward pass, no clipping.
///
/// ```rust
/// use typed_amp::prelude::*;
///
/// let options = StepOptions::new().clip_grad_norm(1.0).accumulate(4);
/// assert_eq!(options.micro_batches(), 4);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepOptions {
    clip: Option<Clip>,
    micro_batches: usize,
}

impl Default for StepOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl StepOptions {
    /// No clipping, one micro-batch per step.
    pub const fn new() -> Self {
        Self {
            clip: None,
            micro_batches: 1,
        }
    }

    /// Clips the unscaled master gradients to a global 2-norm of at most `max_norm`
    /// ([`clip_grad_norm`]) before the step. `max_norm` must be finite and positive
    /// ([`AmpError::InvalidClip`] otherwise, before anything runs).
    pub const fn clip_grad_norm(mut self, max_norm: f32) -> Self {
        self.clip = Some(Clip::Norm(max_norm));
        self
    }

    /// Clamps every unscaled master gradient element to `[-clip_value, clip_value]`
    /// ([`clip_grad_value`]) before the step. `clip_value` must be finite and positive
    /// ([`AmpError::InvalidClip`] otherwise, before anything runs).
    pub const fn clip_grad_value(mut self, clip_value: f32) -> Self {
        self.clip = Some(Clip::Value(clip_value));
        self
    }

    /// Accumulates the gradients of `micro_batches` forward passes into one step: the forward
    /// closure runs `micro_batches` times per iteration (per loss), each loss weighted by
    /// `1 / micro_batches`, so that the step is the one of the mean over all of them, as if the
    /// batch were `micro_batches` times larger. With a scaler, all of them are scaled at one
    /// scale in one [`Accumulation`](super::Accumulation) window. `micro_batches` must be at
    /// least 1 ([`AmpError::AccumulationOrder`] otherwise, before anything runs).
    pub const fn accumulate(mut self, micro_batches: usize) -> Self {
        self.micro_batches = micro_batches;
        self
    }

    /// The clipping, if any.
    pub const fn clip(&self) -> Option<Clip> {
        self.clip
    }

    /// The forward passes per loss and step (1 without accumulation).
    pub const fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// Checks the options before a step runs anything.
    pub(crate) fn check(&self) -> Result<(), AmpError> {
        if self.micro_batches == 0 {
            return Err(AmpError::AccumulationOrder(
                "a step accumulates at least one micro-batch (`StepOptions::accumulate(0)`)",
            ));
        }
        let (name, limit) = match self.clip {
            None => return Ok(()),
            Some(Clip::Norm(v)) => ("max_norm", v),
            Some(Clip::Value(v)) => ("clip_value", v),
        };
        if limit.is_finite() && limit > 0.0 {
            Ok(())
        } else {
            Err(AmpError::InvalidClip(format!(
                "{name} must be finite and positive, got {limit}"
            )))
        }
    }

    /// The weight of each micro-batch's loss: none for one micro-batch (the loss as it is, bit
    /// for bit), `1 / micro_batches` otherwise.
    pub(crate) fn weigh<D: AmpDevice>(&self, loss: Loss<D>) -> Loss<D> {
        if self.micro_batches == 1 {
            loss
        } else {
            loss * (1.0 / self.micro_batches as f32)
        }
    }

    /// Clips `grads` (unscaled, ready for the step) as the options say.
    pub(crate) fn clip_grads<'t, D: AmpDevice, G: Unscaled<'t, D>>(
        &self,
        grads: &mut G,
    ) -> Result<(), AmpError>
    where
        G::Kind: ReadyForStep,
    {
        match self.clip {
            None => Ok(()),
            Some(Clip::Norm(max_norm)) => clip_grad_norm(grads, max_norm).map(|_| ()),
            Some(Clip::Value(clip_value)) => clip_grad_value(grads, clip_value),
        }
    }
}

/// What the forward closure of the one-call step returns: the FP32 [`Loss`] itself, or a
/// `Result` of it (for a forward pass that uses `?`), whose error type the step returns.
#[diagnostic::on_unimplemented(
    message = "the forward closure of a one-call step returns `{Self}`, not an FP32 loss",
    label = "the closure's return type",
    note = "return the `Loss` of typed-amp's losses (`mse_loss`, `cross_entropy_with_logits_loss`, ...), or a `Result` of it whose error converts from `AmpError`"
)]
pub trait ForwardOutput<D: AmpDevice> {
    /// The error the step returns.
    type Error: From<AmpError>;
    /// The loss, or the forward pass's error.
    fn into_loss(self) -> Result<Loss<D>, Self::Error>;
}

impl<D: AmpDevice> ForwardOutput<D> for Loss<D> {
    type Error = AmpError;
    fn into_loss(self) -> Result<Loss<D>, AmpError> {
        Ok(self)
    }
}

impl<D: AmpDevice, E: From<AmpError>> ForwardOutput<D> for Result<Loss<D>, E> {
    type Error = E;
    fn into_loss(self) -> Result<Loss<D>, E> {
        self
    }
}

/// The one-call step without a loss scaler, for models whose gradients have FP32's exponent
/// range (BF16 and FP32: rule [`FullRange`]); an FP16 model's step does not compile with it
/// (use a [`GradScaler`](crate::scaler::GradScaler)).
///
/// Its stages: [`Loss::backward`] (once per micro-batch, into the same gradients) →
/// [`RawGrads::check`](super::RawGrads::check) → clip →
/// [`UnscaledGrads::step`](super::UnscaledGrads::step) →
/// [`StepOutcome::into_grads`](super::StepOutcome::into_grads).
///
/// ```rust
/// # use typed_amp::prelude::*;
/// # fn main() -> Result<(), AmpError> {
/// #[typed_amp::amp(policy = "O2", dtype = "bf16", cast_model_outputs = "fp32")]
/// struct Mlp { fc1: Linear<8, 16>, act: ReLU, fc2: Linear<16, 2> }
///
/// let dev = Cpu::default();
/// let mut model = Mlp::build(&dev)?;
/// let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
/// let options = StepOptions::new().clip_grad_norm(1.0);
/// let mut no_scaler = NoScaler::new();
/// let mut grads = model.alloc_grads()?;
/// for _ in 0..2 {
///     grads = no_scaler.train_step_with(&mut model, &mut opt, grads, &options, |model, _, grads| {
///         let x: Tensor<Rank2<4, 8>, f32, _> = dev.sample_normal();
///         let logits = model.working().forward(x.traced_mixed(grads));
///         mse_loss(logits, dev.zeros())
///     })?;
/// }
/// assert_eq!(no_scaler.skipped_steps(), 0);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoScaler {
    skipped_steps: u64,
}

impl NoScaler {
    /// A scale-free step that has skipped no step yet.
    pub const fn new() -> Self {
        Self { skipped_steps: 0 }
    }

    /// Steps skipped so far because a gradient was inf or NaN (or its square overflowed FP32).
    pub const fn skipped_steps(&self) -> u64 {
        self.skipped_steps
    }

    /// One iteration without a loss scaler, as
    /// [`StepProtocol::train_step_with`](super::StepProtocol::train_step_with) runs it with one:
    /// `forward(target, i, grads)` traces micro-batch `i` (of [`StepOptions::micro_batches`])
    /// into `grads` and returns its FP32 loss; the losses are
    /// backward into the same gradients (each weighted by `1 / micro_batches`), checked into
    /// `target`'s master gradients (inf/NaN found), clipped as `options` say, and `optimizer`
    /// steps unless a gradient was inf or NaN. Returns the zeroed gradients for the next
    /// iteration.
    pub fn train_step_with<D, T, O, R, F>(
        &mut self,
        target: &mut T,
        optimizer: &mut O,
        grads: MixedGradients<D>,
        options: &StepOptions,
        mut forward: F,
    ) -> Result<MixedGradients<D>, R::Error>
    where
        D: AmpDevice,
        T: TrainTarget<D>,
        T::Precision: FullRange,
        O: MasterOptimizer<T::Master, D>,
        R: ForwardOutput<D>,
        F: FnMut(&mut T, usize, MixedGradients<D>) -> R,
    {
        options.check()?;
        let mut grads = grads;
        for micro_batch in 0..options.micro_batches() {
            let loss = forward(target, micro_batch, grads).into_loss()?;
            grads = options.weigh(loss).backward()?.grads;
        }
        let raw = super::RawGrads::new(grads);
        let mut unscaled = raw.check(target)?;
        options.clip_grads(&mut unscaled)?;
        let outcome = unscaled.step(optimizer)?;
        self.skipped_steps += u64::from(outcome.skipped());
        Ok(outcome.into_grads())
    }

    /// [`NoScaler::train_step_with`] with the default options: one forward pass, no clipping.
    pub fn train_step<D, T, O, R, F>(
        &mut self,
        target: &mut T,
        optimizer: &mut O,
        grads: MixedGradients<D>,
        forward: F,
    ) -> Result<MixedGradients<D>, R::Error>
    where
        D: AmpDevice,
        T: TrainTarget<D>,
        T::Precision: FullRange,
        O: MasterOptimizer<T::Master, D>,
        R: ForwardOutput<D>,
        F: FnMut(&mut T, usize, MixedGradients<D>) -> R,
    {
        self.train_step_with(target, optimizer, grads, &StepOptions::new(), forward)
    }
}

/// The backward passes of one loss's micro-batches with `scaler`, as the one-call step runs
/// them: one forward pass (`forward(target, first_index, grads)`) scaled and backward without
/// accumulation; otherwise `options.micro_batches()` of them (indices `first_index..`), each
/// weighted, in one accumulation window at one scale.
pub(crate) fn scaled_backward<D, T, R, F>(
    scaler: &GradScaler,
    target: &mut T,
    grads: MixedGradients<D>,
    options: &StepOptions,
    first_index: usize,
    forward: &mut F,
) -> Result<ScaledGrads<D>, R::Error>
where
    D: AmpDevice,
    T: TrainTarget<D>,
    R: ForwardOutput<D>,
    F: FnMut(&mut T, usize, MixedGradients<D>) -> R,
{
    if options.micro_batches() == 1 {
        let loss = forward(target, first_index, grads).into_loss()?;
        return Ok(scaler.scale(loss).backward()?);
    }
    let mut window = scaler.accumulate(grads);
    for micro_batch in 0..options.micro_batches() {
        let grads = window.take_grads()?;
        let loss = forward(target, first_index + micro_batch, grads).into_loss()?;
        window.backward(options.weigh(loss))?;
    }
    Ok(window.finish()?)
}
