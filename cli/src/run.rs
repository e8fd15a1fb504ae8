//! One training run: a model under a policy, trained on Fashion-MNIST with the typed step,
//! with checkpoints, progress and the figures the comparison table needs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use typed_amp::amp::{AmpConfig, AmpModel, MasterOf, OptLevel, WorkingOf};
use typed_amp::checkpoint::{self, CheckpointError};
use typed_amp::device::Kernels;
use typed_amp::dfdx::optim::Adam;
use typed_amp::loss::try_cross_entropy_with_logits_loss;
use typed_amp::optim::{cosine_lr, LearningRate, MasterOptimizer, OptimizerState};
use typed_amp::prelude::*;
use typed_amp::{
    AmpDevice, AmpElem, AmpError, LowPrecisionUpdates, Parameters, Precision, TrainTarget,
};
use typed_amp_data::{BatchError, DataError, FashionMnist, Normalize, Split, CLASSES};
pub use typed_amp_data::{Flat, Image, Layout};

use crate::models::*;
use crate::{heap, memory};

/// Pixels are normalised by Fashion-MNIST's mean and standard deviation.
const NORMALIZE: Normalize = Normalize::FASHION_MNIST;
/// Test images evaluated per forward pass.
const EVAL_BATCH: usize = 500;

/// Everything that can end a run early.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The data set could not be loaded.
    #[error(transparent)]
    Data(#[from] DataError),
    /// A batch could not be built.
    #[error(transparent)]
    Batch(#[from] BatchError),
    /// Training failed on the device.
    #[error(transparent)]
    Amp(#[from] AmpError),
    /// A checkpoint could not be written or read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The arguments do not describe a run.
    #[error("{0}")]
    Usage(String),
    /// A run of `compare`, trained in a process of its own, failed with exit code `code` (1 or
    /// 2) after printing its error.
    #[error("the {label} run failed with exit code {code}")]
    ChildFailed {
        /// The run (`O2-FP16`).
        label: String,
        /// Its process's exit code.
        code: u8,
    },
    /// A run of `compare` could not be started in a process of its own, ended abnormally, or
    /// printed no readable result.
    #[error("{0}")]
    Child(String),
}

/// What to train, and how.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The architecture.
    pub arch: Arch,
    /// The mixed-precision policy.
    pub policy: OptLevel,
    /// The 16-bit precision of O1, O2 and O3 (ignored under O0).
    pub dtype: LowDtype,
    /// Epochs to train (in total, counting those a resumed checkpoint already did); the
    /// learning-rate schedule spans them.
    pub epochs: usize,
    /// Stop after this many epochs in this invocation (to split a run across processes).
    pub stop_after: Option<usize>,
    /// Examples per step.
    pub batch: usize,
    /// Seeds initialisation and data order.
    pub seed: u64,
    /// Adam's learning rate at the start; it follows a cosine schedule down to 0 at the end.
    pub lr: f64,
    /// Write a checkpoint here after every epoch.
    pub save: Option<PathBuf>,
    /// Continue from this checkpoint.
    pub resume: Option<PathBuf>,
    /// Show a progress bar.
    pub progress: bool,
    /// The device to train on.
    pub device: DeviceChoice,
}

/// One epoch's figures.
#[derive(Debug, Clone)]
pub struct EpochReport {
    /// Epoch number, from 1.
    pub epoch: usize,
    /// Training time (forward, backward, step), excluding evaluation.
    pub seconds: f64,
    /// Mean training loss over the epoch.
    pub train_loss: f32,
    /// Training accuracy over the epoch.
    pub train_accuracy: f32,
    /// Test accuracy after the epoch.
    pub test_accuracy: f32,
}

/// A run's results.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// The configuration.
    pub config: RunConfig,
    /// The model's recipe, as `#[amp]` compiled it.
    pub recipe: String,
    /// Whether the model keeps FP32 master weights beside a separate working copy.
    pub master_weights: bool,
    /// Epochs trained in this process.
    pub epochs: Vec<EpochReport>,
    /// Test accuracy at the end.
    pub test_accuracy: f32,
    /// Optimizer steps taken in total (including skipped ones).
    pub steps: u64,
    /// Steps skipped because of inf/NaN gradients.
    pub skipped_steps: u64,
    /// The loss scale at the end.
    pub final_scale: f32,
    /// Bytes of parameters held: master weights plus the working copy where separate.
    pub weights_bytes: usize,
    /// Size of the checkpoint file.
    pub checkpoint_bytes: u64,
    /// Peak resident memory of the process during the run, where the OS reports it.
    pub peak_rss_bytes: Option<u64>,
    /// The most heap bytes held at once from the first training step to the end of training
    /// (evaluations and checkpoints included, loading the data and building the model not),
    /// where the process counts them ([`crate::heap::CountingAllocator`]).
    pub peak_heap_bytes: Option<u64>,
    /// What the training loop itself held at its peak: [`RunReport::peak_heap_bytes`] less
    /// what was held when it started (the data set, the model and its master weights): the
    /// step's activations, gradients and optimizer state.
    pub loop_peak_bytes: Option<u64>,
    /// The process that trained.
    pub pid: u32,
}

