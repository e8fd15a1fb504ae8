//! The embedding composed of dfdx's ops: what a device without the fused kernels runs, and the
//! reference the fused op is tested against.

use dfdx::prelude::{
    Axis, BroadcastTo, Const, Dim, GatherTo, HasShape, PutTape, ReshapeTo, SplitTape, Tape, Tensor,
    TryAdd,
};

use crate::ops::cast::CastDevice;
use crate::ops::tokens::Tokens;
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// `wte[tokens] + wpe[..tokens]` by dfdx's gather, slice, broadcast and add, in `E`.
pub fn try_embed_composed<const V: usize, const P: usize, const C: usize, B, S, E, D, T>(
    tokens: Tensor<(B, S), usize, D, T>,
    wte: &Tensor<(Const<V>, Const<C>), E, D>,
    wpe: &Tensor<(Const<P>, Const<C>), E, D>,
) -> Result<Tokens<B, S, C, E, D, T>, D::Err>
where
    B: Dim,
    S: Dim,
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E>,
    T: AmpTape<D> + Tape<E, D>,
{
    let (b, s) = *tokens.shape();
    if s.size() > P || tokens.as_vec().iter().any(|&t| t >= V) {
        return Err(dfdx::tensor::CpuError::WrongNumElements.into());
    }
    let positions = wpe
        .retaped::<T>()
        .try_slice((0..s.size(), ..))?
        .try_reshape_like(&(s, Const::<C>))?
        .try_broadcast_like::<_, Axis<0>>(&(b, s, Const::<C>))?;
    // The table takes the ids' tape for the gather, as dfdx's `Embedding` does.
    let (tokens, tape) = tokens.split_tape();
    let rows = wte.clone().put_tape(tape).try_gather(tokens)?;
    rows.try_add(positions)
}
