//! `typed-amp`: train Fashion-MNIST in FP32 and mixed precision, and compare.

use std::path::PathBuf;
use std::process::ExitCode;

use typed_amp::amp::OptLevel;
use typed_amp_cli::data_parallel::Ranks;
use typed_amp_cli::models::{Arch, LowDtype};
use typed_amp_cli::report::{comparison_table, run_json};
use typed_amp_cli::run::{run, DeviceChoice, RunConfig, RunError};
use typed_amp_data::FashionMnist;

const USAGE: &str = "\
typed-amp: train Fashion-MNIST in FP32 and mixed precision

USAGE:
    typed-amp [compare] [OPTIONS]     train FP32 (O0), O2-FP16 and O2-BF16 alike, print the table
                                      (with --policy or --dtype: FP32 and that one mixed run)
    typed-amp train [OPTIONS]         train one model under one policy

OPTIONS:
    --model mlp|cnn        architecture                                  [default: mlp]
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
                    .map_err(|e: typed_amp::AmpError| e.to_string())?
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

fn main_result(args: Args) -> Result<Option<String>, RunError> {
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
                return Ok(None);
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
            Ok(verdict)
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
            let runs = configs
                .iter()
                .map(|config| run(config, &data))
                .collect::<Result<Vec<_>, _>>()?;
            if args.json {
                let value = serde_json::json!({
                    "data": data.describe(),
                    "runs": runs.iter().map(run_json).collect::<Vec<_>>(),
                });
                println!(
                    "{}",
                    serde_json::to_string_pretty(&value).expect("JSON values serialise")
                );
            } else {
                print!("{}", comparison_table(&runs));
            }
            let verdicts: Vec<String> = runs.iter().filter_map(diverged).collect();
            Ok((!verdicts.is_empty()).then(|| verdicts.join("\n")))
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
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(verdict)) => {
            eprintln!("error: {verdict}");
            ExitCode::from(EXIT_DIVERGED)
        }
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