impl RunConfig {
    /// The run's name in tables: `FP32 (O0)`, `O2-FP16`, `O2-BF16`.
    pub fn label(&self) -> String {
        match self.policy {
            OptLevel::O0 => "FP32 (O0)".to_string(),
            level => format!("{level}-{}", self.dtype.upper()),
        }
    }

    /// The precision the run computes its matrix products in, as JSON and tables name it.
    pub fn compute_dtype(&self) -> &'static str {
        match self.policy {
            OptLevel::O0 => "fp32",
            _ => self.dtype.name(),
        }
    }
}

impl RunReport {
    /// Mean training time per epoch.
    pub fn seconds_per_epoch(&self) -> f64 {
        if self.epochs.is_empty() {
            0.0
        } else {
            self.epochs.iter().map(|e| e.seconds).sum::<f64>() / self.epochs.len() as f64
        }
    }
}

/// The element type of `M`'s input: the precision its entry casts to (FP32 under O0 and O1,
/// the 16-bit precision under O2 and O3), in which its batches are built.
pub type InputElem<M, D> = <<M as AmpModel<D>>::Input as Precision>::Elem;

pub(crate) type Logits<D, T = NoneTape> = Tensor<(usize, Const<CLASSES>), f32, D, T>;

/// How many rows of `logits` predict `labels`.
pub(crate) fn correct(logits: &[f32], labels: &[u8]) -> usize {
    logits
        .chunks(CLASSES)
        .zip(labels)
        .filter(|(row, &label)| {
            let predicted = row
                .iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
                    if v > best.1 {
                        (i, v)
                    } else {
                        best
                    }
                })
                .0;
            predicted == usize::from(label)
        })
        .count()
}

/// The share of `test` that `model` classifies right, from batches in precision `E`.
pub(crate) fn evaluate<I: Layout, E: AmpElem, W, D: AmpDevice + Kernels<E>>(
    dev: &D,
    model: &W,
    test: &Split,
) -> Result<f32, RunError>
where
    W: Module<Tensor<I::Shape, E, D>, Output = Logits<D>, Error = D::Err>,
{
    let indices: Vec<usize> = (0..test.len()).collect();
    let mut right = 0;
    for chunk in indices.chunks(EVAL_BATCH) {
        let batch = test.batch::<I, E, D>(dev, chunk, NORMALIZE)?;
        let logits = model.try_forward(batch.images).map_err(AmpError::device)?;
        right += correct(&logits.as_vec(), &batch.labels);
    }
    Ok(right as f32 / test.len().max(1) as f32)
}

