//! The typed training step.
//!
//! With a loss scaler (FP16 models, and any model that wants one):
//! scale → backward → unscale → (clip) → step → update.
//!
//! | stage | takes | gives |
//! | --- | --- | --- |
//! | [`GradScaler::scale`] | an FP32 [`Loss`] | [`ScaledLoss`] |
//! | [`ScaledLoss::backward`] | | [`ScaledGrads`]: working-precision gradients, still × scale, tagged with the scaler |
//! | [`GradScaler::unscale`] | the model, [`ScaledGrads`] | [`UnscaledGrads`]: master gradients ÷ scale, checked for inf/NaN, borrowing the model |
//! | [`clip_grad_norm`], [`clip_grad_value`] | [`UnscaledGrads`] | the total norm |
//! | [`GradScaler::step`] | an FP32-master optimizer, [`UnscaledGrads`] | [`StepOutcome`] |
//! | [`GradScaler::update`] | every [`StepOutcome`] of the iteration | the zeroed gradients for the next one |
//!
//! Without one (models whose working precision has FP32's exponent range: BF16 and FP32, rule
//! [`FullRange`]): backward → check → (clip) → step.
//!
//! | stage | takes | gives |
//! | --- | --- | --- |
//! | [`Loss::backward`] | | [`RawGrads`]: working-precision gradients at scale 1 |
//! | [`RawGrads::check`] | the model | [`UnscaledGrads`], checked for inf/NaN |
//! | [`UnscaledGrads::step`] | an FP32-master optimizer | [`StepOutcome`], whose [`StepOutcome::into_grads`] gives the next gradients |
//!
//! Each stage returns a value only the next stage accepts, so the order is checked by the
//! compiler: no optimizer accepts scaled gradients; unscaling consumes them, so they cannot be
//! unscaled twice; clipping takes only unscaled gradients; stepping consumes those; the next
//! iteration's gradients come only out of [`GradScaler::update`] (or, without a scaler, out of
//! the outcome), so an iteration cannot skip its update, and an outcome cannot be counted twice.
//! Unscaled gradients borrow the model they were unscaled into, so clipping and the step need
//! no second reference to it. What cannot be a type is checked before anything changes: the
//! gradients must have been allocated by the model they are unscaled into, and unscaled by the
//! scaler that scaled them.

use std::marker::PhantomData;

use dfdx::prelude::{Device, Shape, SplitTape, Storage, Tensor};

use crate::device::{AmpDevice, Kernels};
use crate::error::AmpError;
use crate::loss::Loss;
use crate::master::{for_each_trainable_grad, GradOp, TrainTarget};
use crate::ops::cast::CastKernel;
use crate::ops::fill::FillKernel;
use crate::ops::host::HostKernel;
use crate::ops::reduce::ReduceKernel;
use crate::optim::MasterOptimizer;
use crate::params::Parameters;
use crate::precision::{AmpElem, FullRange};
use crate::scaler::{GradScaler, ScalerId};
use crate::tape::MixedGradients;

/// Where unscaled gradients came from: a [`GradScaler`] ([`FromScaler`]) or a backward pass
/// without one ([`ScaleFree`]). It decides how the step's outcome is consumed.
pub trait StepKind: sealed::Sealed + 'static {}

/// Gradients unscaled by a [`GradScaler`]: the step's outcome goes to [`GradScaler::update`].
#[derive(Debug)]
pub struct FromScaler;

/// Gradients of a backward pass without a loss scale (BF16 and FP32 models): the step's outcome
/// gives the next gradients itself.
#[derive(Debug)]
pub struct ScaleFree;

/// Gradients of a data-parallel run unscaled by one rank, from its shard of the batch alone
/// ([`DataParallel::unscale`](crate::distributed::DataParallel::unscale)): unscaled, but neither
/// clipping (rule [`ReadyForStep`]) nor a step (rule
/// [`ReducedAcrossRanks`](crate::distributed::ReducedAcrossRanks)) takes them until
/// [`DataParallel::all_reduce`](crate::distributed::DataParallel::all_reduce) has averaged them
/// across ranks.
#[derive(Debug)]
pub struct Unreduced;

