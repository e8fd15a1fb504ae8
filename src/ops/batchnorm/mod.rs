//! Batch norm with 16-bit activations and FP32 parameters and statistics (Apex's
//! `keep_batchnorm_fp32`, as cuDNN's mixed batch norm runs it): the input and the output are in
//! the working precision, the scale, the bias and the running statistics in FP32, and every
//! statistic and the normalization are computed in FP32, so the tape keeps the 16-bit input and
//! two FP32 numbers per channel, not an FP32 copy of the activations as casting around an FP32
//! batch norm does.
//!
//! How it runs is the device's ([`BatchNormOp`]): the default is dfdx's FP32 layer between two
//! casts ([`try_batchnorm_composed_train`], [`try_batchnorm_composed_infer`]); the CPU and CUDA
//! run the fused op ([`try_batchnorm_fused_train`], [`try_batchnorm_fused_infer`]) on their
//! [`MixedBatchNormKernel`]s. The CPU's passes are those of the vendored dfdx's fused batch norm
//! (`tensor_ops/batchnorm`), which reads and writes any precision and computes in FP32 (sums in
//! f64 across runs): given the same input, the statistics and the output are those of an FP32
//! batch norm on the widened input, rounded once to the working precision. A ReLU right after
//! it is fused ([`crate::ops::relu`]). Inputs that are not contiguous (and training batches
//! with a single value per channel) run composed on every device.

mod cpu_kernel;
#[cfg(feature = "cuda")]
mod cuda_kernel;
mod kernel;
mod layer;
mod op;

use dfdx::prelude::{
    Axes, Cpu, HasShape, Module, ModuleMut, PutTape, Shape, SplitTape, Storage, Tape, Tensor,
};
use dfdx::tensor_ops::batchnorm_parts::BatchNormLayout;

use crate::ops::cast::CastDevice;
use crate::ops::fused_activation::{ActivationSlot, FusedActivation};
use crate::precision::AmpElem;
use crate::tape::AmpTape;

pub use kernel::{ChannelStats, MixedBatchNormKernel, RunningUpdate};
pub use layer::{BatchNormLayer, BatchNormParams, BatchNormParamsMut};
pub use op::{try_batchnorm_composed_infer, try_batchnorm_composed_train, BatchNormOp};

/// The training forward of `layer` (16-bit or FP32 activations, reduced over `Ax`), its
/// parameters and statistics in FP32, the output in `x`'s precision; the device's
/// [`BatchNormOp`] decides how.
pub fn try_batch_norm_train<const C: usize, S: Shape, Ax: Axes, E, D, T, L>(
    layer: &mut L,
    x: Tensor<S, E, D, T>,
) -> Result<Tensor<S, E, D, T>, D::Err>
where
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E> + BatchNormOp<E>,
    T: AmpTape<D> + Tape<E, D>,
    L: BatchNormLayer<C, D>
        + ModuleMut<Tensor<S, f32, D, T>, Output = Tensor<S, f32, D, T>, Error = D::Err>,
{
    D::try_batch_norm_train::<C, S, Ax, T, L>(layer, x)
}

/// The inference forward of `layer`, as [`try_batch_norm_train`] but with the running
/// statistics.
pub fn try_batch_norm_infer<const C: usize, S: Shape, Ax: Axes, E, D, L>(
    layer: &L,
    x: Tensor<S, E, D>,
) -> Result<Tensor<S, E, D>, D::Err>
where
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E> + BatchNormOp<E>,
    L: BatchNormLayer<C, D> + Module<Tensor<S, f32, D>, Output = Tensor<S, f32, D>, Error = D::Err>,
{
    D::try_batch_norm_infer::<C, S, Ax, L>(layer, x)
}

/// The layout of `x` for the fused op of `C` channels reduced over `Ax`, if it can run on it
/// (`x` is contiguous, and, for training, a channel has at least two values: the running
/// variance is unbiased).
fn fused_layout<const C: usize, S: Shape, Ax: Axes, E: AmpElem, D: Storage<E>, T>(
    x: &Tensor<S, E, D, T>,
    training: bool,
) -> Option<BatchNormLayout> {
    if x.strides() != x.shape().strides() {
        return None;
    }
    let lay = BatchNormLayout::of::<S, Ax>(x.shape());
    (lay.chan == C && (!training || lay.per_chan() >= 2)).then_some(lay)
}

