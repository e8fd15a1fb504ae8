//! The typed training step: scale → backward → unscale → (clip) → step → update.
//!
//! Each stage returns a value only the next stage accepts, so the order is checked by the
//! compiler:
//!
//! | stage | takes | gives |
//! | --- | --- | --- |
//! | [`GradScaler::scale`] | an FP32 [`Loss`] | [`ScaledLoss`] |
//! | [`ScaledLoss::backward`] | | [`ScaledGrads`]: working-precision gradients, still × scale |
//! | [`GradScaler::unscale`] | [`ScaledGrads`] | [`UnscaledGrads`]: FP32 master gradients + found-inf |
//! | [`UnscaledGrads::clip_grad_norm`] | | the total norm |
//! | [`GradScaler::step`] | [`UnscaledGrads`], an FP32-master optimizer | [`StepOutcome`] |
//! | [`GradScaler::update`] | `found_inf` | |
//!
//! No optimizer accepts [`ScaledGrads`]; unscaling consumes them, so they cannot be unscaled
//! twice; clipping exists only on [`UnscaledGrads`]; stepping consumes those, so a step cannot be
//! taken twice with the same gradients.

use dfdx::prelude::{Device, Shape, SplitTape, Tensor};

use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::loss::Loss;
use crate::master::{for_each_trainable_grad, TrainTarget};
use crate::optim::MasterOptimizer;
use crate::params::{ParamVisitor, Parameters};
use crate::precision::{AmpElem, AnyBufMut, AnyGrads};
use crate::scaler::GradScaler;
use crate::tape::MixedGradients;

/// A loss multiplied, for backward, by the scale current when it was made.
#[must_use = "a scaled loss does nothing until `backward()` is called"]
#[derive(Debug)]
pub struct ScaledLoss<D: AmpDevice> {
    loss: Loss<D>,
    scale: f32,
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
    pub fn backward(self) -> Result<ScaledGrads<D>, AmpError> {
        let scale = self.scale;
        let grads = backward_seeded(self.loss, scale)?;
        Ok(ScaledGrads { grads, scale })
    }
}

/// Runs a loss's tape with its gradient seeded with `scale`.
fn backward_seeded<D: AmpDevice>(loss: Loss<D>, scale: f32) -> Result<MixedGradients<D>, AmpError> {
    let (loss, tape) = loss.into_tensor().split_tape();
    tape.execute(|grads| {
        let seed = grads.f32.get_or_alloc_mut(&loss)?;
        loss.device().try_fill(AnyBufMut::F32(seed), scale)
    })
}

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
/// let outcome = scaler.step(&mut opt, &mut model, unscaled)?;
/// scaler.update(outcome.found_inf)?;
/// # Ok(())
/// # }
/// ```
#[must_use = "an accumulation window does nothing until `finish()` hands its gradients on"]
#[derive(Debug)]
pub struct Accumulation<'s, D: AmpDevice> {
    scaler: std::marker::PhantomData<&'s GradScaler>,
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

    /// Backward of a micro-batch's loss at the window's scale; its gradients add to the
    /// window's. Weigh the loss (e.g. `loss * 0.25` for four micro-batches) for a mean.
    pub fn backward(&mut self, loss: Loss<D>) -> Result<(), AmpError> {
        if self.grads.is_some() {
            return Err(AmpError::AccumulationOrder(
                "backward was called without a traced micro-batch (trace inputs with `window.trace(x)`)",
            ));
        }
        self.grads = Some(backward_seeded(loss, self.scale)?);
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
        })
    }
}

/// Gradients of the working model, still multiplied by the loss scale.
///
/// No optimizer takes these: pass them to [`GradScaler::unscale`].
#[must_use = "scaled gradients must be unscaled (`scaler.unscale(..)`) before a step"]
#[derive(Debug)]
pub struct ScaledGrads<D: AmpDevice> {
    grads: MixedGradients<D>,
    scale: f32,
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

