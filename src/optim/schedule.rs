//! Learning-rate schedules: the cosine schedule. An optimizer's learning rate is read and set
//! between steps through [`MasterOptimizer`](crate::optim::MasterOptimizer).

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
