//! What an epoch does with its batches: the training forward and its tally, the evaluation,
//! and the progress bar.

use indicatif::{ProgressBar, ProgressStyle};
use typed_amp::amp::AmpModel;
use typed_amp::device::Kernels;
use typed_amp::loss::try_cross_entropy_with_logits_loss;
use typed_amp::prelude::*;
use typed_amp::{
    device::AmpDevice,
    error::AmpError,
    loss::Loss,
    precision::{AmpElem, Precision},
    tape::{MixedGradients, MixedTape},
};
pub use typed_amp_data::Layout;
use typed_amp_data::{Normalize, Split, CLASSES};

use crate::config::{RunConfig, RunError};

/// Pixels are normalised by Fashion-MNIST's mean and standard deviation.
const NORMALIZE: Normalize = Normalize::FASHION_MNIST;
/// Test images evaluated per forward pass.
const EVAL_BATCH: usize = 500;

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
