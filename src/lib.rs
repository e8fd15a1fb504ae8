//! typed-amp: mixed-precision training for [dfdx] in which precision lives in the type system.
//!
//! Mixed-precision training runs most of a network in a 16-bit precision (FP16 or BF16) and
//! keeps the fragile parts in FP32: FP32 master weights for the optimizer, a scaled loss so
//! small gradients survive FP16's narrow exponent range, and losses, softmax and norms in FP32.
//! Each of those rules is a trait bound here, so a recipe that breaks one does not compile:
//!
//! | mistake | caught by |
//! | --- | --- |
//! | an optimizer over FP16 or BF16 weights | [`UpdatablePrecision`], [`MasterOptimizer`] |
//! | a loss over FP16 or BF16 values | [`LossPrecision`] |
//! | a softmax or log-softmax over FP16 or BF16 values | [`ops::softmax::SoftmaxPrecision`] |
//! | an FP16 model stepping without a loss scaler | [`FullRange`] |
//! | stepping or clipping with gradients still × scale | [`step::Unscaled`] |
//! | unscaling twice | [`step::Scaled`] (and ownership) |
//! | an iteration that never updates the scaler, or updates it with a made-up flag | [`step::StepOutcomes`], `#[must_use]` |
//! | FP32 data into a 16-bit layer (or FP16 into BF16) without a cast | dfdx's `Module`/`TryMatMul` bounds, with typed-amp's message; [`precision::SamePrecisionAs`] for `SelfAttention` |
//! | a model with no FP32 master weights given to the step | [`TrainTarget`] |
//! | a model declaring a compute precision wider than its weights' | [`precision::NoWiderThan`] |
//! | dfdx's own optimizer updating the 16-bit working copy | rule `UpdatableByAnOptimizer`: [`master::WorkingCopy`] is no `TensorCollection` |
//! | a step's outcome cloned | rule `OutcomesAreNeverCloned`: [`step::StepOutcome`] is never `Clone` |
//! | gradients all-reduced twice | rule `AllReducedOnce`: [`DataParallel::all_reduce`](distributed::DataParallel::all_reduce) takes [`Unreduced`](step::Unreduced) gradients only |
//!
//! What cannot be a type is checked at run time, before anything changes, with a typed error:
//! FP16 gradients (of an FP16 model, or computed in FP16 inside one that declares FP32 or BF16)
//! with no enabled loss scaler ([`AmpError::Fp16GradientsNeedALossScale`]);
//! gradients unscaled into a model that did not allocate them
//! ([`AmpError::ForeignGradients`]), or by a scaler that did not scale them
//! ([`AmpError::ScalerMismatch`]); a static loss scale above FP16's largest value
//! ([`AmpError::StaticScaleOverflowsFp16`]); an update given no outcomes
//! ([`AmpError::NoOutcomes`]); an outcome dropped or forgotten before its update
//! ([`AmpError::OutcomeNotUpdated`]); one-scaler-per-loss gradients missing a loss
//! ([`AmpError::LossNotMerged`]); a data-parallel model stepped without its all-reduce
//! ([`AmpError::NotAllReduced`]); a forward pass through another model traced with these
//! gradients ([`AmpError::ForeignForward`]); last step's scaled gradients kept and reused
//! ([`AmpError::StaleGradients`]).
//!
//! # The training step
//!
//! One call per iteration, as PyTorch's `autocast` + `GradScaler` loop:
//! [`StepProtocol::train_step_with`](step::StepProtocol::train_step_with) takes the forward pass
//! as a closure that traces the batch into the gradients and returns the FP32 loss, and
//! [`StepOptions`](step::StepOptions) adds clipping (on the unscaled gradients) and gradient
//! accumulation:
//!
//! ```rust
//! use typed_amp::prelude::*;
//!
//! #[typed_amp::amp(policy = "O2", cast_model_outputs = "fp32")]
//! struct Mlp { fc1: Linear<784, 128>, act: ReLU, fc2: Linear<128, 10> }
//!
//! # fn main() -> Result<(), AmpError> {
//! let dev = Cpu::default();
//! let mut model = Mlp::build(&dev)?;                       // FP32 master, FP16 working copy
//! let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
//! let mut scaler = Mlp::scaler();                          // PyTorch's defaults
//! let options = StepOptions::new().clip_grad_norm(1.0).accumulate(2);
//! let mut grads = model.alloc_grads()?;
//! for _ in 0..3 {
//!     grads = scaler.train_step_with(&mut model, &mut opt, grads, &options, |model, _micro, grads| {
//!         let x: Tensor<Rank2<32, 784>, f32, _> = dev.sample_normal(); // micro-batch `_micro`
//!         let y: Tensor<Rank2<32, 10>, f32, _> = dev.zeros();
//!         let logits = model.working().forward(x.traced_mixed(grads));  // FP16 inside
//!         cross_entropy_with_logits_loss(logits, y)                      // FP32 only
//!     })?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Under it run the typed stages, each a value only the next accepts ([`step`]): for each
//! micro-batch the forward pass and [`GradScaler::scale`](scaler::GradScaler::scale) →
//! [`ScaledLoss::backward`](step::ScaledLoss::backward) (in one
//! [`Accumulation`](step::Accumulation) window when accumulating), then
//! [`GradScaler::unscale`](scaler::GradScaler::unscale) →
//! [`clip_grad_norm`](step::clip_grad_norm) → [`GradScaler::step`](scaler::GradScaler::step) →
//! [`GradScaler::update`](scaler::GradScaler::update).
//! Every rule of the stages holds for the short form (an FP16 loss, an optimizer over the working
//! copy, an FP16 model stepped by [`NoScaler`](step::NoScaler) do not compile). The same
//! iteration stage by stage, for a loop that needs to look inside (the short form gives the same
//! bits):
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
//! BF16 has FP32's exponent range, so a BF16 model (or an FP32 one) steps without a scaler, its
//! gradients still checked for inf and NaN: in one call with [`NoScaler`](step::NoScaler)
//! (`NoScaler::new().train_step_with(..)`, which does not compile for an FP16 model), or by
//! stages:
//!
//! ```rust
//! # use typed_amp::prelude::*;
//! # fn main() -> Result<(), AmpError> {
//! #[typed_amp::amp(policy = "O2", dtype = "bf16", cast_model_outputs = "fp32")]
//! struct Mlp { fc1: Linear<784, 128>, act: ReLU, fc2: Linear<128, 10> }
//!
//! let dev = Cpu::default();
//! let mut model = Mlp::build(&dev)?;                       // BF16 working copy, FP32 master
//! let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
//! let x: Tensor<Rank2<32, 784>, f32, _> = dev.zeros();
//! let y: Tensor<Rank2<32, 10>, f32, _> = dev.zeros();
//! let logits = model.working().forward(x.traced_mixed(model.alloc_grads()?));
//! let loss = cross_entropy_with_logits_loss(logits, y);
//! let mut grads = loss.backward()?.check(&mut model)?;      // no scale; inf/NaN checked
//! clip_grad_norm(&mut grads, 1.0)?;
//! let next = grads.step(&mut opt)?.into_grads();            // skipped on inf/NaN
//! # let _ = next;
//! # Ok(())
//! # }
//! ```
//!
//! The mixed-precision autograd underneath is [`MixedTape`]: one dfdx tape for every precision,
//! with differentiable casts ([`to_f16`], [`to_bf16`], [`to_f32`], [`Cast::cast`]).
//!
//! Beyond one step: [`GradScaler::accumulate`] opens a gradient-accumulation window (the scale
//! cannot change inside it); several optimizers share a scaler by stepping their own targets and
//! passing every outcome to one [`GradScaler::update`]; [`LossScalers`] and
//! [`UnscaledGrads::merge`] give each loss its own scaler; [`MixedGradients::watch_layers`]
//! makes a skipped step name the layer that overflowed ([`watch`]); [`checkpoint`] saves and
//! restores a run exactly; [`step::StepProtocol`] runs a whole iteration with a [`GradScaler`],
//! [`LossScalers`] or a [`distributed::DataParallel`], so that one training loop runs in one
//! process or in many.
//!
//! # Precisions
//!
//! [`with_precisions!`] is the one list of precisions (FP16, BF16, FP32); the [`DType`] enum,
//! the per-precision gradient stores, the device capability bundle [`AmpDevice`] and the CUDA
//! kernels' element types are generated from it (see [`precision`]).
//!
//! # Policies: `#[amp(policy = ...)]`
//!
//! [`macro@amp`] on a struct whose fields are layers gives each layer the precision of Apex's
//! optimisation levels, and generates the FP32 master model (`NameMaster<D>`), the working
//! model (`NameWorking<D>`), a forward that casts at every precision boundary, and
//! `Name::build(&dev)`, which returns what the optimizer trains:
//!
//! | policy | `dtype` | matmul, conv | batch/layer norm | softmax, exp, log | weights the optimizer updates | input | loss scale | `build` returns |
//! | --- | --- | --- | --- | --- | --- | --- | --- | --- |
//! | `"O0"` | (none: a compile error) | FP32 | FP32 | FP32 | FP32 | FP32 | none | [`Fp32Weights`] |
//! | `"O1"` | `"fp16"` (default) | FP16 (FP32 weights cast per pass) | FP32 | FP32 | FP32 | FP32 | dynamic | [`Fp32Weights`] computing in [`F16`] |
//! | `"O1"` | `"bf16"` | BF16 (FP32 weights cast per pass) | FP32 | FP32 | FP32 | FP32 | none | [`Fp32Weights`] computing in [`BF16`] |
//! | `"O2"` | `"fp16"` | FP16 | FP32 (`keep_batchnorm_fp32`) | FP32 | FP32 master copy | cast to FP16 | dynamic | [`MasterWeights`] |
//! | `"O2"` | `"bf16"` | BF16 | FP32 (`keep_batchnorm_fp32`) | FP32 | FP32 master copy | cast to BF16 | none | [`MasterWeights`] |
//! | `"O3"` | `"fp16"` | FP16 | FP16 | FP16 | FP16, opt-in only (`allow_fp16_updates`) | cast to FP16 | static 1.0 | [`Fp16Weights`] |
//! | `"O3"` | `"bf16"` | BF16 | BF16 | BF16 | BF16, opt-in only (`allow_bf16_updates`) | cast to BF16 | none | [`Bf16Weights`] |
//!
//! BF16 has FP32's exponent range, so its policies need no loss scale, and their step compiles
//! without a scaler (an FP16 one does not: rule [`FullRange`]); a model that pins any layer to
//! FP16 is scaled dynamically again.
//!
//! Properties override the policy, as in Apex: `dtype = "fp16" | "bf16"`,
//! `keep_batchnorm_fp32 = bool`, `master_weights = bool`,
//! `loss_scale = "dynamic" | <number below 65520>`, `cast_model_outputs = "fp32" | "fp16" | "bf16"`,
//! `allow_fp16_updates` / `allow_bf16_updates`, `custom_forward` (generate no forward), and
//! `fp8 = "hybrid" | "hybrid-current"` (O2-BF16 with master weights only): the products of the
//! linear layers take FP8 operands, E4M3 activations and weights forward, E5M2 output gradients
//! backward, accumulated in FP32 and returned in BF16 ([`fp8::Hybrid`]: Transformer Engine's
//! delayed scaling, whose amax histories the working copy holds, the step commits, checkpoints
//! save and data parallelism reduces; [`fp8::HybridCurrent`]: each tensor's own amax), see
//! [`ops::fp8_linear`]; everything else is O2-BF16's.
//! `#[amp(fp16)]`, `#[amp(bf16)]` or `#[amp(fp32)]` on a field pins that layer. A layer's
//! row of the table is its [`amp::AmpLayer`] impl, not its name: dfdx's and typed-amp's layers,
//! type aliases of them, tuples (run in order), `Repeated`, `Residual` (its branch cast back to
//! the input's precision before the sum), `Embedding` (token ids pass the entry cast as they
//! are) and a user's own layer with a one-line `AmpLayer` impl all work unpinned; a field of
//! another `#[amp]` struct runs under that struct's own policy. Conflicting properties, unknown
//! names and fields that are not layers are compile errors on the offending tokens, and a layer
//! without `AmpLayer` is a compile error naming the trait.
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
//! let opt: typed_amp::optim::LowPrecisionUpdates<Sgd<_, f16, Cpu>> =
//!     typed_amp::optim::LowPrecisionUpdates(Sgd::new(model.master(), SgdConfig::default()));
//! ```
//!
//! Without `allow_fp16_updates`, O3 does not compile, and the error says why:
//!
//! ```compile_fail
//! # use typed_amp::prelude::*;
//! #[typed_amp::amp(policy = "O3")] // O3 without master weights would have the optimizer update FP16 weights ...
//! struct Mlp { fc1: Linear<8, 16>, act: ReLU, fc2: Linear<16, 2> }
//! ```
//!
//! [`UpdatablePrecision`]: precision::UpdatablePrecision
//! [`MasterOptimizer`]: optim::MasterOptimizer
//! [`LossPrecision`]: precision::LossPrecision
//! [`FullRange`]: precision::FullRange
//! [`TrainTarget`]: master::TrainTarget
//! [`AmpError::Fp16GradientsNeedALossScale`]: error::AmpError::Fp16GradientsNeedALossScale
//! [`AmpError::ForeignGradients`]: error::AmpError::ForeignGradients
//! [`AmpError::ScalerMismatch`]: error::AmpError::ScalerMismatch
//! [`AmpError::StaticScaleOverflowsFp16`]: error::AmpError::StaticScaleOverflowsFp16
//! [`AmpError::NoOutcomes`]: error::AmpError::NoOutcomes
//! [`AmpError::OutcomeNotUpdated`]: error::AmpError::OutcomeNotUpdated
//! [`AmpError::LossNotMerged`]: error::AmpError::LossNotMerged
//! [`AmpError::NotAllReduced`]: error::AmpError::NotAllReduced
//! [`AmpError::ForeignForward`]: error::AmpError::ForeignForward
//! [`AmpError::StaleGradients`]: error::AmpError::StaleGradients
//! [`MixedTape`]: tape::MixedTape
//! [`to_f16`]: ops::cast::to_f16
//! [`to_bf16`]: ops::cast::to_bf16
//! [`to_f32`]: ops::cast::to_f32
//! [`Cast::cast`]: ops::cast::Cast::cast
//! [`GradScaler::accumulate`]: scaler::GradScaler::accumulate
//! [`GradScaler::update`]: scaler::GradScaler::update
//! [`LossScalers`]: scaler::LossScalers
//! [`UnscaledGrads::merge`]: step::UnscaledGrads::merge
//! [`MixedGradients::watch_layers`]: tape::MixedGradients::watch_layers
//! [`GradScaler`]: scaler::GradScaler
//! [`DType`]: precision::DType
//! [`AmpDevice`]: device::AmpDevice
//! [`Fp32Weights`]: master::Fp32Weights
//! [`F16`]: precision::F16
//! [`BF16`]: precision::BF16
//! [`MasterWeights`]: master::MasterWeights
//! [`Fp16Weights`]: master::Fp16Weights
//! [`Bf16Weights`]: master::Bf16Weights
//! [`LowPrecisionUpdates`]: optim::LowPrecisionUpdates
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

