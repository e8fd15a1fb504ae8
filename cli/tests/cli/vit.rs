//! `--model vit` end to end: the ViT trains under every mixed policy to within 2% of FP32's
//! loss over 200 steps, and a resumed run matches the uninterrupted one bit for bit.

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

/// One `train --model vit --json` run of 200 steps on the embedded subset (2,000 images,
/// batch 20, 2 epochs): its JSON.
fn two_hundred_steps(policy: &str, dtype: &str) -> serde_json::Value {
    let out = ok(&typed_amp(&[
        "train",
        "--model",
        "vit",
        "--policy",
        policy,
        "--dtype",
        dtype,
        "--epochs",
        "2",
        "--batch",
        "20",
        "--seed",
        "0",
        "--quiet",
        "--json",
        "--data-dir",
        SUBSET,
    ]));
    let json: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert_eq!(json["model"], "vit");
    assert_eq!(json["steps"], 200);
    json
}

/// The mean training loss of steps 101–200.
fn late_loss(run: &serde_json::Value) -> f64 {
    run["epochs"][1]["train_loss"].as_f64().expect("a loss")
}

#[test]
fn vit_losses_over_200_steps_are_within_2_percent_of_fp32_under_each_mixed_policy() {
    let fp32 = two_hundred_steps("O0", "fp16");
    let reference = late_loss(&fp32);
    let first = fp32["epochs"][0]["train_loss"].as_f64().unwrap();
    assert!(
        reference < 0.8 * first,
        "the ViT learns: {first} -> {reference}"
    );
    for (policy, dtype) in [
        ("O2", "fp16"),
        ("O2", "bf16"),
        ("O1", "fp16"),
        ("O1", "bf16"),
    ] {
        let run = two_hundred_steps(policy, dtype);
        let loss = late_loss(&run);
        let gap = (loss - reference).abs() / reference;
        eprintln!(
            "{policy}-{dtype}: {loss:.5} vs O0 {reference:.5} ({:.2}%)",
            100.0 * gap
        );
        assert!(
            gap <= 0.02,
            "{policy}-{dtype}: loss {loss} is {:.2}% from O0's {reference}",
            100.0 * gap
        );
        if dtype == "fp16" && policy == "O2" {
            // Skipped steps are the dynamic scale's first probes only (2^16 down to what fits).
            let skipped = run["skipped_steps"].as_u64().unwrap();
            assert!(skipped <= 20, "{skipped} skipped steps");
        }
    }
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

#[test]
fn a_resumed_o2_fp16_vit_run_matches_the_uninterrupted_run_bit_for_bit() {
    let dir = TempDir::new("cli-resume-vit");
    let common = [
        "train",
        "--model",
        "vit",
        "--policy",
        "O2",
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
    let with = |extra: &[&'static str]| -> Vec<String> {
        common.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let run = |args: Vec<String>| {
        ok(&typed_amp(
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        ))
    };
    let (full_s, part_s, resumed_s) = (
        full.to_str().unwrap().to_string(),
        part.to_str().unwrap().to_string(),
        resumed.to_str().unwrap().to_string(),
    );
    let mut a = with(&["--save"]);
    a.push(full_s);
    run(a);
    let mut a = with(&["--stop-after", "1", "--save"]);
    a.push(part_s.clone());
    run(a);
    let mut a = with(&["--resume"]);
    a.extend([part_s, "--save".to_string(), resumed_s]);
    run(a);

    let (a, b) = (tensors(&full), tensors(&resumed));
    assert!(a.iter().any(|(n, _)| n.starts_with("optim.")));
    assert!(
        a.iter().any(|(n, _)| n.contains("c_attn.weight")),
        "attention is saved by name"
    );
    assert_eq!(a.len(), b.len());
    for ((name, x), (other, y)) in a.iter().zip(&b) {
        assert_eq!(name, other);
        assert!(
            x == y,
            "`{name}` differs between the resumed and the uninterrupted run"
        );
    }
    assert_ne!(tensors(&part), a, "the split run really stopped halfway");
}
