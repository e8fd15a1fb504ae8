//! What an optimizer trains: FP32 master weights with a 16-bit working copy
//! ([`MasterWeights`]), a plain FP32 model ([`Fp32Weights`]), or, for O3 only, a plain 16-bit
//! model ([`Fp16Weights`], [`Bf16Weights`]).
//!
//! Forward and backward run on the working copy; unscaled gradients are written into gradients
//! of the FP32 master; the optimizer updates the master and, in the same pass, the working copy
//! ([`MasterOptimizer::try_update_paired`](crate::optim::MasterOptimizer::try_update_paired)). Master
//! and working parameters are paired by type: the two models are walked together
//! ([`Paired`]), tuple element by tuple element and layer by layer.
//!
//! | file | concept |
//! | --- | --- |
//! | `target.rs` | [`TrainTarget`], what the typed step trains |
//! | `pair.rs` | [`Paired`]: the walk over a master and its working copy together |
//! | `copy.rs` | copies between the two (refresh, reload, buffers) and the pairing check |
//! | `unscale.rs` | working gradients into master gradients, unscaled and checked |
//! | `flags.rs` | per-parameter non-finite flags, read back once a step |
//! | `grads.rs` | operations on every trainable parameter's gradient |
//! | `master_weights.rs` | [`MasterWeights`] |
//! | `single.rs` | [`SinglePrecision`] and its aliases |
//! | `working_copy.rs` | [`WorkingCopy`]: the working model, which runs forward but no optimizer updates |
//! | `optimizer.rs` | [`MasterOptimizer`](crate::optim::MasterOptimizer): dfdx's optimizers admitted over FP32 masters (its path is `typed_amp::optim`'s; it is here, below [`TrainTarget`], which steps with one) |
//! | `fused_update.rs` | the fused Adam/SGD update over a pair walk, refreshing the working copy in the same pass |

mod copy;
mod flags;
mod fused_update;
mod grads;
mod master_weights;
pub(crate) mod optimizer;
mod pair;
mod single;
mod target;
mod unscale;
mod working_copy;

pub use master_weights::MasterWeights;
pub use pair::{zip_layer, CompositePaired, PairVisitor, Paired};
pub use single::{Bf16Weights, Fp16Weights, Fp32Weights, SinglePrecision};
pub use target::TrainTarget;
pub use working_copy::{UpdatableByAnOptimizer, WorkingCopy};

pub(crate) use copy::refresh_pair;
pub(crate) use grads::{for_each_trainable_grad, GradOp};