/// Peak resident memory since the last reset, from `/proc/self/status` (Linux).
pub(crate) fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Starts a new peak-memory measurement (Linux's `clear_refs`; ignored elsewhere).
pub(crate) fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

pub(crate) fn meta_get<T: std::str::FromStr>(
    meta: &BTreeMap<String, String>,
    key: &str,
) -> Result<T, RunError> {
    meta.get(key).and_then(|v| v.parse().ok()).ok_or_else(|| {
        RunError::Usage(format!(
            "the checkpoint has no valid `{key}`: was it written by `typed-amp train`?"
        ))
    })
}

/// Refuses a batch whose training step would not fit in the memory left to the process
/// ([`memory::available`]), naming the batch that would: the alternative is an abort or the
/// OOM killer in the middle of the first step.
pub(crate) fn check_memory(
    cfg: &RunConfig,
    train_examples: usize,
    weights_bytes: usize,
    master_bytes: usize,
) -> Result<(), RunError> {
    let Some((available, limit)) = memory::available() else {
        return Ok(());
    };
    let per_example = cfg.arch.step_bytes_per_example(cfg.policy);
    // A step takes at most the whole training set.
    let examples = cfg.batch.min(train_examples) as u64;
    // Weights and their gradients, and Adam's two moments per master weight.
    let fixed = (weights_bytes as u64)
        .saturating_add(master_bytes as u64)
        .saturating_mul(2);
    let needed = fixed.saturating_add(per_example.saturating_mul(examples));
    if needed <= available {
        return Ok(());
    }
    let fits = available.saturating_sub(fixed) / per_example;
    // A tenth spare: the estimate is within a few per cent, not exact.
    let advice = match fits - fits / 10 {
        0 => "not even one example fits".to_string(),
        suggested => format!("use a smaller --batch, such as {suggested}"),
    };
    Err(RunError::Usage(format!(
        "--batch {} needs about {} per step (the {}'s activations: {} per example for {examples} examples, and {} of weights, gradients and optimizer state), more than the {} {limit}; {advice}",
        cfg.batch,
        memory::human(needed),
        cfg.arch.upper(),
        memory::human(per_example),
        memory::human(fixed),
        memory::human(available),
    )))
}

/// An epoch's progress bar (hidden unless `show`).
pub(crate) fn epoch_bar(
    cfg: &RunConfig,
    epoch: usize,
    steps_per_epoch: usize,
    show: bool,
) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(steps_per_epoch as u64);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>14} [{bar:28}] {pos}/{len} {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(format!("{} epoch {}", cfg.policy, epoch + 1));
    bar
}

/// The training loss and accuracy of an epoch so far.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Tally {
    /// The sum of the batches' mean losses, each weighted by its examples.
    pub(crate) loss_sum: f64,
    pub(crate) right: usize,
    pub(crate) seen: usize,
}

impl Tally {
    pub(crate) fn loss(&self) -> f32 {
        (self.loss_sum / self.seen.max(1) as f64) as f32
    }

    pub(crate) fn accuracy(&self) -> f32 {
        self.right as f32 / self.seen.max(1) as f32
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "loss {:.4}  acc {:.2}%",
            self.loss(),
            100.0 * self.accuracy()
        )
    }
}

/// The training forward of one batch (the examples `chunk` of `train`, in precision `E`)
/// traced into `grads`: its FP32 loss, counted into `tally`.
pub(crate) fn forward_loss<I, E, W, D>(
    dev: &D,
    working: &mut W,
    train: &Split,
    chunk: &[usize],
    grads: MixedGradients<D>,
    tally: &mut Tally,
) -> Result<Loss<D>, RunError>
where
    I: Layout,
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
    W: ModuleMut<
        Tensor<I::Shape, E, D, MixedTape<D>>,
        Output = Logits<D, MixedTape<D>>,
        Error = D::Err,
    >,
{
    let batch = train.batch::<I, E, D>(dev, chunk, NORMALIZE)?;
    let logits = working
        .try_forward_mut(batch.images.traced_mixed(grads))
        .map_err(AmpError::device)?;
    tally.right += correct(&logits.as_vec(), &batch.labels);
    tally.seen += chunk.len();
    let loss =
        try_cross_entropy_with_logits_loss(logits, batch.targets).map_err(AmpError::device)?;
    tally.loss_sum += f64::from(loss.value()) * chunk.len() as f64;
    Ok(loss)
}

