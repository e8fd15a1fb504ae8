//! Optimizers over FP32 master weights: dfdx's [`Sgd`], [`Adam`] (AdamW through
//! [`adamw_config`]) and [`RMSprop`], admitted only when they update FP32 weights, and
//! [`LowPrecisionUpdates`], the explicit opt-in for updating 16-bit weights (O3).

use dfdx::nn::TensorCollection;
use dfdx::optim::{Adam, Optimizer, OptimizerUpdateError, RMSprop, Sgd};
use dfdx::prelude::{AdamConfig, Gradients, SgdConfig, Shape, Tensor, WeightDecay};

use crate::device::{AmpDevice, CastKernel, Kernels, UpdateKernel};
use crate::error::AmpError;
use crate::master::{PairVisitor, Paired};
use crate::precision::{AmpElem, LowPrecision, UpdatablePrecision};
use crate::tape::MixedGradients;

/// An optimizer that updates the master module `M` (FP32, by rule [`UpdatablePrecision`]).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot update `{M}`: optimizers update FP32 master weights only",
    label = "this optimizer does not update the FP32 master module",
    note = "build the optimizer on the master module, e.g. `Sgd::new(model.master(), config)`: its weights are FP32, unlike the 16-bit working copy"
)]
pub trait MasterOptimizer<M, D: AmpDevice> {
    /// Applies one update to `master` from its unscaled gradients.
    fn try_update(&mut self, master: &mut M, grads: &MixedGradients<D>) -> Result<(), AmpError>;

    /// Applies one update to `master` and refreshes its working copy `working`: weights master
    /// → working, buffers (batch norm statistics) working → master. Adam and SGD do it in one
    /// pass per parameter where the device has fused kernels ([`UpdateKernel`]); any other
    /// optimizer updates, then refreshes.
    fn try_update_paired<W>(
        &mut self,
        master: &mut M,
        working: &mut W,
        grads: &MixedGradients<D>,
    ) -> Result<(), AmpError>
    where
        M: Paired<W, D>,
    {
        self.try_update(master, grads)?;
        crate::master::refresh_pair(master, working)
    }
}

/// The gradients of precision `E` in `grads`, or an empty store if no parameter of that
/// precision has one.
fn store_of<E: AmpElem, D: AmpDevice + Kernels<E>>(
    grads: &MixedGradients<D>,
) -> std::borrow::Cow<'_, Gradients<E, D>> {
    match grads.store::<E>() {
        Some(store) => std::borrow::Cow::Borrowed(store),
        None => std::borrow::Cow::Owned(Gradients::leaky()),
    }
}

fn map_update_error<Err: std::fmt::Display>(err: OptimizerUpdateError<Err>) -> AmpError {
    match err {
        // Every trainable master parameter receives a gradient (zero when unused), so this
        // means the optimizer was built for another module.
        OptimizerUpdateError::UnusedParams(unused) => AmpError::Optimizer(format!(
            "{} parameters had no gradient: was the optimizer built for this model?",
            unused.ids.len()
        )),
        OptimizerUpdateError::DeviceError(err) => AmpError::device(err),
    }
}

macro_rules! master_optimizer {
    ($($opt:ident => $fused:expr),*) => {$(
        impl<M, E, D> MasterOptimizer<M, D> for $opt<M, E, D>
        where
            M: TensorCollection<E, D>,
            E: AmpElem,
            E::Precision: UpdatablePrecision,
            D: AmpDevice + Kernels<E>,
        {
            fn try_update(&mut self, master: &mut M, grads: &MixedGradients<D>) -> Result<(), AmpError> {
                Optimizer::update(self, master, &store_of::<E, D>(grads)).map_err(map_update_error)
            }

            fn try_update_paired<W>(
                &mut self,
                master: &mut M,
                working: &mut W,
                grads: &MixedGradients<D>,
            ) -> Result<(), AmpError>
            where
                M: Paired<W, D>,
            {
                #[allow(clippy::redundant_closure_call)]
                ($fused)(self, master, working, grads)
            }
        }
    )*};
}

