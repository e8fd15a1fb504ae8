//! The data sets: Fashion-MNIST's loader and its errors, Shakespeare as characters, and batches
//! in the model's entry precision. One test binary (`tests/<area>/main.rs`, as in the library's
//! tests), so that the crates are linked once.

#[path = "../../../tests/common/mod.rs"]
mod common;

// `pub`, as each file was a crate root before: what `#[amp]` and the tests declare `pub` (the
// weights' type aliases of every model, say) is not dead code where a test does not use it.
pub mod batches;
pub mod fashion_mnist;
pub mod shakespeare;
