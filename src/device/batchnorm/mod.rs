//! The mixed batch norm's kernels: their trait and the CPU's (CUDA runs the layer in FP32
//! between two casts); the op on tensors is [`crate::ops::batchnorm`]'s.

mod cpu_kernel;

use dfdx::prelude::{HasErr, Storage};
use dfdx::tensor::CpuError;
use dfdx::tensor_ops::batchnorm_parts::BatchNormLayout;

use crate::precision::AmpElem;

/// The passes of batch norm over activations of element type `E` (FP32 per-channel values).
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait MixedBatchNormKernel<E: AmpElem>:
    Storage<E> + Storage<f32> + HasErr<Err: From<CpuError>>
{
    /// Whether the device has these kernels; without them no method here is called.
    const FUSED: bool = false;

    /// Per channel, the batch mean and (biased) variance of `x`.
    fn try_bn_stats(
        &self,
        lay: &BatchNormLayout,
        x: &<Self as Storage<E>>::Vec,
    ) -> Result<(Vec<f64>, Vec<f64>), Self::Err> {
        let _ = (lay, x);
        Err(CpuError::WrongNumElements.into())
    }

    /// `y = (x − mean[c]) · a[c] + b[c]`, rounded once to `E`.
    fn try_bn_normalize(
        &self,
        lay: &BatchNormLayout,
        x: &<Self as Storage<E>>::Vec,
        y: &mut <Self as Storage<E>>::Vec,
        per_channel: [&[f32]; 3],
    ) -> Result<(), Self::Err> {
        let _ = (lay, x, y, per_channel);
        Err(CpuError::WrongNumElements.into())
    }

    /// Per channel, `Σ dy` and `Σ dy·(x − mean[c])`, `dy` taken as zero where `mask` (the
    /// output of a ReLU fused after the batch norm) is not positive.
    fn try_bn_grad_sums(
        &self,
        lay: &BatchNormLayout,
        x: &<Self as Storage<E>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        mask: Option<&<Self as Storage<E>>::Vec>,
        mean: &[f32],
    ) -> Result<Vec<[f64; 2]>, Self::Err> {
        let _ = (lay, x, dy, mask, mean);
        Err(CpuError::WrongNumElements.into())
    }

    /// `gx (+)= k1[c] · (dy − mdy[c] − (x − mean[c]) · k2[c])` (added to `gx` only if its
    /// flag says so, else written), with `per_channel` = `[mean, k1, mdy, k2]` and `dy` masked
    /// as in [`MixedBatchNormKernel::try_bn_grad_sums`].
    fn try_bn_input_grad(
        &self,
        lay: &BatchNormLayout,
        x: &<Self as Storage<E>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        mask: Option<&<Self as Storage<E>>::Vec>,
        gx: (&mut <Self as Storage<E>>::Vec, bool),
        per_channel: [&[f32]; 4],
    ) -> Result<(), Self::Err> {
        let _ = (lay, x, dy, mask, gx, per_channel);
        Err(CpuError::WrongNumElements.into())
    }
}

#[cfg(feature = "cuda")]
impl<E: AmpElem> MixedBatchNormKernel<E> for dfdx::prelude::Cuda where
    dfdx::prelude::Cuda: Storage<E>
{
}