/// Every model, policy and dtype the CLI trains, each as `$train!(Model, Layout, optimizer
/// dtype)` with the caller's `train!`: FP32 Adam on the master weights, or (O3) 16-bit Adam on
/// the 16-bit weights, opted into.
macro_rules! for_each_model {
    ($cfg:expr, $train:ident) => {{
        use typed_amp::amp::OptLevel;
        use typed_amp::half::{bf16, f16};
        use $crate::models::LowDtype::{Bf16, Fp16};
        use $crate::models::*;
        use $crate::run::{Flat, Image};
        match ($cfg.arch, $cfg.policy, $cfg.dtype) {
            (Arch::Mlp, OptLevel::O0, _) => $train!(MlpO0, Flat, f32),
            (Arch::Mlp, OptLevel::O1, Fp16) => $train!(MlpO1, Flat, f32),
            (Arch::Mlp, OptLevel::O2, Fp16) => $train!(MlpO2, Flat, f32),
            (Arch::Mlp, OptLevel::O3, Fp16) => $train!(MlpO3, Flat, f16),
            (Arch::Mlp, OptLevel::O1, Bf16) => $train!(MlpO1Bf16, Flat, f32),
            (Arch::Mlp, OptLevel::O2, Bf16) => $train!(MlpO2Bf16, Flat, f32),
            (Arch::Mlp, OptLevel::O3, Bf16) => $train!(MlpO3Bf16, Flat, bf16),
            (Arch::Cnn, OptLevel::O0, _) => $train!(CnnO0, Image, f32),
            (Arch::Cnn, OptLevel::O1, Fp16) => $train!(CnnO1, Image, f32),
            (Arch::Cnn, OptLevel::O2, Fp16) => $train!(CnnO2, Image, f32),
            (Arch::Cnn, OptLevel::O3, Fp16) => $train!(CnnO3, Image, f16),
            (Arch::Cnn, OptLevel::O1, Bf16) => $train!(CnnO1Bf16, Image, f32),
            (Arch::Cnn, OptLevel::O2, Bf16) => $train!(CnnO2Bf16, Image, f32),
            (Arch::Cnn, OptLevel::O3, Bf16) => $train!(CnnO3Bf16, Image, bf16),
            (Arch::Vit, OptLevel::O0, _) => $train!(VitO0, Flat, f32),
            (Arch::Vit, OptLevel::O1, Fp16) => $train!(VitO1, Flat, f32),
            (Arch::Vit, OptLevel::O2, Fp16) => $train!(VitO2, Flat, f32),
            (Arch::Vit, OptLevel::O3, Fp16) => $train!(VitO3, Flat, f16),
            (Arch::Vit, OptLevel::O1, Bf16) => $train!(VitO1Bf16, Flat, f32),
            (Arch::Vit, OptLevel::O2, Bf16) => $train!(VitO2Bf16, Flat, f32),
            (Arch::Vit, OptLevel::O3, Bf16) => $train!(VitO3Bf16, Flat, bf16),
        }
    }};
}

#[cfg(feature = "mpi")] // for `data_parallel`
pub(crate) use for_each_model;

