//! typed-amp: mixed-precision training for [dfdx] in which precision lives in the type system.
//!
//! Mixed-precision training runs most of a network in FP16 and keeps the fragile parts in FP32:
//! FP32 master weights for the optimizer, a scaled loss so small gradients survive FP16, and
//! losses, softmax and norms in FP32. Each of those rules is a trait bound here, so a recipe
//! that breaks one does not compile:
//!
//! | mistake | caught by |
//! | --- | --- |
//! | an optimizer over FP16 weights | [`UpdatablePrecision`], [`MasterOptimizer`] |
//! | a loss over FP16 values | [`LossPrecision`] |
//! | stepping or clipping with gradients still × scale | [`step::Unscaled`] |
//! | unscaling twice | [`step::Scaled`] (and ownership) |
//! | FP32 data into an FP16 layer without a cast | dfdx's `Module`/`TryMatMul` bounds, with typed-amp's message |
//! | a model with no FP32 master weights given to the step | [`TrainTarget`] |
//!
//! # The training step
//!
//! ```rust
//! use typed_amp::dfdx::optim::Sgd;
//! use typed_amp::prelude::*;
//!
//! type Mlp = (Linear<784, 128>, ReLU, Linear<128, 10>);
//!
//! # fn main() -> Result<(), AmpError> {
//! let dev = Cpu::default();
//! // FP32 master weights and an FP16 working copy.
//! let mut model = MasterWeights::build::<Mlp>(&dev)?;
//! // The optimizer updates the FP32 master.
//! let mut opt = Sgd::new(model.master(), SgdConfig::default());
//! let mut scaler = GradScaler::dynamic(); // PyTorch's defaults: 2^16, x2 / x0.5, 2000 steps
//! let mut grads = model.alloc_grads()?;
//!
//! let x: Tensor<Rank2<32, 784>, f16, _> = dev.zeros();
//! let y: Tensor<Rank2<32, 10>, f32, _> = dev.zeros();
//! let logits = model.working().forward(x.traced_mixed(grads));   // FP16
//! let loss = cross_entropy_with_logits_loss(logits.to_f32(), y);  // FP32 only
//! let scaled = scaler.scale(loss).backward()?;                    // gradients x scale
//! let mut unscaled = scaler.unscale(&mut model, scaled)?;         // FP32 master gradients
//! clip_grad_norm(&mut unscaled, 1.0)?;                            // only on unscaled ones
//! let outcome = scaler.step(&mut opt, unscaled)?;                 // skipped on inf/NaN
//! grads = scaler.update(outcome)?;                                // zeroed, for the next step
//! # let _ = grads;
//! # Ok(())
//! # }
//! ```
//!
//! The mixed-precision autograd underneath is [`MixedTape`]: one dfdx tape for both precisions,
//! with differentiable casts ([`to_f16`], [`to_f32`]).
//!
//! Beyond one step: [`GradScaler::accumulate`] opens a gradient-accumulation window (the scale
//! cannot change inside it); several optimizers share a scaler by stepping their own targets and
//! updating once with the OR of their overflows; [`LossScalers`] and [`UnscaledGrads::merge`]
//! give each loss its own scaler; [`MixedGradients::watch_layers`] makes a skipped step name the
//! layer that overflowed ([`watch`]); [`checkpoint`] saves and restores a run exactly.
//!
//! # Policies: `#[amp(policy = ...)]`
//!
//! [`macro@amp`] on a struct whose fields are layers gives each layer the precision of Apex's
//! optimisation levels, and generates the FP32 master model (`NameMaster<D>`), the working
//! model (`NameWorking<D>`), a forward that casts at every precision boundary, and
//! `Name::build(&dev)`, which returns what the optimizer trains:
//!
//! | policy | matmul, conv | batch/layer norm | softmax, exp, log | weights the optimizer updates | input | loss scale | `build` returns |
//! | --- | --- | --- | --- | --- | --- | --- | --- |
//! | `"O0"` | FP32 | FP32 | FP32 | FP32 | FP32 | none | [`Fp32Weights`] |
//! | `"O1"` | FP16 (FP32 weights cast per pass) | FP32 | FP32 | FP32 | FP32 | dynamic | [`Fp32Weights`] |
//! | `"O2"` | FP16 | FP32 (`keep_batchnorm_fp32`) | FP32 | FP32 master copy | cast to FP16 | dynamic | [`MasterWeights`] |
//! | `"O3"` | FP16 | FP16 | FP16 | FP16, opt-in only (`allow_fp16_updates`) | cast to FP16 | static 1.0 | [`Fp16Weights`] |
//!
//! Properties override the policy, as in Apex: `keep_batchnorm_fp32 = bool`,
//! `master_weights = bool`, `loss_scale = "dynamic" | <number below 65520>`,
//! `cast_model_outputs = "fp32" | "fp16"`, `allow_fp16_updates`, and `custom_forward` (generate
//! no forward). `#[amp(fp16)]` or `#[amp(fp32)]` on a field pins that layer. Layers are
//! recognised by name (dfdx's and typed-amp's); tuples of layers run in order; a field of
//! another `#[amp]` struct runs under that struct's own policy. Conflicting properties, unknown
//! names and fields that are not layers are compile errors on the offending tokens.
//!
//! O0, the FP32 baseline:
//!
//! ```rust
//! # use typed_amp::prelude::*;
//! #[typed_amp::amp(policy = "O0")]
//! struct Mlp { fc1: Linear<8, 16>, act: ReLU, fc2: Linear<16, 2> }
//!
//! let model = Mlp::build(&Cpu::default()).unwrap(); // Fp32Weights<MlpMaster<Cpu>, Cpu>
//! let _: &typed_amp::dfdx::nn::modules::Linear<8, 16, f32, Cpu> = &model.working().fc1;
//! assert!(!Mlp::scaler().is_enabled());
//! ```
//!
//! O1, FP32 weights with FP16 compute for matrix products:
//!
//! ```rust
//! # use typed_amp::prelude::*;
//! #[typed_amp::amp(policy = "O1")]
//! struct Mlp { fc1: Linear<8, 16>, act: ReLU, fc2: Linear<16, 2> }
//!
//! let dev = Cpu::default();
//! let model = Mlp::build(&dev).unwrap();
//! let _: &typed_amp::dfdx::nn::modules::Linear<8, 16, f32, Cpu> = &model.working().fc1;
//! let x: Tensor<Rank2<4, 8>, f32, _> = dev.zeros();
//! let y: Tensor<Rank2<4, 2>, f16, _> = model.working().forward(x); // computed in FP16
//! ```
//!
//! O2, an FP16 model with FP32 batch norm and FP32 master weights:
//!
//! ```rust
//! # use typed_amp::prelude::*;
//! use typed_amp::dfdx::nn::builders::BatchNorm1D;
//!
//! #[typed_amp::amp(policy = "O2", cast_model_outputs = "fp32")]
//! struct Mlp { fc1: Linear<8, 16>, bn: BatchNorm1D<16>, act: ReLU, fc2: Linear<16, 2> }
//!
//! let dev = Cpu::default();
//! let model = Mlp::build(&dev).unwrap(); // MasterWeights<MlpMaster<Cpu>, MlpWorking<Cpu>, Cpu>
//! let _: &typed_amp::dfdx::nn::modules::Linear<8, 16, f16, Cpu> = &model.working().fc1;
//! let _: &typed_amp::dfdx::nn::modules::BatchNorm1D<16, f32, Cpu> = &model.working().bn;
//! let _: &typed_amp::dfdx::nn::modules::Linear<8, 16, f32, Cpu> = &model.master().fc1;
//! // FP32 input is cast at the entry: no "Input type FloatTensor and weight type HalfTensor".
//! let x: Tensor<Rank2<4, 8>, f32, _> = dev.zeros();
//! let y: Tensor<Rank2<4, 2>, f32, _> = model.working().forward(x);
//! ```
//!
//! O3, pure FP16, only with its explicit opt-in; its optimizer is wrapped in [`LowPrecisionUpdates`]:
//!
//! ```rust
//! # use typed_amp::prelude::*;
//! use typed_amp::dfdx::optim::Sgd;
//!
//! #[typed_amp::amp(policy = "O3", allow_fp16_updates)]
//! struct Mlp { fc1: Linear<8, 16>, act: ReLU, fc2: Linear<16, 2> }
//!
//! let model = Mlp::build(&Cpu::default()).unwrap(); // Fp16Weights<MlpWorking<Cpu>, Cpu>
//! let _: &typed_amp::dfdx::nn::modules::Linear<8, 16, f16, Cpu> = &model.master().fc1;
//! let opt: typed_amp::LowPrecisionUpdates<Sgd<_, f16, Cpu>> =
//!     typed_amp::LowPrecisionUpdates(Sgd::new(model.master(), SgdConfig::default()));
//! ```
//!
//! Without `allow_fp16_updates`, O3 does not compile, and the error says why:
//!
//! ```compile_fail
//! # use typed_amp::prelude::*;
//! #[typed_amp::amp(policy = "O3")] // O3 without master weights would have the optimizer update FP16 weights ...
//! struct Mlp { fc1: Linear<8, 16>, act: ReLU, fc2: Linear<16, 2> }
//! ```
#![warn(missing_docs)]

