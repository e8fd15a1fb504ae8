//! The typed training step.
//!
//! In one call per iteration: [`StepProtocol::train_step_with`] (a
//! [`GradScaler`](crate::scaler::GradScaler), [`LossScalers`](crate::scaler::LossScalers) or
//! [`DataParallel`](crate::distributed::DataParallel)) or, without a scaler,
//! [`NoScaler::train_step_with`], each with [`StepOptions`] (clipping, gradient accumulation).
//! That call runs the stages below in order; write them out for a loop that needs to look
//! inside.
//!
//! With a loss scaler (FP16 models, and any model that wants one):
//! scale → backward → unscale → (clip) → step → update.
//!
//! | stage | takes | gives |
//! | --- | --- | --- |
//! | [`GradScaler::scale`](crate::scaler::GradScaler::scale) | an FP32 [`Loss`](crate::loss::Loss) | [`ScaledLoss`] |
//! | [`ScaledLoss::backward`] | | [`ScaledGrads`]: working-precision gradients, still × scale, tagged with the scaler |
//! | [`GradScaler::unscale`](crate::scaler::GradScaler::unscale) | the model, [`ScaledGrads`] | [`UnscaledGrads`]: master gradients ÷ scale, checked for inf/NaN, borrowing the model |
//! | [`clip_grad_norm`], [`clip_grad_value`] | [`UnscaledGrads`] | the total norm |
//! | [`GradScaler::step`](crate::scaler::GradScaler::step) | an FP32-master optimizer, [`UnscaledGrads`] | [`StepOutcome`] |
//! | [`GradScaler::update`](crate::scaler::GradScaler::update) | every [`StepOutcome`] of the iteration | the zeroed gradients for the next one |
//!
//! Without one (models whose working precision has FP32's exponent range: BF16 and FP32, rule
//! [`FullRange`](crate::precision::FullRange)): backward → check → (clip) → step.
//!
//! | stage | takes | gives |
//! | --- | --- | --- |
//! | [`Loss::backward`](crate::loss::Loss::backward) | | [`RawGrads`]: working-precision gradients at scale 1 |
//! | [`RawGrads::check`] | the model | [`UnscaledGrads`], checked for inf/NaN |
//! | [`UnscaledGrads::step`] | an FP32-master optimizer | [`StepOutcome`], whose [`StepOutcome::into_grads`] gives the next gradients |
//!
//! Each stage returns a value only the next stage accepts, so the order is checked by the
//! compiler: no optimizer accepts scaled gradients; unscaling consumes them, so they cannot be
//! unscaled twice; clipping takes only unscaled gradients; stepping consumes those; the next
//! iteration's gradients come only out of [`GradScaler::update`](crate::scaler::GradScaler::update) (or, without a scaler, out of
//! the outcome), so an iteration cannot skip its update, and an outcome cannot be counted twice.
//! Unscaled gradients borrow the model they were unscaled into, so clipping and the step need
//! no second reference to it. What cannot be a type is checked before anything changes: the
//! gradients must have been allocated by the model they are unscaled into, and unscaled by the
//! scaler that scaled them; and gradients that a backward pass computed in FP16 (whatever the
//! model declares), or of an FP16 model, need an enabled scaler (`loss_scale.rs`).

mod accumulation;
mod backward;
mod clip;
mod kind;
mod loss_scale;
mod markers;
mod merge;
mod outcome;
mod protocol;
// The scaler's step-time behaviour (`GradScaler::scale`/`unscale`/`step`/`update`, the same for
// `LossScalers`) and both as a `StepProtocol`: here, above the step's values and the scaler's
// state, both of which they use.
mod scaler;
mod scaler_protocol;
mod short;
mod unscaled;
mod update;

/// The largest gradient magnitude a step takes (2^62; defined beside the unscale kernel, which
/// checks it).
pub use crate::device::unscale::GRADIENT_LIMIT;
pub use accumulation::Accumulation;
pub(crate) use backward::check_fresh;
pub use backward::{RawGrads, ScaledGrads, ScaledLoss};
pub use clip::{clip_grad_norm, clip_grad_value};
pub use kind::{AllReduced, FromScaler, ReadyForStep, ScaleFree, StepKind, Unreduced};
pub use markers::{Scaled, Unscaled};
pub(crate) use outcome::sealed::OutcomeSet;
pub(crate) use outcome::{outcome_impls, verdicts};
pub use outcome::{OutcomesAreNeverCloned, StepOutcome, StepOutcomes};
pub(crate) use protocol::sealed;
pub use protocol::{ScaleState, StepProtocol};
pub(crate) use short::scaled_backward;
pub use short::{Clip, ForwardOutput, NoScaler, StepOptions};
pub(crate) use unscaled::into_master;
pub use unscaled::UnscaledGrads;
