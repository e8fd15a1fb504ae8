//! Batch norm with 16-bit activations and FP32 parameters and statistics (Apex's
//! `keep_batchnorm_fp32`, as cuDNN's mixed batch norm runs it): the input and the output are in
//! the working precision, the scale, the bias and the running statistics in FP32, and every
//! statistic and the normalization are computed in FP32 (sums in f64 across runs), so the tape
//! keeps the 16-bit input and nothing in FP32.
//!
//! The passes are those of the vendored dfdx's fused batch norm (`tensor_ops/batchnorm`),
//! which reads and writes any precision and computes in FP32: given the same input, the
//! statistics and the output are those of an FP32 batch norm on the widened input, rounded once
//! to the working precision. A ReLU right after it is fused ([`crate::ops::relu`]). Devices
//! without the fused kernels (CUDA), and inputs that are not contiguous, run the layer in FP32
//! between two casts instead.

use dfdx::prelude::{Axes, HasShape, PutTape, Rank1, Shape, SplitTape, Storage, Tensor};
use dfdx::tensor_ops::batchnorm_parts::BatchNormLayout;

use crate::device::{AmpDevice, Kernels, MixedBatchNormKernel};
use crate::ops::fused_activation::{ActivationSlot, FusedActivation};
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// A batch norm layer's FP32 parameters and statistics.
pub struct BatchNormParams<'a, const C: usize, D: Storage<f32>> {
    /// The scale (γ).
    pub scale: &'a Tensor<Rank1<C>, f32, D>,
    /// The bias (β).
    pub bias: &'a Tensor<Rank1<C>, f32, D>,
    /// The running mean, updated by training forwards.
    pub running_mean: &'a mut Tensor<Rank1<C>, f32, D>,
    /// The running variance (unbiased), updated by training forwards.
    pub running_var: &'a mut Tensor<Rank1<C>, f32, D>,
    /// Added to the variance before its square root.
    pub epsilon: f64,
    /// The running statistics' update weight.
    pub momentum: f64,
}

/// The layout of `x` for a batch norm of `C` channels reduced over `Ax`, if the fused kernels
/// can run on it (the device has them, `x` is contiguous, and, for training, a channel has at
/// least two values).
pub fn fused_layout<const C: usize, S: Shape, Ax: Axes, E: AmpElem, D, T>(
    x: &Tensor<S, E, D, T>,
    training: bool,
) -> Option<BatchNormLayout>
where
    D: AmpDevice + Kernels<E>,
{
    if !<D as MixedBatchNormKernel<E>>::FUSED || x.strides() != x.shape().strides() {
        return None;
    }
    let lay = BatchNormLayout::of::<S, Ax>(x.shape());
    (lay.chan == C && (!training || lay.per_chan() >= 2)).then_some(lay)
}

/// Per-channel FP32 values of a rank-1 tensor.
fn channels<const C: usize, D: AmpDevice>(t: &Tensor<Rank1<C>, f32, D>) -> Vec<f32> {
    t.as_vec()
}

