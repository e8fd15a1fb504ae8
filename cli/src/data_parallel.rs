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
    use typed_amp::dfdx::optim::Adam;
    use typed_amp::distributed::mpi::MpiCollective;
    use typed_amp::distributed::{AllReduce, Collective, DataParallel};
    use typed_amp::prelude::*;
    use typed_amp::{ops::AmpOps, optim::LowPrecisionUpdates};
    use typed_amp_data::FashionMnist;

    use crate::run::{
        claim_save_path, for_each_model, run_model, DeviceChoice, RunConfig, RunError, RunReport,
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
                    let dev = crate::config::open_cuda(gpu, cfg.seed)?;
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

    fn run_on<D: AmpOps, C: AllReduce<D>>(
        cfg: &RunConfig,
        data: &FashionMnist,
        dev: D,
        comm: &C,
    ) -> Result<RunReport, RunError> {
        let adam = AdamConfig {
            lr: cfg.lr,
            ..Default::default()
        };
        // The data-parallel step protocol over this rank's collective, in the one epoch loop.
        let make_dist = |scaler| DataParallel::new(scaler, comm);
        // As `run::run_on`: FP32 Adam on the masters, or (O3) 16-bit Adam, opted into.
        macro_rules! train {
            ($model:ty, $input:ty, f32) => {
                run_model::<$model, $input, _, D, C, _>(cfg, data, dev, comm, make_dist, |m| {
                    Adam::<_, f32, D>::new(m, adam)
                })
            };
            ($model:ty, $input:ty, $low:ty) => {
                run_model::<$model, $input, _, D, C, _>(cfg, data, dev, comm, make_dist, |m| {
                    LowPrecisionUpdates(Adam::<_, $low, D>::new(
                        m,
                        crate::run::adam_for::<$low>(adam),
                    ))
                })
            };
        }
        for_each_model!(cfg, train)
    }
}