/// Gradients of a data-parallel run averaged across ranks, with the overflow flag reduced across
/// ranks ([`DataParallel::all_reduce`](crate::distributed::DataParallel::all_reduce)): the step's
/// outcome goes to [`DataParallel::update`](crate::distributed::DataParallel::update).
#[derive(Debug)]
pub struct AllReduced;

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::FromScaler {}
    impl Sealed for super::ScaleFree {}
    impl Sealed for super::Unreduced {}
    impl Sealed for super::AllReduced {}
}

impl StepKind for FromScaler {}
impl StepKind for ScaleFree {}
impl StepKind for Unreduced {}
impl StepKind for AllReduced {}

/// Gradients of these kinds may be clipped and stepped: all but [`Unreduced`], a data-parallel
/// rank's gradients before they are averaged across ranks.
#[diagnostic::on_unimplemented(
    message = "gradients of kind `{Self}` are one rank's alone: in a data-parallel run, gradients are all-reduced across ranks before they are clipped or stepped",
    label = "not all-reduced across ranks",
    note = "pass what `dist.unscale(..)` returned to `dist.all_reduce(..)?`, then clip or `dist.step(..)` the averaged gradients it returns"
)]
pub trait ReadyForStep: StepKind {}
impl ReadyForStep for FromScaler {}
impl ReadyForStep for ScaleFree {}
impl ReadyForStep for AllReduced {}

/// A loss multiplied, for backward, by the scale current when it was made.
#[must_use = "a scaled loss does nothing until `backward()` is called"]
#[derive(Debug)]
pub struct ScaledLoss<D: AmpDevice> {
    loss: Loss<D>,
    scale: f32,
    scaler: ScalerId,
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
        let grads = backward_seeded(self.loss, self.scale)?;
        Ok(ScaledGrads {
            grads,
            scale: self.scale,
            scaler: self.scaler,
        })
    }
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
    grads: MixedGradients<D>,
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
    /// [`GradScaler`].
    pub fn check<T>(self, target: &mut T) -> Result<UnscaledGrads<'_, T, D, ScaleFree>, AmpError>
    where
        T: TrainTarget<D>,
        T::Precision: FullRange,
    {
        into_master(target, self.grads, 1.0, Vec::new())
    }
}

/// Divides `grads` by the scale they carry into `target`'s master gradients, after checking
/// that they belong to it.
fn into_master<T, D, K>(
    target: &mut T,
    mut grads: MixedGradients<D>,
    inv_scale: f32,
    scalers: Vec<(ScalerId, bool)>,
) -> Result<UnscaledGrads<'_, T, D, K>, AmpError>
where
    D: AmpDevice,
    T: TrainTarget<D>,
    K: StepKind,
{
    check_owner(target, &grads)?;
    let timing = typed_amp_kernels::timing::scope(typed_amp_kernels::timing::Kind::UnscaleCheck);
    let (master, flags) = target.unscale_into_master(&mut grads, inv_scale)?;
    drop(timing);
    let non_finite: Vec<String> = target
        .layout()
        .iter()
        .filter(|p| p.trainable)
        .zip(&flags)
        .filter(|(_, flag)| **flag)
        .map(|(p, _)| p.path.clone())
        .collect();
    let found_inf = !non_finite.is_empty();
    let scalers = scalers.into_iter().map(|(id, _)| (id, found_inf)).collect();
    let layers = std::mem::take(&mut grads.layer_report);
    Ok(UnscaledGrads {
        target,
        master,
        working: grads,
        found_inf,
        non_finite,
        layers,
        scalers,
        kind: PhantomData,
    })
}

fn check_owner<T: TrainTarget<D>, D: AmpDevice>(
    target: &T,
    grads: &MixedGradients<D>,
) -> Result<(), AmpError> {
    if grads.owner == Some(target.id()) {
        Ok(())
    } else {
        Err(AmpError::ForeignGradients(match grads.owner {
            Some(_) => "they were allocated by another model",
            None => "they were not allocated by a model (use `model.alloc_grads()`, or reuse what the step returned)",
        }))
    }
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
    id: ScalerId,
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
            scaler: self.id,
        })
    }
}

