//! The typed step and what surrounds it: the step's stages and outcomes, the step protocol,
//! training-loop patterns, PyTorch's `GradScaler` trace, identity checks, checkpoints and fault
//! injection.
//!
//! One test binary per area (`tests/<area>/main.rs`; see `tests/amp/main.rs`).

#[path = "../common/mod.rs"]
mod common;

// `pub`, as each file was a crate root before: what `#[amp]` and the tests declare `pub` (the
// weights' type aliases of every model, say) is not dead code where a test does not use it.
pub mod checkpoint;
pub mod fault_injection;
pub mod gradscaler_trace;
pub mod identity;
pub mod step_outcomes;
pub mod step_protocol;
pub mod training_patterns;
pub mod typed_step;
