//! [`LowPrecisionUpdates`]: the explicit opt-in for updating 16-bit weights (O3).

use dfdx::nn::TensorCollection;
use dfdx::optim::{Adam, Optimizer, RMSprop, Sgd};
use dfdx::prelude::AdamConfig;

use crate::device::{AmpDevice, Kernels};
use crate::error::AmpError;
use crate::precision::{AmpElem, LowPrecision};
use crate::tape::MixedGradients;

use super::master_optimizer::{map_update_error, store_of, MasterOptimizer};

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