master_optimizer!(
    Sgd => fused_sgd,
    Adam => fused_adam,
    RMSprop => |opt: &mut RMSprop<M, E, D>, master: &mut M, working: &mut W, grads: &MixedGradients<D>| {
        opt.try_update(master, grads)?;
        crate::master::refresh_pair(master, working)
    }
);

/// The state store of an optimizer over FP32 masters, as the FP32 store it is (rule
/// [`UpdatablePrecision`] admits `E = f32` only).
fn fp32_state<E: AmpElem, D: AmpDevice + Kernels<E>>(
    store: &mut Gradients<E, D>,
) -> &mut Gradients<f32, D> {
    (store as &mut dyn std::any::Any)
        .downcast_mut()
        .expect("optimizers over master weights hold FP32 state (rule UpdatablePrecision)")
}

/// Counts the parameters without a gradient, as dfdx's optimizers do.
fn unused_error(unused: usize) -> Result<(), AmpError> {
    if unused == 0 {
        Ok(())
    } else {
        Err(AmpError::Optimizer(format!(
            "{unused} parameters had no gradient: was the optimizer built for this model?"
        )))
    }
}

/// Adam's update fused with the refresh, pair by pair.
fn fused_adam<M, W, E, D>(
    opt: &mut Adam<M, E, D>,
    master: &mut M,
    working: &mut W,
    grads: &MixedGradients<D>,
) -> Result<(), AmpError>
where
    M: Paired<W, D>,
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
{
    struct Visit<'a, D: AmpDevice> {
        t: i32,
        cfg: AdamConfig,
        moments: (&'a mut Gradients<f32, D>, &'a mut Gradients<f32, D>),
        grads: &'a Gradients<f32, D>,
        unused: usize,
    }
    impl<D: AmpDevice> PairVisitor<D> for Visit<'_, D> {
        type Error = AmpError;
        fn visit_pair<Sm: Shape, Sw: Shape, W: AmpElem>(
            &mut self,
            path: &str,
            master: &mut Tensor<Sm, f32, D>,
            working: &mut Tensor<Sw, W, D>,
            trainable: bool,
        ) -> Result<(), AmpError>
        where
            D: Kernels<W>,
        {
            let Some(grad) = self.grads.get_ref_checked(master).filter(|_| trainable) else {
                self.unused += usize::from(trainable);
                return refresh_one(path, master, working, trainable);
            };
            let dev = master.device().clone();
            let m1 = self
                .moments
                .0
                .get_or_alloc_mut(master)
                .map_err(AmpError::device)?;
            let m2 = self
                .moments
                .1
                .get_or_alloc_mut(master)
                .map_err(AmpError::device)?;
            UpdateKernel::<W>::try_adam_refresh(
                &dev,
                self.t,
                &self.cfg,
                master,
                m1,
                m2,
                grad,
                working.storage_mut(),
            )
            .map_err(AmpError::device)
        }
    }
    // dfdx counts the step before updating, and keeps the count if a parameter had no gradient.
    let t = opt
        .step_count()
        .checked_add(1)
        .ok_or_else(|| AmpError::Optimizer("Adam's step count overflowed".to_string()))?;
    opt.set_step_count(t);
    let cfg = opt.cfg;
    let (m1, m2) = opt.moments_mut();
    let empty = Gradients::leaky();
    let mut visit = Visit {
        t,
        cfg,
        moments: (fp32_state(m1), fp32_state(m2)),
        grads: grads.store::<f32>().unwrap_or(&empty),
        unused: 0,
    };
    master.visit_pairs(working, &mut visit)?;
    unused_error(visit.unused)
}

