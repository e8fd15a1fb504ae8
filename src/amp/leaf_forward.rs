//! The leaf rows with a forward of their own: linear layers (typed-amp's fused op, or O1's
//! per-pass cast), activations (ReLU and exact GELU fused into the op before it) and layer norm (typed-amp's
//! fused op wherever its parameters are FP32).

use std::fmt::Debug;

use dfdx::nn::modules::Module;
use dfdx::prelude::{Shape, Tensor};

use super::kind;
use super::model::{AutocastForward, CastTo};
use super::norm::MixedNorm;
use crate::device::{AmpDevice, Kernels};
use crate::ops::linear::LinearInput;
use crate::precision::{AmpElem, LowPrecision, Precision, F32};

use super::layer::{plan, KindRun, KindRunMut, LeafKind, RunPlanned};

/// The kinds whose leaf forward is a trait of their own, by plan: `KindRun` and `KindRunMut`
/// both call `$method` (the layer has no state a training forward updates: a linear layer, or
/// layer norm, which keeps no running statistics).
macro_rules! run_by_plan {
    ($($kind:ty => $trait:ident::$method:ident;)*) => {$(
        impl<W, Pol, X> KindRun<W, Pol, X> for $kind
        where
            Self: LeafKind<Pol>,
            X: $trait<W, <Self as LeafKind<Pol>>::Plan>,
        {
            type Output = X::Output;
            type Error = X::Error;
            fn try_run(x: X, layer: &W) -> Result<X::Output, X::Error> {
                x.$method(layer)
            }
        }

        impl<W, Pol, X> KindRunMut<W, Pol, X> for $kind
        where
            Self: LeafKind<Pol>,
            X: $trait<W, <Self as LeafKind<Pol>>::Plan>,
        {
            type Output = X::Output;
            type Error = X::Error;
            fn try_run_mut(x: X, layer: &mut W) -> Result<X::Output, X::Error> {
                x.$method(layer)
            }
        }
    )*};
}

run_by_plan! {
    kind::Linear => RunLinear::try_run_linear;
    kind::LayerNorm => RunLayerNorm::try_run_layer_norm;
}

/// Runs a linear layer `M` on `self` by plan `Pl`: typed-amp's fused op for the plans that keep
/// the layer's own precision, O1's per-pass cast for [`plan::Autocast`].
#[doc(hidden)] // `#[amp]`'s generated code and typed-amp's own machinery: see `typed_amp::__private`.
pub trait RunLinear<M, Pl>: Sized {
    /// The layer's output.
    type Output;
    /// The error the forward can return.
    type Error: Debug;
    /// Runs `layer` on `self`.
    fn try_run_linear(self, layer: &M) -> Result<Self::Output, Self::Error>;
}

/// The fused linear op's rows for a linear layer type: its own precision (`In`, casting the
/// input) and `Pass`.
macro_rules! run_linear {
    ($($layer:ident),*) => {$(
        impl<X, S, const I: usize, const O: usize, E, D, T, P>
            RunLinear<dfdx::nn::modules::$layer<I, O, E, D>, plan::In<P>> for X
        where
            P: Precision<Elem = E>,
            X: CastTo<P, Output = Tensor<S, E, D, T>, Error = D::Err>,
            S: LinearInput<I, O>,
            E: AmpElem,
            D: AmpDevice + Kernels<E> + crate::ops::linear::LinearOp<E>,
            T: crate::tape::AmpTape<D>,
            dfdx::nn::modules::$layer<I, O, E, D>:
                Module<Tensor<S, E, D, T>, Output = Tensor<S::Output, E, D, T>, Error = D::Err>,
        {
            type Output = Tensor<S::Output, E, D, T>;
            type Error = D::Err;
            fn try_run_linear(
                self,
                layer: &dfdx::nn::modules::$layer<I, O, E, D>,
            ) -> Result<Self::Output, D::Err> {
                crate::ops::linear::try_linear(layer, self.try_cast_to()?)
            }
        }

        impl<X, S, const I: usize, const O: usize, E, D, T, P, R>
            RunLinear<dfdx::nn::modules::$layer<I, O, E, D>, plan::Fp8<P, R>> for X
        where
            P: Precision<Elem = E>,
            R: crate::fp8::Fp8Recipe,
            X: CastTo<P, Output = Tensor<S, E, D, T>, Error = D::Err>,
            S: LinearInput<I, O>,
            E: AmpElem,
            D: AmpDevice
                + Kernels<E>
                + crate::ops::linear::LinearOp<E>
                + crate::ops::fp8_linear::Fp8LinearOp<E>,
            T: crate::tape::AmpTape<D> + dfdx::prelude::Tape<E, D>,
            dfdx::nn::modules::$layer<I, O, E, D>:
                Module<Tensor<S, E, D, T>, Output = Tensor<S::Output, E, D, T>, Error = D::Err>,
        {
            type Output = Tensor<S::Output, E, D, T>;
            type Error = D::Err;
            fn try_run_linear(
                self,
                layer: &dfdx::nn::modules::$layer<I, O, E, D>,
            ) -> Result<Self::Output, D::Err> {
                crate::ops::fp8_linear::try_fp8_linear::<R, S, I, O, E, D, T, _>(layer, self.try_cast_to()?)
            }
        }

        impl<S, const I: usize, const O: usize, E, D, T, P>
            RunLinear<dfdx::nn::modules::$layer<I, O, E, D>, plan::Pass<P>> for Tensor<S, E, D, T>
        where
            S: LinearInput<I, O>,
            E: AmpElem,
            D: AmpDevice + Kernels<E> + crate::ops::linear::LinearOp<E>,
            T: crate::tape::AmpTape<D>,
            dfdx::nn::modules::$layer<I, O, E, D>:
                Module<Tensor<S, E, D, T>, Output = Tensor<S::Output, E, D, T>, Error = D::Err>,
        {
            type Output = Tensor<S::Output, E, D, T>;
            type Error = D::Err;
            fn try_run_linear(
                self,
                layer: &dfdx::nn::modules::$layer<I, O, E, D>,
            ) -> Result<Self::Output, D::Err> {
                crate::ops::linear::try_linear(layer, self)
            }
        }
    )*};
}

