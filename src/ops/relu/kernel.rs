//! ReLU's kernels' trait.

use dfdx::prelude::{HasErr, Shape, Storage, Tape, Tensor};

use crate::device::{AmpDevice, Kernels};
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// How a device runs ReLU on activations of element type `E`: the default is dfdx's op; a
/// device with [`ReluKernel`]s fuses it into the op before it where that op offers
/// ([`super::try_relu_fused`]).
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

/// ReLU's kernels, for fusing it into the op before it.
pub trait ReluKernel<E: AmpElem>: Storage<E> + HasErr {
    /// `y = max(y, 0)` in place.
    fn try_relu_in_place(&self, y: &mut <Self as Storage<E>>::Vec) -> Result<(), Self::Err>;

    /// ReLU's backward in place, by its output `out`: `grad = 0` where `out` is not positive.
    fn try_relu_mask(
        &self,
        out: &<Self as Storage<E>>::Vec,
        grad: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), Self::Err>;
}
