//! The `typed-amp` program end to end: resumed runs match uninterrupted ones bit for bit,
//! damaged data gives a clear error and a non-zero exit code, and the table prints.

use std::path::Path;
use std::process::{Command, Output};

use crate::common;
use common::TempDir;

const SUBSET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/fashion-mnist-subset");

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

/// Every tensor of a checkpoint, as raw bytes, by name.
fn tensors(path: &Path) -> Vec<(String, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, view.data().to_vec()))
        .collect();
    out.sort();
    out
}

fn scaler_state(path: &Path) -> Vec<(String, String)> {
    let bytes = std::fs::read(path).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let mut state: Vec<(String, String)> = header
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| {
            k.starts_with("scaler.") || k.starts_with("optim.") || k.starts_with("user.")
        })
        .collect();
    state.sort();
    state
}

fn resume_matches(model: &str, policy: &str) {
    resume_matches_in(model, policy, "fp16");
}

/// Runs `model` under `policy` in `dtype` straight through, and stopped after one epoch then
/// resumed; checks the two final checkpoints are equal bit for bit and returns the precisions
/// of the saved `master.*` tensors.
fn resume_matches_in(model: &str, policy: &str, dtype: &str) -> Vec<safetensors::Dtype> {
    let dir = TempDir::new(&format!("cli-resume-{model}-{policy}-{dtype}"));
    let common = [
        "train",
        "--model",
        model,
        "--policy",
        policy,
        "--dtype",
        dtype,
        "--epochs",
        "2",
        "--batch",
        "250",
        "--seed",
        "3",
        "--quiet",
        "--data-dir",
        SUBSET,
    ];
    let full = dir.join("full.safetensors");
    let part = dir.join("part.safetensors");
    let resumed = dir.join("resumed.safetensors");
    fn args<'a>(common: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        common.iter().chain(extra).copied().collect()
    }

    ok(&typed_amp(&args(
        &common,
        &["--save", full.to_str().unwrap()],
    )));
    ok(&typed_amp(&args(
        &common,
        &["--stop-after", "1", "--save", part.to_str().unwrap()],
    )));
    ok(&typed_amp(&args(
        &common,
        &[
            "--resume",
            part.to_str().unwrap(),
            "--save",
            resumed.to_str().unwrap(),
        ],
    )));

    let (a, b) = (tensors(&full), tensors(&resumed));
    assert!(
        a.iter().any(|(n, _)| n.starts_with("optim.")),
        "optimizer state is saved"
    );
    assert_eq!(a.len(), b.len());
    for ((name, x), (other, y)) in a.iter().zip(&b) {
        assert_eq!(name, other);
        assert!(
            x == y,
            "{model} {policy} {dtype}: `{name}` differs between the resumed and the uninterrupted run"
        );
    }
    assert_eq!(scaler_state(&full), scaler_state(&resumed));
    assert_ne!(tensors(&part), a, "the split run really stopped halfway");

    let bytes = std::fs::read(&full).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .filter(|(name, _)| name.starts_with("master."))
        .map(|(_, view)| view.dtype())
        .collect()
}

#[test]
fn a_resumed_mlp_run_matches_the_uninterrupted_run_bit_for_bit() {
    resume_matches("mlp", "O2");
}

#[test]
fn a_resumed_cnn_run_with_batch_norm_matches_bit_for_bit() {
    resume_matches("cnn", "O2");
}

#[test]
fn a_resumed_bf16_cnn_run_matches_bit_for_bit() {
    // O2-BF16 saves its FP32 masters (batch norm's statistics included).
    let master = resume_matches_in("cnn", "O2", "bf16");
    assert!(!master.is_empty());
    assert!(
        master.iter().all(|d| *d == safetensors::Dtype::F32),
        "{master:?}"
    );
}

#[test]
fn a_resumed_o3_bf16_mlp_run_matches_bit_for_bit() {
    // O3-BF16 has no master copy: the checkpoint holds its BF16 weights and optimizer state.
    let master = resume_matches_in("mlp", "O3", "bf16");
    assert!(!master.is_empty());
    assert!(
        master.iter().all(|d| *d == safetensors::Dtype::BF16),
        "{master:?}"
    );
}

