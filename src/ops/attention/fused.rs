//! The fused attention op on tensors, on any device with [`AttentionKernel`]s.

use dfdx::prelude::{Const, Dim, HasShape, PutTape, Shape, SplitTape, Storage, Tape, Tensor};

use super::{AttentionDims, AttentionKernel};
use crate::ops::cast::CastDevice;
use crate::ops::tokens::Tokens;
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// Attention over packed `[q | k | v]` rows as one op: the scores in FP32 inside the kernels,
/// never stored; the tape keeps `qkv` (shared with the op that made it), the output and one
/// FP32 log-sum-exp per query row and head, and the backward recomputes the probabilities.
///
/// Runs the composed computation instead (scores in FP32) where `qkv` is not contiguous.
pub fn try_attention_fused<const M: usize, const M3: usize, const H: usize, B, S, E, D, T>(
    qkv: Tensor<(B, S, Const<M3>), E, D, T>,
    causal: bool,
) -> Result<Tokens<B, S, M, E, D, T>, D::Err>
where
    B: Dim,
    S: Dim,
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E> + AttentionKernel<E>,
    T: AmpTape<D> + Tape<E, D>,
{
    const {
        assert!(
            H > 0 && M.is_multiple_of(H) && M3 == 3 * M,
            "attention takes 3 × width packed inputs, and the width must be a multiple of the heads"
        )
    };
    if qkv.strides() != qkv.shape().strides() {
        return super::try_attention_composed::<M, M3, H, B, S, E, f32, D, T>(qkv, causal);
    }
    let (b, s, _) = *qkv.shape();
    let dims = AttentionDims {
        batch: b.size(),
        tokens: s.size(),
        heads: H,
        head_dim: M / H,
        causal,
    };
    let (qkv, mut tape) = qkv.split_tape();
    let dev = qkv.device().clone();
    let (y, lse) = AttentionKernel::<E>::try_attention_forward_new(&dev, dims, qkv.storage())?;
    let y: Tensor<(B, S, Const<M>), E, D> =
        Storage::<E>::tensor_from_storage(&dev, (b, s, Const::<M>), y);
    let (y_id, out) = (y.id(), y.clone());
    tape.record_mixed(move |grads| {
        let _timing = typed_amp_kernels::timing::scope(typed_amp_kernels::timing::Kind::Attention);
        let Some(dy) = grads.store_mut::<E>().remove(y_id) else {
            return Ok(());
        };
        let store = grads.store_mut::<E>();
        if !store.wants_grad(&qkv) {
            return Ok(());
        }
        // Written into a new buffer, or added to a gradient that other ops already wrote.
        if store.get_ref_checked(&qkv).is_none() {
            let dqkv = AttentionKernel::<E>::try_attention_backward_new(
                &dev,
                dims,
                qkv.storage(),
                out.storage(),
                &dy,
                &lse,
            )?;
            store.insert(qkv.id(), dqkv);
            return Ok(());
        }
        AttentionKernel::<E>::try_attention_backward(
            &dev,
            dims,
            qkv.storage(),
            out.storage(),
            &dy,
            &lse,
            (store.get_or_alloc_mut(&qkv)?, true),
        )
    });
    Ok(y.put_tape(tape))
}
