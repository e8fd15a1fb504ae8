//! Data-parallel training: one process (rank) per device, each on its own shard of every batch,
//! the gradients averaged across ranks before the step, on an established collective library.
//!
//! | backend | devices | feature | what it is |
//! | --- | --- | --- | --- |
//! | `mpi::MpiCollective` | CPU (any device, through host copies) | `mpi` | MPI (rsmpi over OpenMPI or another MPI), launched with `mpirun` |
//! | `nccl::NcclCollective` | CUDA | `nccl` (type-checked with `cuda` + `ci-check`) | NVIDIA's NCCL through cudarc, on dfdx's stream |
//! | [`SingleProcess`] | any | always | one rank: the data-parallel stages without communication, for tests and for code that runs either way |
//!
//! The typed step gains one stage, between unscaling and the step, and the type of every value
//! says how far it got:
//!
//! | stage | takes | gives |
//! | --- | --- | --- |
//! | [`DataParallel::scale`] / [`DataParallel::accumulate`] | the rank's loss(es) | [`ScaledLoss`](crate::step::ScaledLoss) / an [`Accumulation`](crate::step::Accumulation) window, as with a [`GradScaler`](crate::scaler::GradScaler) |
//! | [`DataParallel::unscale`] | the model, [`ScaledGrads`](crate::step::ScaledGrads) | [`UnscaledGrads`](crate::step::UnscaledGrads) of kind [`Unreduced`]: this rank's FP32 master gradients and its own overflow flag. Neither clipping (rule `ReadyForStep`) nor a step (rule `ReducedAcrossRanks`) takes them |
//! | [`DataParallel::all_reduce`] | those | [`UnscaledGrads`](crate::step::UnscaledGrads) of kind [`AllReduced`]: master gradients averaged across ranks (summed in FP32), the overflow flag ORed across ranks |
//! | [`clip_grad_norm`](crate::step::clip_grad_norm), [`clip_grad_value`](crate::step::clip_grad_value) | [`AllReduced`] gradients | (every rank clips the same average by the same norm) |
//! | [`DataParallel::step`] | an optimizer, [`AllReduced`] gradients only (rule `ReducedAcrossRanks`) | [`StepOutcome`](crate::step::StepOutcome) of kind [`AllReduced`] |
//! | [`DataParallel::update`] | outcomes of [`AllReduced`] steps only (rule [`ReducedOutcomes`]) | the next gradients; the scale backs off on every rank when any rank overflowed |
//!
//! A plain [`GradScaler`](crate::scaler::GradScaler)'s `step` takes [`FromScaler`](crate::step::FromScaler) gradients only
//! and its `update` outcomes of that kind only, so a data-parallel value cannot slip into the
//! single-process step, nor the reverse; and [`DataParallel`] keeps its scaler to itself, so the
//! scale changes only with a flag reduced across ranks.
//!
//! # Precision of the reduction
//!
//! The reduction averages the FP32 master gradients, after each rank has unscaled its own:
//! summing N ranks' scaled FP16 gradients in FP16 would overflow at a sum past 65504 where no rank
//! did (the loss scale is chosen to put the largest gradient just below that), and round every
//! partial sum to 11 bits. The master gradients are FP32 already (the optimizer takes them), so
//! reducing them costs no conversion, twice the bytes of an FP16 reduction, and gives each rank
//! exactly the average the optimizer steps on. Gradients of 16-bit masters (O3) are widened to
//! FP32 for the sum and rounded once back. The sum is divided by the number of ranks (an exact
//! scaling when that is a power of two).
//!
//! Every rank receives the same bits: `mpi::MpiCollective` reduces to rank 0
//! and broadcasts the result (an MPI all-reduce may round differently on different ranks for
//! more than two), and NCCL's ring all-reduce gives every rank the same result. So master
//! weights, optimizer state and the loss scale stay identical across ranks for a whole run
//! ([`DataParallel::check_in_sync`] checks).
//!
//! # Gradient accumulation
//!
//! An accumulation window ([`DataParallel::accumulate`]) adds a rank's micro-batches up in its
//! own working gradients; [`DataParallel::unscale`] then [`DataParallel::all_reduce`] run once
//! per window, so the gradients cross the network once per optimizer step, not once per
//! micro-batch.
//!
//! ```rust
//! # use typed_amp::prelude::*;
//! use typed_amp::distributed::{DataParallel, SingleProcess};
//! # fn main() -> Result<(), AmpError> {
//! # let dev = Cpu::default();
//! # let mut model = MasterWeights::build::<(Linear<4, 2>,)>(&dev)?;
//! # let mut opt = typed_amp::optim::sgd(model.master(), SgdConfig::default());
//! // Under `mpirun`: `DataParallel::new(GradScaler::default(), MpiCollective::init()?)?`.
//! let mut dist = DataParallel::new(GradScaler::default(), SingleProcess)?;
//! let mut grads = model.alloc_grads()?;
//! for _ in 0..2 {
//!     let x: Tensor<Rank2<8, 4>, f16, _> = dev.zeros(); // this rank's shard of the batch
//!     let logits = model.working().forward(x.traced_mixed(grads));
//!     let loss = mse_loss(logits.to_f32(), dev.zeros());
//!     let scaled = dist.scale(loss).backward()?;
//!     let local = dist.unscale(&mut model, scaled)?; // this rank's gradients
//!     let mut averaged = dist.all_reduce(local)?; // averaged across ranks
//!     clip_grad_norm(&mut averaged, 1.0)?;
//!     let outcome = dist.step(&mut opt, averaged)?;
//!     grads = dist.update(outcome)?;
//! }
//! dist.check_in_sync(&model)?;
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(all(feature = "cuda", any(feature = "nccl", feature = "ci-check")))]
pub mod nccl;

mod bytes;
mod collective;
mod data_parallel;
mod digest;
mod metadata;
mod protocol;
mod reduce;
mod rules;
mod shard;
mod sync;

pub use collective::{AllReduce, Collective, SingleProcess};
pub use data_parallel::DataParallel;
pub use digest::master_digest;
pub use metadata::{check_world_size, record_world_size, WORLD_SIZE_KEY};
pub use rules::{AllReducedOnce, ReducedAcrossRanks, ReducedOutcomes};
pub use shard::shard;

pub use crate::step::{AllReduced, ReadyForStep, Unreduced};
