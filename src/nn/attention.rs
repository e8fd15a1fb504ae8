//! Multi-head self-attention that follows the policy table: projections and the `QKᵀ` and `AV`
//! products in the working precision, the scores' softmax by the `Fp32Op` row (FP32 under O0,
//! O1 and O2, cast in and back; 16-bit only under O3).
//!
//! Why not dfdx's `MultiHeadAttention`: its forward is one generic function over a single
//! element type, calling `softmax` on the scores in that type, so under O2 it would sum
//! exponentials in FP16 (the overflow `typed_amp::ops::softmax` exists to prevent). Making it
//! follow the table would need a cast hook inside the vendored forward; a layer of our own is a
//! [`kind::Composite`] whose parts (four linear layers and dfdx's `Softmax`) each take their
//! row of the policy, so `#[amp]` casts at exactly the boundaries the table names, and its
//! parameters walk, convert and checkpoint like any other layer's.

use dfdx::nn::modules::{Linear, Softmax};
use dfdx::nn::{
    BuildModule, BuildOnDevice, Module, ModuleVisitor, NonMutableModule, TensorCollection,
};
use dfdx::prelude::{
    Axes4, Const, Device, Dim, Dtype, HasShape, Merge, PermuteTo, ReshapeTo, Tape, Tensor,
    TryMatMul, TryMul, WithEmptyTape,
};

use crate::amp::kind;
use crate::amp::layer::{CompositeRun, CompositeRunMut, CompositeWorking, RunLayer, WorkingUnder};
use crate::amp::{AmpLayer, CastTo};
use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::master::{CompositePaired, PairVisitor, Paired};
use crate::ops::cast::{Cast, CastDevice};
use crate::params::{ParamPath, Parameters};
use crate::precision::{AmpElem, SamePrecisionAs};

/// Architecture type for [`SelfAttention`].
pub mod builder {
    /// Self-attention over `M`-wide tokens with `H` heads of width `M / H` (`M` a multiple
    /// of `H`).
    #[derive(Debug, Clone, Copy, Default)]
    pub struct SelfAttention<const M: usize, const H: usize>;
}

impl<const M: usize, const H: usize, E: Dtype, D: Device<E>> BuildOnDevice<D, E>
    for builder::SelfAttention<M, H>
where
    SelfAttention<H, Linear<M, M, E, D>>: BuildModule<D, E>,
{
    type Built = SelfAttention<H, Linear<M, M, E, D>>;
}

/// Multi-head self-attention with `H` heads: `softmax(QKᵀ/√d)·V` per head, then an output
/// projection, as PyTorch's `nn.MultiheadAttention` with `batch_first=True` and no mask.
///
/// Takes `(batch, tokens, M)` and returns the same shape. `L` is the projection layer
/// (`Linear<M, M, E, D>`; another type in a working copy under a policy).
#[derive(Debug, Clone)]
pub struct SelfAttention<const H: usize, L> {
    /// Query projection.
    pub q: L,
    /// Key projection.
    pub k: L,
    /// Value projection.
    pub v: L,
    /// Output projection.
    pub o: L,
}

impl<const H: usize, L: TensorCollection<E, D>, E: Dtype, D: Device<E>> TensorCollection<E, D>
    for SelfAttention<H, L>
{
    type To<E2: Dtype, D2: Device<E2>> = SelfAttention<H, L::To<E2, D2>>;

    fn iter_tensors<V: ModuleVisitor<Self, E, D>>(
        visitor: &mut V,
    ) -> Result<Option<Self::To<V::E2, V::D2>>, V::Err> {
        visitor.visit_fields(
            (
                Self::module("q", |s| &s.q, |s| &mut s.q),
                Self::module("k", |s| &s.k, |s| &mut s.k),
                Self::module("v", |s| &s.v, |s| &mut s.v),
                Self::module("o", |s| &s.o, |s| &mut s.o),
            ),
            |(q, k, v, o)| SelfAttention { q, k, v, o },
        )
    }
}

crate::params::field_params! {
    [const H: usize, L: Parameters<D>,] SelfAttention<H, L> { q => "q", k => "k", v => "v", o => "o" };
}

