//! What `#[amp(policy = ...)]` builds on: policies, the [`AmpModel`] trait its structs
//! implement, the precision casts it inserts, and O1's cast-for-compute.
//!
//! | file | concept |
//! | --- | --- |
//! | `config.rs` | a model's recipe ([`OptLevel`], [`AmpConfig`], [`LossScale`]) |
//! | `kind.rs` | the rows of the policy table ([`kind`]) |
//! | `layer_kind.rs` | [`AmpLayer`]: a layer's row, and the rows of dfdx's layers |
//! | `layer.rs` | what a policy does with each row, and how `#[amp]` makes and runs a layer's working copy |
//! | `model.rs` | [`AmpModel`], the casts `#[amp]` inserts, O1's cast-for-compute |
//! | `paired.rs` | how each row pairs a master layer with its working copy (`AmpLayer` → [`Paired`](crate::master::Paired)) |
//! | `norm.rs` | norms over 16-bit activations with FP32 parameters |
//!
//! The attribute itself lives in the `typed-amp-macros` crate and is re-exported as
//! [`crate::amp`](macro@crate::amp); its documentation, with the policy table, is on the crate root.

mod built;
mod composite;
mod config;
pub mod kind;
#[doc(hidden)]
// `#[amp]`'s generated code (through `typed_amp::__private`); users name `AmpLayer` and `kind`.
pub mod layer;
mod layer_kind;
mod leaf_forward;
mod model;
pub mod norm;
pub(crate) mod paired;
mod planned;

pub(crate) use built::built_policy;
#[doc(hidden)]
pub use built::record_built_policy;
pub use config::{AmpConfig, Fp8Linear, LossScale, OptLevel};
pub(crate) use layer_kind::amp_layers;
pub use layer_kind::AmpLayer;
// The run traits of the leaf rows with a forward of their own (`layer::KindRun` bounds).
pub use leaf_forward::{RunActivation, RunLinear};
pub use model::{
    try_convert, AmpModel, AutocastForward, Built, CastTo, Converted, MasterOf, TupleField,
    WorkingOf,
};
