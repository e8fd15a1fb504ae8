//! Constructors of the optimizers over FP32 master weights.

use dfdx::optim::{Adam, Sgd};
use dfdx::prelude::{AdamConfig, WeightDecay};

use crate::device::AmpDevice;

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
