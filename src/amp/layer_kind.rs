//! [`AmpLayer`]: how a layer takes part in mixed precision (its row of the policy table), and
//! the rows of dfdx's layers.

use dfdx::nn::modules as dm;
use dfdx::prelude::{ConstDim, Device, Dtype};

use super::kind;

/// How a layer takes part in mixed precision: its row of the policy table.
///
/// Implemented on module types (what `dev.build_module::<Arch, E>()` returns), for every
/// element type, for dfdx's layers, typed-amp's, tuples, [`Repeated`](dfdx::nn::modules::Repeated) and [`Residual`](dfdx::nn::modules::Residual);
/// `#[amp]` implements it for the models it generates.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not say how it runs in mixed precision",
    label = "not an `AmpLayer`",
    note = "`#[amp]` runs each layer by its row of the policy table: implement `typed_amp::amp::AmpLayer` for the layer's module type with `type Kind = typed_amp::amp::kind::Matmul;` (or `Norm`, `Fp32Op`, `Elementwise`, `Neutral`), make it an `#[amp]` model, or pin the field to one precision with `#[amp(fp16)]`, `#[amp(bf16)]` or `#[amp(fp32)]`"
)]
pub trait AmpLayer {
    /// The layer's row: one of the types in [`kind`].
    type Kind;
}

/// Implements [`AmpLayer`] for layer module types.
macro_rules! amp_layers {
    ($($kind:ty => $([$($generics:tt)*] $layer:ty),+;)*) => {$($(
        impl<$($generics)*> $crate::amp::AmpLayer for $layer {
            type Kind = $kind;
        }
    )+)*};
}

pub(crate) use amp_layers;

amp_layers! {
    kind::Linear =>
        [const I: usize, const O: usize, E: Dtype, D: Device<E>] dm::Linear<I, O, E, D>,
        [const I: usize, const O: usize, E: Dtype, D: Device<E>] dm::UnbiasedLinear<I, O, E, D>;
    kind::Activation =>
        [] dm::ReLU,
        [] dm::AccurateGeLU;
    kind::Norm =>
        [const C: usize, E: Dtype, D: Device<E>] dm::BatchNorm1D<C, E, D>,
        [const C: usize, E: Dtype, D: Device<E>] dm::BatchNorm2D<C, E, D>;
    kind::LayerNorm =>
        [const M: usize, E: Dtype, D: Device<E>] dm::LayerNorm1D<M, E, D>;
    kind::Softmax =>
        [] dm::Softmax,
        [] dm::LogSoftmax;
    kind::Fp32Op =>
        [] dm::Exp,
        [] dm::Ln;
    kind::Elementwise =>
        [E: Dtype, D: Device<E>] dfdx::nn::prelu::PReLU<E, D>,
        [C: ConstDim, E: Dtype, D: Device<E>] dfdx::nn::prelu::PReLU1D<C, E, D>,
        [const C: usize, E: Dtype, D: Device<E>] dm::Bias2D<C, E, D>,
        [const V: usize, const M: usize, E: Dtype, D: Device<E>] dm::Embedding<V, M, E, D>;
    kind::Neutral =>
        [] dm::FastGeLU,
        [] dm::Sigmoid,
        [] dm::Tanh,
        [] dm::Sin,
        [] dm::Cos,
        [] dm::Square,
        [] dm::Sqrt,
        [] dm::Abs,
        [E: Dtype] dm::LeakyReLU<E>,
        [] dm::Dropout,
        [const N: usize] dm::DropoutOneIn<N>,
        [] dm::AvgPoolGlobal,
        [] dm::MaxPoolGlobal,
        [] dm::MinPoolGlobal;
}

// dfdx's deprecated `GeLU` (the tanh approximation, as `FastGeLU`) is still a correct layer:
// models written against dfdx's older name train like `FastGeLU` ones.
#[allow(deprecated)]
impl AmpLayer for dm::GeLU {
    type Kind = kind::Neutral;
}
