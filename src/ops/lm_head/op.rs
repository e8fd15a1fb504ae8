//! The language-model head and its loss as an op on tensors: how a device runs them, the
//! composed computation by default.

use dfdx::prelude::{Const, Dim, HasErr, Rank0, Tape, Tensor};

use crate::ops::cast::CastDevice;
use crate::ops::tokens::Tokens;
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// How a device runs the language-model head over hidden states of element type `E`:
/// `logits = h · Wᵀ` and the mean cross-entropy of the logits against the targets, in FP32 (the
/// policy table's loss row).
///
/// The default composes dfdx's ops ([`super::try_lm_head_loss_composed`]): a product in `E`,
/// a cast of the logits to FP32, log-softmax, and the one-hot targets' cross-entropy, each
/// keeping its output for the backward pass. A device with [`LmHeadKernel`](super::LmHeadKernel)s runs
/// [`super::try_lm_head_loss_fused`].
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait LmHeadOp<E: AmpElem>: HasErr + Sized {
    /// The mean cross-entropy of `h · wᵀ` against `targets` (token ids below `V`), as an FP32
    /// scalar on `h`'s tape; the gradient reaches `h` and `w` (whose gradient is FP32).
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
        super::try_lm_head_loss_composed(h, w, targets)
    }

    /// The logits `h · wᵀ` in FP32, for evaluation and sampling (no tape).
    fn try_lm_logits<const V: usize, const C: usize, B, S>(
        h: &Tensor<(B, S, Const<C>), E, Self>,
        w: &Tensor<(Const<V>, Const<C>), E, Self>,
    ) -> Result<Tokens<B, S, V, f32, Self>, Self::Err>
    where
        Self: CastDevice<E, f32> + CastDevice<f32, E>,
        B: Dim,
        S: Dim,
    {
        super::try_lm_logits_composed(h, w)
    }
}
