//! `--model gpt`, `sample` and `export` end to end, on the small GPT for a few dozen
//! iterations: the table and the JSON, resumed runs that match uninterrupted ones bit for bit
//! (FP16, BF16, and the baby GPT's dropout), checkpoints of other settings or another
//! vocabulary refused, deterministic samples, exports half the size of the master weights.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common;
use common::TempDir;

const TEXTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/shakespeare-subset");
const FASHION: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/fashion-mnist-subset");

fn typed_amp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_typed-amp"))
        .args(args)
        .output()
        .expect("the typed-amp binary runs")
}

fn ok(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "typed-amp failed: {stderr}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Exits with `code`; returns stderr.
fn fails(output: &Output, code: i32) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(code), "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    stderr
}

/// The embedded subset's texts named `files` (all four where empty), decompressed into a
/// directory of `dir`: the same text on every machine, whether or not
/// `/usr/share/datasets/shakespeare` exists.
fn texts(dir: &TempDir, name: &str, files: &[&str]) -> PathBuf {
    let out = dir.join(name);
    std::fs::create_dir_all(&out).unwrap();
    let all = [
        "hamlet_gut.txt",
        "macbeth_gut.txt",
        "midsummer_nights_dream_gut.txt",
        "sonnets_gut.txt",
    ];
    let files = if files.is_empty() { &all[..] } else { files };
    for file in files {
        let gz = std::fs::read(Path::new(TEXTS).join(format!("{file}.gz"))).unwrap();
        let mut text = Vec::new();
        flate2::read::MultiGzDecoder::new(&gz[..])
            .read_to_end(&mut text)
            .unwrap();
        std::fs::write(out.join(file), text).unwrap();
    }
    out
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Every tensor of a safetensors file, as raw bytes, by name.
fn tensors(path: &Path) -> Vec<(String, safetensors::Dtype, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<_> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, view.dtype(), view.data().to_vec()))
        .collect();
    out.sort();
    out
}

/// A safetensors file's metadata.
fn metadata(path: &Path) -> std::collections::BTreeMap<String, String> {
    let bytes = std::fs::read(path).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    header
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect()
}

/// `train --model gpt` of `iters` iterations (small GPT, evaluations every 8 over 8 windows)
/// with `extra` arguments, on the texts in `data`.
fn train<'a>(data: &'a Path, iters: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "train",
        "--model",
        "gpt",
        "--iters",
        iters,
        "--eval-every",
        "8",
        "--eval-windows",
        "8",
        "--seed",
        "3",
        "--quiet",
        "--data-dir",
        s(data),
    ];
    args.extend_from_slice(extra);
    args
}

/// Trains `common` straight through, and stopped after `half` iterations then resumed; checks
/// the two final checkpoints hold the same tensors and metadata bit for bit.
fn resume_matches(name: &str, iters: &str, half: &str, common: &[&str]) {
    let dir = TempDir::new(&format!("gpt-resume-{name}"));
    let data = texts(&dir, "texts", &[]);
    let full = dir.join("full.safetensors");
    let part = dir.join("part.safetensors");
    let resumed = dir.join("resumed.safetensors");
    let args = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<&str> = train(&data, iters, common);
        a.extend_from_slice(extra);
        a.into_iter().map(String::from).collect()
    };
    let run = |extra: &[&str]| {
        let a = args(extra);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        serde_json::from_str::<serde_json::Value>(&ok(&typed_amp(&a))).unwrap()
    };
    let straight = run(&["--json", "--save", s(&full)]);
    run(&["--json", "--stop-after", half, "--save", s(&part)]);
    let second = run(&["--json", "--resume", s(&part), "--save", s(&resumed)]);

    let (a, b) = (tensors(&full), tensors(&resumed));
    assert!(a.iter().any(|(n, _, _)| n.starts_with("optim.")));
    assert_eq!(a.len(), b.len());
    for ((name, _, x), (other, _, y)) in a.iter().zip(&b) {
        assert_eq!(name, other);
        assert!(
            x == y,
            "{name}: `{name}` differs between the resumed and the uninterrupted run"
        );
    }
    assert_eq!(metadata(&full), metadata(&resumed));
    assert_ne!(tensors(&part), a, "the split run really stopped halfway");
    // The same final losses, bit for bit.
    for key in [
        "val_loss",
        "best_val_loss",
        "train_loss",
        "last_loss",
        "skipped_steps",
    ] {
        assert_eq!(straight[key], second[key], "{key}");
    }
    assert_eq!(straight["iterations"], second["iterations"]);
    assert_eq!(
        second["iterations_run"].as_u64().unwrap() * 2,
        second["iterations"].as_u64().unwrap()
    );
}

