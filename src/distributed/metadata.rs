//! The number of ranks in checkpoint metadata, and the check that a run resumes on as many.

use crate::error::AmpError;
use std::collections::BTreeMap;

/// The checkpoint metadata key holding the number of ranks that trained a run.
pub const WORLD_SIZE_KEY: &str = "world_size";

/// Records the number of ranks in checkpoint metadata (a checkpoint without it was written by a
/// single process).
pub fn record_world_size(meta: &mut BTreeMap<String, String>, size: usize) {
    meta.insert(WORLD_SIZE_KEY.to_string(), size.to_string());
}

/// Checks that a checkpoint was written by a run of `size` ranks: resuming with another number
/// of ranks would change the global batch and the shards, so it is refused
/// ([`AmpError::WorldSize`]). A checkpoint without the key counts as one rank's.
pub fn check_world_size(meta: &BTreeMap<String, String>, size: usize) -> Result<(), AmpError> {
    let saved = match meta.get(WORLD_SIZE_KEY) {
        None => 1,
        Some(v) => v.parse().map_err(|_| {
            AmpError::Collective(format!("the checkpoint's `{WORLD_SIZE_KEY}` is `{v}`"))
        })?,
    };
    if saved == size {
        Ok(())
    } else {
        Err(AmpError::WorldSize {
            saved,
            current: size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn world_size_is_checked() {
        let mut meta = BTreeMap::new();
        assert!(check_world_size(&meta, 1).is_ok());
        record_world_size(&mut meta, 2);
        assert!(check_world_size(&meta, 2).is_ok());
        let err = check_world_size(&meta, 3).unwrap_err();
        assert!(
            matches!(
                err,
                AmpError::WorldSize {
                    saved: 2,
                    current: 3
                }
            ),
            "{err}"
        );
    }
}
