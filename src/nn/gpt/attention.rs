//! Multi-head self-attention over one packed `3 × width` projection, run as typed-amp's
//! attention op ([`crate::ops::attention`]): a GPT's causal attention and an encoder's full one.

use std::marker::PhantomData;

use dfdx::nn::modules::{Linear, UnbiasedLinear};
use dfdx::nn::{
    BuildModule, BuildOnDevice, Module, ModuleVisitor, NonMutableModule, TensorCollection,
};
use dfdx::prelude::{Const, Device, Dim, Dtype, Tape, Tensor};

use crate::amp::kind;
use crate::amp::layer::{
    CompositeRun, CompositeRunMut, CompositeWorking, Plan, Policy, RunLayer, WorkingUnder,
};
use crate::amp::AmpLayer;
use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::master::{CompositePaired, PairVisitor, Paired};
use crate::ops::attention::{try_attention, AttentionOp};
use crate::ops::cast::CastDevice;
use crate::params::{ParamPath, Parameters};
use crate::precision::{AmpElem, Precision};
use crate::tape::AmpTape;

/// Which tokens a query attends to.
#[doc(hidden)] // the attention's machinery: users name `Causal` or `Full`.
pub trait Mask: Send + Sync + 'static {
    /// Token `i` sees only tokens `j ≤ i`.
    const CAUSAL: bool;
}

/// A decoder's mask: each token sees itself and the tokens before it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Causal;

/// An encoder's (no mask): every token sees every token.
#[derive(Debug, Clone, Copy, Default)]
pub struct Full;

impl Mask for Causal {
    const CAUSAL: bool = true;
}

impl Mask for Full {
    const CAUSAL: bool = false;
}

/// Architecture types for [`Attention`].
pub mod builder {
    /// A GPT's attention (nanoGPT's `CausalSelfAttention` with `bias=False`): width `M`, `H`
    /// heads, `M3 = 3·M` (the packed projection's width, written out because stable Rust
    /// cannot compute it in a type), causal, projections without biases.
    #[derive(Debug, Clone, Copy, Default)]
    pub struct CausalSelfAttention<const M: usize, const H: usize, const M3: usize>;

    /// An encoder's attention (PyTorch's `nn.MultiheadAttention` layout: one packed input
    /// projection with a bias, an output projection with a bias), no mask.
    #[derive(Debug, Clone, Copy, Default)]
    pub struct PackedSelfAttention<const M: usize, const H: usize, const M3: usize>;
}

impl<const M: usize, const H: usize, const M3: usize, E: Dtype, D: Device<E>> BuildOnDevice<D, E>
    for builder::CausalSelfAttention<M, H, M3>
where
    Attention<M, H, M3, Causal, UnbiasedLinear<M, M3, E, D>, UnbiasedLinear<M, M, E, D>>:
        BuildModule<D, E>,
{
    type Built =
        Attention<M, H, M3, Causal, UnbiasedLinear<M, M3, E, D>, UnbiasedLinear<M, M, E, D>>;
}

impl<const M: usize, const H: usize, const M3: usize, E: Dtype, D: Device<E>> BuildOnDevice<D, E>
    for builder::PackedSelfAttention<M, H, M3>
where
    Attention<M, H, M3, Full, Linear<M, M3, E, D>, Linear<M, M, E, D>>: BuildModule<D, E>,
{
    type Built = Attention<M, H, M3, Full, Linear<M, M3, E, D>, Linear<M, M, E, D>>;
}

/// Multi-head self-attention with `H` heads over `(batch, tokens, M)`: `c_attn` projects to
/// packed `[q | k | v]` (`M3 = 3·M` wide), the attention op runs per head with mask `K`, and
/// `c_proj` projects back.
///
/// Under a policy each projection runs by its own row (a matrix product: the working
/// precision), and the attention's scores take the precision of the policy's softmax row, the
/// `Fp32Op` row: FP32 under O0, O1 and O2 (where the CPU runs the fused kernel, the scores never
/// stored), 16-bit only under O3. The type of the scores is the op's type parameter
/// ([`crate::ops::attention::try_attention`]), chosen here from the policy.
#[derive(Debug, Clone)]
pub struct Attention<const M: usize, const H: usize, const M3: usize, K, A, O> {
    /// The packed `[q | k | v]` projection, `M → 3M`.
    pub c_attn: A,
    /// The output projection, `M → M`.
    pub c_proj: O,
    mask: PhantomData<K>,
}

impl<const M: usize, const H: usize, const M3: usize, K, A, O> Attention<M, H, M3, K, A, O> {
    /// Attention from its two projections.
    pub fn new(c_attn: A, c_proj: O) -> Self {
        Attention {
            c_attn,
            c_proj,
            mask: PhantomData,
        }
    }
}

impl<const M: usize, const H: usize, const M3: usize, K, A, O, E, D> TensorCollection<E, D>
    for Attention<M, H, M3, K, A, O>
where
    K: Mask,
    A: TensorCollection<E, D>,
    O: TensorCollection<E, D>,
    E: Dtype,
    D: Device<E>,
{
    type To<E2: Dtype, D2: Device<E2>> = Attention<M, H, M3, K, A::To<E2, D2>, O::To<E2, D2>>;

    fn iter_tensors<V: ModuleVisitor<Self, E, D>>(
        visitor: &mut V,
    ) -> Result<Option<Self::To<V::E2, V::D2>>, V::Err> {
        visitor.visit_fields(
            (
                Self::module("c_attn", |s| &s.c_attn, |s| &mut s.c_attn),
                Self::module("c_proj", |s| &s.c_proj, |s| &mut s.c_proj),
            ),
            |(c_attn, c_proj)| Attention::new(c_attn, c_proj),
        )
    }
}

