//! The validation loss: mean cross-entropy over the fixed validation windows, from the model's
//! FP32 logits, in f64 on the host.

use typed_amp::error::AmpError;
use typed_amp::master::TrainTarget;
use typed_amp::ops::AmpOps;
use typed_amp::prelude::*;
use typed_amp_data::{CharCorpus, TextSplit};
use typed_amp_models::gpt::{GptModel, VOCAB};

use crate::config::RunError;

/// The mean over rows of `-log softmax(row)[target]`, summed in f64: `logits` holds one row of
/// [`VOCAB`] FP32 logits per target. Returns the sum (not the mean) and the rows.
pub(crate) fn cross_entropy_sum(logits: &[f32], targets: &[usize]) -> f64 {
    debug_assert_eq!(logits.len(), targets.len() * VOCAB);
    logits
        .chunks(VOCAB)
        .zip(targets)
        .map(|(row, &target)| {
            let max = row
                .iter()
                .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
            let sum: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
            max + sum.ln() - f64::from(row[target])
        })
        .sum()
}

/// The validation loss of `model`: the mean cross-entropy of every target of the windows
/// starting at `starts` ([`CharCorpus::validation_starts`]), `batch` windows per forward pass.
/// NaN if a logit is NaN (a diverged model).
pub(crate) fn validation_loss<M, D>(
    dev: &D,
    model: &M::Weights,
    corpus: &CharCorpus,
    starts: &[usize],
    batch: usize,
) -> Result<f64, RunError>
where
    D: AmpOps,
    M: GptModel<D>,
{
    let context = M::SIZE.context();
    let mut sum = 0.0;
    for chunk in starts.chunks(batch.max(1)) {
        let (x, y) = corpus.windows(TextSplit::Validation, chunk, context)?;
        let x: Tensor<(usize, usize), usize, D> = dev.tensor_from_vec(x, (chunk.len(), context));
        let logits = M::try_logits(model.working(), x).map_err(AmpError::device)?;
        sum += cross_entropy_sum(&logits.as_vec(), &y);
    }
    Ok(sum / (starts.len() * context).max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cross_entropy_of_uniform_logits_is_log_vocab() {
        let logits = vec![0.5f32; 2 * VOCAB];
        let sum = cross_entropy_sum(&logits, &[3, 80]);
        assert!((sum / 2.0 - (VOCAB as f64).ln()).abs() < 1e-12);
    }

    #[test]
    fn cross_entropy_is_stable_for_large_logits() {
        let mut row = vec![0.0f32; VOCAB];
        row[7] = 1000.0;
        assert!(cross_entropy_sum(&row, &[7]).abs() < 1e-12);
        assert!((cross_entropy_sum(&row, &[0]) - 1000.0).abs() < 1e-9);
        row[1] = f32::NAN;
        assert!(cross_entropy_sum(&row, &[0]).is_nan());
    }
}