/// Gradients of the working model, still multiplied by the loss scale of the scaler that made
/// them.
///
/// No optimizer takes these: pass them to [`GradScaler::unscale`].
#[must_use = "scaled gradients must be unscaled (`scaler.unscale(..)`) before a step"]
#[derive(Debug)]
pub struct ScaledGrads<D: AmpDevice> {
    grads: MixedGradients<D>,
    scale: f32,
    scaler: ScalerId,
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

/// Master gradients (FP32, or 16-bit for O3), divided by the scale, checked for inf and NaN,
/// and borrowing the model they belong to.
///
/// `K` says where they came from ([`FromScaler`] or [`ScaleFree`]).
#[must_use = "unscaled gradients do nothing until stepped"]
pub struct UnscaledGrads<'t, T: TrainTarget<D>, D: AmpDevice, K: StepKind = FromScaler> {
    target: &'t mut T,
    master: MixedGradients<D>,
    working: MixedGradients<D>,
    found_inf: bool,
    non_finite: Vec<String>,
    layers: Vec<crate::watch::LayerReport>,
    /// The scalers whose losses these gradients hold, with whether that loss's gradients held
    /// inf or NaN (one entry, or one per loss after [`UnscaledGrads::merge`]).
    scalers: Vec<(ScalerId, bool)>,
    kind: PhantomData<K>,
}

impl<T: TrainTarget<D>, D: AmpDevice, K: StepKind> std::fmt::Debug for UnscaledGrads<'_, T, D, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnscaledGrads")
            .field("found_inf", &self.found_inf)
            .field("non_finite", &self.non_finite)
            .finish_non_exhaustive()
    }
}

impl<'t, T: TrainTarget<D>, D: AmpDevice, K: StepKind> UnscaledGrads<'t, T, D, K> {
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

    /// The model these gradients belong to.
    pub fn target(&self) -> &T {
        self.target
    }

    /// The master gradients.
    pub fn master_grads(&self) -> &MixedGradients<D> {
        &self.master
    }

    /// A copy of one master parameter's gradient (`param` is a parameter of
    /// `self.target().master()`).
    pub fn get<S: Shape, E: AmpElem>(&self, param: &Tensor<S, E, D>) -> Option<Tensor<S, E, D>>
    where
        D: Kernels<E>,
    {
        self.master.get(param)
    }

    /// Every trainable master parameter's gradient, copied to the host and widened to FP32,
    /// with its path.
    pub fn to_host(&mut self) -> Result<Vec<(String, Vec<f32>)>, AmpError> {
        struct Read(Vec<Vec<f32>>);
        impl<D: AmpDevice> GradOp<D> for Read {
            fn apply<E: AmpElem>(
                &mut self,
                dev: &D,
                _slot: usize,
                grad: &mut <D as Storage<E>>::Vec,
            ) -> Result<(), D::Err>
            where
                D: Kernels<E>,
            {
                let values = HostKernel::<E>::try_read(dev, grad)?;
                self.0
                    .push(values.into_iter().map(AmpElem::to_f32).collect());
                Ok(())
            }
        }
        let mut read = Read(Vec::new());
        for_each_trainable_grad(self.target.master(), &mut self.master, &mut read)?;
        let paths = self
            .target
            .layout()
            .iter()
            .filter(|p| p.trainable)
            .map(|p| p.path.clone());
        Ok(paths.zip(read.0).collect())
    }

    /// The global 2-norm of all master gradients (inf or NaN if any gradient is).
    pub fn global_norm(&mut self) -> Result<f32, AmpError> {
        let squares = master_sums_of_squares(self.target, &mut self.master)?;
        Ok(squares.iter().map(|s| f64::from(*s)).sum::<f64>().sqrt() as f32)
    }

