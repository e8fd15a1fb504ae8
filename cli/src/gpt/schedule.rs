//! nanoGPT's learning-rate schedule (`get_lr` of its `train.py`).

/// Iterations of linear warm-up.
pub const WARMUP_ITERS: usize = 100;

/// The learning rate of iteration `it` (counted from 0) of a run of `max_iters` iterations
/// whose peak rate is `lr`, as nanoGPT's `get_lr` with `warmup_iters = 100`,
/// `lr_decay_iters = max_iters` and `min_lr = lr / 10`: linear warm-up
/// `lr · (it + 1) / (100 + 1)` for the first 100 iterations, then cosine from `lr` down to
/// `lr / 10` at `max_iters`.
pub fn get_lr(it: usize, lr: f64, max_iters: usize) -> f64 {
    let min_lr = lr / 10.0;
    if it < WARMUP_ITERS {
        return lr * (it + 1) as f64 / (WARMUP_ITERS + 1) as f64;
    }
    if it > max_iters {
        return min_lr;
    }
    // it >= 100 here, so max_iters >= it >= 100; a run of exactly 100 iterations never gets
    // here with it < max_iters, and at it == max_iters == 100 the ratio is taken as 1.
    let span = max_iters - WARMUP_ITERS;
    let ratio = if span == 0 {
        1.0
    } else {
        (it - WARMUP_ITERS) as f64 / span as f64
    };
    let coeff = 0.5 * (1.0 + (std::f64::consts::PI * ratio).cos());
    min_lr + coeff * (lr - min_lr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_then_decays_to_a_tenth() {
        let lr = 1e-3;
        assert_eq!(get_lr(0, lr, 2000), lr / 101.0);
        assert_eq!(get_lr(99, lr, 2000), lr * 100.0 / 101.0);
        assert_eq!(get_lr(100, lr, 2000), lr);
        let mid = get_lr(1050, lr, 2000);
        assert!((mid - (lr / 10.0 + 0.5 * (lr - lr / 10.0))).abs() < 1e-15);
        assert!((get_lr(2000, lr, 2000) - lr / 10.0).abs() < 1e-18);
        assert_eq!(get_lr(5000, lr, 2000), lr / 10.0);
        // Monotone after the warm-up.
        let rates: Vec<f64> = (100..2000).map(|it| get_lr(it, lr, 2000)).collect();
        assert!(rates.windows(2).all(|w| w[1] <= w[0]));
    }

    #[test]
    fn short_runs_stay_in_the_warm_up() {
        assert_eq!(get_lr(19, 1e-3, 20), 1e-3 * 20.0 / 101.0);
        assert_eq!(get_lr(100, 1e-3, 100), 1e-4);
    }
}
