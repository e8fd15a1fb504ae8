//! `typed-amp sample`: characters from a trained GPT, one at a time, as nanoGPT's `sample.py`
//! draws them.

use std::path::PathBuf;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use typed_amp::error::AmpError;
use typed_amp::master::TrainTarget;
use typed_amp::ops::AmpOps;
use typed_amp::prelude::*;
use typed_amp_data::DataError;
use typed_amp_models::gpt::{GptModel, VOCAB};

use super::source::{inspect, load_weights, GptFile};
use crate::config::{DeviceChoice, RunError};

/// What to sample, and how.
#[derive(Debug, Clone)]
pub struct SampleConfig {
    /// A checkpoint of `typed-amp train --model gpt`, or an export of one.
    pub model: PathBuf,
    /// Characters to generate after the prompt.
    pub tokens: usize,
    /// The logits are divided by it before the softmax: below 1 sharper, above 1 flatter.
    pub temperature: f64,
    /// Draw from the `k` likeliest characters only.
    pub top_k: Option<usize>,
    /// Seeds the draws: the same seed gives the same sample.
    pub seed: u64,
    /// The text to continue.
    pub prompt: String,
    /// The device to run on.
    pub device: DeviceChoice,
}

impl SampleConfig {
    /// 500 characters after a line break, temperature 1, every character, seed 0, on the CPU.
    pub fn new(model: PathBuf) -> Self {
        Self {
            model,
            tokens: 500,
            temperature: 1.0,
            top_k: None,
            seed: 0,
            prompt: "\n".to_string(),
            device: DeviceChoice::Cpu,
        }
    }
}

/// A sample: the prompt and what followed it.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The prompt.
    pub prompt: String,
    /// The characters generated after it.
    pub generated: String,
}

/// Samples `cfg.tokens` characters after `cfg.prompt` from the model in `cfg.model`.
pub fn sample(cfg: &SampleConfig) -> Result<Sample, RunError> {
    if !(cfg.temperature.is_finite() && cfg.temperature > 0.0) {
        return Err(RunError::Usage(
            "--temperature must be a positive number".to_string(),
        ));
    }
    if cfg.top_k == Some(0) {
        return Err(RunError::Usage("--top-k must be at least 1".to_string()));
    }
    let file = inspect(&cfg.model)?;
    let prompt =
        encode(&file.vocab, &cfg.prompt).map_err(|e| RunError::Usage(format!("--prompt: {e}")))?;
    if prompt.is_empty() {
        return Err(RunError::Usage(
            "--prompt must hold at least one character".to_string(),
        ));
    }
    match cfg.device {
        DeviceChoice::Cpu => sample_on(cfg, &file, &prompt, Cpu::seed_from_u64(cfg.seed)),
        #[cfg(feature = "cuda")]
        DeviceChoice::Cuda(ordinal) => sample_on(
            cfg,
            &file,
            &prompt,
            crate::config::open_cuda(ordinal, cfg.seed)?,
        ),
        #[cfg(not(feature = "cuda"))]
        DeviceChoice::Cuda(_) => Err(RunError::Usage(format!(
            "device `{}` needs a build with CUDA: `cargo run --release -p typed-amp-cli --features cuda -- ...`",
            cfg.device
        ))),
    }
}

/// The token ids of `text` in `vocab` (sorted: a character's id is its index). A character
/// outside it is the data crate's [`DataError::UnknownCharacter`], naming it and its position.
pub(crate) fn encode(vocab: &[char], text: &str) -> Result<Vec<usize>, DataError> {
    text.chars()
        .enumerate()
        .map(|(position, character)| {
            vocab
                .binary_search(&character)
                .map_err(|_| DataError::UnknownCharacter {
                    character,
                    position,
                    vocab_size: vocab.len(),
                })
        })
        .collect()
}

fn sample_on<D: AmpOps>(
    cfg: &SampleConfig,
    file: &GptFile,
    prompt: &[usize],
    dev: D,
) -> Result<Sample, RunError> {
    macro_rules! go {
        ($model:ty) => {
            sample_model::<$model, D>(cfg, file, prompt, dev)
        };
    }
    for_each_gpt!(file.size, file.policy, file.dtype, go)
}

