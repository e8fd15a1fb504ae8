//! typed-amp patch: batch normalization as one op per pass, for [crate::nn::BatchNorm1D] and
//! [crate::nn::BatchNorm2D].
//!
//! Upstream composes batch norm from about a dozen generic ops (mean, broadcast, sub, square,
//! mean, add, sqrt, div, broadcast, mul, add), each a pass over the activations with
//! per-element index arithmetic, and as many backward ops. [BatchNormKernel]'s methods default
//! to that composition ([train_fwd_composed], [infer_fwd_composed]); the CPU overrides them
//! with fused kernels (`cpu_kernel.rs`): training forward in three passes (sum, sum of squared
//! deviations, normalize), its backward in two (two sums, then the input gradient), inference
//! in one. Other devices (CUDA) keep the composition.

mod cpu_kernel;

/// typed-amp patch: the fused CPU kernels' passes, for typed-amp's batch norm whose activations
/// are 16-bit and whose parameters and statistics are FP32 (Apex's `keep_batchnorm_fp32`).
#[cfg(feature = "cpu")]
pub use cpu_kernel::parts;

#[cfg(feature = "cuda")]
mod cuda_kernel;

use crate::{shapes::*, tensor::*, tensor_ops::*};

/// Batch normalization's training forward and inference forward. Every method has a default
/// body, the upstream composition of generic ops; a device overrides them with fused kernels.
pub trait BatchNormKernel<E: Dtype>: Storage<E> {
    /// Training forward: normalizes `x` with the batch statistics over every axis but the
    /// channel axis, applies `scale` and `bias` per channel, and updates the running statistics
    /// (`running = running · (1 − momentum) + batch · momentum`, the variance unbiased).
    #[allow(clippy::too_many_arguments)]
    fn try_batchnorm_train<const C: usize, S: Shape, T: Tape<E, Self>, Ax: Axes>(
        x: Tensor<S, E, Self, T>,
        var: &mut Tensor<Rank1<C>, E, Self>,
        mean: &mut Tensor<Rank1<C>, E, Self>,
        scale: &Tensor<Rank1<C>, E, Self>,
        bias: &Tensor<Rank1<C>, E, Self>,
        epsilon: f64,
        momentum: f64,
    ) -> Result<Tensor<S, E, Self, T>, Self::Err>
    where
        Self: Device<E>,
        S: HasAxes<Ax> + ReduceShapeTo<Rank1<C>, Ax>,
    {
        train_fwd_composed(x, var, mean, scale, bias, epsilon, momentum)
    }

    /// Inference forward: normalizes `x` with the running statistics, then applies `scale` and
    /// `bias` per channel.
    fn try_batchnorm_infer<const C: usize, S: Shape, Ax: Axes>(
        x: Tensor<S, E, Self>,
        var: &Tensor<Rank1<C>, E, Self>,
        mean: &Tensor<Rank1<C>, E, Self>,
        scale: &Tensor<Rank1<C>, E, Self>,
        bias: &Tensor<Rank1<C>, E, Self>,
        epsilon: f64,
    ) -> Result<Tensor<S, E, Self>, Self::Err>
    where
        Self: Device<E>,
        Rank1<C>: BroadcastShapeTo<S, Ax>,
    {
        infer_fwd_composed(x, var, mean, scale, bias, epsilon)
    }
}

/// The channel layout of a batch-norm input: `outer × chan × inner`, the channel axis being the
/// one axis not in `Ax`.
///
/// typed-amp patch: `pub`, with [BatchNormLayout::of] and [BatchNormLayout::per_chan] (all
/// `pub(crate)` before), for `tensor_ops::batchnorm_parts`.
#[derive(Debug, Clone, Copy)]
pub struct BatchNormLayout {
    pub outer: usize,
    pub chan: usize,
    pub inner: usize,
}

