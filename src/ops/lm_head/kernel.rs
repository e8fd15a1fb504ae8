//! The fused language-model head's kernels' trait and its sizes.

use dfdx::prelude::{HasErr, Storage};

use crate::precision::AmpElem;

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

/// The fused head's passes: the logits from the product's store straight in FP32 (never
/// rounded to 16 bits), the loss and its gradient in one pass per row each, the logits'
/// gradient written once, in `E`, for the two products of the backward pass.
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
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
