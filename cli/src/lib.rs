//! typed-amp's main job: train Fashion-MNIST models and a character-level GPT on Shakespeare
//! in FP32 and in mixed precision, and compare; sample and export the GPT.
//!
//! The `typed-amp` binary parses arguments and prints; this library holds the models, the
//! training run and the report, so that tests can drive them directly.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod child;
mod config;
pub mod data_parallel;
mod epoch;
mod footprint;
pub mod gpt;
pub mod heap;
mod json_fields;
pub mod memory;
pub mod models;
pub mod report;
pub mod run;
mod save_claim;
