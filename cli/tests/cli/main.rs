//! The `typed-amp` program end to end, as a user runs it: its commands and checks, the GPT and
//! the ViT. One test binary for the three (`tests/<area>/main.rs`, as in the library's tests), so
//! that the program's crates are linked once; the data-parallel tests, which run `mpirun`, keep
//! a binary of their own (`data_parallel.rs`).

#[path = "../../../tests/common/mod.rs"]
mod common;

// `pub`, as each file was a crate root before: what `#[amp]` and the tests declare `pub` (the
// weights' type aliases of every model, say) is not dead code where a test does not use it.
pub mod commands;
pub mod gpt;
pub mod vit;