/// SGD's update fused with the refresh, pair by pair.
fn fused_sgd<M, W, E, D>(
    opt: &mut Sgd<M, E, D>,
    master: &mut M,
    working: &mut W,
    grads: &MixedGradients<D>,
) -> Result<(), AmpError>
where
    M: Paired<W, D>,
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
{
    struct Visit<'a, D: AmpDevice> {
        cfg: SgdConfig,
        velocity: &'a mut Gradients<f32, D>,
        grads: &'a Gradients<f32, D>,
        unused: usize,
    }
    impl<D: AmpDevice> PairVisitor<D> for Visit<'_, D> {
        type Error = AmpError;
        fn visit_pair<Sm: Shape, Sw: Shape, W: AmpElem>(
            &mut self,
            path: &str,
            master: &mut Tensor<Sm, f32, D>,
            working: &mut Tensor<Sw, W, D>,
            trainable: bool,
        ) -> Result<(), AmpError>
        where
            D: Kernels<W>,
        {
            let Some(grad) = self.grads.get_ref_checked(master).filter(|_| trainable) else {
                self.unused += usize::from(trainable);
                return refresh_one(path, master, working, trainable);
            };
            let dev = master.device().clone();
            let v = self
                .velocity
                .get_or_alloc_mut(master)
                .map_err(AmpError::device)?;
            UpdateKernel::<W>::try_sgd_refresh(
                &dev,
                &self.cfg,
                master,
                v,
                grad,
                working.storage_mut(),
            )
            .map_err(AmpError::device)
        }
    }
    let cfg = opt.cfg;
    let empty = Gradients::leaky();
    let mut visit = Visit {
        cfg,
        velocity: fp32_state(opt.velocity_mut()),
        grads: grads.store::<f32>().unwrap_or(&empty),
        unused: 0,
    };
    master.visit_pairs(working, &mut visit)?;
    unused_error(visit.unused)
}

/// The refresh of one pair that the optimizer did not update: a buffer (working → master), or
/// a weight without a gradient (master → working).
fn refresh_one<Sm: Shape, Sw: Shape, W: AmpElem, D: AmpDevice + Kernels<W>>(
    _path: &str,
    master: &mut Tensor<Sm, f32, D>,
    working: &mut Tensor<Sw, W, D>,
    trainable: bool,
) -> Result<(), AmpError> {
    let dev = master.device().clone();
    if trainable {
        CastKernel::<f32, W>::try_copy_cast(&dev, master.storage(), working.storage_mut())
    } else {
        CastKernel::<W, f32>::try_copy_cast(&dev, working.storage(), master.storage_mut())
    }
    .map_err(AmpError::device)
}

/// The explicit opt-in for updating 16-bit weights directly (Apex's O3, [`Fp16Weights`]
/// models): wraps a dfdx optimizer over an FP16 or BF16 module.
///
/// Updates of FP16 weights lose every step smaller than half a unit in the last place of the
/// weight (`|Δw| < |w|·2^-11`; BF16: `|w|·2^-8`), which is why typed-amp otherwise admits only
/// optimizers over FP32 master weights.
///
/// [`Fp16Weights`]: crate::master::Fp16Weights
#[derive(Debug, Clone)]
pub struct LowPrecisionUpdates<O>(pub O);

impl<M, E: AmpElem, D: AmpDevice + Kernels<E>> LowPrecisionUpdates<Sgd<M, E, D>>
where
    E::Precision: LowPrecision,
{
    /// SGD over 16-bit weights, opted in.
    pub fn sgd(weights: &M, config: dfdx::prelude::SgdConfig) -> Self {
        LowPrecisionUpdates(Sgd::new(weights, config))
    }
}

impl<M, E: AmpElem, D: AmpDevice + Kernels<E>> LowPrecisionUpdates<Adam<M, E, D>>
where
    E::Precision: LowPrecision,
{
    /// Adam over 16-bit weights, opted in.
    pub fn adam(weights: &M, config: AdamConfig) -> Self {
        LowPrecisionUpdates(Adam::new(weights, config))
    }
}

macro_rules! low_precision_optimizer {
    ($($opt:ident),*) => {$(
        impl<M, E, D> MasterOptimizer<M, D> for LowPrecisionUpdates<$opt<M, E, D>>
        where
            M: TensorCollection<E, D>,
            E: AmpElem,
            E::Precision: LowPrecision,
            D: AmpDevice + Kernels<E>,
        {
            fn try_update(&mut self, master: &mut M, grads: &MixedGradients<D>) -> Result<(), AmpError> {
                self.0.update(master, &store_of::<E, D>(grads)).map_err(map_update_error)
            }
        }
    )*};
}

low_precision_optimizer!(Sgd, Adam, RMSprop);

