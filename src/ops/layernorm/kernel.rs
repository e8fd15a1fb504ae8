//! Layer norm's two traits: the op on tensors (default: dfdx's FP32 layer between two casts)
//! and the fused kernels' passes over buffers.

use dfdx::nn::modules::{LayerNorm1D, Module};
use dfdx::prelude::{HasErr, Shape, Storage, Tape, Tensor};

use crate::ops::cast::{Cast, CastDevice};
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// Each row's FP32 statistics, kept on the device by the forward for the backward.
pub struct RowStats<D: Storage<f32>> {
    /// The row's mean.
    pub mean: <D as Storage<f32>>::Vec,
    /// `1 / √(variance + ε)`, the variance biased (divided by the width).
    pub rstd: <D as Storage<f32>>::Vec,
}

/// How a device runs a layer norm with FP32 parameters over activations of element type `E`,
/// returning `E`.
///
/// The default is the composition that O2 ran every norm as before the fused op: the input cast
/// to FP32, dfdx's `LayerNorm1D` (a dozen broadcast ops and reductions, each keeping its output),
/// the output cast back. A device with [`MixedLayerNormKernel`]s runs
/// [`super::try_layernorm_fused`].
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
        super::try_layernorm_composed(layer, x)
    }
}

/// The passes of layer norm over rows of `width` activations of element type `E`, with FP32
/// parameters (`gamma`, and `beta` if there is one, per column) and FP32 arithmetic.
pub trait MixedLayerNormKernel<E: AmpElem>: Storage<E> + Storage<f32> + HasErr {
    /// `y = (x − mean) · rstd · gamma + beta` per row, rounded once to `E`; returns each row's
    /// statistics.
    fn try_ln_forward(
        &self,
        width: usize,
        x: &<Self as Storage<E>>::Vec,
        y: &mut <Self as Storage<E>>::Vec,
        gamma: &<Self as Storage<f32>>::Vec,
        beta: Option<&<Self as Storage<f32>>::Vec>,
        epsilon: f64,
    ) -> Result<RowStats<Self>, Self::Err>;

    /// The gradients from `dy`: the input's written into `gx` (or added to it if its flag says
    /// so; `None` when nobody reads it), and `gamma`'s (`Σ dy·x̂` per column) and `beta`'s
    /// (`Σ dy`) added to their FP32 gradients (written over a fresh one), summed in an order that
    /// does not depend on the thread count.
    #[allow(clippy::too_many_arguments)]
    fn try_ln_backward(
        &self,
        width: usize,
        x: &<Self as Storage<E>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        gx: Option<(&mut <Self as Storage<E>>::Vec, bool)>,
        gamma: &<Self as Storage<f32>>::Vec,
        stats: &RowStats<Self>,
        dgamma: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
        dbeta: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
    ) -> Result<(), Self::Err>;
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
