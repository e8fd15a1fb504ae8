//! A scaler's ledger of steps in flight: every step taken with gradients a scaler scaled is
//! written down until its outcome reaches that scaler's update, so that an outcome dropped or
//! passed to `std::mem::forget` (which no drop guard sees) is found by the scaler itself.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::AmpError;

/// A step taken whose outcome has not reached the update yet.
#[derive(Debug, Clone, Copy)]
struct Pending {
    /// The model stepped (its `TargetId`'s number).
    target: u64,
    /// The step, counted from 1 by this ledger.
    step: u64,
}

#[derive(Debug, Default)]
struct Book {
    steps: u64,
    /// Updates counted (calls of [`Ledger::settle`]).
    updates: u64,
    pending: Vec<Pending>,
}

/// A scaler's ledger, shared by the scaler and the losses, gradients and outcomes it scaled
/// (cloning a handle shares the ledger; a cloned scaler gets a new one).
#[derive(Debug, Clone, Default)]
pub(crate) struct Ledger(Arc<Mutex<Book>>);

impl Ledger {
    fn book(&self) -> MutexGuard<'_, Book> {
        // The book is consistent after every statement that writes it: a panic elsewhere while
        // it was locked leaves nothing half-written.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Writes down a step taken on `target`; returns its number.
    pub(crate) fn record_step(&self, target: u64) -> u64 {
        let mut book = self.book();
        book.steps += 1;
        let step = book.steps;
        book.pending.push(Pending { target, step });
        step
    }

    /// Errors if a step on `target` is still waiting for its outcome to reach the update: the
    /// next iteration of a model is traced only after the last one's outcome was counted.
    pub(crate) fn check_target(&self, target: u64) -> Result<(), AmpError> {
        match self.book().pending.iter().find(|p| p.target == target) {
            Some(p) => Err(AmpError::OutcomeNotUpdated { step: p.step }),
            None => Ok(()),
        }
    }

    /// Errors, changing nothing, unless every step in flight is among `steps` (the outcomes an
    /// update was given).
    pub(crate) fn check_settled(&self, steps: &[u64]) -> Result<(), AmpError> {
        match self
            .book()
            .pending
            .iter()
            .find(|p| !steps.contains(&p.step))
        {
            Some(p) => Err(AmpError::OutcomeNotUpdated { step: p.step }),
            None => Ok(()),
        }
    }

    /// Errors if any step is still waiting for its outcome to reach the update.
    pub(crate) fn check_none_pending(&self) -> Result<(), AmpError> {
        match self.book().pending.first() {
            Some(p) => Err(AmpError::OutcomeNotUpdated { step: p.step }),
            None => Ok(()),
        }
    }

    /// The steps still waiting for their outcomes to reach the update, oldest first.
    #[cfg(debug_assertions)]
    pub(crate) fn pending_steps(&self) -> Vec<u64> {
        self.book().pending.iter().map(|p| p.step).collect()
    }

    /// Crosses out the steps whose outcomes an update counted.
    pub(crate) fn settle(&self, steps: &[u64]) {
        let mut book = self.book();
        book.pending.retain(|p| !steps.contains(&p.step));
        book.updates += 1;
    }

    /// The updates counted so far: gradients a backward pass wrote before the last of them are
    /// an earlier iteration's.
    pub(crate) fn updates(&self) -> u64 {
        self.book().updates
    }
}
