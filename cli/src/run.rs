//! One training run: a model under a policy, trained on Fashion-MNIST with the typed step,
//! with checkpoints, progress and the figures the comparison table needs.

use crate::heap;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::time::Instant;
use typed_amp::amp::{AmpConfig, AmpModel, MasterOf, WorkingOf};
use typed_amp::checkpoint::{self, CheckpointError};
use typed_amp::device::Kernels;
use typed_amp::dfdx::optim::Adam;
use typed_amp::distributed::{record_world_size, shard, Collective, SingleProcess};
use typed_amp::optim::{cosine_lr, MasterOptimizer, OptimizerState};
use typed_amp::prelude::*;
use typed_amp::step::{ScaleState, StepProtocol};
use typed_amp::{
    error::AmpError, master::TrainTarget, ops::AmpOps, optim::LowPrecisionUpdates,
    params::Parameters, tape::MixedTape,
};
use typed_amp_data::FashionMnist;
pub use typed_amp_data::{Flat, Image, Layout};

pub use crate::config::{DeviceChoice, EpochReport, RunConfig, RunError, RunReport};
pub use crate::epoch::InputElem;
use crate::epoch::{epoch_bar, evaluate, forward_loss, Logits, Tally};
use crate::footprint::{check_memory, peak_rss, reset_peak_rss};
pub use crate::save_claim::{claim_save_path, SaveClaim};

