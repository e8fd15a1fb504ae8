//! Attention as an op on tensors: how a device runs it, the composed computation by default.

use dfdx::prelude::{Const, Dim, HasErr, Tape, Tensor};

use crate::ops::cast::CastDevice;
use crate::ops::tokens::Tokens;
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// How a device runs multi-head attention over packed `[q | k | v]` rows of element type `E`,
/// with its scores (`QKᵀ/√d`, the mask and the softmax) in precision `Sc`.
///
/// The default is the composed computation ([`super::try_attention_composed`]): the heads split
/// by reshapes and permutes, `QKᵀ` as a batched product, the mask added, the scores cast to `Sc`
/// for the softmax and back, `PV`, and the heads merged; every intermediate kept for the
/// backward pass, the `T × T` scores included. A device with the fused kernels
/// ([`AttentionKernel`](super::AttentionKernel)) overrides it with [`super::try_attention_fused`] for FP32 scores.
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait AttentionOp<E: AmpElem>: HasErr + Sized {
    /// Attention over `qkv` (`(batch, tokens, 3M)`, `M = H × head_dim`): `(batch, tokens, M)`.
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
        super::try_attention_composed::<M, M3, H, B, S, E, Sc, Self, T>(qkv, causal)
    }
}
