//! `typed-amp`: train Fashion-MNIST in FP32 and mixed precision, and compare.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};

use typed_amp::amp::OptLevel;
use typed_amp_cli::data_parallel::Ranks;
use typed_amp_cli::heap::CountingAllocator;
use typed_amp_cli::models::{Arch, LowDtype};
use typed_amp_cli::report::{comparison_table, run_from_json, run_json};
use typed_amp_cli::run::{run, DeviceChoice, RunConfig, RunError, RunReport};
use typed_amp_data::{DataOrigin, FashionMnist};

/// Counts the heap bytes the program holds, for each run's `peak heap (training)`.
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const USAGE: &str = "\
typed-amp: train Fashion-MNIST in FP32 and mixed precision

USAGE:
    typed-amp [compare] [OPTIONS]     train FP32 (O0), O2-FP16 and O2-BF16 alike, each in its own
                                      process, print the table
                                      (with --policy or --dtype: FP32 and that one mixed run)
    typed-amp train [OPTIONS]         train one model under one policy

OPTIONS:
    --model mlp|cnn|vit    architecture                                  [default: mlp]
    --policy O0|O1|O2|O3   policy (compare: the mixed one)               [default: O2]
    --dtype fp16|bf16      16-bit precision of O1-O3                     [default: fp16]
    --epochs N             epochs                                        [default: 5]
    --batch B              examples per step                             [default: 128]
    --seed S               seed for initialisation and data order        [default: 0]
    --lr LR                Adam's initial learning rate (cosine decay)   [default: 0.001]
    --data-dir DIR         the four Fashion-MNIST IDX .gz files          [default: /usr/share/datasets/fashion-mnist,
                                                                                   else the embedded subset]
    --device cpu|cuda:N    device (cuda needs `--features cuda`)        [default: cpu]
    --save PATH            (train) write a checkpoint after every epoch
    --stop-after N         (train) stop after N epochs of this invocation (resume later)
    --resume PATH          (train) continue from a checkpoint
    --data-parallel        (train) one rank of a data-parallel run started by `mpirun -n N`
                           (needs `--features mpi`): --batch is per rank, rank 0 prints and saves
    --quiet                no progress bar
    --json                 print results as JSON
    -h, --help             this help
";

#[derive(Debug)]
struct Args {
    command: Command,
    config: RunConfig,
    /// Whether `--policy` or `--dtype` chose one mixed run (else `compare` runs both dtypes).
    chosen_mixed: bool,
    data_dir: Option<PathBuf>,
    json: bool,
    /// One rank of a data-parallel run (`--data-parallel`).
    data_parallel: bool,
}

#[derive(Debug, PartialEq)]
enum Command {
    Train,
    Compare,
}

/// The most epochs a run may ask for: far beyond any real run, and small enough that the step
/// count (epochs × steps per epoch) cannot overflow.
const MAX_EPOCHS: usize = 1_000_000;

/// The value of `--name`, parsed as a number; errors name the option.
fn number<T: std::str::FromStr>(parser: &mut lexopt::Parser, name: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    let value = parser.value().map_err(|e| format!("--{name}: {e}"))?;
    let text = value.to_string_lossy();
    text.parse()
        .map_err(|e| format!("--{name}: cannot parse `{text}` as a number ({e})"))
}

