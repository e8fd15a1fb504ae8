//! ReLU as an op on tensors: how a device runs it, dfdx's op by default.

use dfdx::prelude::{HasErr, Shape, Tape, Tensor};

use crate::device::{AmpDevice, Kernels};
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// How a device runs ReLU on activations of element type `E`: the default is dfdx's op; a
/// device with [`ReluKernel`](super::ReluKernel)s fuses it into the op before it where that op offers
/// ([`super::try_relu_fused`]).
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait ReluOp<E: AmpElem>: HasErr + Sized {
    /// `max(x, 0)`.
    fn try_relu<S: Shape, T>(x: Tensor<S, E, Self, T>) -> Result<Tensor<S, E, Self, T>, Self::Err>
    where
        Self: AmpDevice + Kernels<E>,
        T: AmpTape<Self> + Tape<E, Self>,
    {
        x.try_relu()
    }
}
