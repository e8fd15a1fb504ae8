//! Layers by trait: which row of the policy table a layer belongs to ([`AmpLayer`]), what a
//! policy does with each row ([`Policy`], [`plan`]), and how `#[amp]` makes a layer's working
//! copy ([`WorkingUnder`]) and runs it ([`RunLayer`], [`RunLayerMut`]).
//!
//! `#[amp]` reads none of this from a layer's name: a type alias, a tuple, dfdx's
//! [`Repeated`](dfdx::nn::modules::Repeated)/[`Residual`](dfdx::nn::modules::Residual)/[`Embedding`](dfdx::nn::modules::Embedding) and a user's own layer
//! all work as long as the layer's module type implements [`AmpLayer`].
//!
//! A user's layer says which row it is in one line:
//!
//! ```rust
//! # use typed_amp::prelude::*;
//! use typed_amp::amp::{kind, AmpLayer};
//! # #[derive(Debug, Clone)] struct Gate<E: Dtype, D: Device<E>> { w: Tensor<Rank1<4>, E, D> }
//! // A layer with a weight that multiplies: a matrix-product row (16-bit under O1, O2, O3).
//! impl<E: Dtype, D: Device<E>> AmpLayer for Gate<E, D> {
//!     type Kind = kind::Matmul;
//! }
//! ```
//!
//! Composite layers (several layers run in some order) use [`kind::Composite`] and implement
//! [`CompositeWorking`] and [`CompositeRun`]/[`CompositeRunMut`], as tuples, [`Repeated`](dfdx::nn::modules::Repeated) and
//! [`Residual`](dfdx::nn::modules::Residual) do here.

use std::fmt::Debug;
use std::marker::PhantomData;

use dfdx::nn::modules::{Module, ModuleMut};
use dfdx::nn::TensorCollection;

use super::kind;
use super::layer_kind::AmpLayer;
use super::model::{try_convert, AmpModel, Converted};
use crate::device::{AmpDevice, Kernels};
use crate::error::AmpError;
use crate::precision::{LowPrecision, Precision};

/// What a policy does with a row of its table.
pub mod plan {
    use std::marker::PhantomData;

    /// Parameters stored in `P`; the input is cast to `P` and the layer computes in it.
    #[derive(Debug)]
    pub struct In<P>(PhantomData<P>);

    /// O1's cast-for-compute: FP32 parameters, cast with the input to the 16-bit `P` for each
    /// pass.
    #[derive(Debug)]
    pub struct Autocast<P>(PhantomData<P>);

    /// No cast: the layer computes in whatever precision it receives (its parameters, if any,
    /// stored in `P`).
    #[derive(Debug)]
    pub struct Pass<P>(PhantomData<P>);

    /// Apex's `keep_batchnorm_fp32` (O2's norms): parameters and statistics stored and computed
    /// in FP32; the input is cast to the 16-bit `P` and the output is in `P`
    /// ([`crate::amp::norm`]).
    #[derive(Debug)]
    pub struct KeepFp32<P>(PhantomData<P>);

    /// The matrix-product row of an `#[amp(fp8 = ...)]` model: parameters stored in the 16-bit
    /// `P` as under [`In`]; linear layers run their products with FP8 operands by recipe `R`
    /// ([`crate::fp8::Fp8Recipe`], [`crate::ops::fp8_linear`]) and return `P`; other matrix
    /// products (convolutions) run in `P` as under [`In`].
    #[derive(Debug)]
    pub struct Fp8<P, R>(PhantomData<(P, R)>);
}

/// A plan's storage precision: what a layer's parameters are held in.
pub trait Plan {
    /// The precision the layer's parameters are stored in.
    type Storage: Precision;
}

impl<P: Precision> Plan for plan::In<P> {
    type Storage = P;
}

impl<P: LowPrecision> Plan for plan::Autocast<P> {
    type Storage = crate::precision::F32;
}

impl<P: Precision> Plan for plan::Pass<P> {
    type Storage = P;
}

impl<P: LowPrecision> Plan for plan::KeepFp32<P> {
    type Storage = crate::precision::F32;
}

impl<P: LowPrecision, R: crate::fp8::Fp8Recipe> Plan for plan::Fp8<P, R> {
    type Storage = P;
}