crate::params::field_params! {
    [const M: usize, const H: usize, const M3: usize, K, A: Parameters<D>, O: Parameters<D>,]
    Attention<M, H, M3, K, A, O> { c_attn => "c_attn", c_proj => "c_proj" };
}

impl<const M: usize, const H: usize, const M3: usize, K, A, O> AmpLayer
    for Attention<M, H, M3, K, A, O>
{
    type Kind = kind::Composite;
}

impl<Pol, D, const M: usize, const H: usize, const M3: usize, K, A, O> CompositeWorking<Pol, D>
    for Attention<M, H, M3, K, A, O>
where
    D: AmpDevice,
    A: WorkingUnder<Pol, D>,
    O: WorkingUnder<Pol, D>,
{
    type Working = Attention<M, H, M3, K, A::Working, O::Working>;
    fn try_working_from(&self) -> Result<Self::Working, AmpError> {
        Ok(Attention::new(
            self.c_attn.try_working_from()?,
            self.c_proj.try_working_from()?,
        ))
    }
}

// The master's projections pair with the working copy's, part by part.
impl<D, const M: usize, const H: usize, const M3: usize, K, A, O, Aw, Ow>
    CompositePaired<Attention<M, H, M3, K, Aw, Ow>, D> for Attention<M, H, M3, K, A, O>
where
    D: AmpDevice,
    A: Paired<Aw, D>,
    O: Paired<Ow, D>,
{
    fn visit_pairs_at<V: PairVisitor<D>>(
        &mut self,
        working: &mut Attention<M, H, M3, K, Aw, Ow>,
        path: &mut ParamPath,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        path.within("c_attn", |path| {
            self.c_attn
                .visit_pairs_at(&mut working.c_attn, path, visitor)
        })?;
        path.within("c_proj", |path| {
            self.c_proj
                .visit_pairs_at(&mut working.c_proj, path, visitor)
        })
    }
}

/// The precision of the scores under policy `Pol`: its softmax row's (`Fp32Op`).
pub type ScoresUnder<Pol> = <<<Pol as Policy>::Fp32Op as Plan>::Storage as Precision>::Elem;

/// Under a policy: the projections by their rows, the attention with the softmax row's scores.
impl<Pol, B, S, const M: usize, const H: usize, const M3: usize, K, A, O, E, W, D, T>
    CompositeRun<Pol, Tensor<(B, S, Const<M>), E, D, T>> for Attention<M, H, M3, K, A, O>
where
    Pol: Policy,
    B: Dim,
    S: Dim,
    K: Mask,
    E: AmpElem,
    W: AmpElem,
    D: CastDevice<W, ScoresUnder<Pol>>
        + CastDevice<ScoresUnder<Pol>, W>
        + AttentionOp<W>
        + dfdx::prelude::Storage<E>,
    T: AmpTape<D> + Tape<W, D> + Tape<ScoresUnder<Pol>, D>,
    Tensor<(B, S, Const<M>), E, D, T>:
        RunLayer<A, Pol, Output = Tensor<(B, S, Const<M3>), W, D, T>, Error = D::Err>,
    Tensor<(B, S, Const<M>), W, D, T>:
        RunLayer<O, Pol, Output = Tensor<(B, S, Const<M>), W, D, T>, Error = D::Err>,
{
    type Output = Tensor<(B, S, Const<M>), W, D, T>;
    type Error = D::Err;
    fn try_run(&self, x: Tensor<(B, S, Const<M>), E, D, T>) -> Result<Self::Output, D::Err> {
        let qkv = x.try_run(&self.c_attn)?;
        let y = try_attention::<M, M3, H, B, S, W, ScoresUnder<Pol>, D, T>(qkv, K::CAUSAL)?;
        y.try_run(&self.c_proj)
    }
}

// Attention keeps no state a training forward updates.
impl<Pol, X, const M: usize, const H: usize, const M3: usize, K, A, O> CompositeRunMut<Pol, X>
    for Attention<M, H, M3, K, A, O>
where
    Self: CompositeRun<Pol, X>,
{
    type Output = <Self as CompositeRun<Pol, X>>::Output;
    type Error = <Self as CompositeRun<Pol, X>>::Error;
    fn try_run_mut(&mut self, x: X) -> Result<Self::Output, Self::Error> {
        CompositeRun::<Pol, X>::try_run(self, x)
    }
}

impl<const M: usize, const H: usize, const M3: usize, K, A, O> NonMutableModule
    for Attention<M, H, M3, K, A, O>
{
}

/// Outside a policy: everything in the input's precision but the scores, which are FP32.
impl<B, S, const M: usize, const H: usize, const M3: usize, K, A, O, E, D, T>
    Module<Tensor<(B, S, Const<M>), E, D, T>> for Attention<M, H, M3, K, A, O>
where
    B: Dim,
    S: Dim,
    K: Mask,
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E> + AttentionOp<E>,
    T: AmpTape<D> + Tape<E, D> + Tape<f32, D>,
    A: Module<
        Tensor<(B, S, Const<M>), E, D, T>,
        Output = Tensor<(B, S, Const<M3>), E, D, T>,
        Error = D::Err,
    >,
    O: Module<
        Tensor<(B, S, Const<M>), E, D, T>,
        Output = Tensor<(B, S, Const<M>), E, D, T>,
        Error = D::Err,
    >,
{
    type Output = Tensor<(B, S, Const<M>), E, D, T>;
    type Error = D::Err;
    fn try_forward(&self, x: Tensor<(B, S, Const<M>), E, D, T>) -> Result<Self::Output, D::Err> {
        let qkv = self.c_attn.try_forward(x)?;
        let y = try_attention::<M, M3, H, B, S, E, f32, D, T>(qkv, K::CAUSAL)?;
        self.c_proj.try_forward(y)
    }
}