/// The fused training forward: batch statistics, the running statistics updated
/// (`running · (1 − momentum) + batch · momentum`, the variance unbiased), the normalized
/// output in `E`; its backward writes the input's gradient in `E` and the scale's and bias's in
/// FP32, with the derivative of a ReLU fused after it applied as it reads `dy`. Runs composed
/// where `x` is not contiguous or a channel has fewer than two values.
pub fn try_batchnorm_fused_train<const C: usize, S: Shape, Ax: Axes, E, D, T, L>(
    layer: &mut L,
    x: Tensor<S, E, D, T>,
) -> Result<Tensor<S, E, D, T>, D::Err>
where
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E> + MixedBatchNormKernel<E>,
    T: AmpTape<D> + Tape<E, D>,
    L: BatchNormLayer<C, D>
        + ModuleMut<Tensor<S, f32, D, T>, Output = Tensor<S, f32, D, T>, Error = D::Err>,
{
    let Some(lay) = fused_layout::<C, S, Ax, E, D, T>(&x, true) else {
        return try_batchnorm_composed_train(layer, x);
    };
    let (x, mut tape) = x.split_tape();
    let dev = x.device().clone();
    let mut y: Tensor<S, E, D> = dev.try_zeros_like(x.shape())?;
    let p = layer.params_mut();
    let stats = MixedBatchNormKernel::<E>::try_bn_train_forward(
        &dev,
        &lay,
        x.storage(),
        y.storage_mut(),
        p.scale.storage(),
        p.bias.storage(),
        RunningUpdate {
            mean: p.running_mean.storage_mut(),
            var: p.running_var.storage_mut(),
            momentum: p.momentum,
        },
        p.epsilon,
    )?;
    let (scale, bias_id, y_id) = (p.scale.clone(), p.bias.id(), y.id());
    // Batch norm's backward applies ReLU's derivative, not GELU's.
    let fused = ActivationSlot::<S, E, D>::new(false);
    let relu = fused.clone();
    tape.record_mixed(move |grads| {
        let Some(dy) = grads.store_mut::<E>().remove(y_id) else {
            return Ok(());
        };
        // A fused ReLU's derivative is applied as the passes read `dy`.
        let relu_out = match relu.take() {
            Some(FusedActivation::Relu(out)) => Some(out),
            // Never put: the slot does not take GELU.
            Some(FusedActivation::Gelu(_)) | None => None,
        };
        let mask = relu_out.as_ref().map(|t| t.storage());
        let ([dscale, dbias], store) =
            grads.params_and_store_mut::<E, 2>([(scale.id(), C), (bias_id, C)], &dev)?;
        let gx = if store.wants_grad(&x) {
            // Written over a fresh gradient, added to one that other ops already wrote.
            let accumulate = store.get_ref_checked(&x).is_some();
            Some((store.get_or_alloc_mut(&x)?, accumulate))
        } else {
            None
        };
        MixedBatchNormKernel::<E>::try_bn_backward(
            &dev,
            &lay,
            x.storage(),
            &dy,
            mask,
            gx,
            scale.storage(),
            &stats,
            dscale,
            dbias,
        )
    });
    tape.offer_activation(y.id(), fused);
    Ok(y.put_tape(tape))
}

/// The fused inference forward: normalized with the running statistics. Runs composed where
/// `x` is not contiguous.
pub fn try_batchnorm_fused_infer<const C: usize, S: Shape, Ax: Axes, E, D, L>(
    layer: &L,
    x: Tensor<S, E, D>,
) -> Result<Tensor<S, E, D>, D::Err>
where
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E> + MixedBatchNormKernel<E>,
    L: BatchNormLayer<C, D> + Module<Tensor<S, f32, D>, Output = Tensor<S, f32, D>, Error = D::Err>,
{
    let Some(lay) = fused_layout::<C, S, Ax, E, D, _>(&x, false) else {
        return try_batchnorm_composed_infer(layer, x);
    };
    let dev = x.device().clone();
    let mut y: Tensor<S, E, D> = dev.try_zeros_like(x.shape())?;
    let p = layer.params();
    MixedBatchNormKernel::<E>::try_bn_infer_forward(
        &dev,
        &lay,
        x.storage(),
        y.storage_mut(),
        p.scale.storage(),
        p.bias.storage(),
        p.running_mean.storage(),
        p.running_var.storage(),
        p.epsilon,
    )?;
    Ok(y)
}

/// The CPU fuses batch norm.
impl<E: AmpElem> BatchNormOp<E> for Cpu {
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
        try_batchnorm_fused_train::<C, S, Ax, E, Self, T, L>(layer, x)
    }

    fn try_batch_norm_infer<const C: usize, S: Shape, Ax: Axes, L>(
        layer: &L,
        x: Tensor<S, E, Self>,
    ) -> Result<Tensor<S, E, Self>, Self::Err>
    where
        Self: CastDevice<E, f32> + CastDevice<f32, E>,
        L: BatchNormLayer<C, Self>
            + Module<Tensor<S, f32, Self>, Output = Tensor<S, f32, Self>, Error = Self::Err>,
    {
        try_batchnorm_fused_infer::<C, S, Ax, E, Self, L>(layer, x)
    }
}

/// CUDA fuses batch norm ([`MixedBatchNormKernel`] for `Cuda`: a block per channel for the
/// statistics, a thread per element for the normalization and the input's gradient).
#[cfg(feature = "cuda")]
impl<E: crate::device::utilities::cuda::CudaElem> BatchNormOp<E> for dfdx::prelude::Cuda {
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
        try_batchnorm_fused_train::<C, S, Ax, E, Self, T, L>(layer, x)
    }

    fn try_batch_norm_infer<const C: usize, S: Shape, Ax: Axes, L>(
        layer: &L,
        x: Tensor<S, E, Self>,
    ) -> Result<Tensor<S, E, Self>, Self::Err>
    where
        Self: CastDevice<E, f32> + CastDevice<f32, E>,
        L: BatchNormLayer<C, Self>
            + Module<Tensor<S, f32, Self>, Output = Tensor<S, f32, Self>, Error = Self::Err>,
    {
        try_batchnorm_fused_infer::<C, S, Ax, E, Self, L>(layer, x)
    }
}
