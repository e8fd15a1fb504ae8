//! ReLU's kernels' trait.

use dfdx::prelude::{HasErr, Storage};

use crate::precision::AmpElem;

/// ReLU's kernels, for fusing it into the op before it.
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
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
