//! The error type of every fallible typed-amp operation.

/// What can go wrong in a mixed-precision training step.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AmpError {
    /// The device reported an error (out of memory, a failed kernel launch, ...).
    #[error("device error: {0}")]
    Device(String),

    /// The FP8 recipe's state refused an operation: its amaxes not reduced across ranks before
    /// a data-parallel step, or damaged state put back.
    #[error("FP8 recipe: {0}")]
    Fp8(#[from] crate::fp8::Fp8Error),

    /// Two inputs were traced with separate gradient stores and then combined in one graph.
    #[error(
        "two traced inputs carried separate gradient stores; trace one input with the gradients \
         and give the others an empty tape (`x.retaped::<MixedTape<_>>()`)"
    )]
    ConflictingGradients,

    /// An optimizer over 16-bit weights (O3's [`LowPrecisionUpdates`](crate::optim::LowPrecisionUpdates))
    /// was given an epsilon that rounds to zero in its state's precision (Adam's default 1e-8
    /// in FP16): its second moment, stored in that precision, underflows to 0 for small
    /// gradients and the update divides by the epsilon alone. Refused before the first update.
    #[error(
        "the optimizer's eps of {eps} rounds to 0 in {precision}, the precision of its weights and state: \
         a second moment that underflows to 0 there leaves an update divided by eps alone; \
         use an eps that {precision} holds (at least {smallest:e}; 1e-4 is usual for FP16 Adam), or FP32 master weights (O2)"
    )]
    EpsilonUnderflows {
        /// The optimizer's epsilon.
        eps: f64,
        /// The state's precision.
        precision: crate::precision::DType,
        /// The smallest positive value of that precision.
        smallest: f32,
    },

    /// A master module and its working copy do not have the same parameters.
    #[error("master and working modules differ at `{path}`: {detail}")]
    ParamMismatch {
        /// Path of the first parameter that differs (e.g. `1.weight`).
        path: String,
        /// What differs.
        detail: String,
    },

    /// An opt level or policy name is not known.
    #[error("invalid mixed-precision policy: {0}")]
    InvalidPolicy(String),

    /// A loss-scaler setting is out of range.
    #[error("invalid loss-scaler setting: {0}")]
    InvalidScalerConfig(String),

    /// An accumulation window was used out of order.
    #[error("gradient accumulation: {0}")]
    AccumulationOrder(&'static str),

    /// A clipping limit is out of range.
    #[error("invalid gradient clipping: {0}")]
    InvalidClip(String),

    /// The dynamic loss scale has sat at its floor through too many overflowing steps: the
    /// model itself produces inf or NaN (a loss scale cannot fix that).
    #[error(
        "the loss scale is stuck at its floor ({scale}) after {steps} overflowing steps in a row: \
         the model produces inf or NaN on its own; check the non-finite parameters the step \
         reports, the learning rate and the inputs"
    )]
    ScaleFloor {
        /// The scale.
        scale: f32,
        /// Overflowing steps in a row at the floor.
        steps: u32,
    },

    /// A static loss scale above FP16's largest finite value, 65,504: the scale multiplies the
    /// FP32 loss's gradient, so every FP16 gradient of a loss whose own gradient is 1 or more
    /// comes out inf, and a static scaler never backs off, so every such step is skipped.
    #[error(
        "a static loss scale of {scale} is above 65504, FP16's largest finite value: the FP16 \
         gradients it multiplies overflow and a static scale never backs off, so every such step \
         is skipped; use a static scale of at most 65504, or a dynamic scaler (`GradScaler::dynamic()`), \
         which starts at 65536 and backs off"
    )]
    StaticScaleOverflowsFp16 {
        /// The refused scale.
        scale: f32,
    },

    /// Gradients that need a loss scale reached a step without one (rule `FullRange`): the
    /// model's working precision is FP16 and its scaler is disabled, or a backward pass computed
    /// gradients in FP16 (an FP16 op on the tape of a model that declares BF16 or FP32) and
    /// no enabled scaler scaled the loss. Refused before anything is unscaled or stepped.
    #[error(
        "FP16 gradients need a loss scaler (rule `FullRange`: FP16's exponent range is too \
         narrow to step on raw gradients, which flush to zero below 2^-24): {reason}; scale the \
         loss with an enabled scaler (`let scaled = scaler.scale(loss).backward()?;` \
         `scaler.unscale(&mut model, scaled)?` with `GradScaler::dynamic()`), or compute in \
         BF16 (`.to_bf16()`, `dtype = \"bf16\"`), whose exponent range is FP32's"
    )]
    Fp16GradientsNeedALossScale {
        /// Why these gradients need one: the declared precision, or an FP16 op on the tape.
        reason: &'static str,
    },

    /// An update was given no step outcomes at all: it would count a clean step (and grow the
    /// scale) for a step that was never taken.
    #[error(
        "`update` was given no step outcomes: pass it what `step` returned (one outcome, or a \
         tuple, array or Vec of every outcome of the iteration), not an empty collection"
    )]
    NoOutcomes,

    /// A step's outcome never reached the update of the scaler that scaled its gradients
    /// (dropped, or passed to `std::mem::forget`): its overflow verdict is lost, so the scale
    /// would never back off. Reported at the next backward or unscale of that model with that
    /// scaler, or at an update given the iteration's other outcomes.
    #[error(
        "the outcome of step {step} of this loss scaler (its steps counted from 1 since it was built) \
         never reached its `update`: it was dropped or forgotten, so whether that step overflowed \
         was never counted and the scale would stop backing off; pass every outcome of an \
         iteration to `scaler.update(..)` before the next backward"
    )]
    OutcomeNotUpdated {
        /// The step, counted from 1 by the scaler that scaled its gradients.
        step: u64,
    },

    /// One scaler per loss: the gradients about to be stepped hold no loss of one of the
    /// scalers (its loss was never merged in), refused before the weights change.
    #[error(
        "the gradients about to be stepped hold no loss of scaler {loss} of these {losses} \
         `LossScalers`: merge every loss's gradients (`total.merge(scalers.get(i), grads)?`) \
         before the step, so that each scaler's verdict is known before any weight changes"
    )]
    LossNotMerged {
        /// The index of the scaler whose loss is missing.
        loss: usize,
        /// The number of losses.
        losses: usize,
    },

    /// A model trained across ranks (made rank 0's by a `DataParallel`) was given to a
    /// single-process step, which never averages its gradients across ranks: each rank would
    /// step on its own shard and the ranks' weights would part.
    #[error(
        "this model trains across ranks (a `DataParallel` synced it), but its gradients went to a \
         single-process step (`grads.check(..)` or `scaler.unscale(..)`), which never all-reduces \
         them, so each rank would step on its own shard; step it through the `DataParallel`: \
         `dist.unscale(&mut model, dist.scale(loss).backward()?)?`, `dist.all_reduce(..)?`, \
         `dist.step(..)?`, `dist.update(..)?` (for BF16 or FP32, \
         `DataParallel::new(GradScaler::disabled(), comm)`)"
    )]
    NotAllReduced,

    /// Saved scaler state could not be restored.
    #[error("invalid loss-scaler state: {0}")]
    InvalidScalerState(String),

    /// Gradients were unscaled into a model that did not allocate them.
    #[error("these gradients do not belong to this model: {0}")]
    ForeignGradients(&'static str),

    /// Gradients or a step outcome met a scaler other than the one that scaled them.
    #[error("loss scaler mismatch: {0}")]
    ScalerMismatch(&'static str),

    /// A backward pass reached none of the parameters of the model its gradients were
    /// allocated for: the forward ran through another model (`x.traced_mixed(a_grads)` then
    /// `model_b.forward(..)`), which would never train while the first stepped on zeros.
    /// Reported by the backward, before anything changes.
    #[error(
        "no parameter of the model these gradients were allocated for received a gradient in \
         this backward pass: the forward ran through another model, which would never train \
         while this one stepped on zeros; trace a model's input with that model's own gradients \
         (`x.traced_mixed(grads)` with `grads = model.alloc_grads()?` or what its last update \
         returned)"
    )]
    ForeignForward,

    /// Gradients kept from an earlier iteration (a clone of last step's scaled gradients)
    /// reached a loss scaler's backward or unscale after that scaler's update: they hold the
    /// earlier iteration's gradients, which this step would add in again. Reported before
    /// anything changes.
    #[error(
        "these gradients are stale: a backward pass of this loss scaler wrote them after its \
         update {scaled_after} and it has counted {updates} updates since it was built, so they \
         hold an earlier iteration's gradients; trace every iteration with the gradients the \
         last `scaler.update(..)` returned, not with a copy kept from an earlier one"
    )]
    StaleGradients {
        /// The updates the scaler had counted when its backward pass wrote the gradients.
        scaled_after: u64,
        /// The updates the scaler has counted now.
        updates: u64,
    },

    /// The optimizer failed to update the master weights.
    #[error("optimizer update failed: {0}")]
    Optimizer(String),

    /// A collective operation of data-parallel training failed.
    #[error("data-parallel collective: {0}")]
    Collective(String),

    /// Ranks of a data-parallel run no longer hold the same master weights or loss scale.
    #[error("data-parallel ranks diverged: {0}")]
    RanksDiverged(String),

    /// A data-parallel checkpoint was resumed with another number of ranks.
    #[error(
        "the checkpoint was written by a run of {saved} rank(s) and this run has {current}: \
         resume with the same number of ranks (`mpirun -n {saved} ...`), since the number of \
         ranks sets the global batch and each rank's shard"
    )]
    WorldSize {
        /// Ranks of the run that wrote the checkpoint.
        saved: usize,
        /// Ranks of this run.
        current: usize,
    },
}

impl From<dfdx::prelude::CpuError> for AmpError {
    fn from(err: dfdx::prelude::CpuError) -> Self {
        AmpError::device(err)
    }
}

#[cfg(feature = "cuda")]
impl From<dfdx::prelude::CudaError> for AmpError {
    fn from(err: dfdx::prelude::CudaError) -> Self {
        AmpError::device(err)
    }
}

impl AmpError {
    /// Wraps a device error.
    pub fn device(err: impl std::fmt::Display) -> Self {
        AmpError::Device(err.to_string())
    }
}
