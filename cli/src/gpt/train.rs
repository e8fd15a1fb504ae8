//! One GPT run: nanoGPT's recipe through the typed step (scale → backward → unscale → clip →
//! step → update), with evaluations, checkpoints and the figures the comparison table needs.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use typed_amp::amp::MasterOf;
use typed_amp::checkpoint;
use typed_amp::dfdx::optim::Adam;
use typed_amp::error::AmpError;
use typed_amp::master::TrainTarget;
use typed_amp::ops::AmpOps;
use typed_amp::optim::MasterOptimizer;
use typed_amp::params::Parameters;
use typed_amp::prelude::*;
use typed_amp_data::CharCorpus;
use typed_amp_models::gpt::{init_gpt, GptModel, VOCAB};

use super::config::{EvalPoint, GptConfig, GptReport};
use super::eval::validation_loss;
use super::footprint::check_gpt_memory;
use super::meta::{device_draws_per_step, gpt_metadata, resume_progress, Progress};
use super::schedule::get_lr;
use crate::config::{DeviceChoice, RunError};
use crate::footprint::{peak_rss, reset_peak_rss};
use crate::heap;
use crate::save_claim::claim_save_path;

/// The global L2 norm the unscaled gradients are clipped to.
pub const GRAD_CLIP: f32 = 1.0;

/// Iterations after which a skipped step counts as "skipped after the first 20": the dynamic
/// loss scale starts at 65,536 and halves at each overflow until the gradients fit.
pub const SETTLING_ITERS: usize = 20;

/// Weight of the newest iteration in the smoothed training loss.
const SMOOTHING: f64 = 0.1;

/// nanoGPT's AdamW: betas (0.9, 0.99), eps 1e-8, decoupled weight decay 0.1 on every tensor of
/// two or more dimensions (the tables and the linear layers' weights), none on the norms.
pub fn adamw_recipe(lr: f64) -> AdamConfig {
    AdamConfig {
        lr,
        betas: [0.9, 0.99],
        eps: 1e-8,
        weight_decay: Some(WeightDecay::DecoupledMatrices(0.1)),
    }
}

/// Trains the GPT `cfg` describes on `corpus`, on `cfg.device`. With `cfg.save`, claims it
/// first ([`claim_save_path`]), printing its warnings on stderr.
pub fn train_gpt(cfg: &GptConfig, corpus: &CharCorpus) -> Result<GptReport, RunError> {
    cfg.validate()?;
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
    if cfg.fp8 {
        return train_fp8(cfg, corpus);
    }
    match cfg.device {
        DeviceChoice::Cpu => train_on(cfg, corpus, Cpu::seed_from_u64(cfg.seed)),
        #[cfg(feature = "cuda")]
        DeviceChoice::Cuda(ordinal) => train_on(
            cfg,
            corpus,
            crate::config::open_cuda(ordinal, cfg.seed)?,
        ),
        #[cfg(not(feature = "cuda"))]
        DeviceChoice::Cuda(_) => Err(RunError::Usage(format!(
            "device `{}` needs a build with CUDA: `cargo run --release -p typed-amp-cli --features cuda -- ...`",
            cfg.device
        ))),
    }
}

fn train_on<D: AmpOps>(
    cfg: &GptConfig,
    corpus: &CharCorpus,
    dev: D,
) -> Result<GptReport, RunError> {
    macro_rules! go {
        ($model:ty) => {
            train_model::<$model, D>(cfg, corpus, dev)
        };
    }
    for_each_gpt!(cfg.size, cfg.policy, cfg.dtype, go)
}

/// The GPT with FP8 linear layers (`--fp8`, which `GptConfig::validate` allows under O2-BF16
/// only): FP8 products on the CPU (the kernels' FP8 GEMM) and on CUDA (cuBLASLt, on a GPU of
/// compute capability 8.9 or above; below it, or for a layer whose sizes are not multiples of
/// 16, the 16-bit linear op, see `typed_amp::ops::fp8_linear`).
fn train_fp8(cfg: &GptConfig, corpus: &CharCorpus) -> Result<GptReport, RunError> {
    use typed_amp_models::gpt::{GptBabyO2Bf16Fp8, GptSize, GptSmallO2Bf16Fp8};
    macro_rules! on {
        ($dev:expr, $device:ty) => {
            match cfg.size {
                GptSize::Small => train_model::<GptSmallO2Bf16Fp8, $device>(cfg, corpus, $dev),
                GptSize::Baby => train_model::<GptBabyO2Bf16Fp8, $device>(cfg, corpus, $dev),
            }
        };
    }
    match cfg.device {
        DeviceChoice::Cpu => on!(Cpu::seed_from_u64(cfg.seed), Cpu),
        #[cfg(feature = "cuda")]
        DeviceChoice::Cuda(ordinal) => on!(
            crate::config::open_cuda(ordinal, cfg.seed)?,
            typed_amp::prelude::Cuda
        ),
        #[cfg(not(feature = "cuda"))]
        DeviceChoice::Cuda(_) => Err(RunError::Usage(format!(
            "device `{}` needs a build with CUDA: `cargo run --release -p typed-amp-cli --features cuda -- ...`",
            cfg.device
        ))),
    }
}

