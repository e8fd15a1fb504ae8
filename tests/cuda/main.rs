//! The CUDA tests (feature `cuda`; `nccl` for the NCCL module): typed-amp's CUDA kernels against
//! the CPU implementation, the fused ops' kernels, and the NCCL backend on one GPU. Every test
//! opens GPU 0 first and, where that fails, prints why and passes.
//!
//! One test binary per area (`tests/<area>/main.rs`; see `tests/amp/main.rs`).

// `pub`, as each file was a crate root before: what `#[amp]` and the tests declare `pub` (the
// weights' type aliases of every model, say) is not dead code where a test does not use it.
pub mod fp8;
pub mod fused;
pub mod kernels;
pub mod nccl;