    /// Clipping needs unscaled gradients; this method exists only to say so at compile time.
    pub fn clip_grad_norm<T: TrainTarget<D>>(
        &mut self,
        target: &T,
        max_norm: f32,
    ) -> Result<f32, AmpError>
    where
        Self: Unscaled<D>,
    {
        self.as_unscaled_mut().clip_grad_norm(target, max_norm)
    }
}

/// Master gradients (FP32, or FP16 for O3's [`Fp16Weights`](crate::master::Fp16Weights)),
/// divided by the scale, and whether any was inf or NaN.
#[must_use = "unscaled gradients do nothing until passed to `scaler.step(..)`"]
#[derive(Debug)]
pub struct UnscaledGrads<D: AmpDevice> {
    master: AnyGrads<D>,
    working: MixedGradients<D>,
    found_inf: bool,
    non_finite: Vec<String>,
    layers: Vec<crate::watch::LayerReport>,
}

impl<D: AmpDevice> UnscaledGrads<D> {
    /// Whether any gradient (of any precision) held inf or NaN. The step will be skipped.
    pub fn found_inf(&self) -> bool {
        self.found_inf
    }

    /// Paths of the parameters whose gradients held inf or NaN, in model order (empty unless
    /// [`UnscaledGrads::found_inf`]).
    pub fn non_finite_params(&self) -> &[String] {
        &self.non_finite
    }

    /// Per-layer magnitudes of the pass, when watching
    /// ([`MixedGradients::watch_layers`]).
    pub fn layer_report(&self) -> &[crate::watch::LayerReport] {
        &self.layers
    }

    /// The layer where values first stopped being finite, when watching.
    pub fn overflowing_layer(&self) -> Option<crate::watch::Overflow> {
        crate::watch::overflowing_layer(&self.layers)
    }

    /// The master gradients.
    pub fn master_grads(&self) -> &AnyGrads<D> {
        &self.master
    }

    /// A copy of one master parameter's gradient.
    pub fn get<S: Shape, E: AmpElem, T>(
        &self,
        master_param: &Tensor<S, E, D, T>,
    ) -> Option<Tensor<S, E, D>>
    where
        D: Device<E>,
    {
        let grads = E::same_grads(&self.master)?;
        grads.get_ref_checked(master_param)?;
        Some(grads.get(master_param))
    }

