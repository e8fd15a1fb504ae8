//! Checkpoints: master weights, optimizer state and loss-scaler state in one safetensors file,
//! written atomically, restored exactly.
//!
//! Tensors are named by parameter path: `master.<path>` (every master parameter and buffer, in
//! its own precision), `optim.<store>.<path>` (e.g. `optim.moment1.fc1.weight`). Everything
//! else is string metadata: the format, the scaler's state (`scaler.*`), the optimizer's kind
//! and scalars (`optim.*`), the precision of every master and working parameter
//! (`model.master`, `model.working`), the `#[amp]` policy where the caller gives it
//! ([`save_with_policy`]: `policy.*`), and whatever the caller adds (step, epoch, RNG state,
//! ...). Any safetensors reader can read the tensors by name.
//!
//! The file is written next to its destination and renamed over it, so a crash leaves either
//! the old checkpoint or the new one, never a torn file.

mod atomic;
mod error;
mod format;
mod load;
mod policy;
mod save;
mod scaler_meta;
mod validate;

pub use atomic::{remove_stale_temporaries, temporaries, writer_may_be_running};
pub use error::CheckpointError;
pub use format::FORMAT;
pub use load::{load, load_with_policy, read_metadata};
pub use save::{save, save_with_policy, serialized_size};
