//! [`MasterOptimizer`]: the optimizers that update FP32 master weights, each with its fused
//! update-and-refresh where there is one.

use dfdx::nn::TensorCollection;
use dfdx::optim::{Adam, Optimizer, OptimizerUpdateError, RMSprop, Sgd};
use dfdx::prelude::Gradients;

use crate::device::{AmpDevice, Kernels};
use crate::error::AmpError;
use crate::master::Paired;
use crate::precision::{AmpElem, UpdatablePrecision};
use crate::tape::MixedGradients;

use super::fused_update::{fused_adam, fused_sgd};

/// An optimizer that updates the master module `M` (FP32, by rule [`UpdatablePrecision`]), and
/// whose learning rate a schedule reads and changes between steps.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot update `{M}`: optimizers update FP32 master weights only",
    label = "this optimizer does not update the FP32 master module",
    note = "build the optimizer on the master module, e.g. `Sgd::new(model.master(), config)`: its weights are FP32, unlike the 16-bit working copy"
)]
pub trait MasterOptimizer<M, D: AmpDevice> {
    /// Applies one update to `master` from its unscaled gradients.
    fn try_update(&mut self, master: &mut M, grads: &MixedGradients<D>) -> Result<(), AmpError>;

    /// The current learning rate.
    fn learning_rate(&self) -> f64;

    /// Sets the learning rate for the following steps (a schedule:
    /// [`cosine_lr`](crate::optim::cosine_lr)).
    fn set_learning_rate(&mut self, lr: f64);

    /// Applies one update to `master` and refreshes its working copy `working`: weights master
    /// → working, buffers (batch norm statistics) working → master. Adam and SGD do it in one
    /// pass per parameter where the device has fused kernels ([`UpdateKernel`](crate::device::UpdateKernel)); any other
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
pub(crate) fn store_of<E: AmpElem, D: AmpDevice + Kernels<E>>(
    grads: &MixedGradients<D>,
) -> std::borrow::Cow<'_, Gradients<E, D>> {
    match grads.store::<E>() {
        Some(store) => std::borrow::Cow::Borrowed(store),
        None => std::borrow::Cow::Owned(Gradients::leaky()),
    }
}

pub(crate) fn map_update_error<Err: std::fmt::Display>(err: OptimizerUpdateError<Err>) -> AmpError {
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

            fn learning_rate(&self) -> f64 {
                self.cfg.lr
            }

            fn set_learning_rate(&mut self, lr: f64) {
                self.cfg.lr = lr;
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
