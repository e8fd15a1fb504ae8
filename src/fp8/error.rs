//! The typed run-time errors of FP8 quantisation: bad input is an [`Fp8Error`], never a panic.

/// What can go wrong when quantising to FP8, computing a scale, or multiplying FP8 tensors.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Fp8Error {
    /// An amax (the largest magnitude of a tensor, or one recorded in a history) is inf or NaN:
    /// the data holds a non-finite value, and no scale can be computed from it.
    #[error(
        "the amax {amax} is not finite: the data holds inf or NaN, so no FP8 scale can be \
         computed from it (skip the step, as for an overflow, and quantise finite data)"
    )]
    NonFiniteAmax {
        /// The amax.
        amax: f32,
    },

    /// A scale is inf, NaN, zero or negative: given by hand, or computed from an amax so small
    /// that `fp8_max / amax` overflows FP32.
    #[error(
        "the FP8 scale {scale} is not a finite positive number{context}: a scale multiplies the \
         data before it is cast, so it must be one (an amax below fp8_max / f32::MAX gives an \
         infinite scale)"
    )]
    BadScale {
        /// The scale.
        scale: f32,
        /// Where it came from (empty, or `" (computed from amax …)"`).
        context: String,
    },

    /// Delayed scaling with an amax history that holds no amax above zero yet (a fresh history,
    /// or only all-zero tensors recorded): the scale `fp8_max / amax` is undefined.
    #[error(
        "the amax history of delayed scaling holds no amax above zero ({len} entries): record \
         one first (`DelayedScaling::record_amax`, or `DelayedScaling::from_first` with the \
         first tensor), or use current scaling for this tensor"
    )]
    EmptyHistory {
        /// The history's length.
        len: usize,
    },

    /// A buffer's length does not match the shape it is given with, or two operands' shapes do
    /// not fit a product.
    #[error("FP8 shape mismatch: {0}")]
    Shape(String),

    /// A recipe's FP8 state (amax histories) read back from a checkpoint or reduced across
    /// ranks is damaged: a value that is not a finite magnitude, or counts that do not fit.
    #[error(
        "the FP8 recipe state is damaged: {0} (the scales computed from it would be wrong; \
         load a checkpoint whose FP8 state is intact, or start the recipe fresh)"
    )]
    DamagedState(String),

    /// A data-parallel step tried to commit this step's amaxes before they were reduced across
    /// ranks: each rank would compute other scales from then on.
    #[error(
        "this step's FP8 amaxes were not reduced across ranks before the step: step a \
         data-parallel model through `DataParallel::all_reduce` and `DataParallel::step`, which \
         reduce them (max) before the scales are computed"
    )]
    AmaxNotReduced,
}
