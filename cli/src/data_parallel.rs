//! `typed-amp train --data-parallel`: one rank of a data-parallel run, launched by `mpirun -n N`
//! (feature `mpi`).
//!
//! Every rank builds the same model (rank 0's weights are broadcast to make sure), shuffles the
//! training set with the same seed, and trains on its own shard of each epoch
//! ([`typed_amp::distributed::shard`]): `--batch` examples per rank and step, so a step sees
//! `N × batch` examples. Gradients are averaged across ranks in FP32 before the step, and the
//! overflow flag is reduced across ranks, so every rank takes (or skips) the same step and the
//! loss scale stays the same everywhere. Rank 0 alone prints, evaluates and writes checkpoints;
//! a checkpoint records the number of ranks, and resuming it with another number is refused.
//!
//! On the CPU the ranks talk over MPI; with `--device cuda` (features `cuda` and `nccl`) each
//! rank takes the GPU `ordinal + local rank` and gradients are reduced by NCCL, which MPI
//! bootstraps.

#[cfg(feature = "mpi")]
pub use enabled::*;

#[cfg(not(feature = "mpi"))]
pub use disabled::*;

#[cfg(not(feature = "mpi"))]
mod disabled {
    use typed_amp_data::FashionMnist;

    use crate::run::{RunConfig, RunError, RunReport};

    /// The processes of a data-parallel run (this build has no MPI: never made).
    #[derive(Debug)]
    pub enum Ranks {}

    impl Ranks {
        /// Joins the run: errors, since this build has no MPI.
        pub fn join() -> Result<Self, RunError> {
            Err(RunError::Usage(
                "--data-parallel needs a build with MPI: `cargo build --release -p typed-amp-cli --features mpi` (after `apt-get install libopenmpi-dev openmpi-bin libclang-dev`)".to_string(),
            ))
        }

        /// Whether this is rank 0.
        pub fn is_root(&self) -> bool {
            match *self {}
        }

        /// What the run is, for the header rank 0 prints.
        pub fn describe(&self, _cfg: &RunConfig) -> String {
            match *self {}
        }

        /// Trains on this rank's shards.
        pub fn run(&self, _cfg: &RunConfig, _data: &FashionMnist) -> Result<RunReport, RunError> {
            match *self {}
        }
    }
}

#[cfg(feature = "mpi")]
mod enabled {
    use std::time::Instant;

    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;
    use typed_amp::amp::{AmpModel, MasterOf, WorkingOf};
    use typed_amp::checkpoint;
    use typed_amp::device::Kernels;
    use typed_amp::dfdx::optim::Adam;
    use typed_amp::distributed::mpi::MpiCollective;
    use typed_amp::distributed::{
        check_world_size, record_world_size, shard, AllReduce, Collective, DataParallel,
    };
    use typed_amp::optim::{cosine_lr, LearningRate, MasterOptimizer, OptimizerState};
    use typed_amp::prelude::*;
    use typed_amp::{AmpDevice, LowPrecisionUpdates, Parameters, TrainTarget};
    use typed_amp_data::FashionMnist;

    use crate::run::{
        check_memory, claim_save_path, epoch_bar, evaluate, for_each_model, forward_loss,
        measure_checkpoint, meta_get, peak_rss, reset_peak_rss, resume_point, run_metadata,
        DeviceChoice, EpochReport, InputElem, Layout, Logits, RunConfig, RunError, RunReport,
        Tally,
    };

    /// The processes of a data-parallel run, over MPI.
    #[derive(Debug)]
    pub struct Ranks {
        mpi: MpiCollective,
    }

    impl Ranks {
        /// Joins the run `mpirun` started (a process started without it is rank 0 of 1).
        pub fn join() -> Result<Self, RunError> {
            Ok(Self {
                mpi: MpiCollective::init()?,
            })
        }

        /// Whether this is rank 0, the one that prints and saves.
        pub fn is_root(&self) -> bool {
            self.mpi.is_root()
        }

