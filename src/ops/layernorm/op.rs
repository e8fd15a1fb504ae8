//! Layer norm with FP32 parameters as an op on tensors: how a device runs it, dfdx's FP32 layer
//! between two casts by default.

use dfdx::nn::modules::{LayerNorm1D, Module};
use dfdx::prelude::{HasErr, Shape, Tape, Tensor};

use crate::ops::cast::{Cast, CastDevice};
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// How a device runs a layer norm with FP32 parameters over activations of element type `E`,
/// returning `E`.
///
/// The default is the composition that O2 ran every norm as before the fused op: the input cast
/// to FP32, dfdx's `LayerNorm1D` (a dozen broadcast ops and reductions, each keeping its output),
/// the output cast back. A device with [`MixedLayerNormKernel`](super::MixedLayerNormKernel)s runs
/// [`super::try_layernorm_fused`].
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait LayerNormOp<E: AmpElem>: HasErr + Sized {
    /// `layer` over the last dimension of `x`.
    fn try_layer_norm<const M: usize, S: Shape, T>(
        layer: &LayerNorm1D<M, f32, Self>,
        x: Tensor<S, E, Self, T>,
    ) -> Result<Tensor<S, E, Self, T>, Self::Err>
    where
        Self: CastDevice<E, f32> + CastDevice<f32, E>,
        T: AmpTape<Self> + Tape<E, Self>,
        LayerNorm1D<M, f32, Self>:
            Module<Tensor<S, f32, Self, T>, Output = Tensor<S, f32, Self, T>, Error = Self::Err>,
    {
        try_layernorm_composed(layer, x)
    }
}

/// dfdx's FP32 layer norm between two casts.
pub fn try_layernorm_composed<const M: usize, S: Shape, E, D, T>(
    layer: &LayerNorm1D<M, f32, D>,
    x: Tensor<S, E, D, T>,
) -> Result<Tensor<S, E, D, T>, D::Err>
where
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E>,
    T: AmpTape<D> + Tape<E, D>,
    LayerNorm1D<M, f32, D>:
        Module<Tensor<S, f32, D, T>, Output = Tensor<S, f32, D, T>, Error = D::Err>,
{
    layer
        .try_forward(x.try_to_f32()?)?
        .try_cast::<E::Precision>()
}
