//! Optimizers over FP32 master weights: dfdx's [`Sgd`], [`Adam`] (AdamW through
//! [`adamw_config`]) and [`RMSprop`], admitted only when they update FP32 weights.

use dfdx::nn::TensorCollection;
use dfdx::optim::{Adam, Optimizer, OptimizerUpdateError, RMSprop, Sgd};
use dfdx::prelude::{AdamConfig, Gradients, WeightDecay};

use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::precision::{AmpElem, UpdatablePrecision};

/// An optimizer that updates the FP32 master module `M`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot update `{M}`: optimizers update FP32 master weights only",
    label = "this optimizer does not update the FP32 master module",
    note = "build the optimizer on the master module, e.g. `Sgd::new(model.master(), config)`: its weights are FP32, unlike the FP16 working copy"
)]
pub trait MasterOptimizer<M, D: AmpDevice> {
    /// Applies one update to `master` from its unscaled FP32 gradients.
    fn try_update(&mut self, master: &mut M, grads: &Gradients<f32, D>) -> Result<(), AmpError>;
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
            fn try_update(&mut self, master: &mut M, grads: &Gradients<f32, D>) -> Result<(), AmpError> {
                let grads = <E::Precision as UpdatablePrecision>::from_fp32_grads(grads);
                Optimizer::update(self, master, grads).map_err(map_update_error)
            }
        }
    )*};
}

master_optimizer!(Sgd, Adam, RMSprop);

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