fn parse_args() -> Result<Option<Args>, String> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_env();
    let mut command = None;
    let mut config = RunConfig {
        arch: Arch::Mlp,
        policy: OptLevel::O2,
        dtype: LowDtype::Fp16,
        epochs: 5,
        batch: 128,
        seed: 0,
        lr: 1e-3,
        stop_after: None,
        save: None,
        resume: None,
        progress: true,
        device: DeviceChoice::Cpu,
    };
    let (mut data_dir, mut json, mut chosen_mixed) = (None, false, false);
    let mut data_parallel = false;
    let err = |e: lexopt::Error| e.to_string();
    while let Some(arg) = parser.next().map_err(err)? {
        match arg {
            Value(v) if command.is_none() => {
                command = Some(match v.to_string_lossy().as_ref() {
                    "train" => Command::Train,
                    "compare" => Command::Compare,
                    other => {
                        return Err(format!(
                            "unknown command `{other}`: expected train or compare"
                        ))
                    }
                })
            }
            Long("model") => {
                config.arch = parser
                    .value()
                    .map_err(err)?
                    .string()
                    .map_err(err)?
                    .parse()?
            }
            Long("dtype") => {
                chosen_mixed = true;
                config.dtype = parser
                    .value()
                    .map_err(err)?
                    .string()
                    .map_err(err)?
                    .parse()?
            }
            Long("policy") => {
                chosen_mixed = true;
                config.policy = parser
                    .value()
                    .map_err(err)?
                    .string()
                    .map_err(err)?
                    .parse()
                    .map_err(|e: typed_amp::error::AmpError| e.to_string())?
            }
            Long("epochs") => config.epochs = number(&mut parser, "epochs")?,
            Long("batch") => config.batch = number(&mut parser, "batch")?,
            Long("seed") => config.seed = number(&mut parser, "seed")?,
            Long("lr") => config.lr = number(&mut parser, "lr")?,
            Long("stop-after") => config.stop_after = Some(number(&mut parser, "stop-after")?),
            Long("data-dir") => data_dir = Some(PathBuf::from(parser.value().map_err(err)?)),
            Long("save") => config.save = Some(PathBuf::from(parser.value().map_err(err)?)),
            Long("resume") => config.resume = Some(PathBuf::from(parser.value().map_err(err)?)),
            Long("device") => {
                config.device = parser
                    .value()
                    .map_err(err)?
                    .string()
                    .map_err(err)?
                    .parse()?
            }
            Long("quiet") => config.progress = false,
            Long("json") => json = true,
            Long("data-parallel") => data_parallel = true,
            Short('h') | Long("help") => return Ok(None),
            other => return Err(other.unexpected().to_string()),
        }
    }
    let command = command.unwrap_or(Command::Compare);
    if command == Command::Compare
        && (config.save.is_some() || config.resume.is_some() || config.stop_after.is_some())
    {
        return Err("--save, --resume and --stop-after belong to `typed-amp train`".to_string());
    }
    if command == Command::Compare && data_parallel {
        return Err("--data-parallel belongs to `typed-amp train`".to_string());
    }
    if config.batch == 0 {
        return Err("--batch must be at least 1".to_string());
    }
    if config.epochs == 0 || config.epochs > MAX_EPOCHS {
        return Err(format!(
            "--epochs must be between 1 and {MAX_EPOCHS}, got {}",
            config.epochs
        ));
    }
    if config.stop_after == Some(0) {
        return Err("--stop-after must be at least 1".to_string());
    }
    if let Some(save) = &config.save {
        // Checked now rather than when the first epoch ends and the first checkpoint is due.
        let dir = save
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        if !dir.is_dir() {
            return Err(format!(
                "--save: the directory {} does not exist",
                dir.display()
            ));
        }
    }
    if !(config.lr.is_finite() && config.lr > 0.0) {
        return Err("--lr must be a positive number".to_string());
    }
    Ok(Some(Args {
        command,
        config,
        chosen_mixed,
        data_dir,
        json,
        data_parallel,
    }))
}

fn describe(args: &Args, data: &FashionMnist) -> String {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!(
        "{}\n{}, {} epochs, batch {}, seed {}, Adam lr {} (cosine), {}",
        data.describe(),
        args.config.arch.describe(),
        args.config.epochs,
        args.config.batch,
        args.config.seed,
        args.config.lr,
        match args.config.device {
            DeviceChoice::Cpu => format!("CPU ({threads} threads)"),
            gpu => gpu.to_string(),
        },
    )
}

/// Exit code of a run that completed but trained nothing useful: every step was skipped, or
/// the final loss is not finite.
const EXIT_DIVERGED: u8 = 3;

/// Why a finished run's result cannot be trusted, if it cannot.
fn diverged(report: &typed_amp_cli::run::RunReport) -> Option<String> {
    let name = &report.recipe;
    if report.steps > 0 && report.skipped_steps == report.steps {
        return Some(format!(
            "{name}: every one of the {} steps was skipped (inf/NaN gradients at every scale); nothing was trained",
            report.steps
        ));
    }
    match report.epochs.last() {
        Some(last) if !last.train_loss.is_finite() => Some(format!(
            "{name}: the training loss is {} after epoch {} ({} of {} steps skipped); lower --lr",
            last.train_loss, last.epoch, report.skipped_steps, report.steps
        )),
        _ => None,
    }
}

/// How a command ended, when it did not fail.
enum Outcome {
    /// Trained, and the result is usable.
    Done,
    /// Finished, but trained nothing useful: why (printed, exit code 3).
    Diverged(String),
    /// Finished, but a run trained nothing useful and its process said so (exit code 3).
    DivergedReported,
}

/// The arguments of a `typed-amp train --json` process that trains `cfg` on the data in
/// `data_dir` (the default data where `None`).
fn train_args(cfg: &RunConfig, data_dir: Option<&Path>) -> Vec<OsString> {
    let mut args: Vec<OsString> = [
        "train".to_string(),
        "--model".to_string(),
        cfg.arch.name().to_string(),
        "--policy".to_string(),
        cfg.policy.to_string(),
        "--dtype".to_string(),
        cfg.dtype.name().to_string(),
        "--epochs".to_string(),
        cfg.epochs.to_string(),
        "--batch".to_string(),
        cfg.batch.to_string(),
        "--seed".to_string(),
        cfg.seed.to_string(),
        // `Display` of an f64 reads back as the same f64.
        "--lr".to_string(),
        cfg.lr.to_string(),
        "--device".to_string(),
        cfg.device.to_string(),
        "--json".to_string(),
    ]
    .into_iter()
    .map(OsString::from)
    .collect();
    if !cfg.progress {
        args.push("--quiet".into());
    }
    if let Some(dir) = data_dir {
        args.push("--data-dir".into());
        args.push(dir.as_os_str().to_owned());
    }
    args
}