/// Where a run resumes from the checkpoint at `path` (its metadata `meta`): the epochs and
/// steps it has done. A checkpoint of other settings, of a finished run, or whose step count is
/// no whole number of this run's epochs is a usage error.
pub(crate) fn resume_point(
    cfg: &RunConfig,
    path: &std::path::Path,
    meta: &BTreeMap<String, String>,
    steps_per_epoch: usize,
    train_len: usize,
) -> Result<(usize, u64), RunError> {
    let expect = |key: &str, value: String| -> Result<(), RunError> {
        match meta.get(key) {
            Some(saved) if *saved == value => Ok(()),
            saved => Err(RunError::Usage(format!(
                "{} was saved with {key} = {}, this run has {value}",
                path.display(),
                saved.map_or("nothing", String::as_str)
            ))),
        }
    };
    expect("model", cfg.arch.name().to_string())?;
    expect("policy", cfg.policy.to_string())?;
    expect("dtype", cfg.compute_dtype().to_string())?;
    expect("batch", cfg.batch.to_string())?;
    expect("seed", cfg.seed.to_string())?;
    expect("epochs", cfg.epochs.to_string())?;
    expect("lr", cfg.lr.to_string())?;
    let done: usize = meta_get(meta, "epoch")?;
    if done >= cfg.epochs {
        // Resuming would train nothing and exit as if it had.
        return Err(RunError::Usage(format!(
            "{} has already finished {done} epochs of a run of {} epochs: there is nothing left to train{}",
            path.display(),
            cfg.epochs,
            if done > cfg.epochs {
                " (no run finishes more epochs than it has: the checkpoint is damaged)"
            } else {
                ""
            }
        )));
    }
    // Checkpoints are written at the end of an epoch: a step count that is not a whole
    // number of this run's epochs belongs to other data or another batch size.
    let step: u64 = meta_get(meta, "step")?;
    if (steps_per_epoch as u64).checked_mul(done as u64) != Some(step) {
        return Err(RunError::Usage(format!(
            "{} records {step} steps after {done} epochs, but this run takes {steps_per_epoch} steps per epoch ({} training examples, batch {}): it was trained on other data, or is damaged",
            path.display(),
            train_len,
            cfg.batch
        )));
    }
    Ok((done, step))
}

