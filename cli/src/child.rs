//! `compare`'s runs, each trained by a `typed-amp train --json` process of its own, and how a
//! command ends.

use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;

use crate::config::RunError;

/// What every `typed-amp train --json` process that `compare` starts is told beside its
/// model's own options.
#[derive(Debug)]
pub struct TrainArgs<'a> {
    /// Examples (or windows) per step.
    pub batch: usize,
    /// The run's seed.
    pub seed: u64,
    /// The learning rate (`Display` of an f64 reads back as the same f64).
    pub lr: f64,
    /// `--device` as written on the command line.
    pub device: String,
    /// Whether the process shows its progress bar.
    pub progress: bool,
    /// Where its data is (the default data where `None`).
    pub data_dir: Option<&'a Path>,
}

impl TrainArgs<'_> {
    /// `typed-amp train` with the model's own options `model` (from `--model` on), then these.
    pub fn command_line(&self, model: &[String]) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["train".into()];
        args.extend(model.iter().map(OsString::from));
        for (flag, value) in [
            ("--batch", self.batch.to_string()),
            ("--seed", self.seed.to_string()),
            ("--lr", self.lr.to_string()),
            ("--device", self.device.clone()),
        ] {
            args.push(flag.into());
            args.push(value.into());
        }
        args.push("--json".into());
        if !self.progress {
            args.push("--quiet".into());
        }
        if let Some(dir) = self.data_dir {
            args.push("--data-dir".into());
            args.push(dir.as_os_str().to_owned());
        }
        args
    }
}

/// Exit code of a run that completed but trained nothing useful: every step was skipped, or
/// the final loss is not finite.
pub const EXIT_DIVERGED: u8 = 3;

/// How a command ended, when it did not fail.
#[derive(Debug)]
pub enum Outcome {
    /// Done, and the result is usable.
    Done,
    /// Finished, but trained nothing useful: why (printed, exit code 3).
    Diverged(String),
    /// Finished, but a run trained nothing useful and its process said so (exit code 3).
    DivergedReported,
}

/// What a run's own process printed.
#[derive(Debug)]
pub struct ChildOutput {
    /// Its JSON result.
    pub json: serde_json::Value,
    /// The process that printed it.
    pub pid: u32,
    /// Whether it finished having trained nothing useful (exit code 3; it said why).
    pub diverged: bool,
}

/// Runs this program with `args` (a `train ... --json` command line) in a process of its own,
/// so that the run's memory figures are its own: this process's allocator keeps what an
/// earlier run freed. Its progress bar, warnings and errors go to this process's stderr as
/// they come; its JSON result is read from its stdout. A run whose process fails with exit
/// code 1 or 2 is [`RunError::ChildFailed`] (its error already printed); one that cannot start,
/// ends abnormally or prints no JSON is [`RunError::Child`] naming `label`.
pub fn run_child(label: &str, args: Vec<OsString>) -> Result<ChildOutput, RunError> {
    let program = std::env::current_exe().map_err(|e| {
        RunError::Child(format!(
            "cannot find this program to run {label} in a process of its own: {e}"
        ))
    })?;
    let child = std::process::Command::new(&program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| {
            RunError::Child(format!(
                "cannot start {} to train {label}: {e}",
                program.display()
            ))
        })?;
    let pid = child.id();
    let output = child.wait_with_output().map_err(|e| {
        RunError::Child(format!(
            "the {label} run (process {pid}) could not be waited for: {e}"
        ))
    })?;
    let diverged = match output.status.code() {
        Some(0) => false,
        Some(code) if code == i32::from(EXIT_DIVERGED) => true,
        Some(code @ (1 | 2)) => {
            return Err(RunError::ChildFailed {
                label: label.to_string(),
                code: code as u8,
            })
        }
        _ => {
            return Err(RunError::Child(format!(
                "the {label} run (process {pid}) ended abnormally ({})",
                output.status
            )))
        }
    };
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).map_err(|e| {
        RunError::Child(format!(
            "the {label} run (process {pid}) printed no JSON result: {e}"
        ))
    })?;
    Ok(ChildOutput {
        json,
        pid,
        diverged,
    })
}
