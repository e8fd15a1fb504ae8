//! A GPT's input embedding as one op: `x[b, t] = wte[token[b, t]] + wpe[t]`, the token table
//! (tied to the language-model head, [`crate::ops::lm_head`]) and the learned positions in the
//! policy's storage precision (the `Elementwise` row: FP32 under O0 and O1, 16-bit under O2 and
//! O3), the sum computed in FP32 and rounded once.
//!
//! How it runs is the device's ([`EmbeddingOp`]): the default composes dfdx's gather, slice,
//! broadcast and add ([`try_embed_composed`]), whose backward writes 16-bit table gradients
//! into dfdx's store; the CPU runs [`try_embed_fused`], whose backward sums each table row's
//! gradient in FP32 straight into the parameter's FP32 gradient, where the tied head's adds.

mod composed;
mod cpu_kernel;
#[cfg(feature = "cuda")]
mod cuda_kernel;
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

pub use composed::try_embed_composed;
pub use fused::try_embed_fused;
pub use kernel::{EmbeddingDims, EmbeddingKernel};
pub use op::EmbeddingOp;

/// The embedding of `tokens` (`(batch, tokens)` ids below `V`, at most `P` tokens): `(batch,
/// tokens, C)` in the tables' precision, on `tokens`' tape.
pub fn try_embed<const V: usize, const P: usize, const C: usize, B, S, E, D, T>(
    tokens: Tensor<(B, S), usize, D, T>,
    wte: &Tensor<(Const<V>, Const<C>), E, D>,
    wpe: &Tensor<(Const<P>, Const<C>), E, D>,
) -> Result<Tokens<B, S, C, E, D, T>, D::Err>
where
    B: Dim,
    S: Dim,
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E> + EmbeddingOp<E>,
    T: AmpTape<D> + Tape<E, D>,
{
    D::try_embed(tokens, wte, wpe)
}

/// The CPU fuses the embedding.
impl<E: AmpElem> EmbeddingOp<E> for Cpu {
    fn try_embed<const V: usize, const P: usize, const C: usize, B, S, T>(
        tokens: Tensor<(B, S), usize, Self, T>,
        wte: &Tensor<(Const<V>, Const<C>), E, Self>,
        wpe: &Tensor<(Const<P>, Const<C>), E, Self>,
    ) -> Result<Tokens<B, S, C, E, Self, T>, Self::Err>
    where
        Self: CastDevice<E, f32> + CastDevice<f32, E>,
        B: Dim,
        S: Dim,
        T: AmpTape<Self> + Tape<E, Self>,
    {
        try_embed_fused(tokens, wte, wpe)
    }
}

/// CUDA fuses the embedding, as the CPU does.
#[cfg(feature = "cuda")]
impl<E: crate::device::utilities::cuda::CudaElem> EmbeddingOp<E> for dfdx::prelude::Cuda {
    fn try_embed<const V: usize, const P: usize, const C: usize, B, S, T>(
        tokens: Tensor<(B, S), usize, Self, T>,
        wte: &Tensor<(Const<V>, Const<C>), E, Self>,
        wpe: &Tensor<(Const<P>, Const<C>), E, Self>,
    ) -> Result<Tokens<B, S, C, E, Self, T>, Self::Err>
    where
        Self: CastDevice<E, f32> + CastDevice<f32, E>,
        B: Dim,
        S: Dim,
        T: AmpTape<Self> + Tape<E, Self>,
    {
        try_embed_fused(tokens, wte, wpe)
    }
}