    fn clip_norm(&mut self, max_norm: f32) -> Result<f32, AmpError> {
        check_clip_limit(max_norm, "max_norm")?;
        let norm = self.global_norm()?;
        let factor = max_norm / (norm + 1e-6);
        if factor < 1.0 {
            struct Scale(f32);
            impl<D: AmpDevice> GradOp<D> for Scale {
                fn apply<E: AmpElem>(
                    &mut self,
                    dev: &D,
                    _slot: usize,
                    grad: &mut <D as Storage<E>>::Vec,
                ) -> Result<(), D::Err>
                where
                    D: Kernels<E>,
                {
                    FillKernel::<E>::try_scale(dev, grad, self.0)
                }
            }
            for_each_trainable_grad(self.target.master(), &mut self.master, &mut Scale(factor))?;
        }
        Ok(norm)
    }

    fn clip_value(&mut self, clip_value: f32) -> Result<(), AmpError> {
        check_clip_limit(clip_value, "clip_value")?;
        struct Clamp(f32);
        impl<D: AmpDevice> GradOp<D> for Clamp {
            fn apply<E: AmpElem>(
                &mut self,
                dev: &D,
                _slot: usize,
                grad: &mut <D as Storage<E>>::Vec,
            ) -> Result<(), D::Err>
            where
                D: Kernels<E>,
            {
                FillKernel::<E>::try_clamp(dev, grad, self.0)
            }
        }
        for_each_trainable_grad(
            self.target.master(),
            &mut self.master,
            &mut Clamp(clip_value),
        )?;
        Ok(())
    }

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
        let grads = target.recycle(master, working)?;
        Ok(StepOutcome {
            found_inf,
            non_finite_params: non_finite,
            overflow: crate::watch::overflowing_layer(&layers),
            layers,
            scalers,
            grads,
            kind: PhantomData,
        })
    }
}

impl<'t, T: TrainTarget<D>, D: AmpDevice> UnscaledGrads<'t, T, D, FromScaler> {
    /// Adds another loss's gradients of the same model, scaled by its own scaler, into these
    /// (Apex's one scaler per loss: each loss is scaled and backward with its own scaler, then
    /// the gradients are unscaled into one sum for one step). The step is skipped if either
    /// held inf or NaN; [`LossScalers::update`](crate::LossScalers::update) backs off only the
    /// scalers whose loss overflowed.
    pub fn merge(&mut self, scaler: &GradScaler, other: ScaledGrads<D>) -> Result<(), AmpError> {
        let ScaledGrads {
            mut grads,
            scale,
            scaler: id,
        } = other;
        scaler.check_tag(id)?;
        if self.scalers.iter().any(|(s, _)| *s == id) {
            return Err(AmpError::ScalerMismatch(
                "these gradients already hold a loss of this scaler: accumulate one scaler's losses in one backward (or an accumulation window)",
            ));
        }
        check_owner(&*self.target, &grads)?;
        let (other_master, flags) = self
            .target
            .unscale_into_master(&mut grads, inverse(scale))?;
        add_master_grads(&*self.target, &mut self.master, &other_master)?;
        let found: Vec<String> = self
            .target
            .layout()
            .iter()
            .filter(|p| p.trainable)
            .zip(&flags)
            .filter(|(_, flag)| **flag)
            .map(|(p, _)| p.path.clone())
            .collect();
        let other_inf = !found.is_empty();
        self.found_inf |= other_inf;
        for path in found {
            if !self.non_finite.contains(&path) {
                self.non_finite.push(path);
            }
        }
        self.scalers.push((id, other_inf));
        Ok(())
    }
}

