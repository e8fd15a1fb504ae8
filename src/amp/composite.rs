//! Composite layers: tuples (run in order), [`Repeated`] and [`Residual`] (its branch cast back
//! to the input's precision before the sum).

use std::fmt::Debug;

use dfdx::nn::modules::{Repeated, Residual};
use dfdx::prelude::{Shape, Tape, Tensor, TryAdd, WithEmptyTape};

use super::kind;
use super::layer_kind::AmpLayer;
use super::model::CastTo;
use crate::device::{AmpDevice, Kernels};
use crate::error::AmpError;
use crate::precision::AmpElem;
use crate::tape::AmpTape;

use super::layer::{
    CompositeRun, CompositeRunMut, CompositeWorking, RunLayer, RunLayerMut, WorkingUnder,
};

macro_rules! tuple_layers {
    ($([$($input:ident => $part:ident $idx:tt => $out:ident),+] -> $last:ident;)*) => {$(
        impl<$($part),+> AmpLayer for ($($part,)+) {
            type Kind = kind::Composite;
        }

        impl<Pol, D: AmpDevice, $($part: WorkingUnder<Pol, D>),+> CompositeWorking<Pol, D> for ($($part,)+) {
            type Working = ($($part::Working,)+);
            fn try_working_from(&self) -> Result<Self::Working, AmpError> {
                Ok(($(self.$idx.try_working_from()?,)+))
            }
        }

        // Each part's output feeds the next; the chain's intermediate types are parameters so
        // that the bounds grow linearly with the number of parts.
        impl<Pol, X, Err: Debug, $($part, $out),+> CompositeRun<Pol, X> for ($($part,)+)
        where
            $($input: RunLayer<$part, Pol, Output = $out, Error = Err>,)+
        {
            type Output = $last;
            type Error = Err;
            fn try_run(&self, x: X) -> Result<$last, Err> {
                $(let x = RunLayer::<$part, Pol>::try_run(x, &self.$idx)?;)+
                Ok(x)
            }
        }

        impl<Pol, X, Err: Debug, $($part, $out),+> CompositeRunMut<Pol, X> for ($($part,)+)
        where
            $($input: RunLayerMut<$part, Pol, Output = $out, Error = Err>,)+
        {
            type Output = $last;
            type Error = Err;
            fn try_run_mut(&mut self, x: X) -> Result<$last, Err> {
                $(let x = RunLayerMut::<$part, Pol>::try_run_mut(x, &mut self.$idx)?;)+
                Ok(x)
            }
        }
    )*};
}

tuple_layers! {
    [X => A 0 => Ya] -> Ya;
    [X => A 0 => Ya, Ya => B 1 => Yb] -> Yb;
    [X => A 0 => Ya, Ya => B 1 => Yb, Yb => C 2 => Yc] -> Yc;
    [X => A 0 => Ya, Ya => B 1 => Yb, Yb => C 2 => Yc, Yc => F 3 => Yf] -> Yf;
    [X => A 0 => Ya, Ya => B 1 => Yb, Yb => C 2 => Yc, Yc => F 3 => Yf, Yf => G 4 => Yg] -> Yg;
    [X => A 0 => Ya, Ya => B 1 => Yb, Yb => C 2 => Yc, Yc => F 3 => Yf, Yf => G 4 => Yg, Yg => H 5 => Yh] -> Yh;
}

impl<T, const N: usize> AmpLayer for Repeated<T, N> {
    type Kind = kind::Composite;
}

impl<Pol, D: AmpDevice, T: WorkingUnder<Pol, D>, const N: usize> CompositeWorking<Pol, D>
    for Repeated<T, N>
{
    type Working = Repeated<T::Working, N>;
    fn try_working_from(&self) -> Result<Self::Working, AmpError> {
        let modules = self
            .modules
            .iter()
            .map(T::try_working_from)
            .collect::<Result<_, _>>()?;
        Ok(Repeated { modules })
    }
}

