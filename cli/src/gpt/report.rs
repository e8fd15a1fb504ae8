//! A GPT run's results as JSON and back, the comparison table, and the verdict on a run that
//! trained nothing useful.

use serde_json::{json, Value};

use super::config::{EvalPoint, GptConfig, GptReport};
use crate::json_fields::{bool_of, f64_of, field, optional_u64, pid_of, text_of, u64_of};
use crate::report::{mib, render_columns};

/// One run as JSON (non-finite numbers as `null`).
pub fn gpt_json(report: &GptReport) -> Value {
    let cfg = &report.config;
    json!({
        "model": "gpt",
        "gpt_size": cfg.size.name(),
        "policy": cfg.policy.to_string(),
        "dtype": cfg.compute_dtype(),
        "label": cfg.label(),
        "recipe": report.recipe,
        "master_weights": report.master_weights,
        "context": cfg.context(),
        "batch": cfg.batch,
        "seed": cfg.seed,
        "lr": cfg.lr,
        "iters": cfg.iters,
        "eval_every": cfg.eval_every,
        "eval_windows": cfg.eval_windows,
        "evals": report.evals.iter().map(|e| json!({
            "iteration": e.iteration,
            "val_loss": e.val_loss,
            "train_loss": e.train_loss,
        })).collect::<Vec<_>>(),
        "val_loss": report.val_loss,
        "best_val_loss": report.best_val_loss,
        "train_loss": report.train_loss,
        "last_loss": report.last_loss,
        "iterations": report.iterations,
        "iterations_run": report.iterations_run,
        "train_seconds": report.train_seconds,
        "tokens_per_second": report.tokens_per_second,
        "skipped_steps": report.skipped_steps,
        "skipped_after_20": report.skipped_after_20,
        "final_loss_scale": report.final_scale,
        "weights_bytes": report.weights_bytes,
        "checkpoint_bytes": report.checkpoint_bytes,
        "peak_rss_bytes": report.peak_rss_bytes,
        "peak_heap_bytes": report.peak_heap_bytes,
        "loop_peak_bytes": report.loop_peak_bytes,
        "pid": report.pid,
    })
}