        /// What the run is, for the header rank 0 prints.
        pub fn describe(&self, cfg: &RunConfig) -> String {
            let size = self.mpi.size();
            format!(
                "data-parallel: {size} rank(s) over {} ({}), batch {} per rank, {} per step",
                match cfg.device {
                    DeviceChoice::Cpu => "MPI",
                    DeviceChoice::Cuda(_) => "NCCL",
                },
                MpiCollective::library_version()
                    .split([',', '\n'])
                    .next()
                    .unwrap_or_default()
                    .trim(),
                cfg.batch,
                cfg.batch * size
            )
        }

        /// Trains `cfg.arch` under `cfg.policy` with Adam on this rank's shards.
        pub fn run(&self, cfg: &RunConfig, data: &FashionMnist) -> Result<RunReport, RunError> {
            // Rank 0 alone writes the checkpoint, so it alone claims the path.
            let _claim = match (&cfg.save, self.mpi.is_root()) {
                (Some(save), true) => {
                    let (claim, warnings) = claim_save_path(save, cfg.resume.as_deref())?;
                    for warning in warnings {
                        eprintln!("warning: {warning}");
                    }
                    Some(claim)
                }
                _ => None,
            };
            match cfg.device {
                DeviceChoice::Cpu => {
                    run_on(cfg, data, Cpu::seed_from_u64(cfg.seed), &self.mpi)
                }
                #[cfg(feature = "nccl")]
                DeviceChoice::Cuda(ordinal) => {
                    let local = std::env::var("OMPI_COMM_WORLD_LOCAL_RANK")
                        .ok()
                        .and_then(|r| r.parse::<usize>().ok())
                        .unwrap_or(self.mpi.rank());
                    let gpu = ordinal + local;
                    let dev = typed_amp::dfdx::prelude::Cuda::try_build(gpu, cfg.seed)
                        .map_err(|e| RunError::Usage(format!("cannot open cuda:{gpu}: {e}")))?;
                    let nccl =
                        typed_amp::distributed::nccl::NcclCollective::bootstrap(&dev, &self.mpi)?;
                    run_on(cfg, data, dev, &nccl)
                }
                #[cfg(not(feature = "nccl"))]
                DeviceChoice::Cuda(_) => Err(RunError::Usage(
                    "data-parallel training on GPUs needs a build with NCCL: `--features cuda,nccl,mpi`"
                        .to_string(),
                )),
            }
        }
    }

    /// Trains one model under one policy on this rank's shards.
    fn run_model<M, I, O, D, C>(
        cfg: &RunConfig,
        data: &FashionMnist,
        dev: D,
        comm: &C,
        make_optimizer: impl FnOnce(&MasterOf<M, D>) -> O,
    ) -> Result<RunReport, RunError>
    where
        D: AmpDevice + Kernels<InputElem<M, D>>,
        C: AllReduce<D>,
        M: AmpModel<D>,
        I: Layout,
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
        let root = comm.is_root();
        let mut model = M::try_build(&dev)?;
        let mut opt = make_optimizer(model.master());
        let mut dist = DataParallel::new(M::scaler(), comm)?;
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        let (mut first_epoch, mut steps) = (0usize, 0u64);

        let train = &data.train;
        let shard_len = train.len().div_ceil(comm.size());
        let steps_per_epoch = shard_len.div_ceil(cfg.batch);
        let master_bytes: usize = model.layout().iter().map(|p| p.size_in_bytes()).sum();
        let weights_bytes = if M::CONFIG.master_weights {
            let working = model.working().param_summary();
            master_bytes + working.iter().map(|p| p.size_in_bytes()).sum::<usize>()
        } else {
            master_bytes
        };
        check_memory(cfg, shard_len, weights_bytes, master_bytes)?;
        let total_steps = (steps_per_epoch as u64)
            .checked_mul(cfg.epochs as u64)
            .ok_or_else(|| {
                RunError::Usage(format!(
                    "--epochs {} of {steps_per_epoch} steps each is more steps than can be counted",
                    cfg.epochs
                ))
            })?;

