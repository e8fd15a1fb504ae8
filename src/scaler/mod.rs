//! The loss scaler: PyTorch's `GradScaler` state machine, plus static and disabled modes.
//!
//! Multiplying the loss by a scale `S` before backward lifts small gradients out of FP16's
//! underflow range; the gradients are divided by `S` again before the update. A dynamic scaler
//! halves `S` and skips the step when a gradient is inf or NaN, and doubles `S` after
//! `growth_interval` clean steps in a row. The arithmetic follows PyTorch's
//! `torch._amp_update_scale_` exactly (FP32 scale, growth skipped if it would overflow), so a
//! run reproduces PyTorch's scales step for step.

mod grad_scaler;
mod ledger;
mod loss_scalers;
mod state;
mod tag;
#[cfg(test)]
mod tests;

pub(crate) use grad_scaler::inverse;
pub use grad_scaler::{GradScaler, ScalerId, SMALLEST_SCALE};
pub use loss_scalers::LossScalers;
pub use state::{
    ScaleMode, ScalerState, APEX_MAX_SCALE, DEFAULT_BACKOFF_FACTOR, DEFAULT_FLOOR_PATIENCE,
    DEFAULT_GROWTH_FACTOR, DEFAULT_GROWTH_INTERVAL, DEFAULT_INIT_SCALE, MAX_STATIC_SCALE,
};
pub(crate) use tag::{ScalerTag, StepVerdict};