/// Trains one model under one policy.
fn run_model<M, I, O, D>(
    cfg: &RunConfig,
    data: &FashionMnist,
    dev: D,
    make_optimizer: impl FnOnce(&MasterOf<M, D>) -> O,
) -> Result<RunReport, RunError>
where
    D: AmpDevice + Kernels<InputElem<M, D>>,
    M: AmpModel<D>,
    I: Layout,
    // Batches come in the model's entry precision: its entry cast has nothing to do.
    WorkingOf<M, D>: ModuleMut<
            Tensor<I::Shape, InputElem<M, D>, D, MixedTape<D>>,
            Output = Logits<D, MixedTape<D>>,
            Error = D::Err,
        > + Module<Tensor<I::Shape, InputElem<M, D>, D>, Output = Logits<D>, Error = D::Err>,
    O: MasterOptimizer<MasterOf<M, D>, D> + OptimizerState<D> + LearningRate,
{
    if cfg.batch == 0 {
        return Err(RunError::Usage("--batch must be at least 1".to_string()));
    }
    reset_peak_rss();
    let mut model = M::try_build(&dev)?;
    // The layout is the master's parameter summary.
    let master_bytes: usize = model.layout().iter().map(|p| p.size_in_bytes()).sum();
    let weights_bytes = if M::CONFIG.master_weights {
        let working = model.working().param_summary();
        master_bytes + working.iter().map(|p| p.size_in_bytes()).sum::<usize>()
    } else {
        master_bytes
    };
    let train = &data.train;
    check_memory(cfg, train.len(), weights_bytes, master_bytes)?;
    let steps_per_epoch = train.len().div_ceil(cfg.batch);
    let total_steps = (steps_per_epoch as u64)
        .checked_mul(cfg.epochs as u64)
        .ok_or_else(|| {
            RunError::Usage(format!(
                "--epochs {} of {steps_per_epoch} steps each is more steps than can be counted",
                cfg.epochs
            ))
        })?;
    let mut opt = make_optimizer(model.master());
    let mut scaler = M::scaler();
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let (mut first_epoch, mut steps) = (0usize, 0u64);

    if let Some(path) = &cfg.resume {
        // The run's settings are checked first: a checkpoint of another policy is a usage error.
        let meta = checkpoint::read_metadata(path)?;
        // A data-parallel run's checkpoint resumes only with `--data-parallel` on as many ranks.
        typed_amp::distributed::check_world_size(&meta, 1)
            .map_err(|e| RunError::Usage(format!("{}: {e}", path.display())))?;
        let (done, step) = resume_point(cfg, path, &meta, steps_per_epoch, train.len())?;
        checkpoint::load_with_policy(path, &mut model, &mut opt, &mut scaler, &M::CONFIG)?;
        (first_epoch, steps) = (done, step);
        rng.set_word_pos(meta_get::<u128>(&meta, "rng_word_pos")?);
    }

    let mut grads = model.alloc_grads()?;
    let mut epochs = Vec::new();
    // Saturating: `--stop-after 18446744073709551615` means "to the end", not a wrapped sum.
    let last_epoch = cfg.stop_after.map_or(cfg.epochs, |n| {
        first_epoch.saturating_add(n).min(cfg.epochs)
    });
    heap::reset_peak();
    let heap_at_start = heap::current();
    for epoch in first_epoch..last_epoch {
        let mut order: Vec<usize> = (0..train.len()).collect();
        order.shuffle(&mut rng);
        let bar = epoch_bar(cfg, epoch, steps_per_epoch, cfg.progress);
        let mut tally = Tally::default();
        let started = Instant::now();
        for chunk in order.chunks(cfg.batch) {
            opt.set_learning_rate(cosine_lr(cfg.lr, steps, total_steps));
            let loss = forward_loss::<I, InputElem<M, D>, _, D>(
                &dev,
                model.working_mut(),
                train,
                chunk,
                grads,
                &mut tally,
            )?;
            let scaled = scaler.scale(loss).backward()?;
            let unscaled = scaler.unscale(&mut model, scaled)?;
            let outcome = scaler.step(&mut opt, unscaled)?;
            grads = scaler.update(outcome)?;
            steps += 1;
            bar.inc(1);
            if cfg.progress {
                bar.set_message(format!("{tally}  scale {}", scaler.get_scale()));
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        bar.finish_and_clear();
        let test_accuracy =
            evaluate::<I, InputElem<M, D>, _, D>(&dev, model.working(), &data.test)?;
        epochs.push(EpochReport {
            epoch: epoch + 1,
            seconds,
            train_loss: tally.loss(),
            train_accuracy: tally.accuracy(),
            test_accuracy,
        });
        if let Some(path) = &cfg.save {
            let meta = run_metadata(cfg, epoch + 1, steps, rng.get_word_pos());
            checkpoint::save_with_policy(path, &mut model, &opt, &scaler, &M::CONFIG, &meta)?;
        }
    }

    let test_accuracy = match epochs.last() {
        Some(e) => e.test_accuracy,
        None => evaluate::<I, InputElem<M, D>, _, D>(&dev, model.working(), &data.test)?,
    };
    let peak_heap_bytes = heap::peak();
    let loop_peak_bytes = peak_heap_bytes
        .zip(heap_at_start)
        .map(|(p, s)| p.saturating_sub(s));
    let peak_rss_bytes = peak_rss();
    let checkpoint_bytes = match &cfg.save {
        Some(path) => std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        None => measure_checkpoint(&mut model, &opt, &scaler, &M::CONFIG)?,
    };
    Ok(RunReport {
        config: cfg.clone(),
        recipe: M::CONFIG.to_string(),
        master_weights: M::CONFIG.master_weights,
        epochs,
        test_accuracy,
        steps,
        skipped_steps: scaler.skipped_steps(),
        final_scale: scaler.get_scale(),
        weights_bytes,
        checkpoint_bytes,
        peak_rss_bytes,
        peak_heap_bytes,
        loop_peak_bytes,
        pid: std::process::id(),
    })
}

pub(crate) fn run_metadata(
    cfg: &RunConfig,
    epoch: usize,
    step: u64,
    word_pos: u128,
) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("model".to_string(), cfg.arch.name().to_string()),
        ("policy".to_string(), cfg.policy.to_string()),
        ("dtype".to_string(), cfg.compute_dtype().to_string()),
        ("batch".to_string(), cfg.batch.to_string()),
        ("seed".to_string(), cfg.seed.to_string()),
        ("lr".to_string(), cfg.lr.to_string()),
        ("epochs".to_string(), cfg.epochs.to_string()),
        ("epoch".to_string(), epoch.to_string()),
        ("step".to_string(), step.to_string()),
        ("rng".to_string(), "ChaCha8".to_string()),
        ("rng_word_pos".to_string(), word_pos.to_string()),
    ])
}