/// `(batch, tokens, M)` tokens.
type Tokens<B, S, const M: usize, E, D, T> = Tensor<(B, S, Const<M>), E, D, T>;

/// The attention between projections: `q`, `k`, `v` are `(batch, tokens, M)` in one precision;
/// `softmax` normalises the `(batch, H, tokens, tokens)` scores and returns them in that
/// precision. Queries are scaled by `1/√(M/H)` before the product (as PyTorch does), so the
/// scores stay in range when 16-bit.
pub fn try_attend<B, S, const M: usize, const H: usize, E, D, T, F>(
    q: Tokens<B, S, M, E, D, T>,
    k: Tokens<B, S, M, E, D, T>,
    v: Tokens<B, S, M, E, D, T>,
    softmax: F,
) -> Result<Tokens<B, S, M, E, D, T>, D::Err>
where
    B: Dim,
    S: Dim,
    E: Dtype,
    D: Device<E>,
    T: Tape<E, D> + Merge<T>,
    F: FnOnce(
        Tensor<(B, Const<H>, S, S), E, D, T>,
    ) -> Result<Tensor<(B, Const<H>, S, S), E, D, T>, D::Err>,
{
    const {
        assert!(
            H > 0 && M.is_multiple_of(H),
            "the width must be a multiple of the heads"
        )
    };
    let (b, s, _) = *q.shape();
    let heads = (b, s, Const::<H>, M / H);
    let scale = 1.0 / ((M / H) as f64).sqrt();
    let q = q
        .try_mul(E::from_f64(scale).unwrap())?
        .try_reshape_like(&heads)?
        .try_permute::<_, Axes4<0, 2, 1, 3>>()?;
    let k = k
        .try_reshape_like(&heads)?
        .try_permute::<_, Axes4<0, 2, 3, 1>>()?;
    let v = v
        .try_reshape_like(&heads)?
        .try_permute::<_, Axes4<0, 2, 1, 3>>()?;
    let probs = softmax(q.try_matmul(k)?)?;
    probs
        .try_matmul(v)?
        .try_permute::<_, Axes4<0, 2, 1, 3>>()?
        .try_reshape_like(&(b, s, Const::<M>))
}

impl<const H: usize, L> AmpLayer for SelfAttention<H, L> {
    type Kind = kind::Composite;
}

impl<Pol, D: AmpDevice, const H: usize, L: WorkingUnder<Pol, D>> CompositeWorking<Pol, D>
    for SelfAttention<H, L>
{
    type Working = SelfAttention<H, L::Working>;
    fn try_working_from(&self) -> Result<Self::Working, AmpError> {
        Ok(SelfAttention {
            q: self.q.try_working_from()?,
            k: self.k.try_working_from()?,
            v: self.v.try_working_from()?,
            o: self.o.try_working_from()?,
        })
    }
}

// The master's projections pair with the working copy's, part by part.
impl<D: AmpDevice, const H: usize, L: Paired<W, D>, W> CompositePaired<SelfAttention<H, W>, D>
    for SelfAttention<H, L>
{
    fn visit_pairs_at<V: PairVisitor<D>>(
        &mut self,
        working: &mut SelfAttention<H, W>,
        path: &mut ParamPath,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        path.within("q", |path| {
            self.q.visit_pairs_at(&mut working.q, path, visitor)
        })?;
        path.within("k", |path| {
            self.k.visit_pairs_at(&mut working.k, path, visitor)
        })?;
        path.within("v", |path| {
            self.v.visit_pairs_at(&mut working.v, path, visitor)
        })?;
        path.within("o", |path| {
            self.o.visit_pairs_at(&mut working.o, path, visitor)
        })
    }
}

/// Under a policy: each projection by its row (the input cast to the matrix products'
/// precision `W`), the products in `W`, the softmax by the `Fp32Op` row and cast back to `W`.
impl<Pol, B, S, const M: usize, const H: usize, E, W, D, T, L, P>
    CompositeRun<Pol, Tensor<(B, S, Const<M>), E, D, T>> for SelfAttention<H, L>