run_linear!(Linear, UnbiasedLinear);

impl<X: AutocastForward<M, P>, M, P: LowPrecision> RunLinear<M, plan::Autocast<P>> for X {
    type Output = X::Output;
    type Error = X::Error;
    fn try_run_linear(self, layer: &M) -> Result<X::Output, X::Error> {
        self.try_autocast_forward(layer)
    }
}

impl<W, Pol, X: RunActivation<W>> KindRun<W, Pol, X> for kind::Activation {
    type Output = X::Output;
    type Error = X::Error;
    fn try_run(x: X, layer: &W) -> Result<X::Output, X::Error> {
        x.try_activate(layer)
    }
}

impl<W, Pol, X: RunActivation<W>> KindRunMut<W, Pol, X> for kind::Activation {
    type Output = X::Output;
    type Error = X::Error;
    fn try_run_mut(x: X, layer: &mut W) -> Result<X::Output, X::Error> {
        x.try_activate(layer)
    }
}

/// dfdx's softmax modules ([`kind::Softmax`]) and the modules the row's plan runs in their
/// place: the same op by dfdx's named 16-bit form, which takes any precision, so that the
/// plan decides it (FP32 except under O3's opt-in).
pub trait SoftmaxLayer {
    /// The module run in this layer's place.
    type AnyPrecision: Default;
}

impl SoftmaxLayer for dfdx::nn::modules::Softmax {
    type AnyPrecision = Softmax16Bit;
}

impl SoftmaxLayer for dfdx::nn::modules::LogSoftmax {
    type AnyPrecision = LogSoftmax16Bit;
}

/// dfdx's `Softmax` by `Tensor::try_softmax_16bit`: in the precision the plan gives it.
#[derive(Debug, Default, Clone, Copy)]
pub struct Softmax16Bit;

/// dfdx's `LogSoftmax` by `Tensor::try_log_softmax_16bit`: in the precision the plan gives it.
#[derive(Debug, Default, Clone, Copy)]
pub struct LogSoftmax16Bit;

macro_rules! softmax_16bit_modules {
    ($($layer:ident => $method:ident;)*) => {$(
        impl<S, E, D, T> Module<Tensor<S, E, D, T>> for $layer
        where
            S: Shape + dfdx::prelude::ReduceShape<S::LastAxis>,
            E: dfdx::prelude::Dtype,
            D: dfdx::prelude::Device<E>,
            T: dfdx::prelude::Tape<E, D>,
        {
            type Output = Tensor<S, E, D, T>;
            type Error = D::Err;
            fn try_forward(&self, x: Tensor<S, E, D, T>) -> Result<Self::Output, D::Err> {
                x.$method::<S::LastAxis>()
            }
        }

        impl dfdx::nn::modules::NonMutableModule for $layer {}
    )*};
}

softmax_16bit_modules! {
    Softmax16Bit => try_softmax_16bit;
    LogSoftmax16Bit => try_log_softmax_16bit;
}

