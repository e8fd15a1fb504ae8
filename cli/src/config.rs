//! What a run is given (`RunConfig`, `DeviceChoice`), what it reports (`RunReport`,
//! `EpochReport`) and how it fails (`RunError`).

use std::path::PathBuf;
use typed_amp::amp::OptLevel;
use typed_amp::checkpoint::CheckpointError;
use typed_amp::error::AmpError;
use typed_amp_data::{BatchError, DataError};

use crate::models::*;

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
    /// A file given to the command cannot be used for it (a checkpoint that is not a GPT's, an
    /// export whose tensors do not fit the model): the message names it.
    #[error("{0}")]
    File(String),
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

/// Opens GPU `ordinal` as dfdx's CUDA device, seeded with `seed`. cudarc 0.9 panics, rather than
/// erring, when the driver cannot be initialised or the ordinal names no GPU, so both are checked
/// first: `--device cuda:N` where there is no driver or no GPU N is a usage error, not a panic.
#[cfg(feature = "cuda")]
pub fn open_cuda(ordinal: usize, seed: u64) -> Result<typed_amp::dfdx::prelude::Cuda, RunError> {
    use cudarc::driver::result;
    let fail = |why: String| RunError::Usage(format!("cannot open cuda:{ordinal}: {why}"));
    result::init().map_err(|e| fail(format!("the CUDA driver did not initialise ({e})")))?;
    let count = result::device::get_count()
        .map_err(|e| fail(format!("the GPUs could not be counted ({e})")))?;
    let count = usize::try_from(count).unwrap_or(0);
    if ordinal >= count {
        return Err(fail(match count {
            0 => "this machine has no CUDA GPU".to_string(),
            1 => "this machine has one CUDA GPU, cuda:0".to_string(),
            n => format!("this machine has {n} CUDA GPUs, cuda:0 to cuda:{}", n - 1),
        }));
    }
    typed_amp::dfdx::prelude::Cuda::try_build(ordinal, seed).map_err(|e| fail(e.to_string()))
}
