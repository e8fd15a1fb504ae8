//! Learning rates: read and set between steps ([`LearningRate`]), and the cosine schedule.

use dfdx::optim::{Adam, RMSprop, Sgd};

use super::low_precision::LowPrecisionUpdates;

/// An optimizer whose learning rate can be read and changed between steps (for schedules).
pub trait LearningRate {
    /// The current learning rate.
    fn learning_rate(&self) -> f64;
    /// Sets the learning rate for the following steps.
    fn set_learning_rate(&mut self, lr: f64);
}

macro_rules! learning_rate {
    ($($opt:ident),*) => {$(
        impl<M, E: dfdx::prelude::Dtype, D: dfdx::prelude::Storage<E>> LearningRate for $opt<M, E, D> {
            fn learning_rate(&self) -> f64 {
                self.cfg.lr
            }
            fn set_learning_rate(&mut self, lr: f64) {
                self.cfg.lr = lr;
            }
        }
    )*};
}

learning_rate!(Sgd, Adam, RMSprop);

impl<O: LearningRate> LearningRate for LowPrecisionUpdates<O> {
    fn learning_rate(&self) -> f64 {
        self.0.learning_rate()
    }
    fn set_learning_rate(&mut self, lr: f64) {
        self.0.set_learning_rate(lr);
    }
}

/// Cosine annealing from `base_lr` at step 0 to 0 at step `total_steps` (Loshchilov & Hutter's
/// SGDR without restarts, as PyTorch's `CosineAnnealingLR` with `eta_min = 0`).
///
/// ```rust
/// # use typed_amp::optim::cosine_lr;
/// assert_eq!(cosine_lr(0.1, 0, 100), 0.1);
/// assert!((cosine_lr(0.1, 50, 100) - 0.05).abs() < 1e-12);
/// assert_eq!(cosine_lr(0.1, 100, 100), 0.0);
/// ```
pub fn cosine_lr(base_lr: f64, step: u64, total_steps: u64) -> f64 {
    if total_steps == 0 || step >= total_steps {
        return 0.0;
    }
    let progress = step as f64 / total_steps as f64;
    base_lr * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
}
