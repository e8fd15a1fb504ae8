//! The cast kernels: buffer conversions between precisions, their trait and its CPU and CUDA
//! kernels (the differentiable casts on tensors are [`crate::ops::cast`]'s).

mod cpu_kernel;
#[cfg(feature = "cuda")]
mod cuda_kernel;

use dfdx::prelude::Storage;

use crate::precision::AmpElem;

/// Buffer conversions from element type `Src` to `Dst`, computed through FP32 (exact for every
/// widening, rounded to nearest-even with overflow to ±inf for every narrowing).
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait CastKernel<Src: AmpElem, Dst: AmpElem>: Storage<Src> + Storage<Dst> {
    /// `dst = convert(src)`. Both buffers have the same length.
    fn try_copy_cast(
        &self,
        src: &<Self as Storage<Src>>::Vec,
        dst: &mut <Self as Storage<Dst>>::Vec,
    ) -> Result<(), Self::Err>;

    /// `convert(src)` in a new buffer. The default converts into a zero-filled one; the CPU
    /// copies a buffer of the same precision into a new one in one parallel pass.
    fn try_copy_cast_new(
        &self,
        src: &<Self as Storage<Src>>::Vec,
    ) -> Result<<Self as Storage<Dst>>::Vec, Self::Err> {
        let mut dst = Storage::<Dst>::try_alloc_len(self, Storage::<Src>::len(self, src))?;
        self.try_copy_cast(src, &mut dst)?;
        Ok(dst)
    }

    /// `dst += convert(src)`, the sum rounded once to `Dst`. Both buffers have the same length.
    fn try_add_cast(
        &self,
        src: &<Self as Storage<Src>>::Vec,
        dst: &mut <Self as Storage<Dst>>::Vec,
    ) -> Result<(), Self::Err>;
}