/// A policy: the plan for each row of the table. `#[amp]` writes one [`Table`] per model from
/// its `policy`, `dtype` and `keep_batchnorm_fp32`.
pub trait Policy {
    /// The plan for [`kind::Matmul`].
    type Matmul: Plan;
    /// The plan for [`kind::Norm`].
    type Norm: Plan;
    /// The plan for [`kind::Fp32Op`].
    type Fp32Op: Plan;
    /// The plan for [`kind::Elementwise`].
    type Elementwise: Plan;
    /// The plan for [`kind::Neutral`].
    type Neutral: Plan;
}

/// A policy table, one plan per row.
#[derive(Debug)]
pub struct Table<Matmul, Norm, Fp32Op, Elementwise, Neutral>(
    PhantomData<(Matmul, Norm, Fp32Op, Elementwise, Neutral)>,
);

impl<Mm: Plan, No: Plan, Fp: Plan, El: Plan, Ne: Plan> Policy for Table<Mm, No, Fp, El, Ne> {
    type Matmul = Mm;
    type Norm = No;
    type Fp32Op = Fp;
    type Elementwise = El;
    type Neutral = Ne;
}

/// A row with a single plan (every kind but [`kind::Composite`] and [`kind::Nested`]).
pub trait LeafKind<Pol> {
    /// The plan `Pol` gives this row.
    type Plan: Plan;
}

macro_rules! leaf_kinds {
    ($($kind:ident => $row:ident;)*) => {$(
        impl<Pol: Policy> LeafKind<Pol> for kind::$kind {
            type Plan = Pol::$row;
        }
    )*};
}

leaf_kinds! {
    Matmul => Matmul;
    Linear => Matmul;
    Activation => Neutral;
    Norm => Norm;
    LayerNorm => Norm;
    Fp32Op => Fp32Op;
    Softmax => Fp32Op;
    Elementwise => Elementwise;
    Neutral => Neutral;
}

impl<Pol, P: Precision> LeafKind<Pol> for kind::Cast<P> {
    type Plan = plan::In<P>;
}

/// The element type a plan stores parameters in.
type StorageElem<Pl> = <<Pl as Plan>::Storage as Precision>::Elem;

/// An FP32 master layer's working copy under policy `Pol` on device `D`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no working copy under this policy",
    label = "not an `AmpLayer`",
    note = "`#[amp]` makes each layer's working copy by its row of the policy table: implement `typed_amp::amp::AmpLayer` for the layer's module type, or pin the field with `#[amp(fp16)]`, `#[amp(bf16)]` or `#[amp(fp32)]`"
)]
pub trait WorkingUnder<Pol, D: AmpDevice>: Sized {
    /// The working copy's type.
    type Working;
    /// A working copy holding the master's values in the working precisions.
    fn try_working_from(&self) -> Result<Self::Working, AmpError>;
}

impl<M: AmpLayer, Pol, D: AmpDevice> WorkingUnder<Pol, D> for M
where
    M::Kind: KindWorking<M, Pol, D>,
{
    type Working = <M::Kind as KindWorking<M, Pol, D>>::Working;
    fn try_working_from(&self) -> Result<Self::Working, AmpError> {
        <M::Kind as KindWorking<M, Pol, D>>::try_working_from(self)
    }
}

/// How a kind makes the working copy of master layer `M`.
pub trait KindWorking<M, Pol, D: AmpDevice> {
    /// The working copy's type.
    type Working;
    /// A working copy of `master`.
    fn try_working_from(master: &M) -> Result<Self::Working, AmpError>;
}

macro_rules! leaf_working {
    ($($kind:ty $(, $param:ident: $bound:path)?;)*) => {$(
        impl<M, Pol, D $(, $param: $bound)?> KindWorking<M, Pol, D> for $kind
        where
            Self: LeafKind<Pol>,
            M: TensorCollection<f32, D>,
            D: AmpDevice + Kernels<StorageElem<<Self as LeafKind<Pol>>::Plan>>,
        {
            type Working = Converted<M, StorageElem<<Self as LeafKind<Pol>>::Plan>, D>;
            fn try_working_from(master: &M) -> Result<Self::Working, AmpError> {
                try_convert::<M, StorageElem<<Self as LeafKind<Pol>>::Plan>, D>(master)
            }
        }
    )*};
}

