//! The fused attention's kernels' trait and its sizes.

use dfdx::prelude::{HasErr, Storage};

use crate::precision::AmpElem;

/// The sizes of one attention op: `batch × tokens` rows of `3 × heads × head_dim` packed
/// queries, keys and values in, `batch × tokens` rows of `heads × head_dim` out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionDims {
    /// Sequences in the batch.
    pub batch: usize,
    /// Tokens per sequence.
    pub tokens: usize,
    /// Heads.
    pub heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Whether token `i` attends only to tokens `j ≤ i` (a decoder's causal mask).
    pub causal: bool,
}

impl AttentionDims {
    /// The model width, `heads × head_dim`.
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Rows of the packed input and of the output, `batch × tokens`.
    pub fn rows(&self) -> usize {
        self.batch * self.tokens
    }

    /// The scores' scale, `1 / √head_dim`.
    pub fn scale(&self) -> f32 {
        (1.0 / (self.head_dim as f64).sqrt()) as f32
    }
}

/// A forward's output and the log-sum-exps it keeps for the backward.
pub(crate) type OutputAndLse<D, E> = (<D as Storage<E>>::Vec, <D as Storage<f32>>::Vec);

/// The fused attention's passes over buffers (FlashAttention's algorithm): scores in FP32,
/// computed block by block with an online softmax and never stored; the forward keeps one FP32
/// log-sum-exp per query row and head, from which the backward recomputes the probabilities.
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait AttentionKernel<E: AmpElem>: Storage<E> + Storage<f32> + HasErr {
    /// `y = softmax(q·kᵀ·scale + mask)·v` per sequence and head, rounded once to `E`, from
    /// `qkv` (`rows × 3·width`) into `y` (`rows × width`); returns the log-sum-exp of every
    /// query row, `batch × heads × tokens` in that order.
    fn try_attention_forward(
        &self,
        dims: AttentionDims,
        qkv: &<Self as Storage<E>>::Vec,
        y: &mut <Self as Storage<E>>::Vec,
    ) -> Result<<Self as Storage<f32>>::Vec, Self::Err>;

    /// The gradient of `qkv` from the output's `dy`, the output `y` and the forward's
    /// log-sum-exps: written into `dqkv`, or added to it if its flag says so (each element
    /// rounded once).
    #[allow(clippy::too_many_arguments)]
    fn try_attention_backward(
        &self,
        dims: AttentionDims,
        qkv: &<Self as Storage<E>>::Vec,
        y: &<Self as Storage<E>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        lse: &<Self as Storage<f32>>::Vec,
        dqkv: (&mut <Self as Storage<E>>::Vec, bool),
    ) -> Result<(), Self::Err>;

    /// [`try_attention_forward`](Self::try_attention_forward) into a new buffer. The default
    /// zero-fills one for it; the CPU zeroes each sequence's rows in the task that writes them.
    fn try_attention_forward_new(
        &self,
        dims: AttentionDims,
        qkv: &<Self as Storage<E>>::Vec,
    ) -> Result<OutputAndLse<Self, E>, Self::Err> {
        let mut y = Storage::<E>::try_alloc_len(self, dims.rows() * dims.width())?;
        let lse = self.try_attention_forward(dims, qkv, &mut y)?;
        Ok((y, lse))
    }

    /// [`try_attention_backward`](Self::try_attention_backward) for a `qkv` with no gradient
    /// yet, into a new buffer (zero-filled by the default, zeroed per sequence in its task on
    /// the CPU).
    fn try_attention_backward_new(
        &self,
        dims: AttentionDims,
        qkv: &<Self as Storage<E>>::Vec,
        y: &<Self as Storage<E>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        lse: &<Self as Storage<f32>>::Vec,
    ) -> Result<<Self as Storage<E>>::Vec, Self::Err> {
        let mut dqkv = Storage::<E>::try_alloc_len(self, Storage::<E>::len(self, qkv))?;
        self.try_attention_backward(dims, qkv, y, dy, lse, (&mut dqkv, false))?;
        Ok(dqkv)
    }
}