#[test]
fn resuming_a_bf16_checkpoint_as_fp16_is_refused() {
    let dir = TempDir::new("cli-dtype-mismatch");
    let ckpt = dir.join("bf16.safetensors");
    let base = [
        "train",
        "--policy",
        "O2",
        "--epochs",
        "2",
        "--batch",
        "500",
        "--quiet",
        "--data-dir",
        SUBSET,
    ];
    ok(&typed_amp(
        &[
            &base[..],
            &[
                "--dtype",
                "bf16",
                "--stop-after",
                "1",
                "--save",
                ckpt.to_str().unwrap(),
            ],
        ]
        .concat(),
    ));
    let bytes = std::fs::read(&ckpt).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let meta = header.metadata().clone().unwrap_or_default();
    assert_eq!(meta["model.precision"], "BF16");

    let out = typed_amp(
        &[
            &base[..],
            &["--dtype", "fp16", "--resume", ckpt.to_str().unwrap()],
        ]
        .concat(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(
        stderr.contains("dtype = bf16, this run has fp16"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn resuming_with_other_settings_is_refused() {
    let dir = TempDir::new("cli-mismatch");
    let ckpt = dir.join("a.safetensors");
    let base = [
        "train",
        "--epochs",
        "2",
        "--stop-after",
        "1",
        "--batch",
        "500",
        "--quiet",
        "--data-dir",
        SUBSET,
    ];
    ok(&typed_amp(
        &[&base[..], &["--save", ckpt.to_str().unwrap()]].concat(),
    ));
    let out = typed_amp(&[
        "train",
        "--policy",
        "O0",
        "--epochs",
        "2",
        "--batch",
        "500",
        "--quiet",
        "--data-dir",
        SUBSET,
        "--resume",
        ckpt.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("policy = O2, this run has O0"), "{stderr}");
}

#[test]
fn damaged_data_gives_a_clear_error_and_a_nonzero_exit_code() {
    let dir = TempDir::new("cli-damaged");
    for name in [
        "train-images-idx3-ubyte.gz",
        "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    ] {
        std::fs::copy(Path::new(SUBSET).join(name), dir.join(name)).unwrap();
    }
    // Truncate the training images.
    let images = dir.join("train-images-idx3-ubyte.gz");
    let bytes = std::fs::read(&images).unwrap();
    std::fs::write(&images, &bytes[..bytes.len() / 2]).unwrap();

    let out = typed_amp(&[
        "compare",
        "--epochs",
        "1",
        "--quiet",
        "--data-dir",
        dir.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains("train-images-idx3-ubyte.gz"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let missing = TempDir::new("cli-missing");
    let out = typed_amp(&["train", "--quiet", "--data-dir", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("train-images-idx3-ubyte.gz"));
}

/// Gzip-compressed IDX images (all black) and labels files holding `count` examples.
fn idx_files(count: u32) -> (Vec<u8>, Vec<u8>) {
    use std::io::Write;
    let gzip = |bytes: &[u8]| {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    };
    let mut images = Vec::new();
    for field in [0x0803, count, 28, 28] {
        images.extend_from_slice(&u32::to_be_bytes(field));
    }
    images.resize(images.len() + count as usize * 784, 0);
    let mut labels = Vec::new();
    for field in [0x0801, count] {
        labels.extend_from_slice(&u32::to_be_bytes(field));
    }
    labels.resize(labels.len() + count as usize, 0);
    (gzip(&images), gzip(&labels))
}

#[test]
fn data_files_without_examples_are_an_error_naming_them() {
    for (images, labels, split) in [
        (
            "train-images-idx3-ubyte.gz",
            "train-labels-idx1-ubyte.gz",
            "training",
        ),
        (
            "t10k-images-idx3-ubyte.gz",
            "t10k-labels-idx1-ubyte.gz",
            "test",
        ),
    ] {
        let dir = TempDir::new(&format!("cli-empty-{split}"));
        for name in [
            "train-images-idx3-ubyte.gz",
            "train-labels-idx1-ubyte.gz",
            "t10k-images-idx3-ubyte.gz",
            "t10k-labels-idx1-ubyte.gz",
        ] {
            std::fs::copy(Path::new(SUBSET).join(name), dir.join(name)).unwrap();
        }
        // Valid files with a count of 0: training used to take 0 steps and exit 0, testing
        // to report "test accuracy 0.00%".
        let (empty_images, empty_labels) = idx_files(0);
        dir.write(images, &empty_images);
        dir.write(labels, &empty_labels);
        for command in ["train", "compare"] {
            let out = typed_amp(&[
                command,
                "--epochs",
                "1",
                "--quiet",
                "--data-dir",
                dir.to_str().unwrap(),
            ]);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{command} {split}: {stderr}");
            assert_eq!(
                stderr.trim_end(),
                format!(
                    "error: {} and {} hold no examples: the {split} split needs at least one",
                    dir.join(images).display(),
                    dir.join(labels).display()
                )
            );
            assert!(
                !String::from_utf8_lossy(&out.stdout).contains("accuracy"),
                "{command} {split}"
            );
        }
    }
}

#[test]
fn resuming_a_checkpoint_stripped_of_its_optimizer_state_is_an_error_that_leaves_it_alone() {
    let dir = TempDir::new("cli-stripped-state");
    let ckpt = dir.join("run.st");
    let arg = ckpt.to_str().unwrap();
    ok(&typed_amp(
        &[&TWO_EPOCHS[..], &["--stop-after", "1", "--save", arg]].concat(),
    ));
    common::rewrite(&ckpt, |tensors, _| {
        tensors.retain(|(name, ..)| !name.starts_with("optim."))
    });
    let stripped = std::fs::read(&ckpt).unwrap();
    // It used to resume from a fresh Adam with exit code 0 and overwrite the file.
    let out = typed_amp(&[&TWO_EPOCHS[..], &["--resume", arg, "--save", arg]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with(&format!("error: {arg}: tensor `optim.moment1."))
            && stderr.contains("missing from the checkpoint")
            && stderr.contains("`adam` optimizer's `moment1` state"),
        "{stderr}"
    );
    assert!(
        std::fs::read(&ckpt).unwrap() == stripped,
        "the file changed"
    );
}

#[test]
fn bad_arguments_are_usage_errors() {
    for args in [
        &["train", "--model", "resnet"][..],
        &["train", "--policy", "O5"],
        &["train", "--batch", "0"],
        &["compare", "--save", "x"],
        &["train", "--device", "cuda:0"],
        &["fit"],
        &["train", "--epochs", "0"],
        &["train", "--epochs", "9223372036854775808"],
        &["train", "--stop-after", "0"],
        &[
            "train",
            "--save",
            "/nonexistent-typed-amp-dir/run.safetensors",
        ],
    ] {
        let out = typed_amp(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: "));
    }
    // A number that does not parse names its option.
    let out = typed_amp(&["train", "--lr", "fast"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: --lr: cannot parse `fast`"));
}

#[test]
fn a_run_that_diverges_exits_3_and_says_why() {
    let out = typed_amp(&[
        "train",
        "--lr",
        "1e10",
        "--epochs",
        "1",
        "--quiet",
        "--data-dir",
        SUBSET,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("the training loss is NaN"), "{stderr}");
}

#[test]
fn compare_prints_the_table_and_json() {
    let out = ok(&typed_amp(&[
        "compare",
        "--epochs",
        "1",
        "--batch",
        "250",
        "--quiet",
        "--data-dir",
        SUBSET,
    ]));
    for row in [
        "time / epoch",
        "weights in memory",
        "checkpoint on disk",
        "peak memory (RSS)",
        "peak heap (training)",
        "test accuracy",
        "skipped steps",
        "final loss scale",
    ] {
        assert!(out.contains(row), "missing `{row}` in:\n{out}");
    }
    // Three columns by default: FP32, and O2 in each 16-bit precision.
    let header = out
        .lines()
        .find(|l| l.contains("FP32 (O0)"))
        .unwrap_or_default();
    for column in ["O2-FP16", "O2-BF16"] {
        assert!(
            header.contains(column),
            "missing column `{column}` in:\n{out}"
        );
    }

    let out = ok(&typed_amp(&[
        "compare",
        "--epochs",
        "1",
        "--batch",
        "250",
        "--quiet",
        "--json",
        "--data-dir",
        SUBSET,
    ]));
    let value: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
    let runs = value["runs"].as_array().expect("one object per column");
    let columns: Vec<(&str, &str)> = runs
        .iter()
        .map(|r| (r["policy"].as_str().unwrap(), r["dtype"].as_str().unwrap()))
        .collect();
    assert_eq!(columns, [("O0", "fp32"), ("O2", "fp16"), ("O2", "bf16")]);
    assert_eq!(runs[0]["final_loss_scale"], 1.0);
    // BF16 needs no loss scale.
    assert_eq!(runs[2]["final_loss_scale"], 1.0);
    for run in runs {
        let accuracy = run["test_accuracy"].as_f64().unwrap();
        assert!(
            accuracy > 0.5,
            "one epoch on the subset learns something: {accuracy} ({})",
            run["label"]
        );
    }

    // One mixed column when the policy or dtype is chosen.
    let out = ok(&typed_amp(&[
        "compare",
        "--policy",
        "O2",
        "--dtype",
        "bf16",
        "--epochs",
        "1",
        "--batch",
        "250",
        "--quiet",
        "--json",
        "--data-dir",
        SUBSET,
    ]));
    let value: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
    let runs = value["runs"].as_array().expect("one object per column");
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1]["label"], "O2-BF16");
}

/// `typed-amp` with `args` on one worker thread (`RAYON_NUM_THREADS=1`: allocation is then
/// deterministic), its JSON and its process id.
fn json_on_one_thread(args: &[&str]) -> (serde_json::Value, u32) {
    let child = Command::new(env!("CARGO_BIN_EXE_typed-amp"))
        .args(args)
        .env("RAYON_NUM_THREADS", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the typed-amp binary runs");
    let pid = child.id();
    let out = ok(&child.wait_with_output().unwrap());
    (serde_json::from_str(&out).expect("--json prints JSON"), pid)
}

#[test]
fn compare_trains_each_configuration_in_a_process_of_its_own() {
    let settings = ["--epochs", "1", "--batch", "250", "--seed", "2"];
    let data = ["--quiet", "--json", "--data-dir", SUBSET];
    let (compared, compare_pid) =
        json_on_one_thread(&[&["compare"][..], &settings, &data].concat());
    let runs = compared["runs"].as_array().expect("one object per column");
    assert_eq!(runs.len(), 3);
    let pids: Vec<u64> = runs.iter().map(|r| r["pid"].as_u64().unwrap()).collect();
    assert!(
        pids.iter().all(|&pid| pid != u64::from(compare_pid)),
        "{pids:?} against compare's {compare_pid}"
    );
    assert!(
        pids[0] != pids[1] && pids[1] != pids[2] && pids[0] != pids[2],
        "{pids:?}"
    );

    // Each figure is what a `train` process of its own reports.
    let peak = |run: &serde_json::Value| {
        let bytes = run["peak_heap_bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("no peak heap for {}", run["label"]));
        assert!(bytes > 0, "{}", run["label"]);
        bytes
    };
    let mut alone = Vec::new();
    for (policy, dtype) in [("O0", "fp16"), ("O2", "fp16"), ("O2", "bf16")] {
        let (run, _) = json_on_one_thread(
            &[
                &["train", "--policy", policy, "--dtype", dtype][..],
                &settings,
                &data,
            ]
            .concat(),
        );
        alone.push(run);
    }
    let compared_peaks: Vec<u64> = runs.iter().map(peak).collect();
    let alone_peaks: Vec<u64> = alone.iter().map(peak).collect();
    for (i, run) in runs.iter().enumerate() {
        assert_eq!(run["label"], alone[i]["label"]);
        assert_eq!(run["test_accuracy"], alone[i]["test_accuracy"]);
        // Equal on one thread (measured); within 1% leaves room for allocator details.
        let (a, b) = (compared_peaks[i] as f64, alone_peaks[i] as f64);
        assert!(
            (a - b).abs() <= 0.01 * b,
            "{}: {a} bytes in compare, {b} alone",
            run["label"]
        );
    }
    // The row orders the runs as separate processes do.
    let order = |peaks: &[u64]| {
        let mut labels: Vec<usize> = (0..peaks.len()).collect();
        labels.sort_by_key(|&i| peaks[i]);
        labels
    };
    assert_eq!(
        order(&compared_peaks),
        order(&alone_peaks),
        "compare {compared_peaks:?}, alone {alone_peaks:?}"
    );
}

#[test]
fn a_failing_or_diverging_run_of_compare_ends_it_with_that_runs_exit_code() {
    // Every run diverges: each says so once, the table is still printed, exit code 3.
    let out = typed_amp(&[
        "compare",
        "--lr",
        "1e10",
        "--epochs",
        "1",
        "--batch",
        "500",
        "--quiet",
        "--data-dir",
        SUBSET,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    for recipe in ["O0 (", "O2-FP16 (", "O2-BF16 ("] {
        let said = stderr
            .lines()
            .filter(|l| l.starts_with(&format!("error: {recipe}")) && l.ends_with("lower --lr"))
            .count();
        assert_eq!(said, 1, "{recipe}: {stderr}");
    }
    assert_eq!(stderr.lines().count(), 3, "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("peak heap (training)"));

    // A usage error found by a run's own process (its batch does not fit in memory): exit 2,
    // its message once, no table.
    if cfg!(target_os = "linux") {
        let threads = std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|n| n.parse::<u64>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64));
        let out = typed_amp_limited(
            (threads * 66 + 260) * 1024,
            &[
                "compare",
                "--model",
                "cnn",
                "--batch",
                "2000",
                "--epochs",
                "1",
                "--quiet",
                "--data-dir",
                SUBSET,
            ],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.starts_with("error: --batch 2000 needs about "),
            "{stderr}"
        );
        assert_eq!(stderr.matches("error:").count(), 1, "{stderr}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!stdout.contains("test accuracy"), "{stdout}");
    }
}

/// `typed-amp` run by `sh` under an address-space limit (`ulimit -v`) of `kib`.
fn typed_amp_limited(kib: u64, args: &[&str]) -> Output {
    let command = format!("ulimit -v {kib} && exec \"$0\" \"$@\"");
    Command::new("sh")
        .arg("-c")
        .arg(command)
        .arg(env!("CARGO_BIN_EXE_typed-amp"))
        .args(args)
        .output()
        .expect("sh runs")
}

#[test]
fn a_batch_too_large_for_memory_is_refused_before_training() {
    if !cfg!(target_os = "linux") {
        eprintln!("skipping: the memory check reads Linux's /proc");
        return;
    }
    // 260 MiB of address space beyond the 66 MiB each worker thread reserves (allocation arena
    // and stack): the CNN's step at batch 2,000 (about 660 MiB) cannot fit, the MLP's at batch
    // 500 can.
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|n| n.parse::<u64>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64));
    let kib = (threads * 66 + 260) * 1024;
    let out = typed_amp_limited(
        kib,
        &[
            "train",
            "--model",
            "cnn",
            "--batch",
            "2000",
            "--epochs",
            "1",
            "--quiet",
            "--data-dir",
            SUBSET,
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("error: --batch 2000 needs about "),
        "{stderr}"
    );
    assert!(
        stderr.contains("the CNN's activations")
            && stderr.contains(
                "usable under the address-space limit (ulimit -v); use a smaller --batch, such as "
            ),
        "{stderr}"
    );
    assert!(!stderr.contains("memory allocation"), "{stderr}");
    // The batch it suggests trains.
    let suggested = stderr
        .trim_end()
        .rsplit(' ')
        .next()
        .expect("a suggested batch");
    suggested.parse::<usize>().expect("a number");
    ok(&typed_amp_limited(
        kib,
        &[
            "train",
            "--model",
            "cnn",
            "--batch",
            suggested,
            "--epochs",
            "1",
            "--quiet",
            "--data-dir",
            SUBSET,
        ],
    ));
    ok(&typed_amp_limited(
        kib,
        &[
            "train",
            "--model",
            "mlp",
            "--batch",
            "500",
            "--epochs",
            "1",
            "--quiet",
            "--data-dir",
            SUBSET,
        ],
    ));
}

/// The caller's metadata (`user.*`) of a checkpoint.
fn user_meta(path: &Path, key: &str) -> String {
    let bytes = std::fs::read(path).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    header.metadata().as_ref().unwrap()[&format!("user.{key}")].clone()
}

const TWO_EPOCHS: [&str; 10] = [
    "train",
    "--epochs",
    "2",
    "--batch",
    "500",
    "--quiet",
    "--data-dir",
    SUBSET,
    "--seed",
    "4",
];

#[test]
fn stop_after_beyond_any_count_trains_to_the_end_of_the_run() {
    let dir = TempDir::new("cli-stop-after-max");
    let (part, resumed) = (dir.join("part.st"), dir.join("resumed.st"));
    let part_arg = part.to_str().unwrap();
    ok(&typed_amp(
        &[&TWO_EPOCHS[..], &["--stop-after", "1", "--save", part_arg]].concat(),
    ));
    assert_eq!(user_meta(&part, "epoch"), "1");
    // 1 + 18446744073709551615 overflows: the run must still end at epoch 2, not wrap to 0.
    let out = ok(&typed_amp(
        &[
            &TWO_EPOCHS[..],
            &[
                "--resume",
                part_arg,
                "--stop-after",
                "18446744073709551615",
                "--save",
                resumed.to_str().unwrap(),
            ],
        ]
        .concat(),
    ));
    assert!(out.contains("epoch   2"), "{out}");
    assert_eq!(user_meta(&resumed, "epoch"), "2");
    assert_eq!(user_meta(&resumed, "step"), "8");
}

#[test]
fn resuming_a_finished_or_inconsistent_checkpoint_is_a_usage_error() {
    let dir = TempDir::new("cli-resume-finished");
    let (done, edited) = (dir.join("done.st"), dir.join("edited.st"));
    ok(&typed_amp(
        &[&TWO_EPOCHS[..], &["--save", done.to_str().unwrap()]].concat(),
    ));
    let resume =
        |path: &Path| typed_amp(&[&TWO_EPOCHS[..], &["--resume", path.to_str().unwrap()]].concat());

    let out = resume(&done);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "has already finished 2 epochs of a run of 2 epochs: there is nothing left to train"
        ),
        "{stderr}"
    );

    // A checkpoint claiming more epochs than its run has.
    std::fs::copy(&done, &edited).unwrap();
    common::rewrite(&edited, |_, meta| {
        meta.insert("user.epoch".into(), "99".into());
    });
    let out = resume(&edited);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("has already finished 99 epochs of a run of 2 epochs")
            && stderr.contains("damaged"),
        "{stderr}"
    );

    // A step count that is no whole number of this run's epochs (and would overflow).
    common::rewrite(&edited, |_, meta| {
        meta.insert("user.epoch".into(), "1".into());
        meta.insert("user.step".into(), u64::MAX.to_string());
    });
    let out = resume(&edited);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("records 18446744073709551615 steps after 1 epochs, but this run takes 4 steps per epoch"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn saving_over_another_file_warns_and_a_running_writer_is_refused() {
    let dir = TempDir::new("cli-save-claims");
    let path = dir.join("run.st");
    let arg = path.to_str().unwrap();
    let first = &[&TWO_EPOCHS[..], &["--stop-after", "1", "--save", arg]].concat();
    let out = typed_amp(first);
    ok(&out);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("warning"));

    // Another run saving over it.
    let out = typed_amp(first);
    ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "warning: --save {arg} already exists and is not the checkpoint being resumed"
        )),
        "{stderr}"
    );
    // Resuming it into itself is what --save is for.
    let out = typed_amp(&[&TWO_EPOCHS[..], &["--resume", arg, "--save", arg]].concat());
    ok(&out);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("warning"));

    // A temporary file of a running process: another program writing the same checkpoint.
    let tmp = dir.join(format!(".run.st.tmp-{}", std::process::id()));
    std::fs::write(&tmp, b"partial").unwrap();
    let out = typed_amp(&[&TWO_EPOCHS[..], &["--save", arg]].concat());
    ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "warning: {} belongs to process {}, which is running",
            tmp.display(),
            std::process::id()
        )),
        "{stderr}"
    );
    std::fs::remove_file(&tmp).unwrap();

    // A run that is still training into the file.
    let busy = dir.join("busy.st");
    let busy_arg = busy.to_str().unwrap();
    let long_run = [
        "train",
        "--epochs",
        "100000",
        "--batch",
        "500",
        "--quiet",
        "--data-dir",
        SUBSET,
        "--save",
        busy_arg,
    ];
    let mut child = Command::new(env!("CARGO_BIN_EXE_typed-amp"))
        .args(long_run)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while !busy.exists() && started.elapsed() < std::time::Duration::from_secs(120) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = typed_amp(&long_run);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(busy.exists(), "the first run never saved");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "error: --save {busy_arg}: another run (process {}) is saving to this file",
            child.id()
        )),
        "{stderr}"
    );
}

/// Issue 34, item 1: `--policy O0 --lr 2e7` grows the weights until finite gradients' squares
/// overflow FP32; the run exited 0 having saved inf in Adam's second moment, and its own
/// `--resume` refused the file (exit 1). Such a step is now skipped like an overflow: the file a
/// run writes is resumed, and holds only finite state.
#[test]
fn a_checkpoint_of_a_run_whose_gradients_squares_overflow_resumes() {
    let dir = TempDir::new("cli-square-overflow");
    let ckpt = dir.join("f1.st");
    let arg = ckpt.to_str().unwrap();
    let run = [
        "train",
        "--policy",
        "O0",
        "--lr",
        "2e7",
        "--epochs",
        "2",
        "--quiet",
        "--data-dir",
        SUBSET,
    ];
    let out = typed_amp(&[&run[..], &["--stop-after", "1", "--save", arg]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    for (name, bytes) in tensors(&ckpt) {
        let finite = bytes
            .chunks_exact(4)
            .all(|b| f32::from_le_bytes(b.try_into().unwrap()).is_finite());
        assert!(finite, "`{name}` holds a non-finite value");
    }
    // Skipped steps, not an inf second moment.
    assert_ne!(user_meta_or_none(&ckpt, "step"), None);
    let out = typed_amp(&[&run[..], &["--resume", arg]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(0) || out.status.code() == Some(3),
        "the run's own checkpoint is refused: {stderr}"
    );
    assert!(!stderr.contains("non-finite"), "{stderr}");
}

fn user_meta_or_none(path: &Path, key: &str) -> Option<String> {
    let bytes = std::fs::read(path).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    header
        .metadata()
        .as_ref()?
        .get(&format!("user.{key}"))
        .cloned()
}

/// Issue 34, item 3: damaged metadata (a value that does not parse, a key removed) is a damaged
/// checkpoint: exit code 1 and an error naming the file, not a usage error (exit 2) without
/// it. The static-scale refusal of an edited `scaler.mode` names the file too.
#[test]
fn damaged_checkpoint_metadata_is_an_error_naming_the_file() {
    let dir = TempDir::new("cli-damaged-meta");
    let (good, edited) = (dir.join("good.st"), dir.join("edited.st"));
    let o2 = [&TWO_EPOCHS[..], &["--policy", "O2"]].concat();
    ok(&typed_amp(
        &[
            &o2[..],
            &["--stop-after", "1", "--save", good.to_str().unwrap()],
        ]
        .concat(),
    ));
    let arg = edited.to_str().unwrap();
    let resume = || typed_amp(&[&o2[..], &["--resume", arg]].concat());
    type Edit = fn(&mut common::RawMetadata);
    let cases: [(Edit, &str); 4] = [
        (
            |m| {
                m.insert("user.rng_word_pos".into(), "banana".into());
            },
            "`rng_word_pos` is `banana`",
        ),
        (
            |m| {
                m.remove("user.epoch");
            },
            "records no `epoch`",
        ),
        (
            |m| {
                m.insert("user.step".into(), "-1".into());
            },
            "`step` is `-1`",
        ),
        (
            |m| {
                m.insert("scaler.mode".into(), "static".into());
                m.insert("scaler.scale_bits".into(), 70000f32.to_bits().to_string());
            },
            "65504",
        ),
    ];
    for (edit, says) in cases {
        std::fs::copy(&good, &edited).unwrap();
        common::rewrite(&edited, |_, meta| edit(meta));
        let out = resume();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{says}: {stderr}");
        assert!(
            stderr.starts_with(&format!("error: {arg}: ")) && stderr.contains(says),
            "{stderr}"
        );
    }
}

/// Issue 34, item 5: `--save DIR` where DIR is a directory was trained into and failed at the
/// first save (exit 1, after a warning that it would overwrite DIR); now it is a usage error
/// before training, as a directory that does not exist is.
#[test]
fn save_to_a_directory_is_a_usage_error_before_training() {
    let dir = TempDir::new("cli-save-dir");
    let arg = dir.to_str().unwrap();
    let out = typed_amp(&[&TWO_EPOCHS[..], &["--save", arg]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with(&format!("error: --save {arg}: is a directory")),
        "{stderr}"
    );
    assert!(!stderr.contains("overwrite"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).is_empty());
}

/// Issue 34, item 5: two identical runs write byte-identical checkpoints (the metadata's order
/// used to vary from process to process).
#[test]
fn identical_runs_write_identical_files() {
    let dir = TempDir::new("cli-deterministic");
    let (a, b) = (dir.join("a.st"), dir.join("b.st"));
    for path in [&a, &b] {
        ok(&typed_amp(
            &[
                &TWO_EPOCHS[..],
                &["--stop-after", "1", "--save", path.to_str().unwrap()],
            ]
            .concat(),
        ));
    }
    assert!(
        std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
        "the two files differ"
    );
}

/// Issue 34, item 5: a killed writer's `.NAME.tmp-PID` is removed by the next run saving to
/// `NAME` (it stayed while a zombie or a process that reused the PID held it): a PID that no
/// longer runs, and one that runs but started after the file was written.
#[test]
fn a_killed_writers_temporary_files_are_removed_by_the_next_save() {
    let dir = TempDir::new("cli-stale-tmp");
    let path = dir.join("run.st");
    let arg = path.to_str().unwrap();
    // A process that has exited and been waited for.
    let mut gone = Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    let dead = dir.join(format!(".run.st.tmp-{}", gone.id()));
    std::fs::write(&dead, b"partial").unwrap();
    // A zombie: killed, not waited for yet.
    let mut zombie = Command::new("sleep").arg("60").spawn().unwrap();
    zombie.kill().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let of_zombie = dir.join(format!(".run.st.tmp-{}", zombie.id()));
    std::fs::write(&of_zombie, b"partial").unwrap();
    // A PID reused: the file was last written long before the process now holding the PID
    // started.
    let mut later = Command::new("sleep").arg("60").spawn().unwrap();
    let reused = dir.join(format!(".run.st.tmp-{}", later.id()));
    std::fs::write(&reused, b"partial").unwrap();
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&reused)
        .unwrap()
        .set_modified(old)
        .unwrap();

    let out = typed_amp(&[&TWO_EPOCHS[..], &["--stop-after", "1", "--save", arg]].concat());
    later.kill().unwrap();
    later.wait().unwrap();
    zombie.wait().unwrap();
    ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("warning"), "{stderr}");
    for tmp in [&dead, &of_zombie, &reused] {
        assert!(!tmp.exists(), "{} was left behind", tmp.display());
    }
    assert!(path.exists());
}

/// Issue 34, item 5: a single process resuming a data-parallel run's checkpoint is told how
/// `typed-amp` resumes it (`--data-parallel` under `mpirun -n N`).
#[test]
fn a_resume_on_another_rank_count_names_data_parallel() {
    let dir = TempDir::new("cli-world-size");
    let path = dir.join("run.st");
    let arg = path.to_str().unwrap();
    ok(&typed_amp(
        &[&TWO_EPOCHS[..], &["--stop-after", "1", "--save", arg]].concat(),
    ));
    common::rewrite(&path, |_, meta| {
        meta.insert("user.world_size".into(), "2".into());
    });
    let out = typed_amp(&[&TWO_EPOCHS[..], &["--resume", arg]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(arg)
            && stderr.contains("2 rank(s)")
            && stderr.contains("mpirun -n 2 typed-amp train --data-parallel"),
        "{stderr}"
    );
}

/// Issue 34, items 1 and 4: a run whose state stops being finite (O3's 16-bit weights under an
/// absurd learning rate) does not save it over the checkpoint already at `--save` (it used to
/// write hundreds of thousands of non-finite values): it warns, keeps the file, and ends with
/// exit code 3, advising what O3-FP16's diverging runs need (it used to say only "lower --lr").
#[test]
fn a_run_whose_state_is_not_finite_does_not_overwrite_the_checkpoint() {
    let dir = TempDir::new("cli-nan-state");
    let path = dir.join("run.st");
    let arg = path.to_str().unwrap();
    ok(&typed_amp(
        &[&TWO_EPOCHS[..], &["--stop-after", "1", "--save", arg]].concat(),
    ));
    let good = std::fs::read(&path).unwrap();
    let out = typed_amp(&[
        "train",
        "--policy",
        "O3",
        "--lr",
        "1e10",
        "--epochs",
        "1",
        "--batch",
        "500",
        "--quiet",
        "--data-dir",
        SUBSET,
        "--save",
        arg,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("not saved") && stderr.contains("keeps the last checkpoint"),
        "{stderr}"
    );
    // The advice names O3-FP16's own cause (FP16-only weights and state, no master copy) and
    // the policy that has none, not only the learning rate (issue 34, item 4).
    assert!(
        stderr.contains("O3-FP16 keeps its weights and Adam's state in FP16 alone")
            && stderr.contains("--policy O2 (FP32 master weights)"),
        "{stderr}"
    );
    assert!(std::fs::read(&path).unwrap() == good, "the file changed");
}

/// Issue 34, item 4: `train --policy O3` (FP16) got NaN weights from its first Adam update
/// (eps 1e-8 is 0 in FP16 arithmetic), skipped every later step and exited 3. Adam now
/// computes in FP32 registers over the FP16 weights and state, with eps 1e-4: it trains.
#[test]
fn o3_fp16_trains() {
    let out = typed_amp(&[
        "train",
        "--policy",
        "O3",
        "--epochs",
        "2",
        "--quiet",
        "--data-dir",
        SUBSET,
    ]);
    let stdout = ok(&out);
    assert!(
        stdout.contains("O3-FP16") && stdout.contains("(0 skipped)"),
        "{stdout}"
    );
    let accuracy: f32 = stdout
        .split("test accuracy ")
        .nth(1)
        .and_then(|s| s.split('%').next())
        .and_then(|s| s.parse().ok())
        .unwrap();
    assert!(accuracy > 60.0, "{stdout}");
}
