//! The fused embedding's kernels' trait and its sizes.

use dfdx::prelude::{HasErr, Storage};

use crate::precision::AmpElem;

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

/// The fused embedding's passes: the forward in FP32 rounded once, the backward straight into
/// the tables' FP32 gradients (a token's rows summed in FP32, in an order that does not depend
/// on the thread count).
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
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