where
    B: Dim,
    S: Dim,
    E: AmpElem,
    W: AmpElem,
    D: AmpDevice + Device<W> + dfdx::prelude::Storage<E>,
    T: Tape<W, D> + Merge<T>,
    Tensor<(B, S, Const<M>), E, D, T>: WithEmptyTape
        + RunLayer<L, Pol, Output = Tensor<(B, S, Const<M>), W, D, T>, Error = D::Err>,
    Tensor<(B, S, Const<M>), W, D, T>:
        RunLayer<L, Pol, Output = Tensor<(B, S, Const<M>), W, D, T>, Error = D::Err>,
    Tensor<(B, Const<H>, S, S), W, D, T>: RunLayer<Softmax, Pol, Output = P, Error = D::Err>,
    P: CastTo<W::Precision, Output = Tensor<(B, Const<H>, S, S), W, D, T>, Error = D::Err>,
{
    type Output = Tensor<(B, S, Const<M>), W, D, T>;
    type Error = D::Err;
    fn try_run(&self, x: Tensor<(B, S, Const<M>), E, D, T>) -> Result<Self::Output, D::Err> {
        let k = x.with_empty_tape().try_run(&self.k)?;
        let v = x.with_empty_tape().try_run(&self.v)?;
        let q = x.try_run(&self.q)?;
        let context = try_attend::<B, S, M, H, W, D, T, _>(q, k, v, |scores| {
            RunLayer::<Softmax, Pol>::try_run(scores, &Softmax)?.try_cast_to()
        })?;
        context.try_run(&self.o)
    }
}

// Attention keeps no state a training forward updates.
impl<Pol, X, const H: usize, L> CompositeRunMut<Pol, X> for SelfAttention<H, L>
where
    Self: CompositeRun<Pol, X>,
{
    type Output = <Self as CompositeRun<Pol, X>>::Output;
    type Error = <Self as CompositeRun<Pol, X>>::Error;
    fn try_run_mut(&mut self, x: X) -> Result<Self::Output, Self::Error> {
        CompositeRun::<Pol, X>::try_run(self, x)
    }
}

impl<const H: usize, L> NonMutableModule for SelfAttention<H, L> {}

/// Outside a policy: everything in the projections' precision `E` but the softmax, which is FP32
/// (the O1/O2 row: a 16-bit row is cast in and back).
///
/// The tokens' element type `X` is a parameter of its own, bound by rule
/// [`SamePrecisionAs`]: tokens of another precision (FP32 tokens into an O2 working copy's
/// FP16 attention) fail on that rule, whose message names the cast, rather than as a bare
/// mismatch of two tensor types.
impl<B, S, const M: usize, const H: usize, X, E, D, T> Module<Tensor<(B, S, Const<M>), X, D, T>>
    for SelfAttention<H, Linear<M, M, E, D>>
where
    B: Dim,
    S: Dim,
    X: AmpElem,
    X::Precision: SamePrecisionAs<E::Precision>,
    E: AmpElem,
    D: AmpDevice + CastDevice<E, f32> + dfdx::prelude::Storage<X>,
    T: crate::tape::AmpTape<D> + Tape<E, D> + Tape<f32, D> + Merge<T>,
    Linear<M, M, E, D>: Module<
        Tensor<(B, S, Const<M>), E, D, T>,
        Output = Tensor<(B, S, Const<M>), E, D, T>,
        Error = D::Err,
    >,
{
    type Output = Tensor<(B, S, Const<M>), E, D, T>;
    type Error = D::Err;
    fn try_forward(&self, x: Tensor<(B, S, Const<M>), X, D, T>) -> Result<Self::Output, D::Err> {
        let x = <X::Precision as SamePrecisionAs<E::Precision>>::into_same(x);
        let k = self.k.try_forward(x.with_empty_tape())?;
        let v = self.v.try_forward(x.with_empty_tape())?;
        let q = self.q.try_forward(x)?;
        let context = try_attend::<B, S, M, H, E, D, T, _>(q, k, v, |scores| {
            scores
                .try_to_f32()?
                .try_softmax::<dfdx::prelude::Axis<3>>()?
                .try_cast::<E::Precision>()
        })?;
        self.o.try_forward(context)
    }
}
