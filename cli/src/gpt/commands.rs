//! The GPT's commands as the `typed-amp` binary runs them: what they print, and how they end.

use std::ffi::OsString;
use std::path::Path;

use typed_amp::amp::OptLevel;
use typed_amp_data::{CharCorpus, DataOrigin};

use super::config::{GptConfig, GptReport};
use super::export::export;
use super::report::{gpt_diverged, gpt_from_json, gpt_json, gpt_table};
use super::sample::{sample, SampleConfig};
use super::schedule::WARMUP_ITERS;
use super::train::train_gpt;
use crate::child::{run_child, Outcome, TrainArgs};
use crate::config::{DeviceChoice, RunError};
use crate::models::LowDtype;
use crate::report::mib;

/// The run's header: the text, the model and the recipe.
fn describe(cfg: &GptConfig, corpus: &CharCorpus) -> String {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!(
        "{}\n{}\n{} iterations, batch {} x {} tokens, seed {}, AdamW lr {} (warm-up {WARMUP_ITERS}, cosine to lr/10), validation every {} iterations over {} windows, {}",
        corpus.describe(),
        cfg.size.describe(),
        cfg.iters,
        cfg.batch,
        cfg.context(),
        cfg.seed,
        cfg.lr,
        cfg.eval_every,
        cfg.eval_windows,
        match cfg.device {
            DeviceChoice::Cpu => format!("CPU ({threads} threads)"),
            gpu => gpu.to_string(),
        },
    )
}

/// `typed-amp train --model gpt`: trains, prints the evaluations and the result (or its JSON).
pub fn train_command(
    cfg: &GptConfig,
    data_dir: Option<&Path>,
    json: bool,
) -> Result<Outcome, RunError> {
    let corpus = CharCorpus::load(data_dir)?;
    if !json {
        println!("{}\n", describe(cfg, &corpus));
    }
    let report = train_gpt(cfg, &corpus)?;
    let verdict = gpt_diverged(&report);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&gpt_json(&report)).expect("JSON values serialise")
        );
    } else {
        for e in &report.evals {
            println!(
                "iter {:>6}  train loss {:.4}  val loss {:.4}",
                e.iteration, e.train_loss, e.val_loss
            );
        }
        println!(
            "{}: validation loss {:.4} (best {:.4}), {} iterations ({} skipped, {} after iteration 20), {:.0} tokens/s, final loss scale {}",
            report.recipe,
            report.val_loss,
            report.best_val_loss,
            report.iterations,
            report.skipped_steps,
            report.skipped_after_20,
            report.tokens_per_second,
            report.final_scale
        );
    }
    Ok(verdict.map_or(Outcome::Done, Outcome::Diverged))
}

/// The arguments of a `typed-amp train --model gpt --json` process that trains `cfg` on the
/// texts in `data_dir` (the embedded subset where `None`).
fn train_args(cfg: &GptConfig, data_dir: Option<&Path>) -> Vec<OsString> {
    let shared = TrainArgs {
        batch: cfg.batch,
        seed: cfg.seed,
        lr: cfg.lr,
        device: cfg.device.to_string(),
        progress: cfg.progress,
        data_dir,
    };
    let mut args = shared.command_line(&[
        "--model".into(),
        "gpt".into(),
        "--gpt-size".into(),
        cfg.size.name().into(),
        "--policy".into(),
        cfg.policy.to_string(),
        "--dtype".into(),
        cfg.dtype.name().into(),
        "--iters".into(),
        cfg.iters.to_string(),
        "--eval-every".into(),
        cfg.eval_every.to_string(),
        "--eval-windows".into(),
        cfg.eval_windows.to_string(),
    ]);
    if cfg.fp8 {
        args.push("--fp8".into());
    }
    args
}

/// `typed-amp compare --model gpt`: trains FP32 (O0), O2-FP16, O2-BF16 and O2-BF16+FP8 (or, with
/// `chosen_mixed`, FP32 and `cfg`'s policy) each in a process of its own, on the texts loaded
/// here, and prints the table (or the runs' JSON).
pub fn compare_command(
    cfg: &GptConfig,
    chosen_mixed: bool,
    data_dir: Option<&Path>,
    json: bool,
) -> Result<Outcome, RunError> {
    let corpus = CharCorpus::load(data_dir)?;
    super::train::check_corpus(&corpus, cfg.context())?;
    if !json {
        println!("{}\n", describe(cfg, &corpus));
    }
    let fp32 = GptConfig {
        policy: OptLevel::O0,
        fp8: false,
        ..cfg.clone()
    };
    let mut configs = vec![fp32];
    if chosen_mixed {
        configs.push(cfg.clone());
    } else {
        for dtype in [LowDtype::Fp16, LowDtype::Bf16] {
            configs.push(GptConfig {
                policy: OptLevel::O2,
                dtype,
                fp8: false,
                ..cfg.clone()
            });
        }
        // The fourth column: O2-BF16 with FP8 linear layers.
        configs.push(GptConfig {
            policy: OptLevel::O2,
            dtype: LowDtype::Bf16,
            fp8: true,
            ..cfg.clone()
        });
    }
    let description = corpus.describe();
    let dir = match corpus.origin() {
        DataOrigin::Directory(dir) => Some(dir.clone()),
        DataOrigin::Embedded => None,
    };
    drop(corpus);
    let mut runs: Vec<(GptReport, serde_json::Value, bool)> = Vec::new();
    for config in &configs {
        let label = config.label();
        let child = run_child(&label, train_args(config, dir.as_deref()))?;
        let report = gpt_from_json(config, &child.json).map_err(|e| {
            RunError::Child(format!(
                "the {label} run (process {}) printed a result that cannot be read: {e}",
                child.pid
            ))
        })?;
        runs.push((report, child.json, child.diverged));
    }
    if json {
        let value = serde_json::json!({
            "data": description,
            "runs": runs.iter().map(|r| r.1.clone()).collect::<Vec<_>>(),
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&value).expect("JSON values serialise")
        );
    } else {
        let reports: Vec<GptReport> = runs.iter().map(|r| r.0.clone()).collect();
        print!("{}", gpt_table(&reports));
    }
    Ok(if runs.iter().any(|r| r.2) {
        Outcome::DivergedReported
    } else {
        Outcome::Done
    })
}

/// `typed-amp sample`: prints the prompt and the characters that follow it.
pub fn sample_command(cfg: &SampleConfig) -> Result<Outcome, RunError> {
    let sample = sample(cfg)?;
    println!("{}{}", sample.prompt, sample.generated);
    Ok(Outcome::Done)
}

/// `typed-amp export`: writes the export and prints its size beside the checkpoint's.
pub fn export_command(checkpoint: &Path, dtype: LowDtype, out: &Path) -> Result<Outcome, RunError> {
    let report = export(checkpoint, dtype, out)?;
    println!(
        "{}: {} tensors in {}, {} ({} bytes)",
        report.export.display(),
        report.tensors,
        super::source::export_dtype_name(dtype),
        mib(report.export_bytes),
        report.export_bytes
    );
    println!(
        "{}: {} ({} bytes), of which FP32 master weights {} ({} bytes)",
        report.checkpoint.display(),
        mib(report.checkpoint_bytes),
        report.checkpoint_bytes,
        mib(report.master_bytes),
        report.master_bytes
    );
    println!(
        "the export is {:.3}x the checkpoint's master weights, {:.3}x the checkpoint",
        report.export_bytes as f64 / report.master_bytes as f64,
        report.export_bytes as f64 / report.checkpoint_bytes as f64
    );
    Ok(Outcome::Done)
}
