//! What a GPT checkpoint records beside the weights (the run's settings, its vocabulary and
//! where it stands), and the checks a resumed run makes of it.

use std::collections::BTreeMap;
use std::path::Path;

use typed_amp_data::CharCorpus;
use typed_amp_models::gpt::GptSize;

use super::config::GptConfig;
use crate::config::RunError;
use crate::run::meta_get;

/// Where a run stands after an iteration: what a checkpoint records so that the resumed run
/// continues exactly as the uninterrupted one would have.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Progress {
    /// Iterations done.
    pub iteration: u64,
    /// The training windows' ChaCha8 RNG's word position.
    pub rng_word_pos: u128,
    /// Values drawn from the device's RNG since the model was initialised (dropout's seeds).
    pub device_draws: u64,
    /// The lowest validation loss of the scheduled evaluations so far.
    pub best_val_loss: Option<f64>,
    /// Skipped steps after the first 20 iterations.
    pub skipped_after_20: u64,
    /// The smoothed training loss.
    pub loss_ema: Option<f64>,
}

impl Progress {
    /// A run that has done nothing yet.
    pub(crate) fn start() -> Self {
        Self {
            iteration: 0,
            rng_word_pos: 0,
            device_draws: 0,
            best_val_loss: None,
            skipped_after_20: 0,
            loss_ema: None,
        }
    }
}

/// Values a training forward of `size` draws from the device's RNG: one seed per dropout layer
/// (dfdx's dropout draws one `u64` per call and expands it on its own generator). The small
/// GPT has no dropout (p = 0) and so no dropout layers; the baby one has one after the
/// embedding and two per block.
pub(crate) fn device_draws_per_step(size: GptSize) -> u64 {
    match size {
        GptSize::Small => 0,
        GptSize::Baby => 1 + 2 * size.layers() as u64,
    }
}

/// A float as metadata: `Display` of an `f64` reads back as the same `f64` (NaN and infinities
/// included); `none` for no value.
fn float(value: Option<f64>) -> String {
    value.map_or_else(|| "none".to_string(), |v| v.to_string())
}

fn parse_float(
    path: &Path,
    meta: &BTreeMap<String, String>,
    key: &str,
) -> Result<Option<f64>, RunError> {
    match meta.get(key).map(String::as_str) {
        Some("none") => Ok(None),
        _ => meta_get::<f64>(path, meta, key).map(Some),
    }
}

/// The checkpoint metadata of `cfg`'s run on the corpus whose vocabulary is `vocab`, at
/// `progress`.
pub(crate) fn gpt_metadata(
    cfg: &GptConfig,
    vocab: &str,
    progress: &Progress,
) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("model".to_string(), "gpt".to_string()),
        ("gpt_size".to_string(), cfg.size.name().to_string()),
        ("policy".to_string(), cfg.policy.to_string()),
        ("dtype".to_string(), cfg.compute_dtype().to_string()),
        ("batch".to_string(), cfg.batch.to_string()),
        ("seed".to_string(), cfg.seed.to_string()),
        ("lr".to_string(), cfg.lr.to_string()),
        ("iters".to_string(), cfg.iters.to_string()),
        ("eval_every".to_string(), cfg.eval_every.to_string()),
        ("eval_windows".to_string(), cfg.eval_windows.to_string()),
        ("vocab".to_string(), vocab.to_string()),
        ("iteration".to_string(), progress.iteration.to_string()),
        ("rng".to_string(), "ChaCha8".to_string()),
        (
            "rng_word_pos".to_string(),
            progress.rng_word_pos.to_string(),
        ),
        (
            "device_rng_draws".to_string(),
            progress.device_draws.to_string(),
        ),
        ("best_val_loss".to_string(), float(progress.best_val_loss)),
        (
            "skipped_after_20".to_string(),
            progress.skipped_after_20.to_string(),
        ),
        ("loss_ema".to_string(), float(progress.loss_ema)),
    ])
}

