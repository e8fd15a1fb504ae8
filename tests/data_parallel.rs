//! Data-parallel training on two ranks of one machine, under `mpirun -n 2` (feature `mpi`):
//! two ranks with batch `B` each train the same master weights as one process with batch `2B`,
//! within a tolerance derived from FP32 summation order; an overflow on one rank makes both
//! skip and back off alike; a window of micro-batches is all-reduced once; and the ranks hold
//! the same master weights and loss scale, bit for bit, after every step (the worker checks
//! with `DataParallel::check_in_sync` and fails otherwise).
//!
//! The ranks run `tests/data_parallel/worker.rs` (binary `typed-amp-dp-worker`). Without
//! `mpirun` on the PATH the tests print `skipping:` and pass; `.ci/run` installs OpenMPI.
#![cfg(feature = "mpi")]

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Mutex;

/// One `mpirun` at a time: two ranks each already fill this machine's two cores.
static MPIRUN: Mutex<()> = Mutex::new(());

/// `mpirun -n 2` with the options a CI container needs: running as root (OpenMPI refuses it
/// unless told), more ranks than cores if need be, and no single-copy shared-memory mechanism
/// (CMA needs ptrace permissions containers often lack).
fn mpirun(ranks: usize) -> Option<Command> {
    let found = Command::new("mpirun").arg("--version").output().is_ok();
    if !found {
        return None;
    }
    let mut cmd = Command::new("mpirun");
    cmd.args(["-n", &ranks.to_string(), "--oversubscribe"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
    Some(cmd)
}

/// Runs a scenario of the worker on two ranks and returns rank 0's `RESULT key=value` lines.
fn scenario(name: &str) -> Option<BTreeMap<String, String>> {
    let _one_at_a_time = MPIRUN.lock().unwrap_or_else(|e| e.into_inner());
    let Some(mut cmd) = mpirun(2) else {
        println!("skipping: mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)");
        return None;
    };
    let output = cmd
        .arg(env!("CARGO_BIN_EXE_typed-amp-dp-worker"))
        .arg(name)
        .output()
        .expect("mpirun runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{name} failed on some rank ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let results: BTreeMap<String, String> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert!(!results.is_empty(), "rank 0 printed no result:\n{stdout}");
    Some(results)
}

fn number(results: &BTreeMap<String, String>, key: &str) -> f64 {
    results[key].parse().unwrap()
}

#[test]
fn two_ranks_with_batch_b_match_one_process_with_batch_2b() {
    let Some(r) = scenario("equivalence") else {
        return;
    };
    let (diff, tolerance) = (number(&r, "max_diff_vs_batch_2b"), number(&r, "tolerance"));
    println!(
        "{} steps, {} rows per rank: max |master(2 ranks) − master(1 process, 2B)| = {diff:e}, \
         tolerance {tolerance:e} (lr·λ_max {}); vs 1 process accumulating 2 × B: {}; \
         largest |master| {}",
        r["steps"],
        r["rows_per_rank"],
        r["lr_lambda_max"],
        r["max_diff_vs_accumulation"],
        r["max_abs_master"]
    );
    assert!(
        diff <= tolerance,
        "the 2-rank run is {diff:e} from the 1-process run, beyond the FP32 summation-order bound {tolerance:e}"
    );
    assert!(
        number(&r, "max_diff_vs_accumulation") <= tolerance,
        "the 2-rank run differs from one process accumulating the two shards"
    );
    // The bound is meaningful: far below the weights themselves.
    assert!(tolerance < 1e-3 * number(&r, "max_abs_master"));
    let fingerprints: Vec<&str> = r["fingerprints"].split(',').collect();
    assert_eq!(fingerprints.len(), 2);
    assert_eq!(
        fingerprints[0], fingerprints[1],
        "the ranks' masters and scalers differ"
    );
}

/// `step:local_inf:skipped:scale:masters_unchanged` per step.
fn trace(line: &str) -> Vec<(usize, bool, bool, f32, bool)> {
    line.split_whitespace()
        .map(|s| {
            let f: Vec<&str> = s.split(':').collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
                f[4].parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn an_overflow_on_one_rank_makes_every_rank_skip_and_back_off() {
    let Some(r) = scenario("overflow") else {
        return;
    };
    let at: usize = r["overflow_at"].parse().unwrap();
    let (rank0, rank1) = (trace(&r["rank0"]), trace(&r["rank1"]));
    assert_eq!(rank0.len(), rank1.len());
    for (a, b) in rank0.iter().zip(&rank1) {
        let step = a.0;
        // Only rank 1 saw the inf...
        assert!(!a.1, "step {step}: rank 0 had no inf");
        assert_eq!(b.1, step == at, "step {step}: rank 1's inf");
        // ...and both skipped the step, and only that one, leaving the masters as they were.
        assert_eq!((a.2, b.2), (step == at, step == at), "step {step}: skipped");
        assert_eq!(a.4, step == at, "step {step}: rank 0's masters unchanged");
        assert_eq!(b.4, step == at, "step {step}: rank 1's masters unchanged");
        // Both scales follow the same path.
        assert_eq!(a.3, b.3, "step {step}: the ranks' scales differ");
    }
    let before = rank0[at - 1].3;
    assert_eq!(rank0[at].3, before / 2.0, "the scale backed off once");
    assert!(
        rank0.iter().map(|s| s.3).fold(0.0, f32::max) > 256.0,
        "the run also grew the scale"
    );
    assert_eq!(r["skipped_steps"], "1");
    println!(
        "overflow on rank 1 at step {at}: both ranks skipped it, scale {before} -> {}; scales {:?}",
        rank0[at].3,
        rank0.iter().map(|s| s.3).collect::<Vec<_>>()
    );
}

#[test]
fn an_accumulation_window_is_all_reduced_once() {
    let Some(r) = scenario("accumulate") else {
        return;
    };
    println!(
        "{} windows, {} micro-batches in all: {} gradient all-reduces",
        r["windows"], r["micro_batches"], r["gradient_all_reduces"]
    );
    assert_eq!(r["gradient_all_reduces"], r["windows"]);
    assert_eq!(r["reductions"], r["windows"]);
    assert_ne!(r["micro_batches"], r["windows"]);
}