/// A run's report read back from its JSON ([`gpt_json`]), as a `typed-amp train --model gpt
/// --json` process printed it, for the run of `config`. Errors name the field that is missing
/// or of the wrong type.
pub fn gpt_from_json(config: &GptConfig, value: &Value) -> Result<GptReport, String> {
    let evals = field(value, "evals")?
        .as_array()
        .ok_or("`evals` is not a list")?
        .iter()
        .map(|e| {
            Ok(EvalPoint {
                iteration: u64_of(e, "iteration")?,
                val_loss: f64_of(e, "val_loss")?,
                train_loss: f64_of(e, "train_loss")?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(GptReport {
        config: config.clone(),
        recipe: text_of(value, "recipe")?,
        master_weights: bool_of(value, "master_weights")?,
        evals,
        val_loss: f64_of(value, "val_loss")?,
        best_val_loss: f64_of(value, "best_val_loss")?,
        train_loss: f64_of(value, "train_loss")?,
        last_loss: f64_of(value, "last_loss")? as f32,
        iterations: u64_of(value, "iterations")?,
        iterations_run: u64_of(value, "iterations_run")?,
        train_seconds: f64_of(value, "train_seconds")?,
        tokens_per_second: f64_of(value, "tokens_per_second")?,
        skipped_steps: u64_of(value, "skipped_steps")?,
        skipped_after_20: u64_of(value, "skipped_after_20")?,
        final_scale: f64_of(value, "final_loss_scale")? as f32,
        weights_bytes: u64_of(value, "weights_bytes")? as usize,
        checkpoint_bytes: u64_of(value, "checkpoint_bytes")?,
        peak_rss_bytes: optional_u64(value, "peak_rss_bytes")?,
        peak_heap_bytes: optional_u64(value, "peak_heap_bytes")?,
        loop_peak_bytes: optional_u64(value, "loop_peak_bytes")?,
        pid: pid_of(value, "pid")?,
    })
}

/// The comparison table of GPT runs: one column per run.
pub fn gpt_table(runs: &[GptReport]) -> String {
    type Row = (&'static str, fn(&GptReport) -> String);
    let rows: [Row; 13] = [
        ("validation loss", |r| format!("{:.4}", r.val_loss)),
        ("best validation loss", |r| {
            format!("{:.4}", r.best_val_loss)
        }),
        ("training loss (EMA)", |r| format!("{:.4}", r.train_loss)),
        ("tokens / s", |r| format!("{:.0}", r.tokens_per_second)),
        ("training time", |r| format!("{:.1} s", r.train_seconds)),
        ("weights in memory", |r| {
            let mut text = mib(r.weights_bytes as u64);
            if r.master_weights {
                text.push_str(" (FP32 master + working)");
            }
            text
        }),
        ("checkpoint on disk", |r| mib(r.checkpoint_bytes)),
        ("peak memory (RSS)", |r| {
            r.peak_rss_bytes.map_or("n/a".into(), mib)
        }),
        ("peak heap (training)", |r| {
            r.peak_heap_bytes.map_or("n/a".into(), mib)
        }),
        ("training loop's own", |r| {
            r.loop_peak_bytes.map_or("n/a".into(), mib)
        }),
        ("skipped steps", |r| r.skipped_steps.to_string()),
        ("skipped after iter 20", |r| r.skipped_after_20.to_string()),
        ("final loss scale", |r| {
            if r.config.policy == typed_amp::amp::OptLevel::O0 || r.final_scale == 1.0 {
                "none".to_string()
            } else {
                r.final_scale.to_string()
            }
        }),
    ];
    let mut cells: Vec<Vec<String>> = vec![runs.iter().map(|r| r.config.label()).collect()];
    for (_, cell) in &rows {
        cells.push(runs.iter().map(cell).collect());
    }
    let names: Vec<&str> = rows.iter().map(|(n, _)| *n).collect();
    render_columns(&names, &cells)
}

/// Why a finished GPT run's result cannot be trusted, if it cannot: every step was skipped, or
/// the last training loss or the validation loss is not finite.
pub fn gpt_diverged(report: &GptReport) -> Option<String> {
    let name = &report.recipe;
    let advice = crate::report::divergence_advice(
        report.config.policy,
        report.config.dtype,
        report.config.lr,
    );
    if report.iterations > 0 && report.skipped_steps == report.iterations {
        return Some(format!(
            "{name}: every one of the {} steps was skipped (inf/NaN gradients at every scale); nothing was trained",
            report.iterations
        ));
    }
    if report.iterations_run > 0 && !report.last_loss.is_finite() {
        return Some(format!(
            "{name}: the training loss is {} after iteration {} ({} of {} steps skipped); {advice}",
            report.last_loss, report.iterations, report.skipped_steps, report.iterations
        ));
    }
    if !report.val_loss.is_finite() {
        return Some(format!(
            "{name}: the validation loss is {} after iteration {} ({} of {} steps skipped); {advice}",
            report.val_loss, report.iterations, report.skipped_steps, report.iterations
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use typed_amp_models::gpt::GptSize;

    #[test]
    fn a_report_read_back_from_its_json_prints_the_same_json() {
        let config = GptConfig::new(GptSize::Small);
        let report = GptReport {
            config: config.clone(),
            recipe: "O2-FP16 (...)".to_string(),
            master_weights: true,
            evals: vec![EvalPoint {
                iteration: 250,
                val_loss: 2.5,
                train_loss: f64::NAN,
            }],
            val_loss: 2.5,
            best_val_loss: 2.25,
            train_loss: 2.4,
            last_loss: 2.375,
            iterations: 250,
            iterations_run: 250,
            train_seconds: 12.5,
            tokens_per_second: 15360.0,
            skipped_steps: 5,
            skipped_after_20: 1,
            final_scale: 32768.0,
            weights_bytes: 1 << 20,
            checkpoint_bytes: 3 << 20,
            peak_rss_bytes: None,
            peak_heap_bytes: Some(123),
            loop_peak_bytes: Some(45),
            pid: 7,
        };
        let json = gpt_json(&report);
        let back = gpt_from_json(&config, &json).expect("its own JSON reads back");
        assert_eq!(gpt_json(&back), json);
        assert!(back.evals[0].train_loss.is_nan());
        let table = gpt_table(&[report.clone(), back]);
        assert!(table.contains("best validation loss"), "{table}");
        assert!(table.contains("2.2500"), "{table}");
        assert_eq!(gpt_diverged(&report), None);
        let all_skipped = GptReport {
            skipped_steps: 250,
            ..report
        };
        assert!(gpt_diverged(&all_skipped)
            .unwrap()
            .contains("every one of the 250 steps"));
    }
}