/// Errors unless `corpus` fits the GPT: a vocabulary of at most [`VOCAB`] characters, and a
/// window of `context + 1` characters in each split.
pub(crate) fn check_corpus(corpus: &CharCorpus, context: usize) -> Result<(), RunError> {
    if corpus.vocab_size() > VOCAB {
        return Err(RunError::Usage(format!(
            "the text has {} distinct characters, more than the GPT's {VOCAB} token rows",
            corpus.vocab_size()
        )));
    }
    corpus.check_context(context)?;
    Ok(())
}

/// The progress bar of a run of `iters` iterations starting at `first` (hidden unless `show`).
fn iteration_bar(cfg: &GptConfig, first: usize, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(cfg.iters as u64);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>10} [{bar:28}] {pos}/{len} {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(cfg.label());
    bar.set_position(first as u64);
    bar
}

/// Writes the run's checkpoint to `path`.
fn save<M: GptModel<D>, D: AmpOps>(
    path: &Path,
    model: &mut M::Weights,
    opt: &impl typed_amp::optim::OptimizerState<D>,
    scaler: &GradScaler,
    meta: &BTreeMap<String, String>,
) -> Result<u64, RunError> {
    Ok(checkpoint::save_with_policy(
        path,
        model,
        opt,
        scaler,
        &M::CONFIG,
        meta,
    )?)
}

