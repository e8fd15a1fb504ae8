//! `#[amp]` models and the policy table: models, layers and policies training under O0–O3 in
//! FP16 and BF16, mixed-precision gradients against FP32 references, a transformer's parts.
//!
//! One test binary per area (`tests/<area>/main.rs`), each file below a module of it, so that
//! dfdx's and typed-amp's generics are compiled and linked once per area rather than once per
//! file.

#[path = "../common/mod.rs"]
mod common;

// `pub`, as each file was a crate root before: what `#[amp]` and the tests declare `pub` (the
// weights' type aliases of every model, say) is not dead code where a test does not use it.
pub mod amp_layers;
pub mod amp_models;
pub mod amp_policies;
pub mod fp8_fused;
pub mod fp8_recipe;
pub mod gpt_smoke;
pub mod input_gradient;
pub mod mixed_fp16_bf16;
pub mod mixed_gradients;
pub mod transformer;
