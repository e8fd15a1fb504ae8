//! Whose a set of gradients is and when a scaler last wrote them: [`TargetId`] (the training
//! target they were allocated for) and [`ScaledAt`] (the scaler and its update count), which the
//! step checks before anything changes.

use std::sync::atomic::{AtomicU64, Ordering};

/// Identifies what a set of gradients belongs to: the training target whose parameters they
/// were allocated for. Unscaling gradients into another target is refused with a typed error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TargetId(u64);

impl TargetId {
    /// A fresh id, distinct from every other in this process.
    pub(crate) fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        TargetId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The id as a number, for bookkeeping below `tape` (a scaler's ledger of steps in flight).
    pub(crate) fn key(self) -> u64 {
        self.0
    }
}

/// When a loss scaler's backward pass last wrote a set of gradients: the scaler (its
/// `ScalerId`'s number) and how many updates it had counted then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ScaledAt {
    pub(crate) scaler: u64,
    pub(crate) updates: u64,
}
