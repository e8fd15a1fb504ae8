//! What the mixed batch norm reads of a layer: dfdx's `BatchNorm1D` and `BatchNorm2D` with FP32
//! parameters and running statistics (the two have the same fields).

use dfdx::nn::modules::{BatchNorm1D, BatchNorm2D};
use dfdx::prelude::{Rank1, Storage, Tensor};

/// A batch norm layer's FP32 parameters and running statistics, as inference reads them.
pub struct BatchNormParams<'a, const C: usize, D: Storage<f32>> {
    /// The scale (γ).
    pub scale: &'a Tensor<Rank1<C>, f32, D>,
    /// The bias (β).
    pub bias: &'a Tensor<Rank1<C>, f32, D>,
    /// The running mean.
    pub running_mean: &'a Tensor<Rank1<C>, f32, D>,
    /// The running variance (unbiased).
    pub running_var: &'a Tensor<Rank1<C>, f32, D>,
    /// Added to the variance before its square root.
    pub epsilon: f64,
}

/// A batch norm layer's FP32 parameters and running statistics, as a training forward reads
/// them and updates the running statistics.
pub struct BatchNormParamsMut<'a, const C: usize, D: Storage<f32>> {
    /// The scale (γ).
    pub scale: &'a Tensor<Rank1<C>, f32, D>,
    /// The bias (β).
    pub bias: &'a Tensor<Rank1<C>, f32, D>,
    /// The running mean, updated by training forwards.
    pub running_mean: &'a mut Tensor<Rank1<C>, f32, D>,
    /// The running variance (unbiased), updated by training forwards.
    pub running_var: &'a mut Tensor<Rank1<C>, f32, D>,
    /// Added to the variance before its square root.
    pub epsilon: f64,
    /// The running statistics' update weight.
    pub momentum: f64,
}

/// A batch norm layer of `C` channels with FP32 parameters and running statistics.
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait BatchNormLayer<const C: usize, D: Storage<f32>> {
    /// The parameters and running statistics, read only.
    fn params(&self) -> BatchNormParams<'_, C, D>;
    /// The parameters, and the running statistics for a training forward to update.
    fn params_mut(&mut self) -> BatchNormParamsMut<'_, C, D>;
}

macro_rules! batch_norm_layer {
    ($layer:ident) => {
        impl<const C: usize, D: Storage<f32>> BatchNormLayer<C, D> for $layer<C, f32, D> {
            fn params(&self) -> BatchNormParams<'_, C, D> {
                BatchNormParams {
                    scale: &self.scale,
                    bias: &self.bias,
                    running_mean: &self.running_mean,
                    running_var: &self.running_var,
                    epsilon: self.epsilon,
                }
            }

            fn params_mut(&mut self) -> BatchNormParamsMut<'_, C, D> {
                BatchNormParamsMut {
                    scale: &self.scale,
                    bias: &self.bias,
                    running_mean: &mut self.running_mean,
                    running_var: &mut self.running_var,
                    epsilon: self.epsilon,
                    momentum: self.momentum,
                }
            }
        }
    };
}

batch_norm_layer!(BatchNorm1D);
batch_norm_layer!(BatchNorm2D);