/// The value of `key` in the metadata `meta` of the checkpoint at `path`. A value that is
/// missing or does not parse is a damaged checkpoint (exit code 1), named with the file.
pub(crate) fn meta_get<T: std::str::FromStr>(
    path: &std::path::Path,
    meta: &BTreeMap<String, String>,
    key: &str,
) -> Result<T, RunError> {
    match meta.get(key) {
        Some(value) => value.parse().map_err(|_| {
            RunError::File(format!(
                "{}: the checkpoint's `{key}` is `{value}`, which is not a valid {key}: the checkpoint is damaged",
                path.display()
            ))
        }),
        None => Err(RunError::File(format!(
            "{}: the checkpoint records no `{key}`: it is damaged, or was not written by `typed-amp train`",
            path.display()
        ))),
    }
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

/// The usage error of a resume on another number of ranks than the checkpoint's, saying how
/// `typed-amp` resumes it: `--data-parallel` under `mpirun -n N`, or without it for one process.
pub(crate) fn world_size_error(path: &std::path::Path, err: AmpError) -> RunError {
    let how = match err {
        AmpError::WorldSize { saved: 1, .. } => {
            " (typed-amp: a checkpoint of one process resumes without `--data-parallel`)"
                .to_string()
        }
        AmpError::WorldSize { saved, .. } => format!(
            " (typed-amp: `mpirun -n {saved} typed-amp train --data-parallel --resume {} ...`)",
            path.display()
        ),
        _ => String::new(),
    };
    RunError::Usage(format!("{}: {err}{how}", path.display()))
}

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
    let done: usize = meta_get(path, meta, "epoch")?;
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
    let step: u64 = meta_get(path, meta, "step")?;
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

/// Trains one model under one policy: the CLI's one epoch loop, in one process (`comm` is
/// [`SingleProcess`], the protocol a [`GradScaler`]) or on one rank of a data-parallel run
/// (`comm` the run's collective, the protocol a [`DataParallel`] over it), where every rank
/// trains on its own shard of each epoch and rank 0 alone evaluates and saves.
pub(crate) fn run_model<M, I, O, D, C, P>(
    cfg: &RunConfig,
    data: &FashionMnist,
    dev: D,
    comm: &C,
    make_protocol: impl FnOnce(GradScaler) -> Result<P, AmpError>,
    make_optimizer: impl FnOnce(&MasterOf<M, D>) -> O,
) -> Result<RunReport, RunError>
where
    D: AmpOps + Kernels<InputElem<M, D>>,
    C: Collective,
    // The protocol's scale state (`ScaleState`): progress, checkpoints, the report.
    P: StepProtocol<D> + ScaleState,
    M: AmpModel<D>,
    I: Layout,
    // Batches come in the model's entry precision: its entry cast has nothing to do.
    WorkingOf<M, D>: ModuleMut<
            Tensor<I::Shape, InputElem<M, D>, D, MixedTape<D>>,
            Output = Logits<D, MixedTape<D>>,
            Error = D::Err,
        > + Module<Tensor<I::Shape, InputElem<M, D>, D>, Output = Logits<D>, Error = D::Err>,
    O: MasterOptimizer<MasterOf<M, D>, D> + OptimizerState<D>,
{
    if cfg.batch == 0 {
        return Err(RunError::Usage("--batch must be at least 1".to_string()));
    }
    reset_peak_rss();
    let root = comm.is_root();
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
    // This rank's share of every epoch (all of it in one process).
    let shard_len = train.len().div_ceil(comm.size());
    check_memory(cfg, shard_len, weights_bytes, master_bytes)?;
    let steps_per_epoch = shard_len.div_ceil(cfg.batch);
    let total_steps = (steps_per_epoch as u64)
        .checked_mul(cfg.epochs as u64)
        .ok_or_else(|| {
            RunError::Usage(format!(
                "--epochs {} of {steps_per_epoch} steps each is more steps than can be counted",
                cfg.epochs
            ))
        })?;
    let mut opt = make_optimizer(model.master());
    let mut protocol = make_protocol(M::scaler())?;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let (mut first_epoch, mut steps) = (0usize, 0u64);

    if let Some(path) = &cfg.resume {
        // The run's settings are checked first: a checkpoint of another policy is a usage error.
        let meta = checkpoint::read_metadata(path)?;
        // The number of ranks first: it decides the shards, and the error says what to do (a
        // data-parallel run's checkpoint resumes only with `--data-parallel` on as many ranks).
        typed_amp::distributed::check_world_size(&meta, comm.size())
            .map_err(|e| world_size_error(path, e))?;
        let (done, step) = resume_point(cfg, path, &meta, steps_per_epoch, shard_len)?;
        let mut scaler = M::scaler();
        checkpoint::load_with_policy(path, &mut model, &mut opt, &mut scaler, &M::CONFIG)?;
        protocol.load_state(scaler.state())?;
        (first_epoch, steps) = (done, step);
        rng.set_word_pos(meta_get::<u128>(path, &meta, "rng_word_pos")?);
    }
    // The same model everywhere (the same seed builds it; a broadcast makes sure).
    protocol.sync_model(&mut model)?;

    let mut grads = model.alloc_grads()?;
    let mut epochs = Vec::new();
    // Saturating: `--stop-after 18446744073709551615` means "to the end", not a wrapped sum.
    let last_epoch = cfg.stop_after.map_or(cfg.epochs, |n| {
        first_epoch.saturating_add(n).min(cfg.epochs)
    });
    // The last save's refusal, if the last epoch's state could not be saved.
    let mut refused_save: Option<CheckpointError> = None;
    heap::reset_peak();
    let heap_at_start = heap::current();
    for epoch in first_epoch..last_epoch {
        let mut order: Vec<usize> = (0..train.len()).collect();
        order.shuffle(&mut rng);
        let mine = shard(&order, comm.rank(), comm.size());
        let bar = epoch_bar(cfg, epoch, steps_per_epoch, cfg.progress && root);
        let mut tally = Tally::default();
        let started = Instant::now();
        for chunk in mine.chunks(cfg.batch) {
            opt.set_learning_rate(cosine_lr(cfg.lr, steps, total_steps));
            grads = protocol.train_step(&mut model, &mut opt, grads, |model, _, grads| {
                forward_loss::<I, InputElem<M, D>, _, D>(
                    &dev,
                    model.working_mut(),
                    train,
                    chunk,
                    grads,
                    &mut tally,
                )
            })?;
            steps += 1;
            bar.inc(1);
            if cfg.progress && root {
                let whose = if P::DATA_PARALLEL { " (rank 0)" } else { "" };
                bar.set_message(format!("{tally}{whose}  scale {}", protocol.get_scale()));
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        bar.finish_and_clear();
        // The epoch's figures over every rank's shard.
        let mut totals = [tally.loss_sum, tally.right as f64, tally.seen as f64];
        comm.sum_f64(&mut totals)?;
        let [loss_sum, right, seen] = totals;
        let tally = Tally {
            loss_sum,
            right: right as usize,
            seen: seen as usize,
        };
        // Batch norm statistics follow each rank's shard: rank 0's go to every rank before
        // evaluating and saving (the weights are the same everywhere already).
        protocol.sync_buffers(&mut model)?;
        let test_accuracy = if root {
            evaluate::<I, InputElem<M, D>, _, D>(&dev, model.working(), &data.test)?
        } else {
            f32::NAN
        };
        epochs.push(EpochReport {
            epoch: epoch + 1,
            seconds,
            train_loss: tally.loss(),
            train_accuracy: tally.accuracy(),
            test_accuracy,
        });
        if let (Some(path), true) = (&cfg.save, root) {
            let mut meta = run_metadata(cfg, epoch + 1, steps, rng.get_word_pos());
            if P::DATA_PARALLEL {
                record_world_size(&mut meta, comm.size());
            }
            match checkpoint::save_with_policy(path, &mut model, &opt, &protocol, &M::CONFIG, &meta)
            {
                Ok(_) => refused_save = None,
                // A state `--resume` would refuse (non-finite weights, as a run whose loss is
                // not finite may have) is not written over the last checkpoint.
                Err(err @ CheckpointError::NotSaved { .. }) => {
                    eprintln!(
                        "warning: epoch {}: {err}; {} keeps the last checkpoint that could be saved",
                        epoch + 1,
                        path.display()
                    );
                    refused_save = Some(err);
                }
                Err(err) => return Err(err.into()),
            }
        }
    }
    // The last epoch's state was not saved: a run whose loss is not finite ends with exit code 3
    // (its verdict says why); one whose loss is finite must not end as if it had saved.
    if let (Some(err), Some(last)) = (refused_save, epochs.last()) {
        if last.train_loss.is_finite() {
            return Err(err.into());
        }
    }
    // Every rank ends with the same weights and scale (checked, bit for bit).
    protocol.check_in_sync(&model)?;
    // Rank 0 may still be writing: the others wait, so that the run ends with its checkpoint.
    comm.barrier()?;

    let test_accuracy = match epochs.last() {
        Some(e) => e.test_accuracy,
        None if root => evaluate::<I, InputElem<M, D>, _, D>(&dev, model.working(), &data.test)?,
        None => f32::NAN,
    };
    let peak_heap_bytes = heap::peak();
    let loop_peak_bytes = peak_heap_bytes
        .zip(heap_at_start)
        .map(|(p, s)| p.saturating_sub(s));
    let peak_rss_bytes = peak_rss();
    let checkpoint_bytes = match &cfg.save {
        Some(path) => std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        None => measure_checkpoint(&mut model, &opt, &protocol, &M::CONFIG)?,
    };
    Ok(RunReport {
        config: cfg.clone(),
        recipe: M::CONFIG.to_string(),
        master_weights: M::CONFIG.master_weights,
        epochs,
        test_accuracy,
        steps,
        skipped_steps: protocol.skipped_steps(),
        final_scale: protocol.get_scale(),
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

/// Adam's eps under O3 in FP16: 1e-4, the usual one for FP16 Adam. The default 1e-8 rounds to
/// 0 in FP16, where O3 keeps Adam's state, and the library refuses it
/// ([`AmpError::EpsilonUnderflows`]): a second moment that underflows to 0 would leave the
/// update divided by eps alone.
pub(crate) const O3_FP16_EPS: f64 = 1e-4;

/// `adam` for an optimizer over weights and state of precision `E`: [`O3_FP16_EPS`] in FP16,
/// unchanged otherwise.
pub(crate) fn adam_for<E: typed_amp::precision::AmpElem>(adam: AdamConfig) -> AdamConfig {
    if typed_amp::precision::dtype_of::<E>() == typed_amp::precision::DType::F16 {
        AdamConfig {
            eps: O3_FP16_EPS,
            ..adam
        }
    } else {
        adam
    }
}

/// Size of the run's checkpoint, serialised but not written.
pub(crate) fn measure_checkpoint<D, T, O, S>(
    model: &mut T,
    opt: &O,
    scaler: &S,
    policy: &AmpConfig,
) -> Result<u64, RunError>
where
    D: AmpOps,
    T: TrainTarget<D>,
    O: OptimizerState<D>,
    S: ScaleState,
{
    Ok(checkpoint::serialized_size(model, opt, scaler, policy)?)
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
            run_on(cfg, data, crate::config::open_cuda(ordinal, cfg.seed)?)
        }
        #[cfg(not(feature = "cuda"))]
        DeviceChoice::Cuda(_) => Err(RunError::Usage(format!(
            "device `{}` needs a build with CUDA: `cargo run --release -p typed-amp-cli --features cuda -- ...`",
            cfg.device
        ))),
    }
}

fn run_on<D: AmpOps>(cfg: &RunConfig, data: &FashionMnist, dev: D) -> Result<RunReport, RunError> {
    let adam = AdamConfig {
        lr: cfg.lr,
        ..Default::default()
    };
    // FP32 Adam on the master weights, or (O3) 16-bit Adam on the 16-bit weights, opted into.
    macro_rules! train {
        ($model:ty, $input:ty, f32) => {
            run_model::<$model, $input, _, D, _, _>(cfg, data, dev, &SingleProcess, Ok, |m| {
                Adam::<_, f32, D>::new(m, adam)
            })
        };
        ($model:ty, $input:ty, $low:ty) => {
            run_model::<$model, $input, _, D, _, _>(cfg, data, dev, &SingleProcess, Ok, |m| {
                LowPrecisionUpdates(Adam::<_, $low, D>::new(m, adam_for::<$low>(adam)))
            })
        };
    }
    for_each_model!(cfg, train)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::*;
    use typed_amp::precision::dtype_of;
    use typed_amp::precision::DType;

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
