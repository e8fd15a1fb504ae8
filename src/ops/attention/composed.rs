//! Attention composed of dfdx's ops: what every device runs unless it has the fused kernels,
//! and the reference the fused kernels are tested against.

use dfdx::prelude::{
    Axes2, Axes4, BroadcastTo, Const, Dim, HasShape, PermuteTo, ReshapeTo, Tape, Tensor, TryAdd,
    TryMatMul, TryMul, WithEmptyTape,
};

use crate::ops::cast::{Cast, CastDevice};
use crate::ops::tokens::Tokens;
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// Attention over packed `[q | k | v]` rows by dfdx's ops: per head, `softmax(q·kᵀ/√d + mask)·v`
/// with the scores cast to `Sc` for the softmax (and back to `E`), every intermediate kept for
/// the backward pass.
pub fn try_attention_composed<const M: usize, const M3: usize, const H: usize, B, S, E, Sc, D, T>(
    qkv: Tensor<(B, S, Const<M3>), E, D, T>,
    causal: bool,
) -> Result<Tokens<B, S, M, E, D, T>, D::Err>
where
    B: Dim,
    S: Dim,
    E: AmpElem,
    Sc: AmpElem,
    D: CastDevice<E, Sc> + CastDevice<Sc, E>,
    T: AmpTape<D> + Tape<E, D> + Tape<Sc, D>,
{
    const {
        assert!(
            H > 0 && M.is_multiple_of(H) && M3 == 3 * M,
            "attention takes 3 × width packed inputs, and the width must be a multiple of the heads"
        )
    };
    let (b, s, _) = *qkv.shape();
    let dev = qkv.device().clone();
    let head_dim = M / H;
    let heads = (b, s, Const::<H>, head_dim);
    let scale = E::from_f64(1.0 / (head_dim as f64).sqrt()).unwrap();
    let part = |qkv: Tensor<(B, S, Const<M3>), E, D, T>, at: usize| {
        qkv.try_slice((.., .., at..at + M))?
            .try_reshape_like(&heads)
    };
    let q = part(qkv.with_empty_tape(), 0)?
        .try_mul(scale)?
        .try_permute::<_, Axes4<0, 2, 1, 3>>()?;
    let k = part(qkv.with_empty_tape(), M)?.try_permute::<_, Axes4<0, 2, 3, 1>>()?;
    let v = part(qkv, 2 * M)?.try_permute::<_, Axes4<0, 2, 1, 3>>()?;
    let mut scores = q.try_matmul(k)?;
    if causal {
        let n = s.size();
        let mask: Vec<E> = (0..n * n)
            .map(|at| {
                let masked = at % n > at / n;
                E::from_f64(if masked { f64::NEG_INFINITY } else { 0.0 }).unwrap()
            })
            .collect();
        let mask: Tensor<(S, S), E, D> = dev.try_tensor_from_vec(mask, (s, s))?;
        let mask = mask.try_broadcast_like::<_, Axes2<0, 1>>(scores.shape())?;
        scores = scores.try_add(mask)?;
    }
    let probs = scores
        .try_cast::<Sc::Precision>()?
        // the precision of `Sc` (the `Fp32Op` row's: 16-bit only under O3's opt-in)
        .try_softmax_16bit::<dfdx::prelude::Axis<3>>()?
        .try_cast::<E::Precision>()?;
    probs
        .try_matmul(v)?
        .try_permute::<_, Axes4<0, 2, 1, 3>>()?
        .try_reshape_like(&(b, s, Const::<M>))
}