/// `into += from`, parameter by parameter, for master gradients of one model.
fn add_master_grads<T: TrainTarget<D>, D: AmpDevice>(
    target: &T,
    into: &mut MixedGradients<D>,
    from: &MixedGradients<D>,
) -> Result<(), AmpError> {
    struct AddVisit<'g, D: AmpDevice> {
        into: &'g mut MixedGradients<D>,
        from: &'g MixedGradients<D>,
    }
    impl<D: AmpDevice> crate::params::ParamVisitor<D> for AddVisit<'_, D> {
        type Error = AmpError;
        fn visit<S: Shape, E: AmpElem>(
            &mut self,
            _path: &str,
            param: &Tensor<S, E, D>,
            trainable: bool,
        ) -> Result<(), AmpError>
        where
            D: Kernels<E>,
        {
            if !trainable {
                return Ok(());
            }
            let Some(src) = self
                .from
                .store::<E>()
                .and_then(|g| g.get_ref_checked(param))
            else {
                return Ok(());
            };
            let dst = self
                .into
                .store_mut::<E>()
                .get_or_alloc_mut(param)
                .map_err(AmpError::device)?;
            CastKernel::<E, E>::try_add_cast(param.device(), src, dst).map_err(AmpError::device)
        }
    }
    target.master().visit_params(&mut AddVisit { into, from })
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
    grads: &mut MixedGradients<D>,
) -> Result<Vec<f32>, AmpError> {
    struct SumSquares<D: AmpDevice> {
        slots: usize,
        stats: Option<<D as crate::ops::utilities::StatsDevice>::Stats>,
    }
    impl<D: AmpDevice> GradOp<D> for SumSquares<D> {
        fn apply<E: AmpElem>(
            &mut self,
            dev: &D,
            slot: usize,
            grad: &mut <D as Storage<E>>::Vec,
        ) -> Result<(), D::Err>
        where
            D: Kernels<E>,
        {
            let stats = match &mut self.stats {
                Some(stats) => stats,
                None => self.stats.insert(dev.try_alloc_stats(self.slots)?),
            };
            ReduceKernel::<E>::try_sum_squares(dev, grad, stats, slot)
        }
    }
    let mut op = SumSquares::<D> {
        slots: target.layout().iter().filter(|p| p.trainable).count(),
        stats: None,
    };
    let device = for_each_trainable_grad(target.master(), grads, &mut op)?;
    match (device, op.stats) {
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

/// Scales all master gradients so that their global 2-norm is at most `max_norm`, as PyTorch's
/// `clip_grad_norm_`: the factor is `max_norm / (norm + 1e-6)`, applied only when below 1.
/// Returns the norm before clipping (inf or NaN after an overflow, in which case the step will
/// be skipped anyway).
///
/// Takes only unscaled gradients: clipping scaled ones would clip at `max_norm × scale`.
pub fn clip_grad_norm<'t, D: AmpDevice, G: Unscaled<'t, D>>(
    grads: &mut G,
    max_norm: f32,
) -> Result<f32, AmpError>
where
    G::Kind: ReadyForStep,
{
    grads.as_unscaled_mut().clip_norm(max_norm)
}

/// Clamps every master gradient element to `[-clip_value, clip_value]`, as PyTorch's
/// `clip_grad_value_`. Takes only unscaled gradients.
pub fn clip_grad_value<'t, D: AmpDevice, G: Unscaled<'t, D>>(
    grads: &mut G,
    clip_value: f32,
) -> Result<(), AmpError>
where
    G::Kind: ReadyForStep,
{
    grads.as_unscaled_mut().clip_value(clip_value)
}

/// What a step did, and the gradients for the next iteration.
///
/// With a scaler ([`FromScaler`]), the only way to the next gradients is
/// [`GradScaler::update`], which consumes every outcome of the iteration; without one
/// ([`ScaleFree`]), [`StepOutcome::into_grads`].
#[must_use = "pass the outcome to `scaler.update(..)`: it returns the gradients for the next iteration"]
pub struct StepOutcome<D: AmpDevice, K: StepKind = FromScaler> {
    found_inf: bool,
    non_finite_params: Vec<String>,
    layers: Vec<crate::watch::LayerReport>,
    overflow: Option<crate::watch::Overflow>,
    scalers: Vec<(ScalerId, bool)>,
    grads: MixedGradients<D>,
    kind: PhantomData<K>,
}

impl<D: AmpDevice, K: StepKind> std::fmt::Debug for StepOutcome<D, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepOutcome")
            .field("skipped", &self.found_inf)
            .field("non_finite_params", &self.non_finite_params)
            .finish_non_exhaustive()
    }
}

