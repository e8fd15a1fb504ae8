//! The fused head on tensors, on any device with [`LmHeadKernel`]s.

use dfdx::prelude::{
    Const, Dim, HasShape, PutTape, Rank0, ReshapeTo, Shape, SplitTape, Storage, Tape, Tensor,
};

use super::{LmHeadDims, LmHeadKernel};
use crate::ops::cast::CastDevice;
use crate::ops::tokens::Tokens;
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// The head's loss as one op: FP32 logits from the product's store (kept, `rows × V`, for the
/// backward pass: the one FP32 activation), the loss and one log-sum-exp per row; the backward
/// writes the logits' gradient once in `E` and runs the two products, the weight's gradient in
/// FP32. Runs the composed computation instead where `h` is not contiguous.
pub fn try_lm_head_loss_fused<const V: usize, const C: usize, B, S, E, D, T>(
    h: Tensor<(B, S, Const<C>), E, D, T>,
    w: &Tensor<(Const<V>, Const<C>), E, D>,
    targets: &Tensor<(B, S), usize, D>,
) -> Result<Tensor<Rank0, f32, D, T>, D::Err>
where
    B: Dim,
    S: Dim,
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E> + LmHeadKernel<E>,
    T: AmpTape<D> + Tape<E, D>,
{
    if h.strides() != h.shape().strides() || targets.strides() != targets.shape().strides() {
        return super::try_lm_head_loss_composed(h, w, targets);
    }
    let (b, s, _) = *h.shape();
    let dims = LmHeadDims {
        rows: b.size() * s.size(),
        width: C,
        vocab: V,
    };
    let (h, mut tape) = h.split_tape();
    let dev = h.device().clone();
    let mut logits = Storage::<f32>::try_alloc_len(&dev, dims.rows * V)?;
    LmHeadKernel::<E>::try_head_logits(&dev, dims, h.storage(), w.storage(), &mut logits)?;
    let mut loss: Tensor<Rank0, f32, D> = dev.try_zeros()?;
    let mut lse = Storage::<f32>::try_alloc_len(&dev, dims.rows)?;
    LmHeadKernel::<E>::try_cross_entropy_forward(
        &dev,
        dims,
        &logits,
        targets.storage(),
        loss.storage_mut(),
        &mut lse,
    )?;
    let (loss_id, w, targets) = (loss.id(), w.clone(), targets.clone());
    tape.record_mixed(move |grads| {
        let Some(g) = grads.store_mut::<f32>().remove(loss_id) else {
            return Ok(());
        };
        let mut dlogits = Storage::<E>::try_alloc_len(&dev, dims.rows * V)?;
        LmHeadKernel::<E>::try_cross_entropy_backward(
            &dev,
            dims,
            &logits,
            &lse,
            targets.storage(),
            &g,
            &mut dlogits,
        )?;
        drop(logits);
        if let Some(dw) = grads.param_grad_mut(w.id(), V * C, &dev)? {
            LmHeadKernel::<E>::try_head_backward(
                &dev,
                dims,
                &dlogits,
                h.storage(),
                w.storage(),
                None,
                Some(dw),
            )?;
        }
        let store = grads.store_mut::<E>();
        if store.wants_grad(&h) {
            // Written over a fresh gradient, added to one that other ops already wrote.
            let accumulate = store.get_ref_checked(&h).is_some();
            let dh = store.get_or_alloc_mut(&h)?;
            LmHeadKernel::<E>::try_head_backward(
                &dev,
                dims,
                &dlogits,
                h.storage(),
                w.storage(),
                Some((dh, accumulate)),
                None,
            )?;
        }
        Ok(())
    });
    Ok(loss.put_tape(tape))
}

/// The logits `h · wᵀ` in FP32, for evaluation and sampling (no tape): straight from the
/// product's store on devices with the fused kernels.
pub fn try_lm_logits_fused<const V: usize, const C: usize, B, S, E, D>(
    h: &Tensor<(B, S, Const<C>), E, D>,
    w: &Tensor<(Const<V>, Const<C>), E, D>,
) -> Result<Tokens<B, S, V, f32, D>, D::Err>
where
    B: Dim,
    S: Dim,
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E> + LmHeadKernel<E>,
{
    let (b, s, _) = *h.shape();
    let dev = h.device().clone();
    let h = h.clone().try_contiguous()?;
    let dims = LmHeadDims {
        rows: b.size() * s.size(),
        width: C,
        vocab: V,
    };
    let mut logits: Tensor<(B, S, Const<V>), f32, D> = dev.try_zeros_like(&(b, s, Const::<V>))?;
    LmHeadKernel::<E>::try_head_logits(&dev, dims, h.storage(), w.storage(), logits.storage_mut())?;
    Ok(logits)
}