impl BatchNormLayout {
    /// The layout of `shape` reduced over `Ax`.
    pub fn of<S: Shape, Ax: Axes>(shape: &S) -> Self {
        let reduced: std::vec::Vec<isize> = Ax::as_array().into_iter().collect();
        let dims = shape.concrete();
        let dims = dims.as_ref();
        let c = (0..dims.len())
            .find(|i| !reduced.contains(&(*i as isize)))
            .expect("batch norm keeps one axis");
        BatchNormLayout {
            outer: dims[..c].iter().product(),
            chan: dims[c],
            inner: dims[c + 1..].iter().product(),
        }
    }

    /// Elements per channel.
    pub fn per_chan(&self) -> usize {
        self.outer * self.inner
    }
}

/// Upstream dfdx's batch-norm training forward, composed of generic ops.
#[allow(clippy::too_many_arguments)]
pub(crate) fn train_fwd_composed<
    const C: usize,
    S: Shape,
    E: Dtype,
    D: Device<E>,
    T: Tape<E, D>,
    Ax: Axes,
>(
    x: Tensor<S, E, D, T>,
    var: &mut Tensor<Rank1<C>, E, D>,
    mean: &mut Tensor<Rank1<C>, E, D>,
    scale: &Tensor<Rank1<C>, E, D>,
    bias: &Tensor<Rank1<C>, E, D>,
    epsilon: f64,
    momentum: f64,
) -> Result<Tensor<S, E, D, T>, D::Err>
where
    S: HasAxes<Ax> + ReduceShapeTo<Rank1<C>, Ax>,
{
    use num_traits::FromPrimitive;
    let n = f64::from_usize(<S as HasAxes<Ax>>::size(x.shape())).unwrap();
    let shape = *x.shape();

    // compute statistics for updating running stats later - on tape
    let mean_chan = x.retaped::<T>().try_mean::<Rank1<C>, _>()?;

    // update statistics since we are training - off tape
    mean.try_axpy(1.0 - momentum, &mean_chan, momentum)?;

    let centered = x.try_sub(mean_chan.try_broadcast_like(&shape)?)?;

    let var_chan = centered
        .retaped::<T>()
        .try_square()?
        .try_mean::<Rank1<C>, _>()?;

    // NOTE: uses unbiased variance in running estimate
    var.try_axpy(1.0 - momentum, &var_chan, momentum * n / (n - 1.0))?;

    // statistics for normalizing - on tape
    let std = var_chan
        .try_add(E::from_f64(epsilon).unwrap())?
        .try_sqrt()?;

    // record broadcast of scale & bias - on tape
    let scale = scale
        .retaped::<T>()
        .try_div(std)?
        .try_broadcast_like(&shape)?;
    let bias = bias.retaped::<T>().try_broadcast_like(&shape)?;

    // normalize & affine - on tape
    centered.try_mul(scale)?.try_add(bias)
}

/// Upstream dfdx's batch-norm inference forward, composed of generic ops.
pub(crate) fn infer_fwd_composed<const C: usize, S: Shape, E: Dtype, D: Device<E>, Ax: Axes>(
    x: Tensor<S, E, D>,
    var: &Tensor<Rank1<C>, E, D>,
    mean: &Tensor<Rank1<C>, E, D>,
    scale: &Tensor<Rank1<C>, E, D>,
    bias: &Tensor<Rank1<C>, E, D>,
    epsilon: f64,
) -> Result<Tensor<S, E, D>, D::Err>
where
    Rank1<C>: BroadcastShapeTo<S, Ax>,
{
    let shape = *x.shape();

    // statistics for normalizing
    let std = var
        .clone()
        .try_add(E::from_f64(epsilon).unwrap())?
        .try_sqrt()?;

    let scale = scale.clone().try_div(std)?.try_broadcast_like(&shape)?;

    // normalize & affine
    let x = x.try_sub(mean.clone().try_broadcast_like(&shape)?)?;
    let x = x.try_mul(scale)?;
    x.try_add(bias.clone().try_broadcast_like(&shape)?)
}
