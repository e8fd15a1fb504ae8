//! Layer norm with 16-bit activations and FP32 parameters and statistics (the `KeepFp32` row
//! of the policy table, as PyTorch's autocast and Apex O2 run layer norm): the input and the
//! output are in the working precision, `gamma` and `beta` in FP32, and each row's mean,
//! variance and normalization computed in FP32 (the sums in f64), rounded once to the working
//! precision. The tape keeps the 16-bit input (shared with the op that produced it) and two
//! FP32 numbers per row, not an FP32 copy of the activations as casting around an FP32 layer
//! norm does.
//!
//! Given the same input, the result is that of dfdx's FP32 `LayerNorm1D` on the widened input,
//! rounded once (up to the order of the f32 operations). Devices without the kernels (CUDA),
//! and inputs that are not contiguous, run the FP32 layer between two casts instead.

mod cpu_kernel;
mod kernel;

use dfdx::prelude::{HasShape, PutTape, Rank1, Shape, SplitTape, Storage, Tensor};

use crate::device::{AmpDevice, Kernels};
use crate::ops::host::HostKernel;
use crate::precision::AmpElem;
use crate::tape::AmpTape;

pub use kernel::{MixedLayerNormKernel, RowStats};

/// A layer norm layer's FP32 parameters over rows of width `M`.
pub struct LayerNormParams<'a, const M: usize, D: Storage<f32>> {
    /// The scale (γ).
    pub gamma: &'a Tensor<Rank1<M>, f32, D>,
    /// The bias (β).
    pub beta: &'a Tensor<Rank1<M>, f32, D>,
    /// Added to the variance before its square root.
    pub epsilon: f64,
}

/// Whether the fused kernels can run on `x` as rows of width `M`: the device has them, `x` is
/// contiguous, and its last dimension is `M`.
pub fn fused_rows<const M: usize, S: Shape, E: AmpElem, D, T>(x: &Tensor<S, E, D, T>) -> bool
where
    D: AmpDevice + Kernels<E>,
{
    <D as MixedLayerNormKernel<E>>::FUSED
        && M > 0
        && x.strides() == x.shape().strides()
        && x.shape().concrete().into_iter().last() == Some(M)
}

/// Layer norm over the last dimension of `x` (for which [`fused_rows`] holds): the output in
/// `E`; its backward writes the input's gradient in `E` and `gamma`'s and `beta`'s in FP32.
pub fn try_layernorm<const M: usize, S: Shape, E, D, T>(
    x: Tensor<S, E, D, T>,
    p: LayerNormParams<'_, M, D>,
) -> Result<Tensor<S, E, D, T>, D::Err>
where
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
    T: AmpTape<D>,
{
    let (x, mut tape) = x.split_tape();
    let dev = x.device().clone();
    let gamma = HostKernel::<f32>::try_read(&dev, p.gamma.storage())?;
    let beta = HostKernel::<f32>::try_read(&dev, p.beta.storage())?;
    let mut y: Tensor<S, E, D> = dev.try_zeros_like(x.shape())?;
    let stats = MixedLayerNormKernel::<E>::try_ln_forward(
        &dev,
        M,
        x.storage(),
        y.storage_mut(),
        [&gamma, &beta],
        p.epsilon,
    )?;

    let (gamma_id, beta_id, y_id) = (p.gamma.id(), p.beta.id(), y.id());
    tape.record_mixed(move |grads| {
        let Some(dy) = grads.store_mut::<E>().remove(y_id) else {
            return Ok(());
        };
        let store = grads.store_mut::<E>();
        let gx = if store.wants_grad(&x) {
            // Written over a fresh gradient, added to one that other ops already wrote.
            let accumulate = store.get_ref_checked(&x).is_some();
            Some((store.get_or_alloc_mut(&x)?, accumulate))
        } else {
            None
        };
        let sums = MixedLayerNormKernel::<E>::try_ln_backward(
            &dev,
            M,
            x.storage(),
            &dy,
            gx,
            &gamma,
            &stats,
        )?;
        grads.add_to_param_grad(gamma_id, &sums[0], &dev)?;
        grads.add_to_param_grad(beta_id, &sums[1], &dev)?;
        Ok(())
    });
    Ok(y.put_tape(tape))
}
