//! The rows of the policy table (Apex's op lists, by layer): what a layer's
//! [`AmpLayer::Kind`](crate::amp::AmpLayer::Kind) names.

use std::marker::PhantomData;

/// Matrix products (linear, convolution): 16-bit under O1 (FP32 weights cast per pass),
/// O2 and O3.
#[derive(Debug)]
pub struct Matmul;

/// dfdx's `Linear` and `UnbiasedLinear`: the [`Matmul`] row, run as typed-amp's fused linear op
/// ([`crate::ops::linear`]).
#[derive(Debug)]
pub struct Linear;

/// ReLU and exact GELU (`AccurateGeLU`): the [`Neutral`] row, fused into a fused linear op
/// just before it ([`crate::ops::relu`], [`crate::ops::gelu`]).
#[derive(Debug)]
pub struct Activation;

/// Batch norm and layer norm: FP32 under O1, and under O2 unless
/// `keep_batchnorm_fp32 = false`; 16-bit under O3.
#[derive(Debug)]
pub struct Norm;

/// dfdx's `LayerNorm1D`: the [`Norm`] row, run as typed-amp's fused layer norm
/// ([`crate::ops::layernorm`]) wherever its parameters are FP32 (O0, O1, and O2 unless
/// `keep_batchnorm_fp32 = false`), as dfdx's layer in 16 bits otherwise.
#[derive(Debug)]
pub struct LayerNorm;

/// Softmax, log-softmax, exp and log: FP32 except under O3.
#[derive(Debug)]
pub struct Fp32Op;

/// dfdx's `Softmax` and `LogSoftmax`: the [`Fp32Op`] row, run by dfdx's named 16-bit forms
/// (`Tensor::try_softmax_16bit`, `try_log_softmax_16bit`), so that O3's 16-bit row is the
/// policy's explicit opt-in. dfdx's modules themselves take f32 and f64 only (the fork's
/// `SoftmaxDtype` rule).
#[derive(Debug)]
pub struct Softmax;

/// Layers with parameters that follow the model's storage precision (PReLU, bias,
/// embedding): FP32 under O0 and O1, 16-bit under O2 and O3.
#[derive(Debug)]
pub struct Elementwise;

/// Parameterless layers that compute in whatever precision they receive (activations,
/// pooling, dropout, flatten).
#[derive(Debug)]
pub struct Neutral;

/// An explicit cast layer: computes in `P` under every policy.
#[derive(Debug)]
pub struct Cast<P>(PhantomData<P>);

/// Several layers, each run by its own kind (tuples, `Repeated`, `Residual`).
#[derive(Debug)]
pub struct Composite;

/// The layers of the `#[amp]` model `M`: run under `M`'s own policy, whatever the
/// enclosing model's.
#[derive(Debug)]
pub struct Nested<M>(PhantomData<M>);
