//! The leaf rows with a forward of their own: linear layers (typed-amp's fused op, or O1's
//! per-pass cast) and activations (ReLU fused into the op before it).

use std::fmt::Debug;

use dfdx::nn::modules::Module;
use dfdx::prelude::{Shape, Tensor};

use super::kind;
use super::model::{AutocastForward, CastTo};
use crate::device::{AmpDevice, Kernels};
use crate::ops::linear::LinearInput;
use crate::precision::{AmpElem, LowPrecision, Precision};

use super::layer::{plan, KindRun, KindRunMut, LeafKind};

impl<W, Pol, X> KindRun<W, Pol, X> for kind::Linear
where
    Self: LeafKind<Pol>,
    X: RunLinear<W, <Self as LeafKind<Pol>>::Plan>,
{
    type Output = X::Output;
    type Error = X::Error;
    fn try_run(x: X, layer: &W) -> Result<X::Output, X::Error> {
        x.try_run_linear(layer)
    }
}

// A linear layer has no state a training forward updates.
impl<W, Pol, X> KindRunMut<W, Pol, X> for kind::Linear
where
    Self: LeafKind<Pol>,
    X: RunLinear<W, <Self as LeafKind<Pol>>::Plan>,
{
    type Output = X::Output;
    type Error = X::Error;
    fn try_run_mut(x: X, layer: &mut W) -> Result<X::Output, X::Error> {
        x.try_run_linear(layer)
    }
}

/// Runs a linear layer `M` on `self` by plan `Pl`: typed-amp's fused op for the plans that keep
/// the layer's own precision, O1's per-pass cast for [`plan::Autocast`].
pub trait RunLinear<M, Pl>: Sized {
    /// The layer's output.
    type Output;
    /// The error the forward can return.
    type Error: Debug;
    /// Runs `layer` on `self`.
    fn try_run_linear(self, layer: &M) -> Result<Self::Output, Self::Error>;
}

impl<X, S, const I: usize, const O: usize, E, D, T, P>
    RunLinear<dfdx::nn::modules::Linear<I, O, E, D>, plan::In<P>> for X
where
    P: Precision<Elem = E>,
    X: CastTo<P, Output = Tensor<S, E, D, T>, Error = D::Err>,
    S: LinearInput<I, O>,
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
    T: crate::tape::AmpTape<D>,
    dfdx::nn::modules::Linear<I, O, E, D>:
        Module<Tensor<S, E, D, T>, Output = Tensor<S::Output, E, D, T>, Error = D::Err>,
{
    type Output = Tensor<S::Output, E, D, T>;
    type Error = D::Err;
    fn try_run_linear(
        self,
        layer: &dfdx::nn::modules::Linear<I, O, E, D>,
    ) -> Result<Self::Output, D::Err> {
        crate::ops::linear::try_linear(layer, self.try_cast_to()?)
    }
}

impl<S, const I: usize, const O: usize, E, D, T, P>
    RunLinear<dfdx::nn::modules::Linear<I, O, E, D>, plan::Pass<P>> for Tensor<S, E, D, T>
where
    S: LinearInput<I, O>,
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
    T: crate::tape::AmpTape<D>,
    dfdx::nn::modules::Linear<I, O, E, D>:
        Module<Tensor<S, E, D, T>, Output = Tensor<S::Output, E, D, T>, Error = D::Err>,
{
    type Output = Tensor<S::Output, E, D, T>;
    type Error = D::Err;
    fn try_run_linear(
        self,
        layer: &dfdx::nn::modules::Linear<I, O, E, D>,
    ) -> Result<Self::Output, D::Err> {
        crate::ops::linear::try_linear(layer, self)
    }
}

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

/// Runs the activation layer `W` on `self` with typed-amp's op (fused where it can be).
pub trait RunActivation<W>: Sized {
    /// The activation's output.
    type Output;
    /// The error the forward can return.
    type Error: Debug;
    /// Runs `layer` on `self`.
    fn try_activate(self, layer: &W) -> Result<Self::Output, Self::Error>;
}

impl<S, E, D, T> RunActivation<dfdx::nn::modules::ReLU> for Tensor<S, E, D, T>
where
    S: Shape,
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
    T: crate::tape::AmpTape<D> + dfdx::prelude::Tape<E, D>,
{
    type Output = Tensor<S, E, D, T>;
    type Error = D::Err;
    fn try_activate(self, _layer: &dfdx::nn::modules::ReLU) -> Result<Self, D::Err> {
        crate::ops::relu::try_relu(self)
    }
}