/// Trains `M`: the run `cfg` describes, from its checkpoint if it resumes one.
pub(crate) fn train_model<M, D>(
    cfg: &GptConfig,
    corpus: &CharCorpus,
    dev: D,
) -> Result<GptReport, RunError>
where
    D: AmpOps,
    M: GptModel<D>,
    Adam<MasterOf<M, D>, f32, D>: MasterOptimizer<MasterOf<M, D>, D>,
{
    reset_peak_rss();
    let context = M::SIZE.context();
    check_corpus(corpus, context)?;
    let mut model = M::try_build(&dev)?;
    // GPT-2's initialisation, before anything is loaded into the model.
    init_gpt(&mut model, M::SIZE)?;
    // The layout is the master's parameter summary.
    let master_bytes: usize = model.layout().iter().map(|p| p.size_in_bytes()).sum();
    let weights_bytes = if M::CONFIG.master_weights {
        let working = model.working().param_summary();
        master_bytes + working.iter().map(|p| p.size_in_bytes()).sum::<usize>()
    } else {
        master_bytes
    };
    check_gpt_memory(cfg, weights_bytes, master_bytes)?;
    let mut opt = typed_amp::optim::adam(model.master(), adamw_recipe(cfg.lr));
    let mut scaler = M::scaler();
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let vocab = corpus.vocab_string();
    let mut progress = Progress::start();

    if let Some(path) = &cfg.resume {
        // The run's settings and vocabulary are checked first: a checkpoint of another run is
        // a usage error.
        let meta = checkpoint::read_metadata(path)?;
        progress = resume_progress(cfg, path, &meta, corpus)?;
        checkpoint::load_with_policy(path, &mut model, &mut opt, &mut scaler, &M::CONFIG)?;
        rng.set_word_pos(progress.rng_word_pos);
        // Dropout's seeds come from the device's generator: draw what the run had drawn.
        for _ in 0..progress.device_draws {
            dev.random_u64();
        }
    }
    let val_starts = corpus.validation_starts(context, cfg.eval_windows)?;
    let draws_per_step = device_draws_per_step(M::SIZE);
    let first = progress.iteration as usize;
    // Saturating: `--stop-after 18446744073709551615` means "to the end".
    let last = cfg
        .stop_after
        .map_or(cfg.iters, |n| first.saturating_add(n).min(cfg.iters));
    let bar = iteration_bar(cfg, first, cfg.progress);
    let tokens_per_step = (cfg.batch * context) as f64;

    let mut grads = model.alloc_grads()?;
    let mut evals = Vec::new();
    let mut train_seconds = 0.0;
    let mut last_loss = f32::NAN;
    heap::reset_peak();
    let heap_at_start = heap::current();
    for it in first..last {
        let started = Instant::now();
        opt.set_learning_rate(get_lr(it, cfg.lr, cfg.iters));
        let (x, y) = corpus.train_batch(&mut rng, cfg.batch, context)?;
        let x: Tensor<(usize, usize), usize, D> = dev.tensor_from_vec(x, (cfg.batch, context));
        let y: Tensor<(usize, usize), usize, D> = dev.tensor_from_vec(y, (cfg.batch, context));
        let loss = M::try_loss(model.working_mut(), x.traced_mixed(grads), &y)
            .map_err(AmpError::device)?;
        last_loss = loss.value();
        let scaled = scaler.scale(loss).backward()?;
        let mut unscaled = scaler.unscale(&mut model, scaled)?;
        clip_grad_norm(&mut unscaled, GRAD_CLIP)?;
        let outcome = scaler.step(&mut opt, unscaled)?;
        if outcome.skipped() && it >= SETTLING_ITERS {
            progress.skipped_after_20 += 1;
        }
        grads = scaler.update(outcome)?;
        train_seconds += started.elapsed().as_secs_f64();

        progress.iteration += 1;
        progress.device_draws += draws_per_step;
        progress.rng_word_pos = rng.get_word_pos();
        if last_loss.is_finite() {
            let loss = f64::from(last_loss);
            progress.loss_ema = Some(match progress.loss_ema {
                Some(ema) => (1.0 - SMOOTHING) * ema + SMOOTHING * loss,
                None => loss,
            });
        }
        bar.inc(1);
        if cfg.progress {
            let tokens = (progress.iteration as usize - first) as f64 * tokens_per_step;
            let scale = if scaler.is_enabled() {
                format!("  scale {}", scaler.get_scale())
            } else {
                String::new()
            };
            bar.set_message(format!(
                "loss {:.4}  {:.0} tok/s{scale}",
                progress.loss_ema.unwrap_or(f64::NAN),
                tokens / train_seconds.max(1e-9)
            ));
        }

        let done = it + 1;
        let scheduled = cfg.evaluates_after(done);
        if scheduled || done == last {
            let val_loss = validation_loss::<M, D>(&dev, &model, corpus, &val_starts, cfg.batch)?;
            if scheduled {
                // A NaN loss is never the best, except as the first.
                progress.best_val_loss = Some(match progress.best_val_loss {
                    Some(best) if best <= val_loss || val_loss.is_nan() => best,
                    _ => val_loss,
                });
            }
            let point = EvalPoint {
                iteration: progress.iteration,
                val_loss,
                train_loss: progress.loss_ema.unwrap_or(f64::NAN),
            };
            if cfg.progress {
                bar.println(format!(
                    "{:>10} iter {:>6}  train loss {:.4}  val loss {:.4}",
                    cfg.label(),
                    point.iteration,
                    point.train_loss,
                    point.val_loss
                ));
            }
            evals.push(point);
            if let Some(path) = &cfg.save {
                save::<M, D>(
                    path,
                    &mut model,
                    &opt,
                    &scaler,
                    &gpt_metadata(cfg, &vocab, &progress),
                )?;
            }
        }
    }
    bar.finish_and_clear();
    let peak_heap_bytes = heap::peak();
    let loop_peak_bytes = peak_heap_bytes
        .zip(heap_at_start)
        .map(|(p, s)| p.saturating_sub(s));
    let peak_rss_bytes = peak_rss();
    let checkpoint_bytes = match &cfg.save {
        Some(path) => std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        None => {
            // Written to a temporary file with the metadata a checkpoint would hold, removed.
            let path = std::env::temp_dir()
                .join(format!("typed-amp-size-{}.safetensors", std::process::id()));
            let meta = gpt_metadata(cfg, &vocab, &progress);
            let size = save::<M, D>(&path, &mut model, &opt, &scaler, &meta);
            let _ = std::fs::remove_file(&path);
            size?
        }
    };
    let val_loss = evals.last().map_or(f64::NAN, |e| e.val_loss);
    let iterations_run = progress.iteration - first as u64;
    Ok(GptReport {
        config: cfg.clone(),
        recipe: M::CONFIG.to_string(),
        master_weights: M::CONFIG.master_weights,
        evals,
        val_loss,
        best_val_loss: progress.best_val_loss.unwrap_or(val_loss),
        train_loss: progress.loss_ema.unwrap_or(f64::NAN),
        last_loss,
        iterations: progress.iteration,
        iterations_run,
        train_seconds,
        tokens_per_second: if train_seconds > 0.0 {
            iterations_run as f64 * tokens_per_step / train_seconds
        } else {
            0.0
        },
        skipped_steps: scaler.skipped_steps(),
        skipped_after_20: progress.skipped_after_20,
        final_scale: scaler.get_scale(),
        weights_bytes,
        checkpoint_bytes,
        peak_rss_bytes,
        peak_heap_bytes,
        loop_peak_bytes,
        pid: std::process::id(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recipe_is_nanogpts_adamw() {
        let cfg = adamw_recipe(1e-3);
        assert_eq!(cfg.lr, 1e-3);
        assert_eq!(cfg.betas, [0.9, 0.99]);
        assert_eq!(cfg.eps, 1e-8);
        assert!(matches!(
            cfg.weight_decay,
            Some(WeightDecay::DecoupledMatrices(wd)) if wd == 0.1
        ));
    }
}