// The first repetition may change the input's precision (a block ending in an FP32 layer
// turns FP16 input into FP32); every later one must keep it.
impl<Pol, X, Y, T, const N: usize> CompositeRun<Pol, X> for Repeated<T, N>
where
    X: RunLayer<T, Pol, Output = Y>,
    Y: RunLayer<T, Pol, Output = Y, Error = X::Error>,
{
    type Output = Y;
    type Error = X::Error;
    fn try_run(&self, x: X) -> Result<Y, X::Error> {
        const { assert!(N > 0, "`Repeated<_, 0>` has no layer to run") };
        let mut y = x.try_run(&self.modules[0])?;
        for module in &self.modules[1..] {
            y = y.try_run(module)?;
        }
        Ok(y)
    }
}

impl<Pol, X, Y, T, const N: usize> CompositeRunMut<Pol, X> for Repeated<T, N>
where
    X: RunLayerMut<T, Pol, Output = Y>,
    Y: RunLayerMut<T, Pol, Output = Y, Error = X::Error>,
{
    type Output = Y;
    type Error = X::Error;
    fn try_run_mut(&mut self, x: X) -> Result<Y, X::Error> {
        const { assert!(N > 0, "`Repeated<_, 0>` has no layer to run") };
        let (first, rest) = self.modules.split_at_mut(1);
        let mut y = x.try_run_mut(&mut first[0])?;
        for module in rest {
            y = y.try_run_mut(module)?;
        }
        Ok(y)
    }
}

impl<F> AmpLayer for Residual<F> {
    type Kind = kind::Composite;
}

impl<Pol, D: AmpDevice, F: WorkingUnder<Pol, D>> CompositeWorking<Pol, D> for Residual<F> {
    type Working = Residual<F::Working>;
    fn try_working_from(&self) -> Result<Self::Working, AmpError> {
        Ok(Residual(self.0.try_working_from()?))
    }
}

// `x + f(x)`: `f` may compute in another precision than `x` (an FP32 norm inside an FP16
// block), so its output is cast back to the input's precision before the sum.
impl<Pol, S, E, D, T, Y, F> CompositeRun<Pol, Tensor<S, E, D, T>> for Residual<F>
where
    S: Shape,
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
    T: AmpTape<D> + Tape<E, D>,
    Tensor<S, E, D, T>: WithEmptyTape,
    Tensor<S, E, D, T>: RunLayer<F, Pol, Output = Y, Error = D::Err>,
    Y: CastTo<E::Precision, Output = Tensor<S, E, D, T>, Error = D::Err>,
    Tensor<S, E, D, T>: TryAdd<Tensor<S, E, D, T>, Err = D::Err>,
{
    type Output = Tensor<S, E, D, T>;
    type Error = D::Err;
    fn try_run(&self, x: Tensor<S, E, D, T>) -> Result<Self::Output, D::Err> {
        let y = x.with_empty_tape().try_run(&self.0)?.try_cast_to()?;
        crate::ops::residual::try_residual_add(y, x)
    }
}

impl<Pol, S, E, D, T, Y, F> CompositeRunMut<Pol, Tensor<S, E, D, T>> for Residual<F>
where
    S: Shape,
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
    T: AmpTape<D> + Tape<E, D>,
    Tensor<S, E, D, T>: WithEmptyTape,
    Tensor<S, E, D, T>: RunLayerMut<F, Pol, Output = Y, Error = D::Err>,
    Y: CastTo<E::Precision, Output = Tensor<S, E, D, T>, Error = D::Err>,
    Tensor<S, E, D, T>: TryAdd<Tensor<S, E, D, T>, Err = D::Err>,
{
    type Output = Tensor<S, E, D, T>;
    type Error = D::Err;
    fn try_run_mut(&mut self, x: Tensor<S, E, D, T>) -> Result<Self::Output, D::Err> {
        let y = x
            .with_empty_tape()
            .try_run_mut(&mut self.0)?
            .try_cast_to()?;
        crate::ops::residual::try_residual_add(y, x)
    }
}
