//! [`LowPrecisionUpdates`]: the explicit opt-in for updating 16-bit weights (O3).

use dfdx::nn::TensorCollection;
use dfdx::optim::{Adam, Optimizer, RMSprop, Sgd};
use dfdx::prelude::AdamConfig;

use crate::device::{AmpDevice, Kernels};
use crate::error::AmpError;
use crate::precision::{AmpElem, LowPrecision};
use crate::tape::MixedGradients;

use crate::master::optimizer::{map_update_error, store_of, MasterOptimizer};

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

/// Errors with [`AmpError::EpsilonUnderflows`] if `eps` rounds to zero in `E`.
fn check_epsilon<E: AmpElem>(eps: Option<f64>) -> Result<(), AmpError> {
    match eps {
        Some(eps) if eps > 0.0 && AmpElem::to_f32(<E as AmpElem>::from_f32(eps as f32)) == 0.0 => {
            // The smallest positive value: the bits of 1 in the last place above zero.
            let smallest = AmpElem::to_f32(E::from_le_bytes(&{
                let mut one = vec![0u8; crate::precision::dtype_of::<E>().size_in_bytes()];
                one[0] = 1;
                one
            }));
            Err(AmpError::EpsilonUnderflows {
                eps,
                precision: crate::precision::dtype_of::<E>(),
                smallest,
            })
        }
        _ => Ok(()),
    }
}

macro_rules! low_precision_optimizer {
    ($($opt:ident => $eps:expr),*) => {$(
        impl<M, E, D> MasterOptimizer<M, D> for LowPrecisionUpdates<$opt<M, E, D>>
        where
            M: TensorCollection<E, D>,
            E: AmpElem,
            E::Precision: LowPrecision,
            D: AmpDevice + Kernels<E>,
        {
            /// Errors with [`AmpError::EpsilonUnderflows`], before anything changes, if the
            /// optimizer's eps (Adam, RMSprop) rounds to zero in `E`.
            fn try_update(&mut self, master: &mut M, grads: &MixedGradients<D>) -> Result<(), AmpError> {
                #[allow(clippy::redundant_closure_call)]
                check_epsilon::<E>(($eps)(&self.0))?;
                self.0.update(master, &store_of::<E, D>(grads)).map_err(map_update_error)
            }

            fn learning_rate(&self) -> f64 {
                self.0.cfg.lr
            }

            fn set_learning_rate(&mut self, lr: f64) {
                self.0.cfg.lr = lr;
            }
        }
    )*};
}

low_precision_optimizer!(
    Sgd => |_: &Sgd<M, E, D>| None,
    Adam => |o: &Adam<M, E, D>| Some(o.cfg.eps),
    RMSprop => |o: &RMSprop<M, E, D>| Some(o.cfg.eps)
);
