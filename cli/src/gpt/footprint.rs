//! Whether a GPT step of the chosen batch fits in memory.

use typed_amp::amp::OptLevel;
use typed_amp_models::gpt::GptSize;

use super::config::GptConfig;
use crate::config::RunError;
use crate::memory;

/// Bytes one window adds to a training step's peak heap (its activations and their gradients,
/// the batch itself) under `policy`: measured as the growth of the training loop's own peak
/// heap (`loop_peak_bytes` of `train --model gpt --iters 2 --eval-windows 1 --json`) between
/// two batch sizes, rounded up by about 10%. Small GPT, batches 4 and 36: O0 2.23 MiB per
/// window, O2 1.15 MiB (FP16) and 1.14 MiB (BF16). Baby GPT, batches 2 and 8: O0 43.6 MiB,
/// O2 21.8 MiB (FP16) and 21.9 MiB (BF16). (The batch's own bytes are a few KiB.)
pub fn step_bytes_per_window(size: GptSize, policy: OptLevel) -> u64 {
    match (size, policy) {
        (GptSize::Small, OptLevel::O0) => 2_560 << 10,
        (GptSize::Small, _) => 1_300 << 10,
        (GptSize::Baby, OptLevel::O0) => 48 << 20,
        (GptSize::Baby, _) => 24 << 20,
    }
}

/// Refuses a batch whose training step would not fit in the memory left to the process
/// ([`memory::available`]), naming the batch that would, as the other models' runs do.
pub(crate) fn check_gpt_memory(
    cfg: &GptConfig,
    weights_bytes: usize,
    master_bytes: usize,
) -> Result<(), RunError> {
    let Some((available, limit)) = memory::available() else {
        return Ok(());
    };
    let per_window = step_bytes_per_window(cfg.size, cfg.policy);
    let windows = cfg.batch as u64;
    // Weights and their gradients, and Adam's two moments per master weight.
    let fixed = (weights_bytes as u64)
        .saturating_add(master_bytes as u64)
        .saturating_mul(2);
    let needed = fixed.saturating_add(per_window.saturating_mul(windows));
    if needed <= available {
        return Ok(());
    }
    let fits = available.saturating_sub(fixed) / per_window;
    // A tenth spare: the estimate is within a few per cent, not exact.
    let advice = match fits - fits / 10 {
        0 => "not even one window fits".to_string(),
        suggested => format!("use a smaller --batch, such as {suggested}"),
    };
    Err(RunError::Usage(format!(
        "--batch {} needs about {} per step (the {} GPT's activations: {} per window of {} tokens for {windows} windows, and {} of weights, gradients and optimizer state), more than the {} {limit}; {advice}",
        cfg.batch,
        memory::human(needed),
        cfg.size.name(),
        memory::human(per_window),
        cfg.size.context(),
        memory::human(fixed),
        memory::human(available),
    )))
}