impl<D: AmpDevice, K: StepKind> StepOutcome<D, K> {
    /// Whether the optimizer step was skipped because a gradient was inf or NaN.
    pub fn skipped(&self) -> bool {
        self.found_inf
    }

    /// Paths of the parameters whose gradients were inf or NaN.
    pub fn non_finite_params(&self) -> &[String] {
        &self.non_finite_params
    }

    /// Per-layer magnitudes of the pass, when watching ([`MixedGradients::watch_layers`]).
    pub fn layers(&self) -> &[crate::watch::LayerReport] {
        &self.layers
    }

    /// The layer where values first stopped being finite, when watching.
    pub fn overflow(&self) -> Option<&crate::watch::Overflow> {
        self.overflow.as_ref()
    }
}

impl<D: AmpDevice> StepOutcome<D, ScaleFree> {
    /// The zeroed gradients, to trace the next iteration with.
    pub fn into_grads(self) -> MixedGradients<D> {
        self.grads
    }
}

/// The outcomes of one iteration's steps, consumed by [`GradScaler::update`]: one
/// [`StepOutcome`], a tuple of them, an array or a `Vec` (several optimizers sharing a scaler).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not the outcome of a step taken with a loss scaler",
    note = "`scaler.update(..)` takes what `scaler.step(..)` returned: one outcome, or a tuple, array or Vec of the outcomes of every optimizer that shared the scaler"
)]
pub trait StepOutcomes<D: AmpDevice> {
    /// The next iteration's gradients, one per outcome.
    type Grads;
    /// Calls `f` with each outcome's scalers and flags.
    #[doc(hidden)]
    fn for_each_flag(&self, f: &mut dyn FnMut(ScalerId, bool));
    /// The gradients, in the same shape as the outcomes.
    #[doc(hidden)]
    fn into_grads(self) -> Self::Grads;
}

/// Implements an outcomes trait ([`StepOutcomes`], or the data-parallel `ReducedOutcomes`)
/// for one [`StepOutcome`] of step kind `$kind`, and for tuples, arrays and `Vec`s of outcomes.
/// The traits stay apart so that each names its own rule when an outcome does not fit.
macro_rules! outcome_impls {
    ($outcomes:ident, $kind:ty) => {
        impl<D: $crate::AmpDevice> $outcomes<D> for $crate::StepOutcome<D, $kind> {
            type Grads = $crate::MixedGradients<D>;
            fn for_each_flag(&self, f: &mut dyn FnMut($crate::scaler::ScalerId, bool)) {
                for (id, found) in self.scaler_flags() {
                    f(*id, *found);
                }
            }
            fn into_grads(self) -> $crate::MixedGradients<D> {
                self.into_next_grads()
            }
        }

        $crate::step::outcome_impls!(@tuple $outcomes [A 0, B 1]);
        $crate::step::outcome_impls!(@tuple $outcomes [A 0, B 1, C 2]);
        $crate::step::outcome_impls!(@tuple $outcomes [A 0, B 1, C 2, F 3]);

        impl<D: $crate::AmpDevice, O: $outcomes<D>, const N: usize> $outcomes<D> for [O; N] {
            type Grads = [O::Grads; N];
            fn for_each_flag(&self, f: &mut dyn FnMut($crate::scaler::ScalerId, bool)) {
                for o in self {
                    o.for_each_flag(f);
                }
            }
            fn into_grads(self) -> Self::Grads {
                self.map($outcomes::into_grads)
            }
        }

        impl<D: $crate::AmpDevice, O: $outcomes<D>> $outcomes<D> for Vec<O> {
            type Grads = Vec<O::Grads>;
            fn for_each_flag(&self, f: &mut dyn FnMut($crate::scaler::ScalerId, bool)) {
                for o in self {
                    o.for_each_flag(f);
                }
            }
            fn into_grads(self) -> Self::Grads {
                self.into_iter().map($outcomes::into_grads).collect()
            }
        }
    };
    (@tuple $outcomes:ident [$($name:ident $idx:tt),+]) => {
        impl<D: $crate::AmpDevice, $($name: $outcomes<D>),+> $outcomes<D> for ($($name,)+) {
            type Grads = ($($name::Grads,)+);
            fn for_each_flag(&self, f: &mut dyn FnMut($crate::scaler::ScalerId, bool)) {
                $(self.$idx.for_each_flag(f);)+
            }
            fn into_grads(self) -> Self::Grads {
                ($(self.$idx.into_grads(),)+)
            }
        }
    };
}