    /// Adds another loss's unscaled gradients of the same model into these (Apex's one scaler
    /// per loss: each loss is scaled, backward and unscaled with its own scaler, then the
    /// gradients are summed for one step). The step is skipped if either found inf or NaN.
    pub fn merge<T: TrainTarget<D>>(
        &mut self,
        target: &T,
        other: UnscaledGrads<D>,
    ) -> Result<(), AmpError> {
        let UnscaledGrads {
            master: mut other_master,
            found_inf,
            non_finite,
            ..
        } = other;
        struct Add<'g, D: AmpDevice> {
            into: &'g mut AnyGrads<D>,
            from: &'g mut AnyGrads<D>,
        }
        impl<D: AmpDevice> ParamVisitor<D> for Add<'_, D> {
            type Error = AmpError;
            fn visit<S: Shape, E: AmpElem>(
                &mut self,
                path: &str,
                param: &Tensor<S, E, D>,
                trainable: bool,
            ) -> Result<(), AmpError>
            where
                D: Device<E>,
            {
                if !trainable {
                    return Ok(());
                }
                let Some(src) = self.from.of_mut::<E>(path)?.get_ref_checked(param) else {
                    return Ok(());
                };
                let dst = self
                    .into
                    .of_mut::<E>(path)?
                    .get_or_alloc_mut(param)
                    .map_err(AmpError::device)?;
                param
                    .device()
                    .try_add_cast(E::erase::<D>(src), E::erase_mut::<D>(dst))
                    .map_err(AmpError::device)
            }
        }
        target.master().visit_params(&mut Add {
            into: &mut self.master,
            from: &mut other_master,
        })?;
        self.found_inf |= found_inf;
        for path in non_finite {
            if !self.non_finite.contains(&path) {
                self.non_finite.push(path);
            }
        }
        Ok(())
    }

    /// Every trainable master parameter's gradient, copied to the host, with its path.
    pub fn to_host<T: TrainTarget<D>>(
        &mut self,
        target: &T,
    ) -> Result<Vec<(String, Vec<f32>)>, AmpError> {
        let mut values = Vec::new();
        for_each_trainable_grad(target.master(), &mut self.master, |dev, _, grad| {
            values.push(dev.try_read_f32(grad.as_buf())?);
            Ok(())
        })?;
        let paths = target
            .layout()
            .iter()
            .filter(|p| p.trainable)
            .map(|p| p.path.clone());
        Ok(paths.zip(values).collect())
    }

    /// The global 2-norm of all master gradients (inf or NaN if any gradient is).
    pub fn global_norm<T: TrainTarget<D>>(&mut self, target: &T) -> Result<f32, AmpError> {
        let squares = master_sums_of_squares(target, &mut self.master)?;
        Ok(squares.iter().map(|s| f64::from(*s)).sum::<f64>().sqrt() as f32)
    }

    /// Scales all master gradients so that their global 2-norm is at most `max_norm`, as
    /// PyTorch's `clip_grad_norm_`: the factor is `max_norm / (norm + 1e-6)`, applied only when
    /// below 1. Returns the norm before clipping (inf or NaN after an overflow, in which case the
    /// step will be skipped anyway).
    pub fn clip_grad_norm<T: TrainTarget<D>>(
        &mut self,
        target: &T,
        max_norm: f32,
    ) -> Result<f32, AmpError> {
        check_clip_limit(max_norm, "max_norm")?;
        let norm = self.global_norm(target)?;
        let factor = max_norm / (norm + 1e-6);
        if factor < 1.0 {
            for_each_trainable_grad(target.master(), &mut self.master, |dev, _, grad| {
                dev.try_scale(grad, factor)
            })?;
        }
        Ok(norm)
    }

    /// Clamps every master gradient element to `[-clip_value, clip_value]`, as PyTorch's
    /// `clip_grad_value_`.
    pub fn clip_grad_value<T: TrainTarget<D>>(
        &mut self,
        target: &T,
        clip_value: f32,
    ) -> Result<(), AmpError> {
        check_clip_limit(clip_value, "clip_value")?;
        for_each_trainable_grad(target.master(), &mut self.master, |dev, _, grad| {
            dev.try_clamp(grad, clip_value)
        })?;
        Ok(())
    }
}

fn check_clip_limit(limit: f32, name: &str) -> Result<(), AmpError> {
    if limit.is_finite() && limit > 0.0 {
        Ok(())
    } else {
        Err(AmpError::InvalidClip(format!(
            "{name} must be finite and positive, got {limit}"
        )))
    }
}

/// Per trainable master parameter, the sum of squares of its gradient, computed on the device
/// and read back once.
fn master_sums_of_squares<D: AmpDevice, T: TrainTarget<D>>(
    target: &T,
    grads: &mut AnyGrads<D>,
) -> Result<Vec<f32>, AmpError> {
    let slots = target.layout().iter().filter(|p| p.trainable).count();
    let mut stats: Option<D::Stats> = None;
    let device = for_each_trainable_grad(target.master(), grads, |dev, slot, grad| {
        let stats = match &mut stats {
            Some(stats) => stats,
            None => stats.insert(dev.try_alloc_stats(slots)?),
        };
        dev.try_sum_squares(grad.as_buf(), stats, slot)
    })?;
    match (device, stats) {
        (Some(dev), Some(stats)) => dev.try_read_stats(&stats).map_err(AmpError::device),
        _ => Ok(Vec::new()),
    }
}

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
pub trait Unscaled<D: AmpDevice>: Sized {
    /// The unscaled gradients.
    fn into_unscaled(self) -> UnscaledGrads<D>;
    /// The unscaled gradients, mutably.
    fn as_unscaled_mut(&mut self) -> &mut UnscaledGrads<D>;
}

impl<D: AmpDevice> Unscaled<D> for UnscaledGrads<D> {
    fn into_unscaled(self) -> UnscaledGrads<D> {
        self
    }
    fn as_unscaled_mut(&mut self) -> &mut UnscaledGrads<D> {
        self
    }
}

