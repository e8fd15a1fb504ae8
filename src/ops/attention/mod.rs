//! Multi-head self-attention as one op over packed `[q | k | v]` rows (the output of one
//! `3 × width` projection), causal (a decoder's) or full (an encoder's).
//!
//! Per head, `softmax(q·kᵀ/√d + mask)·v` with the scores in precision `Sc`: the policy table's
//! softmax row. [`try_attention`] takes `Sc` as a type parameter, so the precision of the scores
//! is part of the call's type: typed-amp's attention layers pass the `Fp32Op` row's precision,
//! FP32 under every policy but O3.
//!
//! How it runs is the device's ([`AttentionOp`]): the default is the composed computation
//! ([`try_attention_composed`]), which stores the `T × T` scores and probabilities for the
//! backward pass; the CPU runs FP32 scores as the fused op ([`try_attention_fused`],
//! FlashAttention's algorithm: online softmax over key blocks, scores never stored, the backward
//! recomputing them from one FP32 log-sum-exp per row), with 16-bit `q`, `k`, `v` and output
//! under O2. 16-bit scores (O3) run composed on every device.
//!
//! On the CPU, heads of at most 64 tokens (`cpu_short`) compute in FP32 from the widened
//! operands to the output's one rounding: their products are FP32 loops, so the probabilities
//! and the scores' gradient are not rounded to the working precision before them (FlashAttention
//! rounds them because its tensor-core products take 16-bit operands, as do the longer heads'
//! products on the 16-bit GEMM, `cpu_blocked`, and the CUDA kernels).

mod composed;
mod cpu_blocked;
mod cpu_kernel;
mod cpu_short;
#[cfg(feature = "cuda")]
mod cuda_kernel;
#[cfg(feature = "cuda")]
mod cuda_mma;
mod fused;
mod kernel;
mod op;
#[cfg(test)]
mod tests;

use dfdx::prelude::{Const, Cpu, Dim, Tape, Tensor};

use crate::ops::cast::CastDevice;
use crate::ops::tokens::Tokens;
use crate::precision::AmpElem;
use crate::tape::AmpTape;

pub use composed::try_attention_composed;
pub use fused::try_attention_fused;
pub use kernel::{AttentionDims, AttentionKernel};
pub use op::AttentionOp;

/// Multi-head attention over `qkv` (`(batch, tokens, 3M)`, queries, keys and values side by
/// side, `M = H × head_dim`), causal or not, with its scores in `Sc`: `(batch, tokens, M)`.
pub fn try_attention<const M: usize, const M3: usize, const H: usize, B, S, E, Sc, D, T>(
    qkv: Tensor<(B, S, Const<M3>), E, D, T>,
    causal: bool,
) -> Result<Tokens<B, S, M, E, D, T>, D::Err>
where
    B: Dim,
    S: Dim,
    E: AmpElem,
    Sc: AmpElem,
    D: CastDevice<E, Sc> + CastDevice<Sc, E> + AttentionOp<E>,
    T: AmpTape<D> + Tape<E, D> + Tape<Sc, D>,
{
    let _timing = typed_amp_kernels::timing::scope(typed_amp_kernels::timing::Kind::Attention);
    D::try_attention::<M, M3, H, B, S, Sc, T>(qkv, causal)
}

/// The CPU fuses attention whose scores are FP32.
impl<E: AmpElem> AttentionOp<E> for Cpu {
    fn try_attention<const M: usize, const M3: usize, const H: usize, B, S, Sc, T>(
        qkv: Tensor<(B, S, Const<M3>), E, Self, T>,
        causal: bool,
    ) -> Result<Tokens<B, S, M, E, Self, T>, Self::Err>
    where
        Self: CastDevice<E, Sc> + CastDevice<Sc, E>,
        B: Dim,
        S: Dim,
        Sc: AmpElem,
        T: AmpTape<Self> + Tape<E, Self> + Tape<Sc, Self>,
    {
        if Sc::INDEX == <f32 as crate::precision::Indexed>::INDEX {
            try_attention_fused::<M, M3, H, B, S, E, Self, T>(qkv, causal)
        } else {
            try_attention_composed::<M, M3, H, B, S, E, Sc, Self, T>(qkv, causal)
        }
    }
}

/// CUDA fuses attention whose scores are FP32, as the CPU does.
#[cfg(feature = "cuda")]
impl<E: crate::device::utilities::cuda::CudaElem> AttentionOp<E> for dfdx::prelude::Cuda {
    fn try_attention<const M: usize, const M3: usize, const H: usize, B, S, Sc, T>(
        qkv: Tensor<(B, S, Const<M3>), E, Self, T>,
        causal: bool,
    ) -> Result<Tokens<B, S, M, E, Self, T>, Self::Err>
    where
        Self: CastDevice<E, Sc> + CastDevice<Sc, E>,
        B: Dim,
        S: Dim,
        Sc: AmpElem,
        T: AmpTape<Self> + Tape<E, Self> + Tape<Sc, Self>,
    {
        if Sc::INDEX == <f32 as crate::precision::Indexed>::INDEX {
            try_attention_fused::<M, M3, H, B, S, E, Self, T>(qkv, causal)
        } else {
            try_attention_composed::<M, M3, H, B, S, E, Sc, Self, T>(qkv, causal)
        }
    }
}
