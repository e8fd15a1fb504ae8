//! The mixed-precision tape: one tape that records dfdx ops of every precision and runs their
//! backward passes in one global reverse order.
//!
//! dfdx's own tape and gradient store hold a single dtype. [`MixedTape`] implements dfdx's public
//! [`Tape`](dfdx::prelude::Tape) trait once, generically over the element type, so every dfdx op and module records
//! onto it unchanged, whichever precision it runs in. Each recorded op gets a number from one
//! global counter; backward sorts by it and runs in reverse, so a 16-bit layer's backward runs
//! after the FP32 loss's backward that feeds it, across any number of casts. Gradients land in a
//! [`MixedGradients`]: one dfdx [`Gradients`](dfdx::prelude::Gradients) store per precision, each parameter's gradient in
//! the parameter's own precision. The stores are indexed by the precision's position in
//! [`with_precisions!`](crate::with_precisions), so nothing here names a precision.
//!
//! | file | concept |
//! | --- | --- |
//! | `grads.rs` | [`MixedGradients`], the gradients of every precision |
//! | `erased_store.rs` | one precision's dfdx gradient store with its element type erased |
//! | `identity.rs` | [`TargetId`] and `ScaledAt`: whose gradients they are, and when a scaler wrote them |
//! | `computed.rs` | the precisions a backward pass computed gradients in (FP16 needs a loss scale) |
//! | `mixed.rs` | [`MixedTape`] and [`TraceMixed`] |
//! | `amp_tape.rs` | [`AmpTape`], what typed-amp's ops record onto (`MixedTape` or dfdx's `NoneTape`) |
//! | `probe.rs` | what layer probes record ([`ActivationRecord`], [`LayerReport`]) |

mod amp_tape;
mod computed;
mod erased_store;
mod grads;
mod identity;
mod mixed;
mod probe;

pub use amp_tape::AmpTape;
pub use grads::MixedGradients;
pub(crate) use identity::ScaledAt;
pub use identity::TargetId;
pub(crate) use mixed::next_op_order;
pub use mixed::{MixedTape, TraceMixed};
pub use probe::{ActivationRecord, LayerReport};
