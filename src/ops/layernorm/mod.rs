//! Layer norm with 16-bit activations and FP32 parameters and statistics (the `KeepFp32` row
//! of the policy table, as PyTorch's autocast and Apex O2 run layer norm): the input and the
//! output are in the working precision, `gamma` and `beta` in FP32, and each row's mean,
//! variance and normalization computed in FP32, rounded once to the working precision. The
//! tape keeps the 16-bit input (shared with the op that produced it) and two FP32 numbers per
//! row, not an FP32 copy of the activations as casting around an FP32 layer norm does.
//!
//! How it runs is the device's ([`LayerNormOp`]): the default is dfdx's FP32 layer between two
//! casts ([`try_layernorm_composed`]); the CPU runs the fused op ([`try_layernorm_fused`]: one
//! pass per row forward and one backward, parallel over rows, the sums in f64), whose result
//! is that of dfdx's FP32 `LayerNorm1D` on the widened input, rounded once (up to the order of
//! the f32 operations). Inputs that are not contiguous rows run composed on every device.

mod cpu_kernel;
#[cfg(feature = "cuda")]
mod cuda_kernel;
mod kernel;
mod op;

use dfdx::nn::modules::LayerNorm1D;
use dfdx::prelude::{Cpu, HasShape, Module, PutTape, Shape, SplitTape, Storage, Tape, Tensor};

use crate::ops::cast::CastDevice;
use crate::precision::AmpElem;
use crate::tape::AmpTape;

pub use kernel::{MixedLayerNormKernel, RowStats};
pub use op::{try_layernorm_composed, LayerNormOp};

/// `layer` over the last dimension of `x` (16-bit or FP32), its parameters and statistics in
/// FP32, the output in `x`'s precision; the device's [`LayerNormOp`] decides how.
pub fn try_layer_norm<const M: usize, S: Shape, E, D, T>(
    layer: &LayerNorm1D<M, f32, D>,
    x: Tensor<S, E, D, T>,
) -> Result<Tensor<S, E, D, T>, D::Err>
where
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E> + LayerNormOp<E>,
    T: AmpTape<D> + Tape<E, D>,
    LayerNorm1D<M, f32, D>:
        Module<Tensor<S, f32, D, T>, Output = Tensor<S, f32, D, T>, Error = D::Err>,
{
    D::try_layer_norm(layer, x)
}

/// The fused layer norm over the last dimension of `x`: the output in `E`; its backward writes
/// the input's gradient in `E` and `gamma`'s and `beta`'s in FP32, in one pass. Runs composed
/// where `x` is not contiguous rows of `M`.
pub fn try_layernorm_fused<const M: usize, S: Shape, E, D, T>(
    layer: &LayerNorm1D<M, f32, D>,
    x: Tensor<S, E, D, T>,
) -> Result<Tensor<S, E, D, T>, D::Err>
where
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E> + MixedLayerNormKernel<E>,
    T: AmpTape<D> + Tape<E, D>,
    LayerNorm1D<M, f32, D>:
        Module<Tensor<S, f32, D, T>, Output = Tensor<S, f32, D, T>, Error = D::Err>,
{
    let rows = M > 0
        && x.strides() == x.shape().strides()
        && x.shape().concrete().into_iter().last() == Some(M);
    if !rows {
        return try_layernorm_composed(layer, x);
    }
    let (x, mut tape) = x.split_tape();
    let dev = x.device().clone();
    let (y, stats) = MixedLayerNormKernel::<E>::try_ln_forward_new(
        &dev,
        M,
        x.storage(),
        layer.gamma.storage(),
        Some(layer.beta.storage()),
        layer.epsilon,
    )?;
    let y: Tensor<S, E, D> = Storage::<E>::tensor_from_storage(&dev, *x.shape(), y);
    let (gamma, y_id) = (layer.gamma.clone(), y.id());
    let beta_id = layer.beta.id();
    tape.record_mixed(move |grads| {
        let Some(mut dy) = grads.store_mut::<E>().remove(y_id) else {
            return Ok(());
        };
        let ([dgamma, dbeta], store) =
            grads.params_and_store_mut::<E, 2>([(gamma.id(), M), (beta_id, M)], &dev)?;
        // The input's first gradient is written over the output's, which nobody reads after
        // this op: no buffer to allocate and zero.
        let fresh = store.get_ref_checked(&x).is_none()
            && Storage::<E>::len(&dev, &dy) == Storage::<E>::len(&dev, x.storage());
        if store.wants_grad(&x) && fresh {
            MixedLayerNormKernel::<E>::try_ln_backward_in_place(
                &dev,
                M,
                x.storage(),
                &mut dy,
                gamma.storage(),
                &stats,
                dgamma,
                dbeta,
            )?;
            store.insert(x.id(), dy);
            return Ok(());
        }
        let gx = if store.wants_grad(&x) {
            // Written over a fresh gradient, added to one that other ops already wrote.
            let accumulate = store.get_ref_checked(&x).is_some();
            Some((store.get_or_alloc_mut(&x)?, accumulate))
        } else {
            None
        };
        MixedLayerNormKernel::<E>::try_ln_backward(
            &dev,
            M,
            x.storage(),
            &dy,
            gx,
            gamma.storage(),
            &stats,
            dgamma,
            dbeta,
        )
    });
    Ok(y.put_tape(tape))
}

/// The CPU fuses layer norm.
impl<E: AmpElem> LayerNormOp<E> for Cpu {
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
        try_layernorm_fused(layer, x)
    }
}

/// CUDA fuses layer norm ([`MixedLayerNormKernel`] for `Cuda`: a warp per row).
#[cfg(feature = "cuda")]
impl<E: crate::device::utilities::cuda::CudaElem> LayerNormOp<E> for dfdx::prelude::Cuda {
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
        try_layernorm_fused(layer, x)
    }
}