pub(crate) use outcome_impls;

outcome_impls!(StepOutcomes, FromScaler);

/// PyTorch computes the reciprocal of the scale in double precision, then rounds to float.
pub(crate) fn inverse(scale: f32) -> f32 {
    (1.0f64 / f64::from(scale)) as f32
}

impl GradScaler {
    /// Opens a gradient-accumulation window over `grads` (usually a model's zeroed gradients,
    /// or what the last [`GradScaler::update`] returned) at the current scale. See
    /// [`Accumulation`].
    pub fn accumulate<D: AmpDevice>(&self, grads: MixedGradients<D>) -> Accumulation<'_, D> {
        Accumulation {
            scaler: PhantomData,
            id: self.id(),
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
        let ScaledGrads {
            grads,
            scale,
            scaler,
        } = grads.into_scaled();
        self.check_tag(scaler)?;
        into_master(target, grads, inverse(scale), vec![(scaler, false)])
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

impl<D: AmpDevice> Loss<D> {
    /// Runs backward without a loss scale: every parameter's gradient lands in that
    /// parameter's own precision. For models whose working precision has FP32's exponent range
    /// (BF16, FP32), which [`RawGrads::check`] requires.
    pub fn backward(self) -> Result<RawGrads<D>, AmpError> {
        Ok(RawGrads::new(backward_seeded(self, 1.0)?))
    }
}

/// What [`crate::distributed`] needs of the step's values: it builds the data-parallel stages
/// out of the same gradients and outcomes.
impl<'t, T: TrainTarget<D>, D: AmpDevice, K: StepKind> UnscaledGrads<'t, T, D, K> {
    /// The model and the master gradients, for a reduction across ranks.
    pub(crate) fn target_and_master(&mut self) -> (&T, &mut MixedGradients<D>) {
        (&*self.target, &mut self.master)
    }

    /// The scalers these gradients hold losses of.
    pub(crate) fn scaler_ids(&self) -> impl Iterator<Item = ScalerId> + '_ {
        self.scalers.iter().map(|(id, _)| *id)
    }

    /// The same gradients as kind `K2`, with `found_inf` as the overflow flag of the step (and of
    /// every loss they hold).
    pub(crate) fn into_kind<K2: StepKind>(self, found_inf: bool) -> UnscaledGrads<'t, T, D, K2> {
        let UnscaledGrads {
            target,
            master,
            working,
            non_finite,
            layers,
            scalers,
            ..
        } = self;
        UnscaledGrads {
            target,
            master,
            working,
            found_inf,
            non_finite,
            layers,
            scalers: scalers.into_iter().map(|(id, _)| (id, found_inf)).collect(),
            kind: PhantomData,
        }
    }
}

impl<D: AmpDevice, K: StepKind> StepOutcome<D, K> {
    /// The same outcome as kind `K2`.
    pub(crate) fn into_kind<K2: StepKind>(self) -> StepOutcome<D, K2> {
        let StepOutcome {
            found_inf,
            non_finite_params,
            layers,
            overflow,
            scalers,
            grads,
            ..
        } = self;
        StepOutcome {
            found_inf,
            non_finite_params,
            layers,
            overflow,
            scalers,
            grads,
            kind: PhantomData,
        }
    }

    /// The scalers of the step, with their overflow flags.
    pub(crate) fn scaler_flags(&self) -> &[(ScalerId, bool)] {
        &self.scalers
    }

    /// The zeroed gradients for the next iteration.
    pub(crate) fn into_next_grads(self) -> MixedGradients<D> {
        self.grads
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
