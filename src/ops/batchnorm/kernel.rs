//! The mixed batch norm's kernels' trait and the statistics it keeps.

use dfdx::prelude::{HasErr, Storage};
use dfdx::tensor_ops::batchnorm_parts::BatchNormLayout;

use crate::precision::AmpElem;

/// Each channel's FP32 batch statistics, kept on the device by the training forward for the
/// backward.
pub struct ChannelStats<D: Storage<f32>> {
    /// The batch mean, rounded to FP32.
    pub mean: <D as Storage<f32>>::Vec,
    /// `√(variance + ε)` in FP32, the variance biased (divided by the values per channel).
    pub std: <D as Storage<f32>>::Vec,
}

/// The running statistics a training forward updates and the constants of the update, as
/// dfdx's batch norm applies them (`running · (1 − momentum) + batch · momentum`, through its
/// FP32 `axpy`; the variance unbiased).
pub struct RunningUpdate<'a, D: Storage<f32>> {
    /// The running mean.
    pub mean: &'a mut <D as Storage<f32>>::Vec,
    /// The running variance (unbiased).
    pub var: &'a mut <D as Storage<f32>>::Vec,
    /// The running statistics' update weight.
    pub momentum: f64,
}

/// The passes of batch norm over activations of element type `E` laid out as
/// `outer × chan × inner` (contiguous), with FP32 per-channel parameters and statistics and
/// FP32 arithmetic.
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait MixedBatchNormKernel<E: AmpElem>: Storage<E> + Storage<f32> + HasErr {
    /// The training forward: each channel's batch mean and (biased) variance of `x`, the
    /// running statistics updated with them, and `y = (x − mean)·(scale / std) + bias` rounded
    /// once to `E`; returns the statistics the backward reads.
    #[allow(clippy::too_many_arguments)]
    fn try_bn_train_forward(
        &self,
        lay: &BatchNormLayout,
        x: &<Self as Storage<E>>::Vec,
        y: &mut <Self as Storage<E>>::Vec,
        scale: &<Self as Storage<f32>>::Vec,
        bias: &<Self as Storage<f32>>::Vec,
        running: RunningUpdate<'_, Self>,
        epsilon: f64,
    ) -> Result<ChannelStats<Self>, Self::Err>;

    /// The inference forward: `y = (x − running_mean)·(scale / √(running_var + ε)) + bias`,
    /// rounded once to `E`.
    #[allow(clippy::too_many_arguments)]
    fn try_bn_infer_forward(
        &self,
        lay: &BatchNormLayout,
        x: &<Self as Storage<E>>::Vec,
        y: &mut <Self as Storage<E>>::Vec,
        scale: &<Self as Storage<f32>>::Vec,
        bias: &<Self as Storage<f32>>::Vec,
        running_mean: &<Self as Storage<f32>>::Vec,
        running_var: &<Self as Storage<f32>>::Vec,
        epsilon: f64,
    ) -> Result<(), Self::Err>;

    /// The gradients from `dy`, taken as zero where `mask` (the output of a ReLU fused after
    /// the batch norm) is not positive: per channel `Σ dy` and `Σ dy·(x − mean)` (f32 partial
    /// sums added in f64), then the input's gradient
    /// `k1·(dy − mean(dy) − (x − mean)·k2)` written into `gx` (or added to it if its flag says
    /// so; `None` when nobody reads it), and the scale's (`Σ dy·(x − mean) / std`) and the
    /// bias's (`Σ dy`) added in f64 to their FP32 gradients (written over a fresh one, as its
    /// flag says), each rounded once.
    #[allow(clippy::too_many_arguments)]
    fn try_bn_backward(
        &self,
        lay: &BatchNormLayout,
        x: &<Self as Storage<E>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        mask: Option<&<Self as Storage<E>>::Vec>,
        gx: Option<(&mut <Self as Storage<E>>::Vec, bool)>,
        scale: &<Self as Storage<f32>>::Vec,
        stats: &ChannelStats<Self>,
        dscale: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
        dbias: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
    ) -> Result<(), Self::Err>;
}
