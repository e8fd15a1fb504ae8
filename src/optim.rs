//! Optimizers over FP32 master weights: dfdx's [`Sgd`], [`Adam`] (AdamW through
//! [`adamw_config`]) and [`RMSprop`], admitted only when they update FP32 weights.

use dfdx::nn::TensorCollection;
use dfdx::optim::{Adam, Optimizer, OptimizerUpdateError, RMSprop, Sgd};
use dfdx::prelude::{AdamConfig, WeightDecay};
use half::f16;

use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::precision::{AmpElem, AnyGrads, UpdatablePrecision};

/// An optimizer that updates the FP32 master module `M`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot update `{M}`: optimizers update FP32 master weights only",
    label = "this optimizer does not update the FP32 master module",
    note = "build the optimizer on the master module, e.g. `Sgd::new(model.master(), config)`: its weights are FP32, unlike the FP16 working copy"
)]
pub trait MasterOptimizer<M, D: AmpDevice> {
    /// Applies one update to `master` from its unscaled gradients.
    fn try_update(&mut self, master: &mut M, grads: &AnyGrads<D>) -> Result<(), AmpError>;
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
    ($($opt:ident),*) => {$(
        impl<M, E, D> MasterOptimizer<M, D> for $opt<M, E, D>
        where
            M: TensorCollection<E, D>,
            E: AmpElem,
            E::Precision: UpdatablePrecision,
            D: AmpDevice + dfdx::prelude::Device<E>,
        {
            fn try_update(&mut self, master: &mut M, grads: &AnyGrads<D>) -> Result<(), AmpError> {
                let grads = E::same_grads(grads).ok_or_else(|| mismatch::<E, D>(grads))?;
                Optimizer::update(self, master, grads).map_err(map_update_error)
            }
        }
    )*};
}

master_optimizer!(Sgd, Adam, RMSprop);

fn mismatch<E: AmpElem, D: AmpDevice>(grads: &AnyGrads<D>) -> AmpError {
    AmpError::Optimizer(format!(
        "the optimizer updates {} weights but the gradients are {}",
        crate::precision::dtype_of::<E>(),
        grads.dtype()
    ))
}

/// The explicit opt-in for updating FP16 weights directly (Apex's O3, [`Fp16Weights`]
/// models): wraps a dfdx optimizer over an FP16 module.
///
/// Updates of FP16 weights lose every step smaller than half a unit in the last place of the
/// weight (`|Δw| < |w|·2^-11`), which is why typed-amp otherwise admits only optimizers over FP32
/// master weights.
///
/// [`Fp16Weights`]: crate::master::Fp16Weights
#[derive(Debug, Clone)]
pub struct Fp16Updates<O>(pub O);

impl<M, D, O> MasterOptimizer<M, D> for Fp16Updates<O>
where
    D: AmpDevice,
    O: Optimizer<M, D, f16>,
{
    fn try_update(&mut self, master: &mut M, grads: &AnyGrads<D>) -> Result<(), AmpError> {
        let grads = f16::same_grads(grads).ok_or_else(|| mismatch::<f16, D>(grads))?;
        self.0.update(master, grads).map_err(map_update_error)
    }
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