/// Size of the run's checkpoint, written to a temporary file and removed.
pub(crate) fn measure_checkpoint<D: AmpDevice, T: TrainTarget<D>, O: OptimizerState<D>>(
    model: &mut T,
    opt: &O,
    scaler: &GradScaler,
    policy: &AmpConfig,
) -> Result<u64, RunError> {
    let path =
        std::env::temp_dir().join(format!("typed-amp-size-{}.safetensors", std::process::id()));
    let size = checkpoint::save_with_policy(&path, model, opt, scaler, policy, &BTreeMap::new())?;
    let _ = std::fs::remove_file(&path);
    Ok(size)
}

/// The device a run trains on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The CPU.
    Cpu,
    /// An NVIDIA GPU, by ordinal (with the `cuda` feature).
    Cuda(usize),
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceChoice::Cuda)
                .ok_or_else(|| format!("unknown device `{other}`: expected cpu or cuda:N")),
        }
    }
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceChoice::Cpu => write!(f, "cpu"),
            DeviceChoice::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Holds `--save PATH` for one run: a lock on `.NAME.lock` beside it, released when the
/// process ends, however it ends.
#[derive(Debug)]
pub struct SaveClaim {
    _lock: Option<std::fs::File>,
}

/// Claims `save` for this run. Refused (a usage error) while another process holds it: two
/// runs saving to one file would overwrite each other's epochs, each run's checkpoint a mix.
/// Returns the claim and warnings for stderr: the file exists and is not the checkpoint being
/// resumed (the first epoch will overwrite it), or a running process is writing it without
/// holding the lock (an older `typed-amp`).
pub fn claim_save_path(
    save: &Path,
    resume: Option<&Path>,
) -> Result<(SaveClaim, Vec<String>), RunError> {
    use std::io::{Read, Seek, Write};
    let dir = save
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = save
        .file_name()
        .ok_or_else(|| RunError::Usage(format!("--save {}: not a file name", save.display())))?
        .to_string_lossy()
        .into_owned();
    let mut warnings = Vec::new();
    let lock_path = dir.join(format!(".{name}.lock"));
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .ok();
    let lock = match lock {
        Some(mut file) => match file.try_lock() {
            Ok(()) => {
                // The holder's pid, for the message another run gets.
                let _ = file.set_len(0);
                let _ = write!(file, "{}", std::process::id());
                Some(file)
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file
                    .rewind()
                    .and_then(|()| file.read_to_string(&mut holder));
                let holder = holder.trim();
                return Err(RunError::Usage(format!(
                    "--save {}: another run{} is saving to this file; two runs saving to one file overwrite each other's epochs: choose another --save",
                    save.display(),
                    if holder.is_empty() {
                        String::new()
                    } else {
                        format!(" (process {holder})")
                    }
                )));
            }
            // A file system without locks: the other checks still run.
            Err(std::fs::TryLockError::Error(_)) => None,
        },
        None => None,
    };
    let prefix = format!(".{name}.tmp-");
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && Path::new("/proc").join(pid.to_string()).exists() {
            warnings.push(format!(
                "{} belongs to process {pid}, which is running: another program may be writing {}",
                entry.path().display(),
                save.display()
            ));
        }
    }
    let same_file = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    if save.exists() && !resume.is_some_and(|r| same_file(save, r)) {
        warnings.push(format!(
            "--save {} already exists and is not the checkpoint being resumed: the first epoch will overwrite it",
            save.display()
        ));
    }
    Ok((SaveClaim { _lock: lock }, warnings))
}

