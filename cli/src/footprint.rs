//! The run's memory: the peak it reached, and whether a step of the chosen batch fits.

use crate::memory;

use crate::config::{RunConfig, RunError};

/// Peak resident memory since the last reset, from `/proc/self/status` (Linux).
pub(crate) fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Starts a new peak-memory measurement (Linux's `clear_refs`; ignored elsewhere).
pub(crate) fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Refuses a batch whose training step would not fit in the memory left to the process
/// ([`memory::available`]), naming the batch that would: the alternative is an abort or the
/// OOM killer in the middle of the first step.
pub(crate) fn check_memory(
    cfg: &RunConfig,
    train_examples: usize,
    weights_bytes: usize,
    master_bytes: usize,
) -> Result<(), RunError> {
    let Some((available, limit)) = memory::available() else {
        return Ok(());
    };
    let per_example = cfg.arch.step_bytes_per_example(cfg.policy);
    // A step takes at most the whole training set.
    let examples = cfg.batch.min(train_examples) as u64;
    // Weights and their gradients, and Adam's two moments per master weight.
    let fixed = (weights_bytes as u64)
        .saturating_add(master_bytes as u64)
        .saturating_mul(2);
    let needed = fixed.saturating_add(per_example.saturating_mul(examples));
    if needed <= available {
        return Ok(());
    }
    let fits = available.saturating_sub(fixed) / per_example;
    // A tenth spare: the estimate is within a few per cent, not exact.
    let advice = match fits - fits / 10 {
        0 => "not even one example fits".to_string(),
        suggested => format!("use a smaller --batch, such as {suggested}"),
    };
    Err(RunError::Usage(format!(
        "--batch {} needs about {} per step (the {}'s activations: {} per example for {examples} examples, and {} of weights, gradients and optimizer state), more than the {} {limit}; {advice}",
        cfg.batch,
        memory::human(needed),
        cfg.arch.upper(),
        memory::human(per_example),
        memory::human(fixed),
        memory::human(available),
    )))
}
