//! The fused embedding on tensors, on any device with [`EmbeddingKernel`]s.

use dfdx::prelude::{Const, Dim, HasShape, PutTape, Shape, SplitTape, Tape, Tensor};

use super::{EmbeddingDims, EmbeddingKernel};
use crate::ops::cast::CastDevice;
use crate::ops::tokens::Tokens;
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// The embedding as one op: the tape keeps the token ids; the backward adds each token's and
/// each position's gradient rows into the tables' FP32 gradients. Runs the composed ops where
/// the ids are not contiguous.
pub fn try_embed_fused<const V: usize, const P: usize, const C: usize, B, S, E, D, T>(
    tokens: Tensor<(B, S), usize, D, T>,
    wte: &Tensor<(Const<V>, Const<C>), E, D>,
    wpe: &Tensor<(Const<P>, Const<C>), E, D>,
) -> Result<Tokens<B, S, C, E, D, T>, D::Err>
where
    B: Dim,
    S: Dim,
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E> + EmbeddingKernel<E>,
    T: AmpTape<D> + Tape<E, D>,
{
    if tokens.strides() != tokens.shape().strides() {
        return super::try_embed_composed(tokens, wte, wpe);
    }
    let (b, s) = *tokens.shape();
    let dims = EmbeddingDims {
        batch: b.size(),
        tokens: s.size(),
        width: C,
        vocab: V,
        positions: P,
    };
    let (tokens, mut tape) = tokens.split_tape();
    let dev = tokens.device().clone();
    let mut y: Tensor<(B, S, Const<C>), E, D> = dev.try_zeros_like(&(b, s, Const::<C>))?;
    EmbeddingKernel::<E>::try_embed_forward(
        &dev,
        dims,
        tokens.storage(),
        wte.storage(),
        wpe.storage(),
        y.storage_mut(),
    )?;
    let (y_id, wte_id, wpe_id) = (y.id(), wte.id(), wpe.id());
    tape.record_mixed(move |grads| {
        let Some(dy) = grads.store_mut::<E>().remove(y_id) else {
            return Ok(());
        };
        // Two FP32 gradients borrowed one after the other: the token table's pass, then the
        // positions'.
        if let Some(dwte) = grads.param_grad_mut(wte_id, V * C, &dev)? {
            EmbeddingKernel::<E>::try_embed_backward(
                &dev,
                dims,
                tokens.storage(),
                &dy,
                Some(dwte),
                None,
            )?;
        }
        if let Some(dwpe) = grads.param_grad_mut(wpe_id, P * C, &dev)? {
            EmbeddingKernel::<E>::try_embed_backward(
                &dev,
                dims,
                tokens.storage(),
                &dy,
                None,
                Some(dwpe),
            )?;
        }
        Ok(())
    });
    Ok(y.put_tape(tape))
}
