//! [`LossScalers`]: one loss scaler per loss.

use crate::error::AmpError;

use super::grad_scaler::GradScaler;

/// One loss scaler per loss (Apex's `num_losses`): each loss is scaled, backward and unscaled
/// with its own scaler, whose scale then follows only that loss's overflows. The unscaled
/// gradients of the losses are summed with [`UnscaledGrads::merge`](crate::step::UnscaledGrads::merge)
/// before one step.
///
/// The scalers know each other: a step with any of them is refused, before the weights change,
/// unless the gradients hold every loss ([`AmpError::LossNotMerged`]).
#[derive(Debug, PartialEq)]
pub struct LossScalers {
    scalers: Vec<GradScaler>,
}

impl Clone for LossScalers {
    /// New scalers in the same states, a group of their own.
    fn clone(&self) -> Self {
        Self::grouped(self.scalers.clone())
    }
}

impl LossScalers {
    /// `losses` scalers, each starting in `template`'s state.
    pub fn new(losses: usize, template: GradScaler) -> Self {
        Self::grouped((0..losses).map(|_| template.clone()).collect())
    }

    /// `scalers` as one group: each knows every scaler whose loss a step must hold.
    fn grouped(mut scalers: Vec<GradScaler>) -> Self {
        let group: Vec<_> = scalers.iter().map(GradScaler::id).collect();
        for scaler in &mut scalers {
            scaler.group = group.clone();
        }
        Self { scalers }
    }

    /// The scaler of loss `loss`, if there is one.
    pub fn get(&self, loss: usize) -> Option<&GradScaler> {
        self.scalers.get(loss)
    }

    /// Number of losses.
    pub fn len(&self) -> usize {
        self.scalers.len()
    }

    /// Whether there are no losses.
    pub fn is_empty(&self) -> bool {
        self.scalers.is_empty()
    }

    /// The scalers, in loss order.
    pub fn iter(&self) -> impl Iterator<Item = &GradScaler> {
        self.scalers.iter()
    }

    /// Ends an iteration: `found_inf[i]` says whether loss `i`'s gradients overflowed. The typed
    /// step calls it from [`LossScalers::update`].
    pub(crate) fn record(&mut self, found_inf: &[bool]) -> Result<(), AmpError> {
        if found_inf.len() != self.scalers.len() {
            return Err(AmpError::InvalidScalerConfig(format!(
                "{} overflow flags for {} losses",
                found_inf.len(),
                self.scalers.len()
            )));
        }
        for (scaler, found) in self.scalers.iter_mut().zip(found_inf) {
            scaler.record(*found)?;
        }
        Ok(())
    }
}
