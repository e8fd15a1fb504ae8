//! Differentiable casts as layers.

use dfdx::nn::{NonMutableModule, ZeroSizedModule};
use dfdx::prelude::*;
use half::f16;

use crate::device::AmpDevice;
use crate::ops::cast::{AmpTape, Cast, CastFrom};
use crate::precision::AmpElem;

/// Casts its input to FP16 (see [`crate::to_f16`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct ToF16;

/// Casts its input to FP32 (see [`crate::to_f32`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct ToF32;

impl ZeroSizedModule for ToF16 {}
impl ZeroSizedModule for ToF32 {}
impl NonMutableModule for ToF16 {}
impl NonMutableModule for ToF32 {}

impl<S: Shape, E: AmpElem, D: AmpDevice + Device<E>, T: AmpTape<D>> Module<Tensor<S, E, D, T>>
    for ToF16
where
    f16: CastFrom<E>,
{
    type Output = Tensor<S, f16, D, T>;
    type Error = D::Err;

    fn try_forward(&self, x: Tensor<S, E, D, T>) -> Result<Self::Output, D::Err> {
        x.try_to_f16()
    }
}

impl<S: Shape, E: AmpElem, D: AmpDevice + Device<E>, T: AmpTape<D>> Module<Tensor<S, E, D, T>>
    for ToF32
where
    f32: CastFrom<E>,
{
    type Output = Tensor<S, f32, D, T>;
    type Error = D::Err;

    fn try_forward(&self, x: Tensor<S, E, D, T>) -> Result<Self::Output, D::Err> {
        x.try_to_f32()
    }
}

crate::params::parameterless_params!([] ToF16; [] ToF32;);
