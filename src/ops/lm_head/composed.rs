//! The head and its loss composed of dfdx's ops: what a device without the fused kernels runs,
//! and the reference the fused op is tested against.

use dfdx::prelude::{
    Axes2, Axis, Const, Dim, HasShape, PermuteTo, Rank0, SumTo, Tape, Tensor, TryMatMul, TryMul,
};

use crate::ops::cast::{Cast, CastDevice};
use crate::ops::tokens::Tokens;
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// `mean over rows of −log softmax(h · wᵀ)[target]` by dfdx's ops: the product in `E`, the
/// logits cast to FP32, log-softmax, and a one-hot mask of the targets.
pub fn try_lm_head_loss_composed<const V: usize, const C: usize, B, S, E, D, T>(
    h: Tensor<(B, S, Const<C>), E, D, T>,
    w: &Tensor<(Const<V>, Const<C>), E, D>,
    targets: &Tensor<(B, S), usize, D>,
) -> Result<Tensor<Rank0, f32, D, T>, D::Err>
where
    B: Dim,
    S: Dim,
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E>,
    T: AmpTape<D> + Tape<E, D>,
{
    let (b, s, _) = *h.shape();
    let dev = h.device().clone();
    let rows = b.size() * s.size();
    let ids = targets.as_vec();
    if ids.iter().any(|&t| t >= V) {
        return Err(dfdx::tensor::CpuError::WrongNumElements.into());
    }
    let mut onehot = vec![0f32; rows * V];
    for (r, &t) in ids.iter().enumerate() {
        onehot[r * V + t] = 1.0;
    }
    let onehot: Tensor<(B, S, Const<V>), f32, D> =
        dev.try_tensor_from_vec(onehot, (b, s, Const::<V>))?;
    let logits = h.try_matmul(w.retaped::<T>().try_permute::<_, Axes2<1, 0>>()?)?;
    logits
        .try_to_f32()?
        .try_log_softmax::<Axis<2>>()?
        .try_mul(onehot)?
        .try_sum::<Rank0, _>()?
        .try_mul(-1.0 / rows.max(1) as f32)
}

/// The logits `h · wᵀ` by dfdx's product in `E`, cast to FP32.
pub fn try_lm_logits_composed<const V: usize, const C: usize, B, S, E, D>(
    h: &Tensor<(B, S, Const<C>), E, D>,
    w: &Tensor<(Const<V>, Const<C>), E, D>,
) -> Result<Tokens<B, S, V, f32, D>, D::Err>
where
    B: Dim,
    S: Dim,
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E>,
{
    h.clone()
        .try_matmul(w.clone().try_permute::<_, Axes2<1, 0>>()?)?
        .try_to_f32()
}
