//! `mpirun -n 2 typed-amp train --data-parallel` end to end (feature `mpi`): rank 0 alone
//! prints, a run stopped and resumed on two ranks ends bit for bit where the uninterrupted one
//! does, and resuming with another number of ranks is a clear usage error. Without `mpirun`
//! the tests print `skipping:` and pass; `.ci/run` installs OpenMPI.
#![cfg(feature = "mpi")]

use std::process::{Command, Output};
use std::sync::Mutex;

#[path = "../../tests/common/mod.rs"]
mod common;
use common::TempDir;

const SUBSET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/fashion-mnist-subset");

/// One `mpirun` at a time: two ranks fill this machine's two cores.
static MPIRUN: Mutex<()> = Mutex::new(());

/// `typed-amp train --data-parallel ARGS` on `ranks` ranks, or `None` without `mpirun`.
fn mpirun(ranks: usize, args: &[&str]) -> Option<Output> {
    let _one_at_a_time = MPIRUN.lock().unwrap_or_else(|e| e.into_inner());
    if Command::new("mpirun").arg("--version").output().is_err() {
        println!("skipping: mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)");
        return None;
    }
    let output = Command::new("mpirun")
        .args(["-n", &ranks.to_string(), "--oversubscribe"])
        // As root (CI containers) OpenMPI wants to be told; CMA needs ptrace rights that
        // containers often lack.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        .arg(env!("CARGO_BIN_EXE_typed-amp"))
        .args(["train", "--data-parallel"])
        .args(args)
        .output()
        .expect("mpirun runs");
    Some(output)
}

fn ok(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "typed-amp failed: {stderr}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn tensors(path: &std::path::Path) -> Vec<(String, Vec<u8>)> {
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

const COMMON: [&str; 11] = [
    "--epochs",
    "2",
    "--batch",
    "125",
    "--seed",
    "3",
    "--quiet",
    "--data-dir",
    SUBSET,
    "--model",
    "mlp",
];

fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    COMMON
        .iter()
        .copied()
        .chain(extra.iter().copied())
        .collect()
}

#[test]
fn two_ranks_train_print_once_save_and_resume_bit_for_bit() {
    let dir = TempDir::new("cli-data-parallel");
    let full = dir.join("full.safetensors");
    let part = dir.join("part.safetensors");
    let resumed = dir.join("resumed.safetensors");
    let Some(output) = mpirun(2, &args(&["--save", full.to_str().unwrap()])) else {
        return;
    };
    let stdout = ok(&output);
    println!("{stdout}");
    // Rank 0 alone prints: one header, one line per epoch, one summary.
    assert_eq!(
        stdout.matches("data-parallel: 2 rank(s)").count(),
        1,
        "{stdout}"
    );
    assert_eq!(stdout.matches("\nepoch ").count(), 2, "{stdout}");
    assert_eq!(stdout.matches("test accuracy").count(), 1, "{stdout}");
    assert!(
        stdout.contains("batch 125 per rank, 250 per step"),
        "{stdout}"
    );

    ok(&mpirun(
        2,
        &args(&["--stop-after", "1", "--save", part.to_str().unwrap()]),
    )
    .unwrap());
    ok(&mpirun(
        2,
        &args(&[
            "--resume",
            part.to_str().unwrap(),
            "--save",
            resumed.to_str().unwrap(),
        ]),
    )
    .unwrap());
    let (a, b) = (tensors(&full), tensors(&resumed));
    assert_eq!(a.len(), b.len());
    for ((name, x), (other, y)) in a.iter().zip(&b) {
        assert_eq!(name, other);
        assert!(
            x == y,
            "`{name}` differs between the resumed and the uninterrupted run"
        );
    }
    assert_ne!(tensors(&part), a, "the split run really stopped halfway");
    let bytes = std::fs::read(&full).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(
        header
            .metadata()
            .as_ref()
            .unwrap()
            .get("user.world_size")
            .map(String::as_str),
        Some("2")
    );

    // Another number of ranks is refused, with a message that says what to do.
    let one = mpirun(1, &args(&["--resume", part.to_str().unwrap()])).unwrap();
    let stderr = String::from_utf8_lossy(&one.stderr);
    assert_eq!(one.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("written by a run of 2 rank(s) and this run has 1")
            && stderr.contains("mpirun -n 2"),
        "{stderr}"
    );
    // So is resuming it in one process without --data-parallel.
    let plain = Command::new(env!("CARGO_BIN_EXE_typed-amp"))
        .arg("train")
        .args(COMMON)
        .args(["--resume", part.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&plain.stderr);
    assert_eq!(plain.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("2 rank(s) and this run has 1"), "{stderr}");
}
