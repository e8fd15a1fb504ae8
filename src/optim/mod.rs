//! Optimizers over FP32 master weights: dfdx's [`Sgd`](dfdx::optim::Sgd), [`Adam`](dfdx::optim::Adam) (AdamW through
//! [`adamw_config`]) and [`RMSprop`](dfdx::optim::RMSprop), admitted only when they update FP32 weights, and
//! [`LowPrecisionUpdates`], the explicit opt-in for updating 16-bit weights (O3).

mod constructors;
mod low_precision;
mod schedule;
mod state;

pub use constructors::{adam, adamw, adamw_config, sgd};
pub use low_precision::LowPrecisionUpdates;
// Defined beside the master weights it steps (`master/optimizer.rs`, below this module).
pub use crate::master::optimizer::MasterOptimizer;
pub use schedule::cosine_lr;
pub use state::{OptimizerState, StateMut, StateRef, StoreInvariant};