/// SGD over FP32 master weights (dfdx's [`Sgd`] with its element type fixed to `f32`, so
/// nothing else needs annotating).
pub fn sgd<M, D: AmpDevice>(master: &M, config: dfdx::prelude::SgdConfig) -> Sgd<M, f32, D> {
    Sgd::new(master, config)
}

/// Adam over FP32 master weights (dfdx's [`Adam`]).
pub fn adam<M, D: AmpDevice>(master: &M, config: AdamConfig) -> Adam<M, f32, D> {
    Adam::new(master, config)
}

/// AdamW over FP32 master weights: Adam with decoupled weight decay ([`adamw_config`]).
pub fn adamw<M, D: AmpDevice>(master: &M, lr: f64, weight_decay: f64) -> Adam<M, f32, D> {
    Adam::new(master, adamw_config(lr, weight_decay))
}

/// AdamW's configuration: Adam with decoupled weight decay (Loshchilov & Hutter), PyTorch's
/// `AdamW(lr, betas=(0.9, 0.999), eps=1e-8, weight_decay)`.
pub fn adamw_config(lr: f64, weight_decay: f64) -> AdamConfig {
    AdamConfig {
        lr,
        betas: [0.9, 0.999],
        eps: 1e-8,
        weight_decay: Some(WeightDecay::Decoupled(weight_decay)),
    }
}

/// A borrowed optimizer state store (momentum, a moment), in the optimizer's precision.
pub struct StateRef<'a>(&'a dyn std::any::Any);

/// A mutably borrowed optimizer state store.
pub struct StateMut<'a>(&'a mut dyn std::any::Any);

impl<'a> StateRef<'a> {
    /// Wraps a store.
    pub fn new<E: AmpElem, D: AmpDevice + Kernels<E>>(store: &'a Gradients<E, D>) -> Self {
        StateRef(store)
    }

    /// The store, if it is of precision `E`.
    pub fn get<E: AmpElem, D: AmpDevice + Kernels<E>>(&self) -> Option<&'a Gradients<E, D>> {
        self.0.downcast_ref()
    }
}

impl<'a> StateMut<'a> {
    /// Wraps a store.
    pub fn new<E: AmpElem, D: AmpDevice + Kernels<E>>(store: &'a mut Gradients<E, D>) -> Self {
        StateMut(store)
    }

    /// The store, if it is of precision `E`.
    pub fn get<E: AmpElem, D: AmpDevice + Kernels<E>>(&mut self) -> Option<&mut Gradients<E, D>> {
        self.0.downcast_mut()
    }
}

/// An optimizer whose state can be saved and restored, so that a resumed run continues exactly.
///
/// State is a few named per-parameter stores in the optimizer's precision (SGD's `velocity`,
/// Adam's `moment1` and `moment2`) and a few named scalars (Adam's step count).
pub trait OptimizerState<D: AmpDevice> {
    /// A name for checkpoints (`"sgd"`, `"adam"`, `"rmsprop"`).
    fn kind(&self) -> &'static str;
    /// The per-parameter state stores, by name.
    fn stores(&self) -> Vec<(&'static str, StateRef<'_>)>;
    /// The per-parameter state stores, mutably.
    fn stores_mut(&mut self) -> Vec<(&'static str, StateMut<'_>)>;
    /// Scalar state, by name.
    fn scalars(&self) -> Vec<(&'static str, i64)>;
    /// Restores one scalar; errors on a name this optimizer does not have.
    fn set_scalar(&mut self, name: &str, value: i64) -> Result<(), AmpError>;
}

impl<M, E: AmpElem, D: AmpDevice + Kernels<E>> OptimizerState<D> for Sgd<M, E, D> {
    fn kind(&self) -> &'static str {
        "sgd"
    }
    fn stores(&self) -> Vec<(&'static str, StateRef<'_>)> {
        vec![("velocity", StateRef::new(self.velocity()))]
    }
    fn stores_mut(&mut self) -> Vec<(&'static str, StateMut<'_>)> {
        vec![("velocity", StateMut::new(self.velocity_mut()))]
    }
    fn scalars(&self) -> Vec<(&'static str, i64)> {
        Vec::new()
    }
    fn set_scalar(&mut self, name: &str, _value: i64) -> Result<(), AmpError> {
        Err(AmpError::Optimizer(format!(
            "SGD has no scalar state `{name}`"
        )))
    }
}

