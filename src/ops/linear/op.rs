//! The linear layer as an op on tensors: how a device runs it, the layer's own forward by default.

use dfdx::nn::modules::Module;
use dfdx::prelude::{HasErr, Tensor};

use super::layer::{LinearInput, LinearParts};
use crate::device::{AmpDevice, Kernels};
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// How a device runs a linear layer (`y = x · Wᵀ + b`) on activations of element type `E`.
///
/// The default is the layer's own forward, dfdx's composition (a product and a broadcast add,
/// the weight's gradient in the layer's precision). A device with [`LinearKernel`](super::LinearKernel)s runs
/// [`super::try_linear_fused`].
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait LinearOp<E: AmpElem>: HasErr + Sized {
    /// `layer` on `x`.
    fn try_linear<S, const I: usize, const O: usize, T, L>(
        layer: &L,
        x: Tensor<S, E, Self, T>,
    ) -> Result<Tensor<S::Output, E, Self, T>, Self::Err>
    where
        Self: AmpDevice + Kernels<E>,
        S: LinearInput<I, O>,
        T: AmpTape<Self>,
        L: LinearParts<I, O, E, Self>
            + Module<Tensor<S, E, Self, T>, Output = Tensor<S::Output, E, Self, T>, Error = Self::Err>,
    {
        layer.try_forward(x)
    }
}
