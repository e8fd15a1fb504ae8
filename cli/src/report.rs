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
        "dtype": report.config.compute_dtype(),
        "label": report.config.label(),
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

/// The comparison table: one column per run.
pub fn comparison_table(runs: &[RunReport]) -> String {
    let weights_note = |r: &RunReport| {
        if r.master_weights {
            " (FP32 master + working)".to_string()
        } else {
            String::new()
        }
    };
    type Row = (&'static str, fn(&RunReport) -> String);
    let rows: [Row; 7] = [
        ("time / epoch", |r| {
            format!("{:.2} s", r.seconds_per_epoch())
        }),
        ("weights in memory", |r| mib(r.weights_bytes as u64)),
        ("checkpoint on disk", |r| mib(r.checkpoint_bytes)),
        ("peak memory (RSS)", |r| {
            r.peak_rss_bytes.map_or("n/a".into(), mib)
        }),
        ("test accuracy", |r| {
            format!("{:.2}%", 100.0 * r.test_accuracy)
        }),
        ("skipped steps", |r| r.skipped_steps.to_string()),
        ("final loss scale", |r| {
            if r.config.policy == typed_amp::amp::OptLevel::O0 || r.final_scale == 1.0 {
                "none".to_string()
            } else {
                r.final_scale.to_string()
            }
        }),
    ];
    let mut cells: Vec<Vec<String>> = vec![runs.iter().map(|r| r.config.label()).collect()];
    for (name, cell) in &rows {
        cells.push(
            runs.iter()
                .map(|r| {
                    let mut text = cell(r);
                    if *name == "weights in memory" {
                        text.push_str(&weights_note(r));
                    }
                    text
                })
                .collect(),
        );
    }
    let widths: Vec<usize> = (0..runs.len())
        .map(|c| cells.iter().map(|row| row[c].len()).max().unwrap_or(0))
        .collect();
    let names = std::iter::once("").chain(rows.iter().map(|(n, _)| *n));
    let mut out = String::new();
    for (name, row) in names.zip(&cells) {
        let mut line = format!("{name:<20}");
        for (cell, width) in row.iter().zip(&widths) {
            line.push_str(&format!(" {cell:<width$} "));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