impl<M, E: AmpElem, D: AmpDevice + Kernels<E>> OptimizerState<D> for Adam<M, E, D> {
    fn kind(&self) -> &'static str {
        "adam"
    }
    fn stores(&self) -> Vec<(&'static str, StateRef<'_>)> {
        let (m1, m2) = self.moments();
        vec![
            ("moment1", StateRef::new(m1)),
            ("moment2", StateRef::new(m2)),
        ]
    }
    fn stores_mut(&mut self) -> Vec<(&'static str, StateMut<'_>)> {
        let (m1, m2) = self.moments_mut();
        vec![
            ("moment1", StateMut::new(m1)),
            ("moment2", StateMut::new(m2)),
        ]
    }
    fn scalars(&self) -> Vec<(&'static str, i64)> {
        vec![("step_count", i64::from(self.step_count()))]
    }
    fn set_scalar(&mut self, name: &str, value: i64) -> Result<(), AmpError> {
        match name {
            "step_count" => {
                let t = i32::try_from(value).map_err(|_| {
                    AmpError::Optimizer(format!("Adam step count {value} is out of range"))
                })?;
                self.set_step_count(t);
                Ok(())
            }
            other => Err(AmpError::Optimizer(format!(
                "Adam has no scalar state `{other}`"
            ))),
        }
    }
}

impl<O: OptimizerState<D>, D: AmpDevice> OptimizerState<D> for LowPrecisionUpdates<O> {
    fn kind(&self) -> &'static str {
        self.0.kind()
    }
    fn stores(&self) -> Vec<(&'static str, StateRef<'_>)> {
        self.0.stores()
    }
    fn stores_mut(&mut self) -> Vec<(&'static str, StateMut<'_>)> {
        self.0.stores_mut()
    }
    fn scalars(&self) -> Vec<(&'static str, i64)> {
        self.0.scalars()
    }
    fn set_scalar(&mut self, name: &str, value: i64) -> Result<(), AmpError> {
        self.0.set_scalar(name, value)
    }
}

/// An optimizer whose learning rate can be read and changed between steps (for schedules).
pub trait LearningRate {
    /// The current learning rate.
    fn learning_rate(&self) -> f64;
    /// Sets the learning rate for the following steps.
    fn set_learning_rate(&mut self, lr: f64);
}

macro_rules! learning_rate {
    ($($opt:ident),*) => {$(
        impl<M, E: dfdx::prelude::Dtype, D: dfdx::prelude::Storage<E>> LearningRate for $opt<M, E, D> {
            fn learning_rate(&self) -> f64 {
                self.cfg.lr
            }
            fn set_learning_rate(&mut self, lr: f64) {
                self.cfg.lr = lr;
            }
        }
    )*};
}

learning_rate!(Sgd, Adam, RMSprop);

impl<O: LearningRate> LearningRate for LowPrecisionUpdates<O> {
    fn learning_rate(&self) -> f64 {
        self.0.learning_rate()
    }
    fn set_learning_rate(&mut self, lr: f64) {
        self.0.set_learning_rate(lr);
    }
}

/// Cosine annealing from `base_lr` at step 0 to 0 at step `total_steps` (Loshchilov & Hutter's
/// SGDR without restarts, as PyTorch's `CosineAnnealingLR` with `eta_min = 0`).
///
/// ```rust
/// # use typed_amp::optim::cosine_lr;
/// assert_eq!(cosine_lr(0.1, 0, 100), 0.1);
/// assert!((cosine_lr(0.1, 50, 100) - 0.05).abs() < 1e-12);
/// assert_eq!(cosine_lr(0.1, 100, 100), 0.0);
/// ```
pub fn cosine_lr(base_lr: f64, step: u64, total_steps: u64) -> f64 {
    if total_steps == 0 || step >= total_steps {
        return 0.0;
    }
    let progress = step as f64 / total_steps as f64;
    base_lr * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
}