/// The training forward, for an input whose layout [`fused_layout`] gave: batch statistics,
/// the running statistics updated (`running · (1 − momentum) + batch · momentum`, the variance
/// unbiased), the normalized output in `E`; its backward writes the input's gradient in `E` and
/// the scale's and bias's in FP32.
pub fn try_batchnorm_train<const C: usize, S: Shape, E, D, T>(
    lay: BatchNormLayout,
    x: Tensor<S, E, D, T>,
    p: BatchNormParams<'_, C, D>,
) -> Result<Tensor<S, E, D, T>, D::Err>
where
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
    T: AmpTape<D>,
{
    let n = lay.per_chan() as f64;
    let (x, mut tape) = x.split_tape();
    let dev = x.device().clone();
    let (mean64, var64) = MixedBatchNormKernel::<E>::try_bn_stats(&dev, &lay, x.storage())?;
    // The running statistics as dfdx's fused kernel updates them, through axpy in FP32.
    let batch = |v: &[f64]| -> Result<Tensor<Rank1<C>, f32, D>, D::Err> {
        dev.try_tensor_from_vec(
            v.iter().map(|v| *v as f32).collect(),
            (dfdx::prelude::Const,),
        )
    };
    p.running_mean
        .try_axpy(1.0 - p.momentum, &batch(&mean64)?, p.momentum)?;
    p.running_var.try_axpy(
        1.0 - p.momentum,
        &batch(&var64)?,
        p.momentum * n / (n - 1.0),
    )?;

    let mean32: Vec<f32> = mean64.iter().map(|m| *m as f32).collect();
    let var32: Vec<f32> = var64.iter().map(|v| *v as f32).collect();
    let scale32 = channels(p.scale);
    let bias32 = channels(p.bias);
    let (std32, a32) =
        dfdx::tensor_ops::batchnorm_parts::std_and_scale(&var32, &scale32, p.epsilon);
    let mut y: Tensor<S, E, D> = dev.try_zeros_like(x.shape())?;
    MixedBatchNormKernel::<E>::try_bn_normalize(
        &dev,
        &lay,
        x.storage(),
        y.storage_mut(),
        [&mean32, &a32, &bias32],
    )?;

    let (scale_id, bias_id, y_id) = (p.scale.id(), p.bias.id(), y.id());
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
        let sums = MixedBatchNormKernel::<E>::try_bn_grad_sums(
            &dev,
            &lay,
            x.storage(),
            &dy,
            mask,
            &mean32,
        )?;
        // dx = (scale / std) · (dy − mean(dy) − (x − mean) · Σ dy·(x − mean) / (n · std²))
        let inv_std: Vec<f64> = std32.iter().map(|s| 1.0 / f64::from(*s)).collect();
        let k1: Vec<f32> = (0..lay.chan)
            .map(|c| (f64::from(scale32[c]) * inv_std[c]) as f32)
            .collect();
        let mdy: Vec<f32> = sums.iter().map(|s| (s[0] / n) as f32).collect();
        let k2: Vec<f32> = (0..lay.chan)
            .map(|c| (sums[c][1] * inv_std[c] * inv_std[c] / n) as f32)
            .collect();
        let store = grads.store_mut::<E>();
        if store.wants_grad(&x) {
            // Written over a fresh gradient, added to one that other ops already wrote.
            let accumulate = store.get_ref_checked(&x).is_some();
            let gx = store.get_or_alloc_mut(&x)?;
            MixedBatchNormKernel::<E>::try_bn_input_grad(
                &dev,
                &lay,
                x.storage(),
                &dy,
                mask,
                (gx, accumulate),
                [&mean32, &k1, &mdy, &k2],
            )?;
        }
        // d scale = Σ dy·(x − mean) / std, d bias = Σ dy: each added in f64, rounded once.
        let dscale: Vec<f64> = (0..lay.chan).map(|c| sums[c][1] * inv_std[c]).collect();
        let dbias: Vec<f64> = sums.iter().map(|s| s[0]).collect();
        grads.add_to_param_grad(scale_id, &dscale, &dev)?;
        grads.add_to_param_grad(bias_id, &dbias, &dev)?;
        Ok(())
    });
    tape.offer_activation(y.id(), fused);
    Ok(y.put_tape(tape))
}

/// The inference forward, for an input whose layout [`fused_layout`] gave: normalized with the
/// running statistics.
pub fn try_batchnorm_infer<const C: usize, S: Shape, E, D>(
    lay: BatchNormLayout,
    x: Tensor<S, E, D>,
    p: BatchNormParams<'_, C, D>,
) -> Result<Tensor<S, E, D>, D::Err>
where
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
{
    let dev = x.device().clone();
    let (_, a32) = dfdx::tensor_ops::batchnorm_parts::std_and_scale(
        &channels(p.running_var),
        &channels(p.scale),
        p.epsilon,
    );
    let mut y: Tensor<S, E, D> = dev.try_zeros_like(x.shape())?;
    MixedBatchNormKernel::<E>::try_bn_normalize(
        &dev,
        &lay,
        x.storage(),
        y.storage_mut(),
        [&channels(p.running_mean), &a32, &channels(p.bias)],
    )?;
    Ok(y)
}
