//! The ops: the fused kernels against the unfused path they replace, the mixed layer norm, FP8
//! tensors and products.
//!
//! One test binary per area (`tests/<area>/main.rs`; see `tests/amp/main.rs`).

#[path = "../common/mod.rs"]
mod common;

// `pub`, as each file was a crate root before: what `#[amp]` and the tests declare `pub` (the
// weights' type aliases of every model, say) is not dead code where a test does not use it.
pub mod fp8;
pub mod fused_kernels;
pub mod layer_norm;
