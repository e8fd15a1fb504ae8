//! The comparison table and the machine-readable results.

use serde_json::{json, Value};

use crate::run::RunReport;

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// One run as JSON.
pub fn run_json(report: &RunReport) -> Value {
    json!({
        "model": report.config.arch.name(),
        "policy": report.config.policy.to_string(),
        "recipe": report.recipe,
        "epochs": report.epochs.iter().map(|e| json!({
            "epoch": e.epoch,
            "seconds": e.seconds,
            "train_loss": e.train_loss,
            "train_accuracy": e.train_accuracy,
            "test_accuracy": e.test_accuracy,
        })).collect::<Vec<_>>(),
        "seconds_per_epoch": report.seconds_per_epoch(),
        "test_accuracy": report.test_accuracy,
        "steps": report.steps,
        "skipped_steps": report.skipped_steps,
        "final_loss_scale": report.final_scale,
        "weights_bytes": report.weights_bytes,
        "checkpoint_bytes": report.checkpoint_bytes,
        "peak_rss_bytes": report.peak_rss_bytes,
        "batch": report.config.batch,
        "seed": report.config.seed,
    })
}

/// The FP32-vs-mixed-precision table.
pub fn comparison_table(fp32: &RunReport, mixed: &RunReport) -> String {
    let weights_note = |r: &RunReport| {
        if r.master_weights {
            " (FP32 master + working copy)".to_string()
        } else {
            String::new()
        }
    };
    let rows: Vec<(&str, String, String)> = vec![
        (
            "time / epoch",
            format!("{:.2} s", fp32.seconds_per_epoch()),
            format!("{:.2} s", mixed.seconds_per_epoch()),
        ),
        (
            "weights in memory",
            format!("{}{}", mib(fp32.weights_bytes as u64), weights_note(fp32)),
            format!("{}{}", mib(mixed.weights_bytes as u64), weights_note(mixed)),
        ),
        (
            "checkpoint on disk",
            mib(fp32.checkpoint_bytes),
            mib(mixed.checkpoint_bytes),
        ),
        (
            "peak memory (RSS)",
            fp32.peak_rss_bytes.map_or("n/a".into(), mib),
            mixed.peak_rss_bytes.map_or("n/a".into(), mib),
        ),
        (
            "test accuracy",
            format!("{:.2}%", 100.0 * fp32.test_accuracy),
            format!("{:.2}%", 100.0 * mixed.test_accuracy),
        ),
        (
            "skipped steps",
            fp32.skipped_steps.to_string(),
            mixed.skipped_steps.to_string(),
        ),
        (
            "final loss scale",
            fp32.final_scale.to_string(),
            mixed.final_scale.to_string(),
        ),
    ];
    let head_fp32 = format!("FP32 ({})", fp32.config.policy);
    let head_mixed = format!("mixed ({})", mixed.config.policy);
    let w1 = rows
        .iter()
        .map(|r| r.1.len())
        .max()
        .unwrap_or(0)
        .max(head_fp32.len());
    let w2 = rows
        .iter()
        .map(|r| r.2.len())
        .max()
        .unwrap_or(0)
        .max(head_mixed.len());
    let mut out = String::new();
    let mut line = |name: &str, a: &str, b: &str| {
        out.push_str(format!("{name:<20} {a:<w1$}  {b:<w2$}").trim_end());
        out.push('\n');
    };
    line("", &head_fp32, &head_mixed);
    for (name, a, b) in &rows {
        line(name, a, b);
    }
    out
}