fn sample_model<M, D>(
    cfg: &SampleConfig,
    file: &GptFile,
    prompt: &[usize],
    dev: D,
) -> Result<Sample, RunError>
where
    D: AmpOps,
    M: GptModel<D>,
{
    let mut model = M::try_build(&dev)?;
    load_weights::<M, D>(file, &mut model)?;
    let context = M::SIZE.context();
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mut ids = prompt.to_vec();
    for _ in 0..cfg.tokens {
        let window = &ids[ids.len().saturating_sub(context)..];
        let x: Tensor<(usize, usize), usize, D> =
            dev.tensor_from_vec(window.to_vec(), (1, window.len()));
        let logits = M::try_logits(model.working(), x)
            .map_err(AmpError::device)?
            .as_vec();
        // The last position's logits, over the rows that name a character.
        let last = &logits[(window.len() - 1) * VOCAB..][..file.vocab.len()];
        let next = draw(last, cfg.temperature, cfg.top_k, &mut rng).ok_or_else(|| {
            RunError::File(format!(
                "{}: the model's logits are not finite: it diverged",
                file.path.display()
            ))
        })?;
        ids.push(next);
    }
    let decode = |ids: &[usize]| ids.iter().map(|&i| file.vocab[i]).collect::<String>();
    Ok(Sample {
        prompt: decode(prompt),
        generated: decode(&ids[prompt.len()..]),
    })
}

/// One draw from `softmax(logits / temperature)`, restricted to the `top_k` largest logits
/// where given (as nanoGPT: logits below the k-th largest are dropped, ties with it kept), in
/// f64 with `rng`. `None` if the logits are not finite.
pub(crate) fn draw(
    logits: &[f32],
    temperature: f64,
    top_k: Option<usize>,
    rng: &mut impl Rng,
) -> Option<usize> {
    if logits.is_empty() || logits.iter().any(|l| !l.is_finite()) {
        return None;
    }
    let scaled: Vec<f64> = logits.iter().map(|&l| f64::from(l) / temperature).collect();
    let threshold = match top_k {
        Some(k) if k < scaled.len() => {
            let mut sorted = scaled.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            sorted[k.max(1) - 1]
        }
        _ => f64::NEG_INFINITY,
    };
    let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scaled
        .iter()
        .map(|&s| if s < threshold { 0.0 } else { (s - max).exp() })
        .collect();
    let total: f64 = weights.iter().sum();
    if !(total.is_finite() && total > 0.0) {
        return None;
    }
    let mut u = rng.gen::<f64>() * total;
    let mut chosen = None;
    for (i, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            chosen = Some(i);
            if u < w {
                break;
            }
            u -= w;
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_one_is_the_argmax() {
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let logits = [0.1f32, 3.0, 2.9, -1.0];
        for _ in 0..20 {
            assert_eq!(draw(&logits, 1.0, Some(1), &mut rng), Some(1));
        }
    }

    #[test]
    fn draws_follow_the_softmax() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let logits = [0.0f32, (3.0f32).ln()];
        let ones = (0..20_000)
            .filter(|_| draw(&logits, 1.0, None, &mut rng) == Some(1))
            .count();
        // p = 0.75; 20,000 draws: standard deviation about 0.003.
        assert!((ones as f64 / 20_000.0 - 0.75).abs() < 0.015, "{ones}");
        // A low temperature sharpens it.
        let ones = (0..2_000)
            .filter(|_| draw(&logits, 0.05, None, &mut rng) == Some(1))
            .count();
        assert!(ones > 1_990, "{ones}");
        assert_eq!(draw(&[f32::NAN, 0.0], 1.0, None, &mut rng), None);
    }

    #[test]
    fn prompts_outside_the_vocabulary_name_the_character() {
        let vocab: Vec<char> = "\n abc".chars().collect();
        assert_eq!(encode(&vocab, "ab c\n").unwrap(), vec![2, 3, 1, 4, 0]);
        let err = encode(&vocab, "abz").unwrap_err().to_string();
        assert!(err.contains("'z'") && err.contains("position 2"), "{err}");
    }
}