/// What [`GradScaler::step`] did.
#[must_use = "pass `found_inf` to `scaler.update(..)` and reuse `grads` for the next iteration"]
#[derive(Debug)]
pub struct StepOutcome<D: AmpDevice> {
    /// Whether a gradient was inf or NaN (pass this to [`GradScaler::update`]).
    pub found_inf: bool,
    /// Whether the optimizer step was skipped (because of `found_inf`).
    pub skipped: bool,
    /// Paths of the parameters whose gradients were inf or NaN.
    pub non_finite_params: Vec<String>,
    /// Per-layer magnitudes of the pass, when watching ([`MixedGradients::watch_layers`]).
    pub layers: Vec<crate::watch::LayerReport>,
    /// The layer where values first stopped being finite, when watching.
    pub overflow: Option<crate::watch::Overflow>,
    /// The working gradients, zeroed, to trace the next iteration with.
    pub grads: MixedGradients<D>,
}

impl GradScaler {
    /// Opens a gradient-accumulation window over `grads` (usually a model's zeroed gradients,
    /// or a previous step's `outcome.grads`) at the current scale. See [`Accumulation`].
    pub fn accumulate<D: AmpDevice>(&self, grads: MixedGradients<D>) -> Accumulation<'_, D> {
        Accumulation {
            scaler: std::marker::PhantomData,
            scale: self.get_scale(),
            grads: Some(grads),
            micro_batches: 0,
        }
    }

    /// Scales a loss for backward by the current scale (1 when the scaler is disabled).
    pub fn scale<D: AmpDevice>(&self, loss: Loss<D>) -> ScaledLoss<D> {
        ScaledLoss {
            loss,
            scale: self.get_scale(),
        }
    }

    /// Divides the working gradients by the scale they were made with, into FP32 gradients of
    /// `target`'s master weights, checking every gradient of every precision for inf and NaN.
    /// As in PyTorch, all gradients are unscaled even when one overflowed.
    pub fn unscale<D, T, G>(&self, target: &mut T, grads: G) -> Result<UnscaledGrads<D>, AmpError>
    where
        D: AmpDevice,
        T: TrainTarget<D>,
        G: Scaled<D>,
    {
        let ScaledGrads { mut grads, scale } = grads.into_scaled();
        // PyTorch computes the reciprocal in double precision, then rounds to float.
        let inv_scale = (1.0f64 / f64::from(scale)) as f32;
        let (master, flags) =
            target.unscale_into_master(&mut grads, inv_scale, self.is_enabled())?;
        let non_finite: Vec<String> = target
            .layout()
            .iter()
            .filter(|p| p.trainable)
            .zip(&flags)
            .filter(|(_, flag)| **flag)
            .map(|(p, _)| p.path.clone())
            .collect();
        let layers = std::mem::take(&mut grads.layer_report);
        Ok(UnscaledGrads {
            master,
            working: grads,
            found_inf: !non_finite.is_empty(),
            non_finite,
            layers,
        })
    }

    /// Updates `target`'s FP32 master weights with `optimizer` and refreshes its working copy,
    /// unless a gradient was inf or NaN, in which case master weights and optimizer state are
    /// left exactly as they were. Then call [`GradScaler::update`] with the outcome's
    /// `found_inf`.
    pub fn step<D, T, O, G>(
        &self,
        optimizer: &mut O,
        target: &mut T,
        grads: G,
    ) -> Result<StepOutcome<D>, AmpError>
    where
        D: AmpDevice,
        T: TrainTarget<D>,
        O: MasterOptimizer<T::Master, D>,
        G: Unscaled<D>,
    {
        let UnscaledGrads {
            master,
            working,
            found_inf,
            non_finite,
            layers,
        } = grads.into_unscaled();
        if !found_inf {
            optimizer.try_update(target.master_mut(), &master)?;
            target.refresh()?;
        }
        let grads = target.recycle(master, working)?;
        Ok(StepOutcome {
            found_inf,
            skipped: found_inf,
            non_finite_params: non_finite,
            overflow: crate::watch::overflowing_layer(&layers),
            layers,
            grads,
        })
    }
}
