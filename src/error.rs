//! The error type of every fallible typed-amp operation.

/// What can go wrong in a mixed-precision training step.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AmpError {
    /// The device reported an error (out of memory, a failed kernel launch, ...).
    #[error("device error: {0}")]
    Device(String),

    /// Two inputs were traced with separate gradient stores and then combined in one graph.
    #[error(
        "two traced inputs carried separate gradient stores; trace one input with the gradients \
         and give the others an empty tape (`x.retaped::<MixedTape<_>>()`)"
    )]
    ConflictingGradients,

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

    /// Saved scaler state could not be restored.
    #[error("invalid loss-scaler state: {0}")]
    InvalidScalerState(String),

    /// Gradients were unscaled into a model that did not allocate them.
    #[error("these gradients do not belong to this model: {0}")]
    ForeignGradients(&'static str),

    /// Gradients or a step outcome met a scaler other than the one that scaled them.
    #[error("loss scaler mismatch: {0}")]
    ScalerMismatch(&'static str),

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