/// What one configuration of `compare` gave, trained by its own process.
struct ChildRun {
    report: RunReport,
    /// Its JSON, as the process printed it.
    json: serde_json::Value,
    /// Whether it finished having trained nothing useful (exit code 3; it said why).
    diverged: bool,
}

/// Trains `cfg` in a `typed-amp train --json` process of its own, so that its memory figures
/// are its own: this process's allocator keeps what an earlier run freed. Its progress bar,
/// warnings and errors go to this process's stderr as they come; its JSON result is read from
/// its stdout. A run that fails ends `compare` with its exit code (its error already printed).
fn run_in_child(cfg: &RunConfig, data_dir: Option<&Path>) -> Result<ChildRun, RunError> {
    let label = cfg.label();
    let program = std::env::current_exe().map_err(|e| {
        RunError::Child(format!(
            "cannot find this program to run {label} in a process of its own: {e}"
        ))
    })?;
    let child = std::process::Command::new(&program)
        .args(train_args(cfg, data_dir))
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
                label,
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
    let report = run_from_json(cfg, &json).map_err(|e| {
        RunError::Child(format!(
            "the {label} run (process {pid}) printed a result that cannot be read: {e}"
        ))
    })?;
    Ok(ChildRun {
        report,
        json,
        diverged,
    })
}

fn main_result(args: Args) -> Result<Outcome, RunError> {
    // A data-parallel rank joins its run first: only rank 0 prints.
    let ranks = if args.data_parallel {
        Some(Ranks::join()?)
    } else {
        None
    };
    let quiet = ranks.as_ref().is_some_and(|r| !r.is_root());
    let data = FashionMnist::load(args.data_dir.as_deref())?;
    if !args.json && !quiet {
        println!("{}\n", describe(&args, &data));
        if let Some(ranks) = &ranks {
            println!("{}\n", ranks.describe(&args.config));
        }
    }
    match args.command {
        Command::Train => {
            let report = match &ranks {
                Some(ranks) => ranks.run(&args.config, &data)?,
                None => run(&args.config, &data)?,
            };
            if quiet {
                return Ok(Outcome::Done);
            }
            let verdict = diverged(&report);
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&run_json(&report))
                        .expect("JSON values serialise")
                );
            } else {
                for e in &report.epochs {
                    println!(
                        "epoch {:>3}  {:6.2} s  loss {:.4}  train {:.2}%  test {:.2}%",
                        e.epoch,
                        e.seconds,
                        e.train_loss,
                        100.0 * e.train_accuracy,
                        100.0 * e.test_accuracy
                    );
                }
                println!(
                    "{}: test accuracy {:.2}%, {} steps ({} skipped), final loss scale {}",
                    report.recipe,
                    100.0 * report.test_accuracy,
                    report.steps,
                    report.skipped_steps,
                    report.final_scale
                );
            }
            Ok(verdict.map_or(Outcome::Done, Outcome::Diverged))
        }
        Command::Compare => {
            let fp32 = RunConfig {
                policy: OptLevel::O0,
                ..args.config.clone()
            };
            let mut configs = vec![fp32];
            if args.chosen_mixed {
                configs.push(args.config.clone());
            } else {
                for dtype in [LowDtype::Fp16, LowDtype::Bf16] {
                    configs.push(RunConfig {
                        dtype,
                        ..args.config.clone()
                    });
                }
            }
            // Each configuration trains in a process of its own, on the data loaded here.
            let data_dir = match &data.origin {
                DataOrigin::Directory(dir) => Some(dir.clone()),
                DataOrigin::Embedded => None,
            };
            let description = data.describe();
            drop(data);
            let runs = configs
                .iter()
                .map(|config| run_in_child(config, data_dir.as_deref()))
                .collect::<Result<Vec<_>, _>>()?;
            if args.json {
                let value = serde_json::json!({
                    "data": description,
                    "runs": runs.iter().map(|r| r.json.clone()).collect::<Vec<_>>(),
                });
                println!(
                    "{}",
                    serde_json::to_string_pretty(&value).expect("JSON values serialise")
                );
            } else {
                let reports: Vec<RunReport> = runs.iter().map(|r| r.report.clone()).collect();
                print!("{}", comparison_table(&reports));
            }
            Ok(if runs.iter().any(|r| r.diverged) {
                Outcome::DivergedReported
            } else {
                Outcome::Done
            })
        }
    }
}

fn main() -> ExitCode {
    // Freed activations stay in the process for the next step instead of going back to the
    // system and being faulted in again (half of the CNN's CPU step otherwise).
    typed_amp::device::keep_freed_memory();
    let args = match parse_args() {
        Ok(Some(args)) => args,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("error: {message}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match main_result(args) {
        Ok(Outcome::Done) => ExitCode::SUCCESS,
        Ok(Outcome::Diverged(verdict)) => {
            eprintln!("error: {verdict}");
            ExitCode::from(EXIT_DIVERGED)
        }
        Ok(Outcome::DivergedReported) => ExitCode::from(EXIT_DIVERGED),
        // The run's own process printed its error.
        Err(RunError::ChildFailed { code, .. }) => ExitCode::from(code),
        Err(RunError::Usage(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}
