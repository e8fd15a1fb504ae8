//! A language model's head and loss as one op: `logits = h · Wᵀ` (`W` the vocabulary's
//! weights, in a GPT the token embedding itself) and their mean cross-entropy against the next
//! tokens, in FP32 (the policy table's loss row).
//!
//! How it runs is the device's ([`LmHeadOp`]). The default composes dfdx's ops
//! ([`try_lm_head_loss_composed`]): the product in the working precision, the logits rounded to
//! it and cast to FP32, log-softmax, one-hot targets. The CPU runs the fused op
//! ([`try_lm_head_loss_fused`]): the logits go from the product's f32 accumulation straight into
//! an FP32 buffer (never a 16-bit copy), the loss is one pass per row, and the backward writes
//! the logits' gradient once, in the working precision, for its two products; the weight's
//! gradient accumulates in FP32 beside the embedding's (one tensor, one gradient).

mod composed;
mod cpu_kernel;
#[cfg(feature = "cuda")]
mod cuda_kernel;
mod fused;
mod kernel;
mod op;
#[cfg(test)]
mod tests;

use dfdx::prelude::{Const, Cpu, Dim, Rank0, Tape, Tensor};

use crate::loss::Loss;
use crate::ops::cast::CastDevice;
use crate::ops::tokens::Tokens;
use crate::precision::AmpElem;
use crate::tape::{AmpTape, MixedTape};

pub use composed::{try_lm_head_loss_composed, try_lm_logits_composed};
pub use fused::{try_lm_head_loss_fused, try_lm_logits_fused};
pub use kernel::{LmHeadDims, LmHeadKernel};
pub use op::LmHeadOp;

/// The mean cross-entropy of the logits `h · wᵀ` against `targets` (`(batch, tokens)` token
/// ids below `V`): a [`Loss`], FP32 whatever `h`'s precision.
pub fn try_lm_head_loss<const V: usize, const C: usize, B, S, E, D>(
    h: Tensor<(B, S, Const<C>), E, D, MixedTape<D>>,
    w: &Tensor<(Const<V>, Const<C>), E, D>,
    targets: &Tensor<(B, S), usize, D>,
) -> Result<Loss<D>, D::Err>
where
    B: Dim,
    S: Dim,
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E> + LmHeadOp<E>,
{
    let _timing = typed_amp_kernels::timing::scope(typed_amp_kernels::timing::Kind::Products);
    Ok(Loss::new(D::try_lm_head_loss(h, w, targets)?))
}

/// The logits `h · wᵀ` in FP32 (`(batch, tokens, V)`), for evaluation and sampling.
pub fn try_lm_logits<const V: usize, const C: usize, B, S, E, D>(
    h: &Tensor<(B, S, Const<C>), E, D>,
    w: &Tensor<(Const<V>, Const<C>), E, D>,
) -> Result<Tokens<B, S, V, f32, D>, D::Err>
where
    B: Dim,
    S: Dim,
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E> + LmHeadOp<E>,
{
    D::try_lm_logits(h, w)
}

/// The CPU fuses the head.
impl<E: AmpElem> LmHeadOp<E> for Cpu {
    fn try_lm_head_loss<const V: usize, const C: usize, B, S, T>(
        h: Tensor<(B, S, Const<C>), E, Self, T>,
        w: &Tensor<(Const<V>, Const<C>), E, Self>,
        targets: &Tensor<(B, S), usize, Self>,
    ) -> Result<Tensor<Rank0, f32, Self, T>, Self::Err>
    where
        Self: CastDevice<E, f32> + CastDevice<f32, E>,
        B: Dim,
        S: Dim,
        T: AmpTape<Self> + Tape<E, Self>,
    {
        try_lm_head_loss_fused(h, w, targets)
    }

    fn try_lm_logits<const V: usize, const C: usize, B, S>(
        h: &Tensor<(B, S, Const<C>), E, Self>,
        w: &Tensor<(Const<V>, Const<C>), E, Self>,
    ) -> Result<Tokens<B, S, V, f32, Self>, Self::Err>
    where
        Self: CastDevice<E, f32> + CastDevice<f32, E>,
        B: Dim,
        S: Dim,
    {
        try_lm_logits_fused(h, w)
    }
}

/// CUDA fuses the head, as the CPU does.
#[cfg(feature = "cuda")]
impl<E: crate::device::utilities::cuda::CudaElem> LmHeadOp<E> for dfdx::prelude::Cuda {
    fn try_lm_head_loss<const V: usize, const C: usize, B, S, T>(
        h: Tensor<(B, S, Const<C>), E, Self, T>,
        w: &Tensor<(Const<V>, Const<C>), E, Self>,
        targets: &Tensor<(B, S), usize, Self>,
    ) -> Result<Tensor<Rank0, f32, Self, T>, Self::Err>
    where
        Self: CastDevice<E, f32> + CastDevice<f32, E>,
        B: Dim,
        S: Dim,
        T: AmpTape<Self> + Tape<E, Self>,
    {
        try_lm_head_loss_fused(h, w, targets)
    }

    fn try_lm_logits<const V: usize, const C: usize, B, S>(
        h: &Tensor<(B, S, Const<C>), E, Self>,
        w: &Tensor<(Const<V>, Const<C>), E, Self>,
    ) -> Result<Tokens<B, S, V, f32, Self>, Self::Err>
    where
        Self: CastDevice<E, f32> + CastDevice<f32, E>,
        B: Dim,
        S: Dim,
    {
        try_lm_logits_fused(h, w)
    }
}