leaf_working! {
    kind::Matmul;
    kind::Linear;
    kind::Activation;
    kind::Norm;
    kind::LayerNorm;
    kind::Fp32Op;
    kind::Softmax;
    kind::Elementwise;
    kind::Neutral;
    kind::Cast<P>, P: Precision;
}

impl<M: CompositeWorking<Pol, D>, Pol, D: AmpDevice> KindWorking<M, Pol, D> for kind::Composite {
    type Working = M::Working;
    fn try_working_from(master: &M) -> Result<Self::Working, AmpError> {
        master.try_working_from()
    }
}

impl<M, Pol, D: AmpDevice, A: AmpModel<D, Master = M>> KindWorking<M, Pol, D> for kind::Nested<A> {
    type Working = A::Working;
    fn try_working_from(master: &M) -> Result<Self::Working, AmpError> {
        A::try_working_from(master)
    }
}

/// The working copy of a [`kind::Composite`] layer: its parts' working copies, each by its
/// own kind.
pub trait CompositeWorking<Pol, D: AmpDevice>: Sized {
    /// The working copy's type.
    type Working;
    /// A working copy holding the master's values in the working precisions.
    fn try_working_from(&self) -> Result<Self::Working, AmpError>;
}

/// Runs layer `W` on `self` (its input) under policy `Pol`, casting where the policy says.
#[diagnostic::on_unimplemented(
    message = "`{W}` cannot run on `{Self}` under this policy",
    label = "no mixed-precision forward for this input",
    note = "every layer needs `typed_amp::amp::AmpLayer` (its row of the policy table) and a forward for the precision and shape its row gives it; cast where precisions meet with `.to_f16()`, `.to_bf16()` or `.to_f32()`"
)]
pub trait RunLayer<W, Pol>: Sized {
    /// The layer's output.
    type Output;
    /// The error the forward can return.
    type Error: Debug;
    /// Runs `layer` on `self`.
    fn try_run(self, layer: &W) -> Result<Self::Output, Self::Error>;
}

/// [`RunLayer`] for training: runs the layer's `ModuleMut` forward (batch norm updates its
/// running statistics, dropout drops).
#[diagnostic::on_unimplemented(
    message = "`{W}` cannot run on `{Self}` under this policy",
    label = "no mixed-precision training forward for this input",
    note = "every layer needs `typed_amp::amp::AmpLayer` (its row of the policy table) and a forward for the precision and shape its row gives it; cast where precisions meet with `.to_f16()`, `.to_bf16()` or `.to_f32()`"
)]
pub trait RunLayerMut<W, Pol>: Sized {
    /// The layer's output.
    type Output;
    /// The error the forward can return.
    type Error: Debug;
    /// Runs `layer` on `self`.
    fn try_run_mut(self, layer: &mut W) -> Result<Self::Output, Self::Error>;
}

/// Runs layer `M` on `self` by plan `Pl` (a pinned field, or a leaf kind's row).
pub trait RunPlanned<M, Pl>: Sized {
    /// The layer's output.
    type Output;
    /// The error the forward can return.
    type Error: Debug;
    /// Runs `layer` on `self`.
    fn try_run_planned(self, layer: &M) -> Result<Self::Output, Self::Error>;
}

/// [`RunPlanned`] for training.
pub trait RunPlannedMut<M, Pl>: Sized {
    /// The layer's output.
    type Output;
    /// The error the forward can return.
    type Error: Debug;
    /// Runs `layer` on `self`.
    fn try_run_planned_mut(self, layer: &mut M) -> Result<Self::Output, Self::Error>;
}

/// How a kind runs layer `W` on input `X`.
pub trait KindRun<W, Pol, X> {
    /// The layer's output.
    type Output;
    /// The error the forward can return.
    type Error: Debug;
    /// Runs `layer` on `x`.
    fn try_run(x: X, layer: &W) -> Result<Self::Output, Self::Error>;
}

/// [`KindRun`] for training.
pub trait KindRunMut<W, Pol, X> {
    /// The layer's output.
    type Output;
    /// The error the forward can return.
    type Error: Debug;
    /// Runs `layer` on `x`.
    fn try_run_mut(x: X, layer: &mut W) -> Result<Self::Output, Self::Error>;
}

