//! Procedural macros for [typed-amp](https://docs.rs/typed-amp).
//!
//! The `#[amp(policy = ...)]` attribute is built in its own issue; this crate compiles so that the
//! workspace layout is in place.