impl<W, Pol, X> KindRun<W, Pol, X> for kind::Softmax
where
    W: SoftmaxLayer,
    Self: LeafKind<Pol>,
    X: RunPlanned<W::AnyPrecision, <Self as LeafKind<Pol>>::Plan>,
{
    type Output = X::Output;
    type Error = X::Error;
    fn try_run(x: X, _layer: &W) -> Result<X::Output, X::Error> {
        x.try_run_planned(&W::AnyPrecision::default())
    }
}

impl<W, Pol, X> KindRunMut<W, Pol, X> for kind::Softmax
where
    W: SoftmaxLayer,
    Self: LeafKind<Pol>,
    X: RunPlanned<W::AnyPrecision, <Self as LeafKind<Pol>>::Plan>,
{
    type Output = X::Output;
    type Error = X::Error;
    fn try_run_mut(x: X, _layer: &mut W) -> Result<X::Output, X::Error> {
        x.try_run_planned(&W::AnyPrecision::default())
    }
}

/// Runs the activation layer `W` on `self` with typed-amp's op (fused where it can be).
#[doc(hidden)] // `#[amp]`'s generated code and typed-amp's own machinery: see `typed_amp::__private`.
pub trait RunActivation<W>: Sized {
    /// The activation's output.
    type Output;
    /// The error the forward can return.
    type Error: Debug;
    /// Runs `layer` on `self`.
    fn try_activate(self, layer: &W) -> Result<Self::Output, Self::Error>;
}

/// The activations typed-amp fuses into the op before them: each layer type, the op it runs
/// and that op's device trait.
macro_rules! run_activation {
    ($($layer:ident => $op:ident::$run:ident: $device:ident;)*) => {$(
        impl<S, E, D, T> RunActivation<dfdx::nn::modules::$layer> for Tensor<S, E, D, T>
        where
            S: Shape,
            E: AmpElem,
            D: AmpDevice + Kernels<E> + crate::ops::$op::$device<E>,
            T: crate::tape::AmpTape<D> + dfdx::prelude::Tape<E, D>,
        {
            type Output = Tensor<S, E, D, T>;
            type Error = D::Err;
            fn try_activate(self, _layer: &dfdx::nn::modules::$layer) -> Result<Self, D::Err> {
                crate::ops::$op::$run(self)
            }
        }
    )*};
}

run_activation! {
    ReLU => relu::try_relu: ReluOp;
    AccurateGeLU => gelu::try_gelu: GeluOp;
}

/// Runs a layer norm `M` on `self` by plan `Pl`: typed-amp's fused op wherever the parameters
/// are FP32 (under O0 and O1 on FP32 activations, as under O2's `keep_batchnorm_fp32` on
/// 16-bit ones), dfdx's layer where they are 16-bit.
///
/// The fused op is one pass per row forward and one backward, parallel over rows, against
/// dfdx's composition of a dozen broadcast ops, reductions and copies; both compute the same
/// function in FP32 (the fused op sums in f64).
pub trait RunLayerNorm<M, Pl>: Sized {
    /// The layer's output.
    type Output;
    /// The error the forward can return.
    type Error: Debug;
    /// Runs `layer` on `self`.
    fn try_run_layer_norm(self, layer: &M) -> Result<Self::Output, Self::Error>;
}

impl<X, M> RunLayerNorm<M, plan::In<F32>> for X
where
    X: CastTo<F32>,
    M: MixedNorm<X::Output, Error = X::Error>,
{
    type Output = M::Output;
    type Error = X::Error;
    fn try_run_layer_norm(self, layer: &M) -> Result<M::Output, X::Error> {
        layer.try_forward_mixed(self.try_cast_to()?)
    }
}

/// The plans whose layer norm runs as [`RunPlanned`] runs any layer of the row.
macro_rules! planned_layer_norm {
    ($($plan:ident<P: $bound:ident>),*) => {$(
        impl<X: RunPlanned<M, plan::$plan<P>>, M, P: $bound> RunLayerNorm<M, plan::$plan<P>> for X {
            type Output = X::Output;
            type Error = X::Error;
            fn try_run_layer_norm(self, layer: &M) -> Result<X::Output, X::Error> {
                self.try_run_planned(layer)
            }
        }
    )*};
}

impl<X: RunPlanned<M, plan::Fp8<P, R>>, M, P: LowPrecision, R> RunLayerNorm<M, plan::Fp8<P, R>>
    for X
{
    type Output = X::Output;
    type Error = X::Error;
    fn try_run_layer_norm(self, layer: &M) -> Result<X::Output, X::Error> {
        self.try_run_planned(layer)
    }
}

planned_layer_norm!(
    In<P: LowPrecision>,
    Autocast<P: LowPrecision>,
    KeepFp32<P: LowPrecision>,
    Pass<P: Precision>
);
