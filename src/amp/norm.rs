//! How a norm layer with FP32 parameters runs on 16-bit activations: the
//! [`plan::KeepFp32`](crate::amp::layer::plan::KeepFp32) row of the policy table (Apex's
//! `keep_batchnorm_fp32`, O2's default).
//!
//! Batch norm runs as typed-amp's mixed op ([`crate::ops::batchnorm`]): the 16-bit input is
//! normalized with FP32 statistics into a 16-bit output, no FP32 copy of the activations made.
//! Layer norm runs as its mixed op ([`crate::ops::layernorm`]) the same way. How each runs is the
//! device's (`BatchNormOp`, `LayerNormOp`): where the fused op cannot run (a device without its
//! kernels, an input that is not contiguous), the layer runs in FP32 between two casts, as O2
//! ran every norm before.

use dfdx::nn::modules::{BatchNorm1D, BatchNorm2D, LayerNorm1D, Module};
use dfdx::prelude::{Axes2, Axes3, Axis, Const, Dim, NoneTape, Shape, Tape, Tensor};
use dfdx::tensor::TrainingTape;

use crate::device::{AmpDevice, Kernels};
use crate::ops::batchnorm::{try_batch_norm_infer, try_batch_norm_train, BatchNormOp};
use crate::ops::layernorm::try_layer_norm;
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// A norm layer with FP32 parameters run (inference, `forward`) on activations of another
/// precision, returning that precision.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run on `{X}` with FP32 parameters",
    label = "no mixed-precision norm forward for this input",
    note = "under `keep_batchnorm_fp32` (O2's default) a norm layer keeps FP32 parameters and takes 16-bit activations: batch norm and layer norm can; for another layer, implement `typed_amp::amp::norm::MixedNorm`, or pin the field with `#[amp(fp32)]`"
)]
pub trait MixedNorm<X> {
    /// The output, in the input's precision.
    type Output;
    /// The error the forward can return.
    type Error: std::fmt::Debug;
    /// Runs the layer on `x`.
    fn try_forward_mixed(&self, x: X) -> Result<Self::Output, Self::Error>;
}

/// [`MixedNorm`] for training (`forward_mut`: batch norm uses and updates batch statistics).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot train on `{X}` with FP32 parameters",
    label = "no mixed-precision norm training forward for this input",
    note = "under `keep_batchnorm_fp32` (O2's default) a norm layer keeps FP32 parameters and takes 16-bit activations: batch norm and layer norm can; for another layer, implement `typed_amp::amp::norm::MixedNormMut`, or pin the field with `#[amp(fp32)]`"
)]
#[doc(hidden)] // `#[amp]`'s generated code and typed-amp's own machinery: see `typed_amp::__private`.
pub trait MixedNormMut<X> {
    /// The output, in the input's precision.
    type Output;
    /// The error the forward can return.
    type Error: std::fmt::Debug;
    /// Runs the layer on `x`, updating its running statistics.
    fn try_forward_mixed_mut(&mut self, x: X) -> Result<Self::Output, Self::Error>;
}

macro_rules! batch_norm {
    ($layer:ident, [$($dims:ident: Dim),*], $shape:ty, $axes:ty) => {
        impl<const C: usize, $($dims: Dim,)* E: AmpElem, D> MixedNorm<Tensor<$shape, E, D, NoneTape>>
            for $layer<C, f32, D>
        where
            D: AmpDevice + Kernels<E> + BatchNormOp<E>,
        {
            type Output = Tensor<$shape, E, D, NoneTape>;
            type Error = D::Err;
            fn try_forward_mixed(
                &self,
                x: Tensor<$shape, E, D, NoneTape>,
            ) -> Result<Self::Output, D::Err> {
                try_batch_norm_infer::<C, $shape, $axes, E, D, Self>(self, x)
            }
        }

        impl<const C: usize, $($dims: Dim,)* E, D, T> MixedNormMut<Tensor<$shape, E, D, T>>
            for $layer<C, f32, D>
        where
            E: AmpElem,
            D: AmpDevice + Kernels<E> + BatchNormOp<E>,
            T: AmpTape<D> + TrainingTape<E, D> + TrainingTape<f32, D> + Tape<E, D>,
        {
            type Output = Tensor<$shape, E, D, T>;
            type Error = D::Err;
            fn try_forward_mixed_mut(
                &mut self,
                x: Tensor<$shape, E, D, T>,
            ) -> Result<Self::Output, D::Err> {
                try_batch_norm_train::<C, $shape, $axes, E, D, T, Self>(self, x)
            }
        }
    };
}

batch_norm!(BatchNorm2D, [B: Dim, H: Dim, W: Dim], (B, Const<C>, H, W), Axes3<0, 2, 3>);
batch_norm!(BatchNorm2D, [H: Dim, W: Dim], (Const<C>, H, W), Axes2<1, 2>);
batch_norm!(BatchNorm1D, [B: Dim], (B, Const<C>), Axis<0>);

// Layer norm: the device's layer-norm op (fused where it can run, else in FP32 between two
// casts).
impl<const M: usize, S: Shape, E: AmpElem, D: AmpDevice + Kernels<E>, T: AmpTape<D>>
    MixedNorm<Tensor<S, E, D, T>> for LayerNorm1D<M, f32, D>
where
    Self: Module<Tensor<S, f32, D, T>, Output = Tensor<S, f32, D, T>, Error = D::Err>,
    T: Tape<E, D>,
    D: crate::ops::layernorm::LayerNormOp<E>,
{
    type Output = Tensor<S, E, D, T>;
    type Error = D::Err;
    fn try_forward_mixed(&self, x: Tensor<S, E, D, T>) -> Result<Self::Output, D::Err> {
        try_layer_norm(self, x)
    }
}

// Layer norm keeps no running statistics: training runs the inference forward.
impl<const M: usize, S: Shape, E: AmpElem, D: AmpDevice + Kernels<E>, T: AmpTape<D>>
    MixedNormMut<Tensor<S, E, D, T>> for LayerNorm1D<M, f32, D>
where
    Self: MixedNorm<Tensor<S, E, D, T>, Output = Tensor<S, E, D, T>, Error = D::Err>,
{
    type Output = Tensor<S, E, D, T>;
    type Error = D::Err;
    fn try_forward_mixed_mut(&mut self, x: Tensor<S, E, D, T>) -> Result<Self::Output, D::Err> {
        self.try_forward_mixed(x)
    }
}