/// Trains `cfg.arch` under `cfg.policy` with Adam, on `cfg.device`. With `cfg.save`, claims it
/// first ([`claim_save_path`]), printing its warnings on stderr.
pub fn run(cfg: &RunConfig, data: &FashionMnist) -> Result<RunReport, RunError> {
    let _claim = match &cfg.save {
        Some(save) => {
            let (claim, warnings) = claim_save_path(save, cfg.resume.as_deref())?;
            for warning in warnings {
                eprintln!("warning: {warning}");
            }
            Some(claim)
        }
        None => None,
    };
    match cfg.device {
        DeviceChoice::Cpu => run_on(cfg, data, Cpu::seed_from_u64(cfg.seed)),
        #[cfg(feature = "cuda")]
        DeviceChoice::Cuda(ordinal) => {
            let dev = typed_amp::dfdx::prelude::Cuda::try_build(ordinal, cfg.seed)
                .map_err(|e| RunError::Usage(format!("cannot open cuda:{ordinal}: {e}")))?;
            run_on(cfg, data, dev)
        }
        #[cfg(not(feature = "cuda"))]
        DeviceChoice::Cuda(_) => Err(RunError::Usage(format!(
            "device `{}` needs a build with CUDA: `cargo run --release -p typed-amp-cli --features cuda -- ...`",
            cfg.device
        ))),
    }
}

fn run_on<D: AmpDevice>(
    cfg: &RunConfig,
    data: &FashionMnist,
    dev: D,
) -> Result<RunReport, RunError> {
    let adam = AdamConfig {
        lr: cfg.lr,
        ..Default::default()
    };
    // FP32 Adam on the master weights, or (O3) 16-bit Adam on the 16-bit weights, opted into.
    macro_rules! train {
        ($model:ty, $input:ty, f32) => {
            run_model::<$model, $input, _, D>(cfg, data, dev, |m| Adam::<_, f32, D>::new(m, adam))
        };
        ($model:ty, $input:ty, $low:ty) => {
            run_model::<$model, $input, _, D>(cfg, data, dev, |m| {
                LowPrecisionUpdates(Adam::<_, $low, D>::new(m, adam))
            })
        };
    }
    for_each_model!(cfg, train)
}

#[cfg(test)]
mod tests {
    use super::*;
    use typed_amp::precision::dtype_of;
    use typed_amp::DType;

    /// Batches are built in each model's entry precision: FP32 under O0 and O1 (O1 casts
    /// per layer), the 16-bit precision under O2 and O3, which their entry cast then keeps.
    #[test]
    fn each_model_takes_its_batches_in_its_entry_precision() {
        assert_eq!(dtype_of::<InputElem<MlpO0, Cpu>>(), DType::F32);
        assert_eq!(dtype_of::<InputElem<MlpO1, Cpu>>(), DType::F32);
        assert_eq!(dtype_of::<InputElem<MlpO2, Cpu>>(), DType::F16);
        assert_eq!(dtype_of::<InputElem<MlpO3, Cpu>>(), DType::F16);
        assert_eq!(dtype_of::<InputElem<MlpO2Bf16, Cpu>>(), DType::BF16);
        assert_eq!(dtype_of::<InputElem<CnnO0, Cpu>>(), DType::F32);
        assert_eq!(dtype_of::<InputElem<CnnO2, Cpu>>(), DType::F16);
        assert_eq!(dtype_of::<InputElem<CnnO3Bf16, Cpu>>(), DType::BF16);
    }
}