// Lets `#[amp]`'s generated code, which names `::typed_amp`, compile inside this crate too.
extern crate self as typed_amp;

pub use dfdx;
pub use half;

pub mod amp;
pub mod checkpoint;
pub mod device;
pub mod distributed;
pub mod error;
pub mod fp8;
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

pub use typed_amp_macros::amp;

/// What `#[amp]`'s generated code names and a user does not: the layer-by-layer plan and run
/// traits, the master/working pairing visitors, the layer probe and the build-time records.
/// Not part of the API (serde's and thiserror's `__private`): their names and shapes change with
/// the macro. Users name [`amp::AmpLayer`] and [`amp::kind`] for their own layers.
#[doc(hidden)]
pub mod __private {
    pub use crate::amp::layer::{
        plan, CompositeRun, CompositeRunMut, CompositeWorking, KindRun, KindRunMut, KindWorking,
        LeafKind, Plan, Policy, RunLayer, RunLayerMut, RunPlanned, RunPlannedMut, Table,
        WorkingUnder,
    };
    pub use crate::amp::paired::KindPaired;
    pub use crate::amp::{
        record_built_policy, AutocastForward, RunActivation, RunLinear, TupleField,
    };
    pub use crate::master::{zip_layer, CompositePaired, PairVisitor, Paired};
    pub use crate::watch::Watch;
}

