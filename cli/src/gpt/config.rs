//! What a GPT run is given ([`GptConfig`]) and what it reports ([`GptReport`], [`EvalPoint`]).

use std::path::PathBuf;

use typed_amp::amp::OptLevel;
use typed_amp_models::gpt::GptSize;

use crate::config::{DeviceChoice, RunError};
use crate::models::LowDtype;

/// What to train, and how: a GPT of one size under one policy on Shakespeare's characters.
#[derive(Debug, Clone)]
pub struct GptConfig {
    /// nanoGPT's small or baby configuration.
    pub size: GptSize,
    /// O0, or O2 (the GPT is declared under these two only).
    pub policy: OptLevel,
    /// The 16-bit precision of O2 (ignored under O0).
    pub dtype: LowDtype,
    /// O2-BF16 with FP8 linear layers (`#[amp(fp8 = "hybrid")]`, `--fp8`).
    pub fp8: bool,
    /// Iterations of the whole run (counting those a resumed checkpoint already did); the
    /// learning-rate schedule spans them.
    pub iters: usize,
    /// Evaluate the validation loss every this many iterations (and at the last one).
    pub eval_every: usize,
    /// Fixed validation windows the validation loss is the mean over.
    pub eval_windows: usize,
    /// Windows per step.
    pub batch: usize,
    /// AdamW's peak learning rate (after the warm-up; cosine down to a tenth of it).
    pub lr: f64,
    /// Seeds initialisation and the training windows.
    pub seed: u64,
    /// Stop after this many iterations of this invocation (to split a run across processes).
    pub stop_after: Option<usize>,
    /// Write a checkpoint here at every evaluation and when this invocation stops.
    pub save: Option<PathBuf>,
    /// Continue from this checkpoint.
    pub resume: Option<PathBuf>,
    /// Show a progress bar.
    pub progress: bool,
    /// The device to train on.
    pub device: DeviceChoice,
}

/// The fewest iterations between evaluations `--eval-every` takes by default: 250 for the small
/// GPT, 500 for the baby one (nanoGPT's `eval_interval` of its two character-level configs).
pub fn default_eval_every(size: GptSize) -> usize {
    match size {
        GptSize::Small => 250,
        GptSize::Baby => 500,
    }
}

/// Validation windows by default (`--eval-windows`).
pub const DEFAULT_EVAL_WINDOWS: usize = 1024;

/// The most iterations a run may ask for: far beyond any real run, small enough that every
/// count derived from it (tokens, RNG words) fits.
pub const MAX_ITERS: usize = 1_000_000_000;

impl GptConfig {
    /// The defaults of `size`: its iterations and batch, evaluations every
    /// [`default_eval_every`] iterations over [`DEFAULT_EVAL_WINDOWS`] windows, lr 1e-3, seed
    /// 0, O2 in FP16, on the CPU.
    pub fn new(size: GptSize) -> Self {
        Self {
            size,
            policy: OptLevel::O2,
            dtype: LowDtype::Fp16,
            fp8: false,
            iters: size.iterations(),
            eval_every: default_eval_every(size),
            eval_windows: DEFAULT_EVAL_WINDOWS,
            batch: size.batch(),
            lr: 1e-3,
            seed: 0,
            stop_after: None,
            save: None,
            resume: None,
            progress: true,
            device: DeviceChoice::Cpu,
        }
    }

    /// The run's name in tables: `FP32 (O0)`, `O2-FP16`, `O2-BF16`.
    pub fn label(&self) -> String {
        match self.policy {
            OptLevel::O0 => "FP32 (O0)".to_string(),
            level if self.fp8 => format!("{level}-{}+FP8", self.dtype.upper()),
            level => format!("{level}-{}", self.dtype.upper()),
        }
    }