        if let Some(path) = &cfg.resume {
            let meta = checkpoint::read_metadata(path)?;
            // The number of ranks first: it decides the shards, and the error says what to do.
            check_world_size(&meta, comm.size())
                .map_err(|e| RunError::Usage(format!("{}: {e}", path.display())))?;
            let (done, step) = resume_point(cfg, path, &meta, steps_per_epoch, shard_len)?;
            let mut scaler = M::scaler();
            checkpoint::load_with_policy(path, &mut model, &mut opt, &mut scaler, &M::CONFIG)?;
            dist.load_state(scaler.state())?;
            (first_epoch, steps) = (done, step);
            rng.set_word_pos(meta_get::<u128>(&meta, "rng_word_pos")?);
        }
        // The same model everywhere (the same seed builds it; a broadcast makes sure).
        dist.broadcast_master(&mut model)?;

        let mut grads = model.alloc_grads()?;
        let mut epochs = Vec::new();
        crate::heap::reset_peak();
        let heap_at_start = crate::heap::current();
        // Saturating: `--stop-after 18446744073709551615` means "to the end", not a wrapped sum.
        let last_epoch = cfg.stop_after.map_or(cfg.epochs, |n| {
            first_epoch.saturating_add(n).min(cfg.epochs)
        });
        for epoch in first_epoch..last_epoch {
            let mut order: Vec<usize> = (0..train.len()).collect();
            order.shuffle(&mut rng);
            let mine = shard(&order, comm.rank(), comm.size());
            let bar = epoch_bar(cfg, epoch, steps_per_epoch, cfg.progress && root);
            let mut tally = Tally::default();
            let started = Instant::now();
            for chunk in mine.chunks(cfg.batch) {
                opt.set_learning_rate(cosine_lr(cfg.lr, steps, total_steps));
                let loss = forward_loss::<I, InputElem<M, D>, _, D>(
                    &dev,
                    model.working_mut(),
                    train,
                    chunk,
                    grads,
                    &mut tally,
                )?;
                let scaled = dist.scale(loss).backward()?;
                let local = dist.unscale(&mut model, scaled)?;
                let averaged = dist.all_reduce(local)?;
                let outcome = dist.step(&mut opt, averaged)?;
                grads = dist.update(outcome)?;
                steps += 1;
                bar.inc(1);
                if cfg.progress && root {
                    bar.set_message(format!("{tally} (rank 0)  scale {}", dist.get_scale()));
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
            dist.sync_buffers(&mut model)?;
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
                record_world_size(&mut meta, comm.size());
                let scaler = GradScaler::from_state(dist.state())?;
                checkpoint::save_with_policy(path, &mut model, &opt, &scaler, &M::CONFIG, &meta)?;
            }
        }
        // Every rank ends with the same weights and scale (checked, bit for bit).
        dist.check_in_sync(&model)?;
        // Rank 0 may still be writing: the others wait, so that the run ends with its checkpoint.
        comm.barrier()?;

        let scaler = GradScaler::from_state(dist.state())?;
        let test_accuracy = match epochs.last() {
            Some(e) => e.test_accuracy,
            None if root => {
                evaluate::<I, InputElem<M, D>, _, D>(&dev, model.working(), &data.test)?
            }
            None => f32::NAN,
        };
        let peak_heap_bytes = crate::heap::peak();
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
            skipped_steps: dist.skipped_steps(),
            final_scale: dist.get_scale(),
            weights_bytes,
            checkpoint_bytes,
            peak_rss_bytes,
            peak_heap_bytes,
            loop_peak_bytes,
            pid: std::process::id(),
        })
    }

    fn run_on<D: AmpDevice, C: AllReduce<D>>(
        cfg: &RunConfig,
        data: &FashionMnist,
        dev: D,
        comm: &C,
    ) -> Result<RunReport, RunError> {
        let adam = AdamConfig {
            lr: cfg.lr,
            ..Default::default()
        };
        // As `run::run_on`: FP32 Adam on the masters, or (O3) 16-bit Adam, opted into.
        macro_rules! train {
            ($model:ty, $input:ty, f32) => {
                run_model::<$model, $input, _, D, C>(cfg, data, dev, comm, |m| {
                    Adam::<_, f32, D>::new(m, adam)
                })
            };
            ($model:ty, $input:ty, $low:ty) => {
                run_model::<$model, $input, _, D, C>(cfg, data, dev, comm, |m| {
                    LowPrecisionUpdates(Adam::<_, $low, D>::new(m, adam))
                })
            };
        }
        for_each_model!(cfg, train)
    }
}
