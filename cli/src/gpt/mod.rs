//! The Shakespeare job: nanoGPT's character-level GPT (`typed_amp_models::gpt`) trained,
//! compared, sampled and exported by `typed-amp --model gpt`, `typed-amp sample` and
//! `typed-amp export`.
//!
//! - [`train_gpt`]: one run of nanoGPT's recipe (AdamW with decay on the matrices only,
//!   warm-up and cosine schedule, gradient clipping at 1.0) through the typed step, on random
//!   windows drawn by a ChaCha8 generator seeded by `--seed`, the validation loss every
//!   `--eval-every` iterations, checkpoints that resume bit for bit;
//! - [`gpt_table`]: `compare`'s table of the runs, each trained in a process of its own;
//! - [`sample()`]: characters drawn from a checkpoint or an export;
//! - [`export()`]: a checkpoint's weights in 16 bits.

/// Runs `$go!(Model)` with the GPT of `size` (`GptSize`) under `policy` (`OptLevel`) in `dtype`
/// (`LowDtype`): O0, or O2 in FP16 or BF16. Another policy is a usage error naming those.
macro_rules! for_each_gpt {
    ($size:expr, $policy:expr, $dtype:expr, $go:ident) => {{
        use typed_amp::amp::OptLevel;
        use typed_amp_models::gpt::*;
        use $crate::models::LowDtype::{Bf16, Fp16};
        match ($size, $policy, $dtype) {
            (GptSize::Small, OptLevel::O0, _) => $go!(GptSmallO0),
            (GptSize::Small, OptLevel::O2, Fp16) => $go!(GptSmallO2),
            (GptSize::Small, OptLevel::O2, Bf16) => $go!(GptSmallO2Bf16),
            (GptSize::Baby, OptLevel::O0, _) => $go!(GptBabyO0),
            (GptSize::Baby, OptLevel::O2, Fp16) => $go!(GptBabyO2),
            (GptSize::Baby, OptLevel::O2, Bf16) => $go!(GptBabyO2Bf16),
            (_, policy, _) => Err($crate::gpt::check_policy(policy).expect_err("O1 or O3")),
        }
    }};
}

mod commands;
mod config;
mod eval;
mod export;
mod footprint;
mod meta;
mod report;
mod sample;
mod schedule;
mod source;
mod train;

pub use commands::{compare_command, export_command, sample_command, train_command};
pub use config::{
    check_policy, default_eval_every, EvalPoint, GptConfig, GptReport, DEFAULT_EVAL_WINDOWS,
    MAX_ITERS,
};
pub use export::{export, ExportReport};
pub use footprint::step_bytes_per_window;
pub use report::{gpt_diverged, gpt_from_json, gpt_json, gpt_table};
pub use sample::{sample, Sample, SampleConfig};
pub use schedule::{get_lr, WARMUP_ITERS};
pub use source::{parse_export_dtype, EXPORT_FORMAT};
pub use train::{adamw_recipe, train_gpt, GRAD_CLIP, SETTLING_ITERS};
pub use typed_amp_models::gpt::{GptSize, VOCAB};
