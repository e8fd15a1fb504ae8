//! The fork's own tests: the bf16 dtype, the convolution kernels, 16-bit elementwise ops, the
//! rewritten CPU kernels and dropout. One test binary (`tests/<area>/main.rs`), so that dfdx's
//! generics are compiled and linked once for all of them. Those over f16 and bf16 need the
//! `f16` feature (`cargo test -p typed-amp-dfdx --features f16`; typed-amp's `cargo test
//! --workspace` turns it on, as typed-amp depends on it).

// `pub`, as each file was a crate root before: what `#[amp]` and the tests declare `pub` (the
// weights' type aliases of every model, say) is not dead code where a test does not use it.
pub mod concat;
#[cfg(feature = "f16")]
pub mod conv_kernels;
#[cfg(feature = "f16")]
pub mod dfdx_bf16;
pub mod dfdx_cpu_kernels;
pub mod dropout;
#[cfg(feature = "f16")]
pub mod elementwise_16bit;
pub mod reshape;