/// Where `cfg`'s run resumes from the checkpoint at `path` (its metadata `meta`) on `corpus`.
/// A checkpoint of other settings (model, size, policy, dtype, batch, seed, learning rate,
/// iterations, evaluation settings), of another vocabulary, or of a finished run is a usage
/// error naming the file and both values.
pub(crate) fn resume_progress(
    cfg: &GptConfig,
    path: &Path,
    meta: &BTreeMap<String, String>,
    corpus: &CharCorpus,
) -> Result<Progress, RunError> {
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
    expect("model", "gpt".to_string())?;
    expect("gpt_size", cfg.size.name().to_string())?;
    expect("policy", cfg.policy.to_string())?;
    expect("dtype", cfg.compute_dtype().to_string())?;
    expect("batch", cfg.batch.to_string())?;
    expect("seed", cfg.seed.to_string())?;
    expect("lr", cfg.lr.to_string())?;
    expect("iters", cfg.iters.to_string())?;
    expect("eval_every", cfg.eval_every.to_string())?;
    expect("eval_windows", cfg.eval_windows.to_string())?;
    let vocab = meta.get("vocab").ok_or_else(|| {
        RunError::Usage(format!(
            "{} records no vocabulary: was it written by `typed-amp train --model gpt`?",
            path.display()
        ))
    })?;
    corpus.check_vocab(vocab).map_err(|e| {
        RunError::Usage(format!(
            "{}: {e} (the checkpoint's {:?}, the data's {:?})",
            path.display(),
            vocab,
            corpus.vocab_string()
        ))
    })?;
    let iteration: u64 = meta_get(path, meta, "iteration")?;
    if iteration >= cfg.iters as u64 {
        return Err(RunError::Usage(format!(
            "{} has already done {iteration} iterations of a run of {}: there is nothing left to train{}",
            path.display(),
            cfg.iters,
            if iteration > cfg.iters as u64 {
                " (no run does more iterations than it has: the checkpoint is damaged)"
            } else {
                ""
            }
        )));
    }
    let device_draws: u64 = meta_get(path, meta, "device_rng_draws")?;
    if Some(device_draws) != device_draws_per_step(cfg.size).checked_mul(iteration) {
        return Err(RunError::Usage(format!(
            "{} records {device_draws} draws of the device's random numbers after {iteration} iterations, the {} GPT makes {} per iteration: the checkpoint is damaged",
            path.display(),
            cfg.size.name(),
            device_draws_per_step(cfg.size)
        )));
    }
    Ok(Progress {
        iteration,
        rng_word_pos: meta_get(path, meta, "rng_word_pos")?,
        device_draws,
        best_val_loss: parse_float(path, meta, "best_val_loss")?,
        skipped_after_20: meta_get(path, meta, "skipped_after_20")?,
        loss_ema: parse_float(path, meta, "loss_ema")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_reads_back_as_the_progress_it_records() {
        let corpus = CharCorpus::embedded().unwrap();
        let mut cfg = GptConfig::new(GptSize::Baby);
        cfg.iters = 40;
        let progress = Progress {
            iteration: 20,
            rng_word_pos: 12345678901234567890,
            device_draws: 20 * 13,
            best_val_loss: Some(2.0f64.sqrt()),
            skipped_after_20: 1,
            loss_ema: Some(f64::NAN),
        };
        let meta = gpt_metadata(&cfg, &corpus.vocab_string(), &progress);
        let back = resume_progress(&cfg, Path::new("x"), &meta, &corpus).unwrap();
        assert_eq!(back.best_val_loss, progress.best_val_loss);
        assert!(back.loss_ema.unwrap().is_nan());
        assert_eq!(
            Progress {
                loss_ema: None,
                ..back
            },
            Progress {
                loss_ema: None,
                ..progress
            }
        );

        let mut other = cfg.clone();
        other.eval_windows = 7;
        let err = resume_progress(&other, Path::new("x.safetensors"), &meta, &corpus)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "x.safetensors was saved with eval_windows = 1024, this run has 7"
        );
        let finished = Progress {
            iteration: 40,
            device_draws: 40 * 13,
            ..progress
        };
        let meta = gpt_metadata(&cfg, &corpus.vocab_string(), &finished);
        let err = resume_progress(&cfg, Path::new("x"), &meta, &corpus).unwrap_err();
        assert!(err.to_string().contains("nothing left to train"), "{err}");
    }
}