#[test]
fn a_resumed_fp16_gpt_run_matches_the_uninterrupted_run_bit_for_bit() {
    resume_matches("fp16", "24", "12", &["--policy", "O2", "--dtype", "fp16"]);
}

#[test]
fn a_resumed_bf16_gpt_run_matches_the_uninterrupted_run_bit_for_bit() {
    resume_matches("bf16", "24", "12", &["--policy", "O2", "--dtype", "bf16"]);
}

#[test]
fn a_resumed_baby_gpt_run_with_dropout_matches_bit_for_bit() {
    // Dropout's seeds come from the device's generator: a resumed run draws what the first
    // part drew, so its masks are the uninterrupted run's.
    resume_matches(
        "baby",
        "4",
        "2",
        &[
            "--gpt-size",
            "baby",
            "--batch",
            "1",
            "--eval-windows",
            "1",
            "--policy",
            "O2",
            "--dtype",
            "bf16",
        ],
    );
}

#[test]
fn train_prints_its_evaluations_and_json() {
    let dir = TempDir::new("gpt-train-json");
    let data = texts(&dir, "texts", &[]);
    let out = ok(&typed_amp(&train(&data, "20", &[])));
    assert!(
        out.contains("GPT small: 4 layers, 4 heads, width 128, context 64"),
        "{out}"
    );
    assert!(out.contains("iter      8  train loss"), "{out}");
    assert!(out.contains("O2-FP16"), "{out}");

    let json: serde_json::Value = serde_json::from_str(&ok(&typed_amp(&train(
        &data,
        "20",
        &["--json", "--policy", "O0"],
    ))))
    .expect("--json prints JSON");
    assert_eq!(json["model"], "gpt");
    assert_eq!(json["gpt_size"], "small");
    assert_eq!(json["label"], "FP32 (O0)");
    assert_eq!(json["iterations"], 20);
    assert_eq!(json["batch"], 12);
    assert_eq!(json["context"], 64);
    let evals: Vec<u64> = json["evals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["iteration"].as_u64().unwrap())
        .collect();
    assert_eq!(
        evals,
        [8, 16, 20],
        "every --eval-every iterations and at the end"
    );
    let (val, best) = (
        json["val_loss"].as_f64().unwrap(),
        json["best_val_loss"].as_f64().unwrap(),
    );
    // Uniform over 84 rows is ln 84 = 4.43; 20 iterations of warm-up learn something.
    assert!(val < 4.0 && best <= val, "{val} {best}");
    for key in [
        "tokens_per_second",
        "train_seconds",
        "checkpoint_bytes",
        "weights_bytes",
        "loop_peak_bytes",
    ] {
        assert!(json[key].as_f64().unwrap() > 0.0, "{key}");
    }
    assert_eq!(json["skipped_steps"], 0);
    assert_eq!(json["skipped_after_20"], 0);
    assert_eq!(json["final_loss_scale"], 1.0);
}

#[test]
fn compare_trains_four_runs_and_prints_the_table() {
    let dir = TempDir::new("gpt-compare");
    let data = texts(&dir, "texts", &[]);
    let common = [
        "--model",
        "gpt",
        "--iters",
        "20",
        "--eval-every",
        "10",
        "--eval-windows",
        "8",
        "--quiet",
        "--data-dir",
        s(&data),
    ];
    let out = ok(&typed_amp(&[&["compare"][..], &common].concat()));
    let header = out
        .lines()
        .find(|l| l.contains("FP32 (O0)"))
        .unwrap_or_else(|| panic!("no header in:\n{out}"));
    for column in ["O2-FP16", "O2-BF16", "O2-BF16+FP8"] {
        assert!(header.contains(column), "{out}");
    }
    for row in [
        "validation loss",
        "best validation loss",
        "tokens / s",
        "training time",
        "peak heap (training)",
        "training loop's own",
        "peak memory (RSS)",
        "skipped steps",
        "skipped after iter 20",
        "final loss scale",
        "checkpoint on disk",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(row)),
            "no row `{row}` in:\n{out}"
        );
    }

    let out = ok(&typed_amp(&[&["compare", "--json"][..], &common].concat()));
    let value: serde_json::Value = serde_json::from_str(&out).unwrap();
    let runs = value["runs"].as_array().unwrap();
    let labels: Vec<&str> = runs.iter().map(|r| r["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["FP32 (O0)", "O2-FP16", "O2-BF16", "O2-BF16+FP8"]);
    let pids: Vec<u64> = runs.iter().map(|r| r["pid"].as_u64().unwrap()).collect();
    assert!(
        pids[0] != pids[1] && pids[1] != pids[2] && pids[2] != pids[3],
        "{pids:?}"
    );
    // The FP8 run's checkpoint holds its recipe's amax histories beside O2-BF16's tensors.
    assert!(runs[3]["checkpoint_bytes"].as_u64() > runs[2]["checkpoint_bytes"].as_u64());
    for run in runs {
        let val = run["val_loss"].as_f64().unwrap();
        assert!(val < 4.0, "{}: {val}", run["label"]);
    }
    // Master weights and a working copy under O2: more weights in memory than O0's.
    assert!(runs[1]["weights_bytes"].as_u64() > runs[0]["weights_bytes"].as_u64());
}

#[test]
fn resuming_a_checkpoint_of_another_vocabulary_size_or_policy_is_refused() {
    let dir = TempDir::new("gpt-refused");
    let data = texts(&dir, "texts", &[]);
    let sonnets = texts(&dir, "sonnets", &["sonnets_gut.txt"]);
    let ckpt = dir.join("ckpt.safetensors");
    ok(&typed_amp(&train(
        &data,
        "16",
        &["--stop-after", "8", "--save", s(&ckpt)],
    )));
    let resume = |data: &Path, extra: &[&str]| {
        let mut args = train(data, "16", &["--resume", s(&ckpt)]);
        args.extend_from_slice(extra);
        fails(&typed_amp(&args), 2)
    };
    let err = resume(&sonnets, &[]);
    assert!(
        err.contains(s(&ckpt))
            && err.contains("the checkpoint's vocabulary (70 characters) differs from the data's"),
        "{err}"
    );
    let err = resume(&data, &["--gpt-size", "baby"]);
    assert!(
        err.contains(&format!(
            "{} was saved with gpt_size = small, this run has baby",
            s(&ckpt)
        )),
        "{err}"
    );
    let err = resume(&data, &["--policy", "O0"]);
    assert!(
        err.contains("was saved with policy = O2, this run has O0"),
        "{err}"
    );
    let err = resume(&data, &["--dtype", "bf16"]);
    assert!(
        err.contains("was saved with dtype = fp16, this run has bf16"),
        "{err}"
    );
    let err = resume(&data, &["--batch", "4"]);
    assert!(
        err.contains("was saved with batch = 12, this run has 4"),
        "{err}"
    );
    // Another run's length: `--iters` and the schedule it sets.
    let mut args = train(&data, "32", &["--resume", s(&ckpt)]);
    args.push("--quiet");
    let err = fails(&typed_amp(&args), 2);
    assert!(
        err.contains("was saved with iters = 16, this run has 32"),
        "{err}"
    );
    // A GPT checkpoint is no MLP's.
    let err = fails(
        &typed_amp(&[
            "train",
            "--epochs",
            "1",
            "--resume",
            s(&ckpt),
            "--quiet",
            "--data-dir",
            FASHION,
        ]),
        2,
    );
    assert!(
        err.contains("was saved with model = gpt, this run has mlp"),
        "{err}"
    );
}

/// A checkpoint of 20 iterations of the small GPT on the subset, in `dir`.
fn checkpoint(dir: &TempDir) -> PathBuf {
    let data = texts(dir, "texts", &[]);
    let ckpt = dir.join("gpt.safetensors");
    ok(&typed_amp(&train(&data, "20", &["--save", s(&ckpt)])));
    ckpt
}

fn sample(model: &Path, extra: &[&str]) -> String {
    let mut args = vec!["sample", "--resume", s(model)];
    args.extend_from_slice(extra);
    ok(&typed_amp(&args))
}

#[test]
fn samples_are_deterministic_for_a_seed_and_differ_for_another() {
    let dir = TempDir::new("gpt-sample");
    let ckpt = checkpoint(&dir);
    let args = ["--tokens", "60", "--prompt", "ROMEO:", "--seed", "1"];
    let first = sample(&ckpt, &args);
    assert_eq!(
        first,
        sample(&ckpt, &args),
        "the same seed, the same sample"
    );
    assert!(first.starts_with("ROMEO:"), "{first:?}");
    // The prompt, 60 characters, the line break `println!` ends it with.
    assert_eq!(first.chars().count(), 6 + 60 + 1, "{first:?}");
    let other = sample(
        &ckpt,
        &["--tokens", "60", "--prompt", "ROMEO:", "--seed", "2"],
    );
    assert_ne!(first, other);
    // Top-k 1 is greedy: the seed does not matter.
    let greedy = |seed| sample(&ckpt, &["--tokens", "20", "--top-k", "1", "--seed", seed]);
    assert_eq!(greedy("1"), greedy("2"));
    // The default prompt is a line break; 500 characters.
    assert_eq!(sample(&ckpt, &[]).chars().count(), 1 + 500 + 1);
}

#[test]
fn a_prompt_with_an_unknown_character_or_a_foreign_checkpoint_is_refused() {
    let dir = TempDir::new("gpt-sample-refused");
    let ckpt = checkpoint(&dir);
    let err = fails(
        &typed_amp(&["sample", "--resume", s(&ckpt), "--prompt", "Ay\u{e9}"]),
        2,
    );
    assert!(
        err.contains("character '\u{e9}' (U+00E9) at position 2 is not in the vocabulary"),
        "{err}"
    );
    // A checkpoint of the MLP.
    let mlp = dir.join("mlp.safetensors");
    ok(&typed_amp(&[
        "train",
        "--epochs",
        "1",
        "--batch",
        "500",
        "--quiet",
        "--data-dir",
        FASHION,
        "--save",
        s(&mlp),
    ]));
    let err = fails(&typed_amp(&["sample", "--resume", s(&mlp)]), 1);
    assert!(
        err.contains(s(&mlp)) && err.contains("it holds a model `mlp`"),
        "{err}"
    );
    let err = fails(&typed_amp(&["export", s(&mlp), s(&dir.join("x"))]), 1);
    assert!(err.contains(s(&mlp)), "{err}");
    // Not a safetensors file at all.
    let junk = dir.join("junk.safetensors");
    std::fs::write(&junk, b"not a checkpoint").unwrap();
    let err = fails(&typed_amp(&["sample", "--resume", s(&junk)]), 1);
    assert!(err.contains(s(&junk)), "{err}");
    fails(&typed_amp(&["sample", "--tokens", "5"]), 2);
    fails(
        &typed_amp(&["sample", "--resume", s(&ckpt), "--temperature", "0"]),
        2,
    );
}

#[test]
fn an_export_is_half_the_master_weights_and_samples() {
    let dir = TempDir::new("gpt-export");
    let ckpt = checkpoint(&dir);
    let master: usize = tensors(&ckpt)
        .iter()
        .filter(|(n, _, _)| n.starts_with("master."))
        .map(|(_, _, data)| data.len())
        .sum();
    let ckpt_bytes = std::fs::metadata(&ckpt).unwrap().len();
    for (dtype, st) in [
        ("f16", safetensors::Dtype::F16),
        ("bf16", safetensors::Dtype::BF16),
    ] {
        let out = dir.join(format!("gpt.{dtype}.safetensors"));
        let printed = ok(&typed_amp(&["export", "--dtype", dtype, s(&ckpt), s(&out)]));
        let size = std::fs::metadata(&out).unwrap().len();
        assert!(printed.contains(&format!("({size} bytes)")), "{printed}");
        assert!(
            printed.contains(&format!("({ckpt_bytes} bytes)")),
            "{printed}"
        );
        assert!((size as f64) < 0.55 * ckpt_bytes as f64);
        assert!(
            (size as f64) < 0.52 * master as f64 && (size as f64) > 0.5 * master as f64,
            "{size} bytes against {master} bytes of master weights"
        );
        let exported = tensors(&out);
        assert!(exported.iter().all(|(_, d, _)| *d == st));
        assert!(exported.iter().any(|(n, _, _)| n == "embed.wte"));
        assert_eq!(
            exported.len(),
            tensors(&ckpt)
                .iter()
                .filter(|(n, _, _)| n.starts_with("master."))
                .count()
        );
        let meta = metadata(&out);
        assert_eq!(meta["format"], "typed-amp export");
        assert_eq!(meta["gpt_size"], "small");
        assert_eq!(meta["dtype"], dtype);
        assert_eq!(meta["vocab"].chars().count(), 70);

        let args = ["--tokens", "40", "--prompt", "KING:", "--seed", "5"];
        let from_export = sample(&out, &args);
        assert_eq!(from_export.chars().count(), 5 + 40 + 1, "{from_export:?}");
        assert_eq!(from_export, sample(&out, &args));
    }
}

#[test]
fn o1_and_o3_gpts_are_refused_naming_what_exists() {
    for args in [
        &["train", "--model", "gpt", "--policy", "O1"][..],
        &["compare", "--model", "gpt", "--policy", "O3"],
    ] {
        let err = fails(&typed_amp(args), 2);
        assert!(
            err.contains(
                "--model gpt is declared under O0 (FP32) and O2 (--dtype fp16 or bf16) only"
            ),
            "{err}"
        );
    }
    for args in [
        &["train", "--iters", "5"][..],
        &["train", "--model", "gpt", "--epochs", "2"],
        &["train", "--model", "gpt", "--eval-every", "0"],
        &["train", "--model", "gpt", "--gpt-size", "large"],
        &["train", "--model", "gpt", "--data-parallel"],
        &["compare", "--model", "gpt", "--stop-after", "3"],
        &["export", "only-one.safetensors"],
        &["train", "--model", "mlp", "--fp8"],
    ] {
        fails(&typed_amp(args), 2);
    }
    // FP8 linear layers are a recipe on top of O2-BF16.
    for args in [
        &["train", "--model", "gpt", "--fp8"][..],
        &["train", "--model", "gpt", "--fp8", "--policy", "O0"],
    ] {
        let err = fails(&typed_amp(args), 2);
        assert!(err.contains("--fp8 is a recipe on top of O2-BF16"), "{err}");
    }
}

#[test]
fn a_data_dir_without_texts_is_the_data_crates_error() {
    let dir = TempDir::new("gpt-no-texts");
    let err = fails(
        &typed_amp(&[
            "train",
            "--model",
            "gpt",
            "--iters",
            "2",
            "--quiet",
            "--data-dir",
            s(&dir),
        ]),
        1,
    );
    assert!(
        err.contains("no text files (*_gut.txt) in this directory"),
        "{err}"
    );
    assert!(err.contains(s(&dir)), "{err}");
}

#[test]
fn a_gpt_run_whose_loss_is_nan_exits_3() {
    let dir = TempDir::new("gpt-diverged");
    let data = texts(&dir, "texts", &[]);
    let out = typed_amp(&train(&data, "20", &["--lr", "1e10"]));
    let err = fails(&out, 3);
    assert!(err.contains("the training loss is NaN"), "{err}");
}

#[test]
fn a_batch_too_large_for_memory_is_refused() {
    let err = fails(
        &typed_amp(&[
            "train",
            "--model",
            "gpt",
            "--gpt-size",
            "baby",
            "--batch",
            "100000000",
            "--quiet",
        ]),
        2,
    );
    assert!(err.contains("per window of 256 tokens"), "{err}");
    assert!(err.contains("use a smaller --batch"), "{err}");
}