// Lets `#[amp]`'s generated code, which names `::typed_amp`, compile inside this crate too.
extern crate self as typed_amp;

pub use dfdx;
pub use half;

pub mod amp;
pub mod checkpoint;
pub mod data;
pub mod device;
pub mod error;
pub mod loss;
pub mod master;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod params;
pub mod precision;
pub mod scaler;
pub mod step;
pub mod tape;
pub mod watch;

pub use device::AmpDevice;
pub use error::AmpError;
pub use loss::Loss;
pub use master::{
    Bf16Weights, Fp16Weights, Fp32Weights, MasterWeights, SinglePrecision, TrainTarget,
};
pub use ops::cast::{to_bf16, to_f16, to_f32, Cast};
pub use optim::{adamw_config, LowPrecisionUpdates, MasterOptimizer};
pub use params::{ParamInfo, Parameters};
pub use precision::{
    AmpElem, AmpTensor, DType, FullRange, LossPrecision, LowPrecision, Precision,
    UpdatablePrecision, BF16, F16, F32,
};
pub use scaler::{GradScaler, LossScalers, ScaleMode, ScalerState};
pub use step::{
    clip_grad_norm, clip_grad_value, Accumulation, RawGrads, ScaledGrads, ScaledLoss, StepOutcome,
    UnscaledGrads,
};
pub use tape::{MixedGradients, MixedTape, TraceMixed};
pub use typed_amp_macros::amp;

/// Everything a training script needs: dfdx's prelude and typed-amp's types.
pub mod prelude {
    pub use dfdx::prelude::*;
    pub use half::{bf16, f16};

    pub use crate::loss::{
        binary_cross_entropy_with_logits_loss, cross_entropy_with_logits_loss, mse_loss, Loss,
    };
    pub use crate::ops::cast::{to_bf16, to_f16, to_f32, Cast};
    pub use crate::{
        adamw_config, clip_grad_norm, clip_grad_value, AmpDevice, AmpError, Fp32Weights,
        GradScaler, MasterWeights, MixedGradients, MixedTape, Parameters, TraceMixed, TrainTarget,
        BF16, F16, F32,
    };
}

/// The README's Rust example, compiled and run as a doctest so that it stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
