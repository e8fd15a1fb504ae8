//! ReLU's kernels' trait.

use dfdx::prelude::{HasErr, Storage};
use dfdx::tensor::CpuError;

use crate::precision::AmpElem;

/// ReLU's kernels, for fusing it into the op before it.
pub trait ReluKernel<E: AmpElem>: Storage<E> + HasErr<Err: From<CpuError>> {
    /// Whether the device has these kernels (else ReLU always runs as dfdx's op).
    const FUSED: bool = false;

    /// `y = max(y, 0)` in place.
    fn try_relu_in_place(&self, y: &mut <Self as Storage<E>>::Vec) -> Result<(), Self::Err> {
        let _ = y;
        Err(CpuError::WrongNumElements.into())
    }

    /// ReLU's backward in place, by its output `out`: `grad = 0` where `out` is not positive.
    fn try_relu_mask(
        &self,
        out: &<Self as Storage<E>>::Vec,
        grad: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), Self::Err> {
        let _ = (out, grad);
        Err(CpuError::WrongNumElements.into())
    }
}

#[cfg(feature = "cuda")]
impl<E: AmpElem> ReluKernel<E> for dfdx::prelude::Cuda where dfdx::prelude::Cuda: Storage<E> {}
