//! The embedding as an op on tensors: how a device runs it, the composed computation by
//! default.

use dfdx::prelude::{Const, Dim, HasErr, Tape, Tensor};

use crate::ops::cast::CastDevice;
use crate::ops::tokens::Tokens;
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// How a device runs a GPT's input embedding: `x[b, t] = wte[token[b, t]] + wpe[t]` in the
/// tables' element type `E`.
///
/// The default composes dfdx's ops ([`super::try_embed_composed`]: a gather, a slice of the
/// position table broadcast over the batch, an add). A device with [`EmbeddingKernel`](super::EmbeddingKernel)s runs
/// [`super::try_embed_fused`].
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait EmbeddingOp<E: AmpElem>: HasErr + Sized {
    /// The embedding of `tokens` (`(batch, tokens)` ids below `V`, at most `P` tokens).
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
        super::try_embed_composed(tokens, wte, wpe)
    }
}
