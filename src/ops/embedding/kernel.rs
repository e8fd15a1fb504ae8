//! The embedding's two traits: the op on tensors (default: composed) and the fused kernels'
//! passes over buffers.

use dfdx::prelude::{Const, Dim, HasErr, Storage, Tape, Tensor};

use crate::ops::cast::CastDevice;
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// The sizes of one embedding: `batch × tokens` token ids into rows of `width`, from a table of
/// `vocab` token rows and `positions` position rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddingDims {
    /// Sequences.
    pub batch: usize,
    /// Tokens per sequence (at most `positions`).
    pub tokens: usize,
    /// The rows' width.
    pub width: usize,
    /// Rows of the token table.
    pub vocab: usize,
    /// Rows of the position table.
    pub positions: usize,
}

/// How a device runs a GPT's input embedding: `x[b, t] = wte[token[b, t]] + wpe[t]` in the
/// tables' element type `E`.
///
/// The default composes dfdx's ops ([`super::try_embed_composed`]: a gather, a slice of the
/// position table broadcast over the batch, an add). A device with [`EmbeddingKernel`]s runs
/// [`super::try_embed_fused`].
pub trait EmbeddingOp<E: AmpElem>: HasErr + Sized {
    /// The embedding of `tokens` (`(batch, tokens)` ids below `V`, at most `P` tokens).
    fn try_embed<const V: usize, const P: usize, const C: usize, B, S, T>(
        tokens: Tensor<(B, S), usize, Self, T>,
        wte: &Tensor<(Const<V>, Const<C>), E, Self>,
        wpe: &Tensor<(Const<P>, Const<C>), E, Self>,
    ) -> Result<Tensor<(B, S, Const<C>), E, Self, T>, Self::Err>
    where
        Self: CastDevice<E, f32> + CastDevice<f32, E>,
        B: Dim,
        S: Dim,
        T: AmpTape<Self> + Tape<E, Self>,
    {
        super::try_embed_composed(tokens, wte, wpe)
    }
}

/// The fused embedding's passes: the forward in FP32 rounded once, the backward straight into
/// the tables' FP32 gradients (a token's rows summed in FP32, in an order that does not depend
/// on the thread count).
pub trait EmbeddingKernel<E: AmpElem>: Storage<E> + Storage<f32> + Storage<usize> + HasErr {
    /// `y[b, t] = wte[tokens[b, t]] + wpe[t]`. A token id of `vocab` or more is an error.
    fn try_embed_forward(
        &self,
        dims: EmbeddingDims,
        tokens: &<Self as Storage<usize>>::Vec,
        wte: &<Self as Storage<E>>::Vec,
        wpe: &<Self as Storage<E>>::Vec,
        y: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), Self::Err>;

    /// `dwte[v] += Σ_{token = v} dy` and `dwpe[t] += Σ_b dy[b, t]` into FP32 gradients, each
    /// written over if its flag says it is fresh.
    fn try_embed_backward(
        &self,
        dims: EmbeddingDims,
        tokens: &<Self as Storage<usize>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        dwte: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
        dwpe: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
    ) -> Result<(), Self::Err>;
}