    /// The precision the run computes its matrix products in: `fp32`, `fp16` or `bf16`.
    pub fn compute_dtype(&self) -> &'static str {
        match self.policy {
            OptLevel::O0 => "fp32",
            _ => self.dtype.name(),
        }
    }

    /// Tokens per window.
    pub fn context(&self) -> usize {
        self.size.context()
    }

    /// Errors (usage) unless the settings describe a run: a policy the GPT is declared under,
    /// a batch, iterations, evaluation settings and a learning rate that make sense.
    pub fn validate(&self) -> Result<(), RunError> {
        check_policy(self.policy)?;
        let usage = |m: String| Err(RunError::Usage(m));
        if self.fp8 && (self.policy != OptLevel::O2 || self.dtype != LowDtype::Bf16) {
            return usage(
                "--fp8 is a recipe on top of O2-BF16: give it with --policy O2 --dtype bf16"
                    .to_string(),
            );
        }
        if self.batch == 0 {
            return usage("--batch must be at least 1".to_string());
        }
        if self.iters == 0 || self.iters > MAX_ITERS {
            return usage(format!(
                "--iters must be between 1 and {MAX_ITERS}, got {}",
                self.iters
            ));
        }
        if self.eval_every == 0 {
            return usage("--eval-every must be at least 1".to_string());
        }
        if self.eval_windows == 0 {
            return usage("--eval-windows must be at least 1".to_string());
        }
        if self.stop_after == Some(0) {
            return usage("--stop-after must be at least 1".to_string());
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return usage("--lr must be a positive number".to_string());
        }
        Ok(())
    }

    /// Whether iteration `done` (counted from 1) ends with an evaluation: every
    /// `--eval-every` iterations and at the run's last one.
    pub fn evaluates_after(&self, done: usize) -> bool {
        done.is_multiple_of(self.eval_every) || done == self.iters
    }
}

/// Errors (usage) unless the GPT is declared under `policy`: O0 and O2 (FP16 or BF16).
pub fn check_policy(policy: OptLevel) -> Result<(), RunError> {
    match policy {
        OptLevel::O0 | OptLevel::O2 => Ok(()),
        other => Err(RunError::Usage(format!(
            "--model gpt is declared under O0 (FP32) and O2 (--dtype fp16 or bf16) only: there is no {other} GPT"
        ))),
    }
}

/// One evaluation of the validation loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalPoint {
    /// Iterations done when it was measured.
    pub iteration: u64,
    /// Mean cross-entropy over the fixed validation windows (nats per character).
    pub val_loss: f64,
    /// The smoothed training loss then.
    pub train_loss: f64,
}

/// A GPT run's results.
#[derive(Debug, Clone)]
pub struct GptReport {
    /// The configuration.
    pub config: GptConfig,
    /// The model's recipe, as `#[amp]` compiled it.
    pub recipe: String,
    /// Whether the model keeps FP32 master weights beside a separate working copy.
    pub master_weights: bool,
    /// The evaluations of this invocation (every `--eval-every` iterations, at the run's last
    /// one, and where `--stop-after` stopped it).
    pub evals: Vec<EvalPoint>,
    /// The validation loss when this invocation stopped.
    pub val_loss: f64,
    /// The lowest validation loss of the run's scheduled evaluations (those of the run a
    /// checkpoint resumed included; an evaluation where `--stop-after` stopped off the
    /// schedule is not one); the final one where there were none.
    pub best_val_loss: f64,
    /// The smoothed training loss at the end (an exponential moving average, weight 0.1 on the
    /// newest iteration, of the iterations whose loss was finite).
    pub train_loss: f64,
    /// The last iteration's training loss.
    pub last_loss: f32,
    /// Iterations done in all (a resumed run's included).
    pub iterations: u64,
    /// Iterations trained in this invocation.
    pub iterations_run: u64,
    /// Seconds spent in training steps in this invocation (evaluations and checkpoints not).
    pub train_seconds: f64,
    /// Training tokens per second of step time.
    pub tokens_per_second: f64,
    /// Steps skipped because of inf/NaN gradients (a resumed run's included).
    pub skipped_steps: u64,
    /// Of those, the ones after the first 20 iterations (where the dynamic loss scale has
    /// come down from 65,536 to where the gradients fit).
    pub skipped_after_20: u64,
    /// The loss scale at the end.
    pub final_scale: f32,
    /// Bytes of parameters held: master weights plus the working copy where separate.
    pub weights_bytes: usize,
    /// Size of the checkpoint file.
    pub checkpoint_bytes: u64,
    /// Peak resident memory of the process during the run, where the OS reports it.
    pub peak_rss_bytes: Option<u64>,
    /// The most heap bytes held at once from the first training step to the end.
    pub peak_heap_bytes: Option<u64>,
    /// What the training loop itself held at its peak (the peak less what was held when it
    /// started: the corpus, the model and its master weights).
    pub loop_peak_bytes: Option<u64>,
    /// The process that trained.
    pub pid: u32,
}