pub mod prelude {
    //! What a training loop needs, and nothing else: dfdx's prelude (its layers, shapes, tensors,
    //! ops and optimizers; not its losses, which typed-amp's FP32-only losses of the same purpose
    //! replace, so no name means two things; its free functions `softmax` and `log_softmax` are
    //! replaced the same way by typed-amp's FP32-only ones) and, of typed-amp, what the loop in the
    //! crate documentation names or calls a method of: the model wrappers ([`MasterWeights`] and
    //! [`TrainTarget`]'s `master()`/`working()`), [`TraceMixed`]'s `.traced_mixed(grads)`,
    //! [`Cast`]'s `.to_f16()`/`.to_bf16()`/`.to_f32()`, the losses, [`GradScaler`], the one-call
    //! step ([`StepProtocol`]'s `train_step`/`train_step_with`, [`StepOptions`], [`NoScaler`],
    //! and [`ScaleState`]'s `get_scale()`/`skipped_steps()` for a `DataParallel` as for a
    //! `GradScaler`), clipping, [`AmpError`] and the precision markers [`F16`], [`BF16`] and
    //! [`F32`].
    //!
    //! Everything else has one path, its module's: `typed_amp::scaler::LossScalers`,
    //! `typed_amp::step::UnscaledGrads`, `typed_amp::precision::DType`,
    //! `typed_amp::tape::MixedTape`.

    pub use dfdx::nn::builders::*;
    pub use dfdx::optim::prelude::*;
    pub use dfdx::shapes::*;
    pub use dfdx::tensor::*;
    pub use dfdx::tensor_ops::*;
    pub use half::{bf16, f16};

    pub use crate::error::AmpError;
    pub use crate::loss::{
        binary_cross_entropy_with_logits_loss, cross_entropy_with_logits_loss, mse_loss,
    };
    pub use crate::master::{MasterWeights, TrainTarget};
    pub use crate::ops::cast::Cast;
    pub use crate::ops::softmax::{log_softmax, softmax};
    pub use crate::precision::{BF16, F16, F32};
    pub use crate::scaler::GradScaler;
    pub use crate::step::{
        clip_grad_norm, clip_grad_value, NoScaler, ScaleState, StepOptions, StepProtocol,
    };
    pub use crate::tape::TraceMixed;
}

/// The README's Rust example, compiled and run as a doctest so that it stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
