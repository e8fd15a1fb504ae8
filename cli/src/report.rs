//! The comparison table and the machine-readable results.

use serde_json::{json, Value};

use crate::json_fields::{bool_of, f64_of, field, optional_u64, pid_of, text_of, u64_of};
use crate::models::LowDtype;
use crate::run::{EpochReport, RunConfig, RunReport};
use typed_amp::amp::OptLevel;

/// `bytes` in MiB, two decimals.
pub(crate) fn mib(bytes: u64) -> String {
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
        "master_weights": report.master_weights,
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
        "peak_heap_bytes": report.peak_heap_bytes,
        "loop_peak_bytes": report.loop_peak_bytes,
        "pid": report.pid,
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
    let rows: [Row; 9] = [
        ("time / epoch", |r| {
            format!("{:.2} s", r.seconds_per_epoch())
        }),
        ("weights in memory", |r| mib(r.weights_bytes as u64)),
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
    let names: Vec<&str> = rows.iter().map(|(n, _)| *n).collect();
    render_columns(&names, &cells)
}

/// A table of one column per run: `cells[0]` is the header row (the runs' names), `cells[i]`
/// the row named `names[i - 1]`; every row has a cell per run.
pub(crate) fn render_columns(names: &[&str], cells: &[Vec<String>]) -> String {
    let runs = cells.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..runs)
        .map(|c| cells.iter().map(|row| row[c].len()).max().unwrap_or(0))
        .collect();
    // The names' column: 20 characters, or the longest name's.
    let first = names.iter().map(|n| n.len()).max().unwrap_or(0).max(20);
    let names = std::iter::once("").chain(names.iter().copied());
    let mut out = String::new();
    for (name, row) in names.zip(cells) {
        let mut line = format!("{name:<first$}");
        for (cell, width) in row.iter().zip(&widths) {
            line.push_str(&format!(" {cell:<width$} "));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A run's report read back from its JSON ([`run_json`]), as a `typed-amp train --json` child
/// process printed it, for the run of `config`. Errors name the field that is missing or of
/// the wrong type.
pub fn run_from_json(config: &RunConfig, value: &Value) -> Result<RunReport, String> {
    let f32_of = |v: &Value, key: &str| f64_of(v, key).map(|x| x as f32);
    let epochs = field(value, "epochs")?
        .as_array()
        .ok_or("`epochs` is not a list")?
        .iter()
        .map(|e| {
            Ok(EpochReport {
                epoch: u64_of(e, "epoch")? as usize,
                seconds: field(e, "seconds")?
                    .as_f64()
                    .ok_or("`seconds` is not a number")?,
                train_loss: f32_of(e, "train_loss")?,
                train_accuracy: f32_of(e, "train_accuracy")?,
                test_accuracy: f32_of(e, "test_accuracy")?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(RunReport {
        config: config.clone(),
        recipe: text_of(value, "recipe")?,
        master_weights: bool_of(value, "master_weights")?,
        epochs,
        test_accuracy: f32_of(value, "test_accuracy")?,
        steps: u64_of(value, "steps")?,
        skipped_steps: u64_of(value, "skipped_steps")?,
        final_scale: f32_of(value, "final_loss_scale")?,
        weights_bytes: u64_of(value, "weights_bytes")? as usize,
        checkpoint_bytes: u64_of(value, "checkpoint_bytes")?,
        peak_rss_bytes: optional_u64(value, "peak_rss_bytes")?,
        peak_heap_bytes: optional_u64(value, "peak_heap_bytes")?,
        loop_peak_bytes: optional_u64(value, "loop_peak_bytes")?,
        pid: pid_of(value, "pid")?,
    })
}

/// What to do about a run whose loss is not finite, naming the cause the configuration points
/// to: under O3 the weights and Adam's state are 16-bit alone (no FP32 master copy), which no
/// learning rate makes safe; under O0, O1 and O2 the learning rate. Ends with `lower --lr`
/// either way, the one remedy every policy shares.
pub fn divergence_advice(policy: OptLevel, dtype: LowDtype, lr: f64) -> String {
    match (policy, dtype) {
        (OptLevel::O3, LowDtype::Fp16) => format!(
            "O3-FP16 keeps its weights and Adam's state in FP16 alone, with no FP32 master copy \
             (Apex's pure-FP16 speed baseline): a weight or activation past 65,504 overflows, an \
             update below 2^-11 of its weight rounds away, and a second moment below 2^-24 \
             flushes to 0, leaving an update divided by eps ({eps}) alone; train with \
             --policy O2 (FP32 master weights) or --dtype bf16 (FP32's exponent range), or \
             lower --lr (now {lr})",
            eps = crate::run::O3_FP16_EPS
        ),
        (OptLevel::O3, LowDtype::Bf16) => format!(
            "O3-BF16 keeps its weights and Adam's state in BF16 alone, with no FP32 master copy: \
             an update below 2^-8 of its weight rounds away; train with --policy O2 --dtype bf16 \
             (FP32 master weights), or lower --lr (now {lr})"
        ),
        _ => format!("the learning rate {lr} is too large for this model: lower --lr"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::Arch;
    use crate::run::DeviceChoice;

    /// Issue 34, item 4: exit 3 used to advise "lower --lr" for every run, O3-FP16's included,
    /// whose cause is its FP16-only weights and state at any learning rate.
    #[test]
    fn the_advice_for_a_diverged_run_names_o3s_16_bit_state_and_otherwise_the_learning_rate() {
        let o3 = divergence_advice(OptLevel::O3, LowDtype::Fp16, 1e-3);
        for part in [
            "FP16 alone",
            "no FP32 master copy",
            "eps (0.0001)",
            "--policy O2",
        ] {
            assert!(o3.contains(part), "{part}: {o3}");
        }
        assert!(o3.ends_with("lower --lr (now 0.001)"), "{o3}");
        let o3_bf16 = divergence_advice(OptLevel::O3, LowDtype::Bf16, 1e-3);
        assert!(
            o3_bf16.contains("BF16 alone") && o3_bf16.contains("--policy O2 --dtype bf16"),
            "{o3_bf16}"
        );
        for (policy, dtype) in [
            (OptLevel::O0, LowDtype::Fp16),
            (OptLevel::O1, LowDtype::Fp16),
            (OptLevel::O2, LowDtype::Fp16),
            (OptLevel::O2, LowDtype::Bf16),
        ] {
            let advice = divergence_advice(policy, dtype, 1e10);
            assert_eq!(
                advice,
                "the learning rate 10000000000 is too large for this model: lower --lr"
            );
        }
    }

    fn config() -> RunConfig {
        RunConfig {
            arch: Arch::Mlp,
            policy: OptLevel::O2,
            dtype: LowDtype::Bf16,
            epochs: 2,
            stop_after: None,
            batch: 128,
            seed: 0,
            lr: 1e-3,
            save: None,
            resume: None,
            progress: false,
            device: DeviceChoice::Cpu,
        }
    }

    #[test]
    fn a_report_read_back_from_its_json_prints_the_same_json() {
        let report = RunReport {
            config: config(),
            recipe: "O2 (bf16)".to_string(),
            master_weights: true,
            epochs: vec![
                EpochReport {
                    epoch: 1,
                    seconds: 0.123456789,
                    train_loss: 0.7,
                    train_accuracy: 0.75,
                    test_accuracy: 0.8,
                },
                EpochReport {
                    epoch: 2,
                    seconds: 0.1,
                    train_loss: f32::NAN,
                    train_accuracy: 0.1,
                    test_accuracy: 0.1,
                },
            ],
            test_accuracy: 0.1,
            steps: 32,
            skipped_steps: 3,
            final_scale: 1.0,
            weights_bytes: 3 << 20,
            checkpoint_bytes: 6 << 20,
            peak_rss_bytes: None,
            peak_heap_bytes: Some(12345678),
            loop_peak_bytes: Some(2345678),
            pid: 4242,
        };
        let json = run_json(&report);
        let back = run_from_json(&config(), &json).expect("its own JSON reads back");
        assert_eq!(run_json(&back), json);
        assert!(back.epochs[1].train_loss.is_nan(), "NaN is written as null");
        assert_eq!(back.pid, 4242);

        let mut broken = json.clone();
        broken["steps"] = Value::from("many");
        assert_eq!(
            run_from_json(&config(), &broken).err().as_deref(),
            Some("`steps` is not a whole number")
        );
        broken.as_object_mut().unwrap().remove("pid");
        broken["steps"] = Value::from(3);
        assert_eq!(
            run_from_json(&config(), &broken).err().as_deref(),
            Some("no field `pid`")
        );
    }
}
