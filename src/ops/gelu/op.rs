//! Exact GELU as an op on tensors: how a device runs it, dfdx's op by default.

use dfdx::prelude::{HasErr, Shape, Tape, Tensor};

use crate::device::{AmpDevice, Kernels};
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// How a device runs exact GELU (`x·Φ(x)`) on activations of element type `E`: the default is
/// dfdx's `accurate_gelu` (its own output buffer, and a backward that writes the input's
/// gradient into a buffer of its own); a device with [`GeluKernel`](super::GeluKernel)s fuses it
/// into the linear op before it where that op offers ([`super::try_gelu_fused`]).
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait GeluOp<E: AmpElem>: HasErr + Sized {
    /// `x·Φ(x)`.
    fn try_gelu<S: Shape, T>(x: Tensor<S, E, Self, T>) -> Result<Tensor<S, E, Self, T>, Self::Err>
    where
        Self: AmpDevice + Kernels<E>,
        T: AmpTape<Self> + Tape<E, Self>,
    {
        x.try_accurate_gelu()
    }
}
