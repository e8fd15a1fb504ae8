//! Batch norm with FP32 parameters as an op on tensors: how a device runs it, dfdx's FP32 layer
//! between two casts by default.

use dfdx::prelude::{Axes, HasErr, Module, ModuleMut, Shape, Tape, Tensor};

use super::BatchNormLayer;
use crate::ops::cast::{Cast, CastDevice};
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// How a device runs a batch norm of `C` channels with FP32 parameters and running statistics
/// over activations of element type `E` (reduced over the axes `Ax`), returning `E`.
///
/// The default is the composition that O2 ran every norm as before the fused op: the input cast
/// to FP32, dfdx's batch norm layer (the fork's `BatchNormKernel`: its fused passes on the CPU,
/// upstream's dozen broadcast ops and reductions elsewhere), the output cast back. A device with
/// [`MixedBatchNormKernel`](super::MixedBatchNormKernel)s runs
/// [`super::try_batchnorm_fused_train`] and [`super::try_batchnorm_fused_infer`].
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait BatchNormOp<E: AmpElem>: HasErr + Sized {
    /// The training forward of `layer` on `x`: batch statistics, the running statistics
    /// updated; its backward writes the input's gradient in `E` and the scale's and the bias's
    /// in FP32.
    fn try_batch_norm_train<const C: usize, S: Shape, Ax: Axes, T, L>(
        layer: &mut L,
        x: Tensor<S, E, Self, T>,
    ) -> Result<Tensor<S, E, Self, T>, Self::Err>
    where
        Self: CastDevice<E, f32> + CastDevice<f32, E>,
        T: AmpTape<Self> + Tape<E, Self>,
        L: BatchNormLayer<C, Self>
            + ModuleMut<Tensor<S, f32, Self, T>, Output = Tensor<S, f32, Self, T>, Error = Self::Err>,
    {
        try_batchnorm_composed_train(layer, x)
    }

    /// The inference forward of `layer` on `x`: normalized with the running statistics.
    fn try_batch_norm_infer<const C: usize, S: Shape, Ax: Axes, L>(
        layer: &L,
        x: Tensor<S, E, Self>,
    ) -> Result<Tensor<S, E, Self>, Self::Err>
    where
        Self: CastDevice<E, f32> + CastDevice<f32, E>,
        L: BatchNormLayer<C, Self>
            + Module<Tensor<S, f32, Self>, Output = Tensor<S, f32, Self>, Error = Self::Err>,
    {
        try_batchnorm_composed_infer(layer, x)
    }
}

/// dfdx's FP32 batch norm (training) between two casts.
pub fn try_batchnorm_composed_train<S: Shape, E, D, T, L>(
    layer: &mut L,
    x: Tensor<S, E, D, T>,
) -> Result<Tensor<S, E, D, T>, D::Err>
where
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E>,
    T: AmpTape<D> + Tape<E, D>,
    L: ModuleMut<Tensor<S, f32, D, T>, Output = Tensor<S, f32, D, T>, Error = D::Err>,
{
    layer
        .try_forward_mut(x.try_to_f32()?)?
        .try_cast::<E::Precision>()
}

/// dfdx's FP32 batch norm (inference) between two casts.
pub fn try_batchnorm_composed_infer<S: Shape, E, D, L>(
    layer: &L,
    x: Tensor<S, E, D>,
) -> Result<Tensor<S, E, D>, D::Err>
where
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E>,
    L: Module<Tensor<S, f32, D>, Output = Tensor<S, f32, D>, Error = D::Err>,
{
    layer
        .try_forward(x.try_to_f32()?)?
        .try_cast::<E::Precision>()
}