/// How a [`kind::Composite`] layer runs its parts on input `X`.
pub trait CompositeRun<Pol, X> {
    /// The layer's output.
    type Output;
    /// The error the forward can return.
    type Error: Debug;
    /// Runs the parts on `x`.
    fn try_run(&self, x: X) -> Result<Self::Output, Self::Error>;
}

/// [`CompositeRun`] for training.
pub trait CompositeRunMut<Pol, X> {
    /// The layer's output.
    type Output;
    /// The error the forward can return.
    type Error: Debug;
    /// Runs the parts on `x`.
    fn try_run_mut(&mut self, x: X) -> Result<Self::Output, Self::Error>;
}

impl<X, W: AmpLayer, Pol> RunLayer<W, Pol> for X
where
    W::Kind: KindRun<W, Pol, X>,
{
    type Output = <W::Kind as KindRun<W, Pol, X>>::Output;
    type Error = <W::Kind as KindRun<W, Pol, X>>::Error;
    fn try_run(self, layer: &W) -> Result<Self::Output, Self::Error> {
        <W::Kind as KindRun<W, Pol, X>>::try_run(self, layer)
    }
}

impl<X, W: AmpLayer, Pol> RunLayerMut<W, Pol> for X
where
    W::Kind: KindRunMut<W, Pol, X>,
{
    type Output = <W::Kind as KindRunMut<W, Pol, X>>::Output;
    type Error = <W::Kind as KindRunMut<W, Pol, X>>::Error;
    fn try_run_mut(self, layer: &mut W) -> Result<Self::Output, Self::Error> {
        <W::Kind as KindRunMut<W, Pol, X>>::try_run_mut(self, layer)
    }
}

macro_rules! leaf_run {
    ($($kind:ty $(, $param:ident: $bound:path)?;)*) => {$(
        impl<W, Pol, X $(, $param: $bound)?> KindRun<W, Pol, X> for $kind
        where
            Self: LeafKind<Pol>,
            X: RunPlanned<W, <Self as LeafKind<Pol>>::Plan>,
        {
            type Output = X::Output;
            type Error = X::Error;
            fn try_run(x: X, layer: &W) -> Result<X::Output, X::Error> {
                x.try_run_planned(layer)
            }
        }

        impl<W, Pol, X $(, $param: $bound)?> KindRunMut<W, Pol, X> for $kind
        where
            Self: LeafKind<Pol>,
            X: RunPlannedMut<W, <Self as LeafKind<Pol>>::Plan>,
        {
            type Output = X::Output;
            type Error = X::Error;
            fn try_run_mut(x: X, layer: &mut W) -> Result<X::Output, X::Error> {
                x.try_run_planned_mut(layer)
            }
        }
    )*};
}

leaf_run! {
    kind::Matmul;
    kind::Norm;
    kind::Fp32Op;
    kind::Elementwise;
    kind::Neutral;
    kind::Cast<P>, P: Precision;
}

impl<W: CompositeRun<Pol, X>, Pol, X> KindRun<W, Pol, X> for kind::Composite {
    type Output = W::Output;
    type Error = W::Error;
    fn try_run(x: X, layer: &W) -> Result<W::Output, W::Error> {
        layer.try_run(x)
    }
}

impl<W: CompositeRunMut<Pol, X>, Pol, X> KindRunMut<W, Pol, X> for kind::Composite {
    type Output = W::Output;
    type Error = W::Error;
    fn try_run_mut(x: X, layer: &mut W) -> Result<W::Output, W::Error> {
        layer.try_run_mut(x)
    }
}

// A nested `#[amp]` model runs its own generated forward, under its own policy.
impl<W: Module<X>, Pol, X, A> KindRun<W, Pol, X> for kind::Nested<A> {
    type Output = W::Output;
    type Error = W::Error;
    fn try_run(x: X, layer: &W) -> Result<W::Output, W::Error> {
        layer.try_forward(x)
    }
}

impl<W: ModuleMut<X>, Pol, X, A> KindRunMut<W, Pol, X> for kind::Nested<A> {
    type Output = W::Output;
    type Error = W::Error;
    fn try_run_mut(x: X, layer: &mut W) -> Result<W::Output, W::Error> {
        layer.try_forward_mut(x)
    }
}
