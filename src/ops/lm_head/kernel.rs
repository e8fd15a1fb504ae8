//! The language-model head's two traits: the op on tensors (default: composed), and the fused
//! kernels' passes over buffers.

use dfdx::prelude::{Const, Dim, HasErr, Rank0, Storage, Tape, Tensor};

use crate::ops::cast::CastDevice;
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// The sizes of one head: `rows` hidden states of `width` against a `vocab × width` weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LmHeadDims {
    /// Positions (batch × tokens).
    pub rows: usize,
    /// The model's width.
    pub width: usize,
    /// The vocabulary's size.
    pub vocab: usize,
}

/// How a device runs the language-model head over hidden states of element type `E`:
/// `logits = h · Wᵀ` and the mean cross-entropy of the logits against the targets, in FP32 (the
/// policy table's loss row).
///
/// The default composes dfdx's ops ([`super::try_lm_head_loss_composed`]): a product in `E`,
/// a cast of the logits to FP32, log-softmax, and the one-hot targets' cross-entropy, each
/// keeping its output for the backward pass. A device with [`LmHeadKernel`]s runs
/// [`super::try_lm_head_loss_fused`].
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
    ) -> Result<Tensor<(B, S, Const<V>), f32, Self>, Self::Err>
    where
        Self: CastDevice<E, f32> + CastDevice<f32, E>,
        B: Dim,
        S: Dim,
    {
        super::try_lm_logits_composed(h, w)
    }
}

/// The fused head's passes: the logits from the product's store straight in FP32 (never
/// rounded to 16 bits), the loss and its gradient in one pass per row each, the logits'
/// gradient written once, in `E`, for the two products of the backward pass.
pub trait LmHeadKernel<E: AmpElem>: Storage<E> + Storage<f32> + Storage<usize> + HasErr {
    /// `logits = h · wᵀ` (`rows × vocab`, FP32).
    fn try_head_logits(
        &self,
        dims: LmHeadDims,
        h: &<Self as Storage<E>>::Vec,
        w: &<Self as Storage<E>>::Vec,
        logits: &mut <Self as Storage<f32>>::Vec,
    ) -> Result<(), Self::Err>;

    /// The mean over rows of `logsumexp(row) − row[target]` into `loss` (one element), and each
    /// row's log-sum-exp into `lse`. A target outside the vocabulary is an error.
    fn try_cross_entropy_forward(
        &self,
        dims: LmHeadDims,
        logits: &<Self as Storage<f32>>::Vec,
        targets: &<Self as Storage<usize>>::Vec,
        loss: &mut <Self as Storage<f32>>::Vec,
        lse: &mut <Self as Storage<f32>>::Vec,
    ) -> Result<(), Self::Err>;

    /// The logits' gradient, `g/rows · (softmax(row) − onehot(target))` with `g` the loss's
    /// gradient (one element, read on the device), rounded once into `dlogits`.
    #[allow(clippy::too_many_arguments)]
    fn try_cross_entropy_backward(
        &self,
        dims: LmHeadDims,
        logits: &<Self as Storage<f32>>::Vec,
        lse: &<Self as Storage<f32>>::Vec,
        targets: &<Self as Storage<usize>>::Vec,
        g: &<Self as Storage<f32>>::Vec,
        dlogits: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), Self::Err>;

    /// The head's backward products: `dh = dlogits · w` into `dh` (added to it if its flag
    /// says so), and `dw = dlogitsᵀ · h` into the FP32 `dw` (added to it unless it is fresh).
    #[allow(clippy::too_many_arguments)]
    fn try_head_backward(
        &self,
        dims: LmHeadDims,
        dlogits: &<Self as Storage<E>>::Vec,
        h: &<Self as Storage<E>>::Vec,
        w: &<Self as Storage<E>>::Vec,
        dh: Option<(&mut <Self as Storage<E>>::Vec, bool)>,
        dw: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
    ) -> Result<(), Self::Err>;
}
