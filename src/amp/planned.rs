//! How a leaf layer runs under each plan: in its own precision, autocast (O1), kept in FP32, or
//! passed through.

use dfdx::nn::modules::{Module, ModuleMut};

use super::model::{AutocastForward, CastTo};
use super::norm::{MixedNorm, MixedNormMut};
use crate::precision::{LowPrecision, Precision};

use super::layer::{plan, RunPlanned, RunPlannedMut};

impl<X, M, P> RunPlanned<M, plan::In<P>> for X
where
    P: Precision,
    X: CastTo<P>,
    M: Module<X::Output, Error = X::Error>,
{
    type Output = M::Output;
    type Error = X::Error;
    fn try_run_planned(self, layer: &M) -> Result<M::Output, X::Error> {
        layer.try_forward(self.try_cast_to()?)
    }
}

impl<X, M, P> RunPlannedMut<M, plan::In<P>> for X
where
    P: Precision,
    X: CastTo<P>,
    M: ModuleMut<X::Output, Error = X::Error>,
{
    type Output = M::Output;
    type Error = X::Error;
    fn try_run_planned_mut(self, layer: &mut M) -> Result<M::Output, X::Error> {
        layer.try_forward_mut(self.try_cast_to()?)
    }
}

// The FP8 plan's matrix products other than linear layers (convolutions) run as `In<P>`.
impl<X, M, P, R> RunPlanned<M, plan::Fp8<P, R>> for X
where
    X: RunPlanned<M, plan::In<P>>,
{
    type Output = X::Output;
    type Error = X::Error;
    fn try_run_planned(self, layer: &M) -> Result<X::Output, X::Error> {
        RunPlanned::<M, plan::In<P>>::try_run_planned(self, layer)
    }
}

impl<X, M, P, R> RunPlannedMut<M, plan::Fp8<P, R>> for X
where
    X: RunPlannedMut<M, plan::In<P>>,
{
    type Output = X::Output;
    type Error = X::Error;
    fn try_run_planned_mut(self, layer: &mut M) -> Result<X::Output, X::Error> {
        RunPlannedMut::<M, plan::In<P>>::try_run_planned_mut(self, layer)
    }
}

impl<X: AutocastForward<M, P>, M, P: LowPrecision> RunPlanned<M, plan::Autocast<P>> for X {
    type Output = X::Output;
    type Error = X::Error;
    fn try_run_planned(self, layer: &M) -> Result<X::Output, X::Error> {
        self.try_autocast_forward(layer)
    }
}

// Autocast makes a fresh 16-bit copy of the layer for the pass, so training and inference run
// the same forward (O1 keeps batch norm in FP32, outside autocast).
impl<X: AutocastForward<M, P>, M, P: LowPrecision> RunPlannedMut<M, plan::Autocast<P>> for X {
    type Output = X::Output;
    type Error = X::Error;
    fn try_run_planned_mut(self, layer: &mut M) -> Result<X::Output, X::Error> {
        self.try_autocast_forward(layer)
    }
}

impl<X, M, P> RunPlanned<M, plan::KeepFp32<P>> for X
where
    P: LowPrecision,
    X: CastTo<P>,
    M: MixedNorm<X::Output, Error = X::Error>,
{
    type Output = M::Output;
    type Error = X::Error;
    fn try_run_planned(self, layer: &M) -> Result<M::Output, X::Error> {
        layer.try_forward_mixed(self.try_cast_to()?)
    }
}

impl<X, M, P> RunPlannedMut<M, plan::KeepFp32<P>> for X
where
    P: LowPrecision,
    X: CastTo<P>,
    M: MixedNormMut<X::Output, Error = X::Error>,
{
    type Output = M::Output;
    type Error = X::Error;
    fn try_run_planned_mut(self, layer: &mut M) -> Result<M::Output, X::Error> {
        layer.try_forward_mixed_mut(self.try_cast_to()?)
    }
}

impl<X, M: Module<X>, P> RunPlanned<M, plan::Pass<P>> for X {
    type Output = M::Output;
    type Error = M::Error;
    fn try_run_planned(self, layer: &M) -> Result<M::Output, M::Error> {
        layer.try_forward(self)
    }
}

impl<X, M: ModuleMut<X>, P> RunPlannedMut<M, plan::Pass<P>> for X {
    type Output = M::Output;
    type Error = M::Error;
    fn try_run_planned_mut(self, layer: &mut M) -> Result<M::Output, M::Error> {
        layer.try_forward_mut(self)
    }
}
