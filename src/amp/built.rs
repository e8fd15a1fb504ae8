//! Which policy each `#[amp]` model was built under, by its training target's identity: a
//! checkpoint compares a file's policy with the model's own, not only with a value its caller
//! passes (which could be another model's `AMP_CONFIG`).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use super::config::AmpConfig;
use crate::device::AmpDevice;
use crate::master::TrainTarget;
use crate::tape::TargetId;

/// Every `#[amp]` model built in this process, by target: a few dozen bytes each, and target
/// ids are never reused, so an entry never names another model.
fn table() -> &'static Mutex<HashMap<TargetId, AmpConfig>> {
    static TABLE: OnceLock<Mutex<HashMap<TargetId, AmpConfig>>> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

/// Records that `target` was built under `config` (`#[amp]`'s generated `build` calls it).
#[doc(hidden)]
pub fn record_built_policy<D: AmpDevice, T: TrainTarget<D>>(target: &T, config: AmpConfig) {
    table()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(target.id(), config);
}

/// The policy the target `id` was built under, if `#[amp]` built it.
pub(crate) fn built_policy(id: TargetId) -> Option<AmpConfig> {
    table()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get(&id)
        .copied()
}
