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
//! | [`DataParallel::scale`] / [`DataParallel::accumulate`] | the rank's loss(es) | [`ScaledLoss`] / an [`Accumulation`] window, as with a [`GradScaler`] |
//! | [`DataParallel::unscale`] | the model, [`ScaledGrads`](crate::ScaledGrads) | [`UnscaledGrads`] of kind [`Unreduced`]: this rank's FP32 master gradients and its own overflow flag. Neither clipping (rule [`ReadyForStep`]) nor a step (rule [`ReducedAcrossRanks`]) takes them |
//! | [`DataParallel::all_reduce`] | those | [`UnscaledGrads`] of kind [`AllReduced`]: master gradients averaged across ranks (summed in FP32), the overflow flag ORed across ranks |
//! | [`clip_grad_norm`](crate::clip_grad_norm), [`clip_grad_value`](crate::clip_grad_value) | [`AllReduced`] gradients | (every rank clips the same average by the same norm) |
//! | [`DataParallel::step`] | an optimizer, [`AllReduced`] gradients only (rule [`ReducedAcrossRanks`]) | [`StepOutcome`] of kind [`AllReduced`] |
//! | [`DataParallel::update`] | outcomes of [`AllReduced`] steps only (rule [`ReducedOutcomes`]) | the next gradients; the scale backs off on every rank when any rank overflowed |
//!
//! A plain [`GradScaler`]'s `step` takes [`FromScaler`](crate::step::FromScaler) gradients only
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

use std::cell::Cell;
use std::collections::BTreeMap;

use dfdx::prelude::{Shape, Storage, Tensor};

use crate::device::{AmpDevice, HostKernel, Kernels};
use crate::error::AmpError;
use crate::master::{for_each_trainable_grad, GradOp, TrainTarget};
use crate::ops::cast::CastKernel;
use crate::ops::fill::FillKernel;
use crate::optim::MasterOptimizer;
use crate::params::{ParamVisitor, ParamVisitorMut, Parameters};
use crate::precision::AmpElem;
use crate::scaler::{GradScaler, ScalerState};
use crate::step::{Accumulation, Scaled, ScaledLoss, StepOutcome, Unscaled, UnscaledGrads};
use crate::tape::MixedGradients;
use crate::Loss;

pub use crate::step::{AllReduced, ReadyForStep, Unreduced};

/// The operations of a process group that do not touch a device's buffers: who is who, flags,
/// small host values, bytes from one rank to all, and a barrier.
///
/// Every rank must call the same operations in the same order (they are collective).
pub trait Collective {
    /// This process's rank, from 0.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn size(&self) -> usize;

    /// Whether `flag` is true on any rank (a logical OR across ranks); every rank gets the same
    /// answer.
    fn any(&self, flag: bool) -> Result<bool, AmpError>;

    /// Sums `values` element by element across ranks, in place, on the host (metrics: loss sums,
    /// counts). Every rank gets the same bits.
    fn sum_f64(&self, values: &mut [f64]) -> Result<(), AmpError>;

    /// Sends `bytes` of rank `root` to every rank (whose `bytes` are replaced, whatever their
    /// length).
    fn broadcast_bytes(&self, root: usize, bytes: &mut Vec<u8>) -> Result<(), AmpError>;

    /// Returns when every rank has called it.
    fn barrier(&self) -> Result<(), AmpError>;

    /// Whether this is rank 0, the rank that prints and writes checkpoints.
    fn is_root(&self) -> bool {
        self.rank() == 0
    }
}

/// A [`Collective`] that sums FP32 buffers of device `D` across ranks: the gradient reduction.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot all-reduce buffers of `{D}`",
    label = "no reduction for this device",
    note = "`MpiCollective` reduces host copies of any device's buffers, `NcclCollective` reduces CUDA buffers in place, `SingleProcess` has nothing to reduce"
)]
pub trait AllReduce<D: AmpDevice>: Collective {
    /// Sums each buffer element by element across ranks, in place. The buffers have the same
    /// lengths, in the same order, on every rank; every rank receives the same bits. One
    /// collective operation for the whole list.
    fn all_reduce_sum(
        &self,
        dev: &D,
        bufs: &mut [<D as Storage<f32>>::Vec],
    ) -> Result<(), AmpError>;
}

/// One process alone: rank 0 of 1. Every operation returns its input; [`DataParallel`] over it
/// trains exactly as a [`GradScaler`] does (it is how tests and examples run the data-parallel
/// stages without a launcher).
#[derive(Debug, Clone, Copy, Default)]
pub struct SingleProcess;

impl Collective for SingleProcess {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn any(&self, flag: bool) -> Result<bool, AmpError> {
        Ok(flag)
    }
    fn sum_f64(&self, _values: &mut [f64]) -> Result<(), AmpError> {
        Ok(())
    }
    fn broadcast_bytes(&self, _root: usize, _bytes: &mut Vec<u8>) -> Result<(), AmpError> {
        Ok(())
    }
    fn barrier(&self) -> Result<(), AmpError> {
        Ok(())
    }
}

impl<D: AmpDevice> AllReduce<D> for SingleProcess {
    fn all_reduce_sum(
        &self,
        _dev: &D,
        _bufs: &mut [<D as Storage<f32>>::Vec],
    ) -> Result<(), AmpError> {
        Ok(())
    }
}

impl<C: Collective + ?Sized> Collective for &C {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn size(&self) -> usize {
        (**self).size()
    }
    fn any(&self, flag: bool) -> Result<bool, AmpError> {
        (**self).any(flag)
    }
    fn sum_f64(&self, values: &mut [f64]) -> Result<(), AmpError> {
        (**self).sum_f64(values)
    }
    fn broadcast_bytes(&self, root: usize, bytes: &mut Vec<u8>) -> Result<(), AmpError> {
        (**self).broadcast_bytes(root, bytes)
    }
    fn barrier(&self) -> Result<(), AmpError> {
        (**self).barrier()
    }
}

impl<D: AmpDevice, C: AllReduce<D> + ?Sized> AllReduce<D> for &C {
    fn all_reduce_sum(
        &self,
        dev: &D,
        bufs: &mut [<D as Storage<f32>>::Vec],
    ) -> Result<(), AmpError> {
        (**self).all_reduce_sum(dev, bufs)
    }
}

/// Gradient kinds a data-parallel step takes: [`AllReduced`] alone.
#[diagnostic::on_unimplemented(
    message = "a data-parallel step takes gradients averaged across ranks, not gradients of kind `{Self}`",
    label = "not all-reduced across ranks",
    note = "in a data-parallel run: `dist.unscale(&mut model, grads)?`, then `dist.all_reduce(..)?`, then `dist.step(&mut opt, ..)`"
)]
pub trait ReducedAcrossRanks: ReadyForStep {}
impl ReducedAcrossRanks for AllReduced {}

/// The outcomes of one data-parallel iteration's steps, consumed by [`DataParallel::update`]:
/// one [`StepOutcome`] of kind [`AllReduced`], a tuple of them, an array or a `Vec`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` carries an overflow flag of one rank alone: a data-parallel update takes the flag reduced across ranks",
    label = "not a data-parallel step's outcome",
    note = "`dist.update(..)` takes what `dist.step(..)` returned (one outcome, or a tuple, array or Vec of them), whose overflow flag `dist.all_reduce(..)` reduced across ranks, so that every rank skips and backs off alike"
)]
pub trait ReducedOutcomes<D: AmpDevice> {
    /// The next iteration's gradients, one per outcome.
    type Grads;
    /// Calls `f` with each outcome's scaler and (reduced) flag.
    #[doc(hidden)]
    fn for_each_flag(&self, f: &mut dyn FnMut(crate::scaler::ScalerId, bool));
    /// The gradients, in the same shape as the outcomes.
    #[doc(hidden)]
    fn into_grads(self) -> Self::Grads;
}

crate::step::outcome_impls!(ReducedOutcomes, AllReduced);

/// A loss scaler for data-parallel training over the collective `C`: the typed step of a
/// [`GradScaler`] with the reduction across ranks in it (see the [module](self) documentation).
///
/// It keeps its [`GradScaler`] to itself: the scale changes only in [`DataParallel::update`],
/// from overflow flags reduced across ranks, so it stays the same on every rank.
#[derive(Debug)]
pub struct DataParallel<C> {
    scaler: GradScaler,
    comm: C,
    reductions: Cell<u64>,
}

impl<C: Collective> DataParallel<C> {
    /// Data-parallel training with `scaler` over `comm`. Collective: every rank calls it, with a
    /// scaler in the same state (checked: [`AmpError::RanksDiverged`] otherwise).
    pub fn new(scaler: GradScaler, comm: C) -> Result<Self, AmpError> {
        let dist = Self {
            scaler,
            comm,
            reductions: Cell::new(0),
        };
        dist.check_same(&scaler_digest(&dist.scaler.state()), "loss-scaler state")?;
        Ok(dist)
    }

    /// The collective.
    pub fn comm(&self) -> &C {
        &self.comm
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.comm.size()
    }

    /// Whether this is rank 0, the one that prints and writes checkpoints.
    pub fn is_root(&self) -> bool {
        self.comm.rank() == 0
    }

    /// The current loss scale (the same on every rank).
    pub fn get_scale(&self) -> f32 {
        self.scaler.get_scale()
    }

    /// Clean steps since the last growth or backoff.
    pub fn growth_tracker(&self) -> u32 {
        self.scaler.growth_tracker()
    }

    /// Steps skipped because a gradient on some rank was inf or NaN.
    pub fn skipped_steps(&self) -> u64 {
        self.scaler.skipped_steps()
    }

    /// The scaler's state, for checkpoints (`GradScaler::from_state(dist.state())?` is a scaler
    /// to pass to [`crate::checkpoint::save`]). The scaler itself stays inside: its own typed
    /// step would take gradients that were never reduced across ranks.
    pub fn state(&self) -> ScalerState {
        self.scaler.state()
    }

    /// Restores saved scaler state (e.g. from a checkpoint). Collective: every rank must load
    /// the same state (checked).
    pub fn load_state(&mut self, state: ScalerState) -> Result<(), AmpError> {
        self.scaler.load_state(state)?;
        self.check_same(&scaler_digest(&self.scaler.state()), "loss-scaler state")
    }

    /// Gradient all-reduces performed so far ([`DataParallel::all_reduce`] calls: one per
    /// optimizer step, whatever the number of micro-batches).
    pub fn reductions(&self) -> u64 {
        self.reductions.get()
    }

    /// Scales this rank's loss for backward by the current scale.
    pub fn scale<D: AmpDevice>(&self, loss: Loss<D>) -> ScaledLoss<D> {
        self.scaler.scale(loss)
    }

    /// Opens a gradient-accumulation window at the current scale (see [`Accumulation`]): its
    /// micro-batches add up in this rank's gradients, which are unscaled and all-reduced once,
    /// after [`Accumulation::finish`].
    pub fn accumulate<D: AmpDevice>(&self, grads: MixedGradients<D>) -> Accumulation<'_, D> {
        self.scaler.accumulate(grads)
    }

    /// Divides this rank's gradients by their scale into `target`'s master gradients and checks
    /// them for inf and NaN, as [`GradScaler::unscale`] does. The result holds this rank's shard
    /// only: [`DataParallel::all_reduce`] it before clipping or the step.
    pub fn unscale<'t, D, T, G>(
        &self,
        target: &'t mut T,
        grads: G,
    ) -> Result<UnscaledGrads<'t, T, D, Unreduced>, AmpError>
    where
        D: AmpDevice,
        T: TrainTarget<D>,
        G: Scaled<D>,
    {
        self.scaler.unscale_as(target, grads)
    }

    /// Averages this rank's master gradients with every other rank's (sum in FP32, divided by
    /// the number of ranks; every rank gets the same bits) and ORs the overflow flags across
    /// ranks. When any rank overflowed, the gradients are not exchanged at all: every rank will
    /// skip the step.
    ///
    /// Collective: every rank calls it once per optimizer step.
    pub fn all_reduce<'t, D, T>(
        &self,
        mut grads: UnscaledGrads<'t, T, D, Unreduced>,
    ) -> Result<UnscaledGrads<'t, T, D, AllReduced>, AmpError>
    where
        D: AmpDevice,
        T: TrainTarget<D>,
        C: AllReduce<D>,
    {
        if grads.scaler_ids().any(|id| id != self.scaler.id()) {
            return Err(AmpError::ScalerMismatch(
                "these gradients were unscaled by another scaler",
            ));
        }
        let found_inf = self.comm.any(grads.found_inf())?;
        if !found_inf && self.comm.size() > 1 {
            let (target, master) = grads.target_and_master();
            average_master_grads(&self.comm, target, master)?;
        }
        self.reductions.set(self.reductions.get() + 1);
        Ok(grads.into_kind(found_inf))
    }

    /// Updates the master weights with `optimizer` from gradients averaged across ranks (the
    /// same update on every rank), unless some rank's gradients held inf or NaN, in which case
    /// every rank skips it, as [`GradScaler::step`] does. Pass the outcome to
    /// [`DataParallel::update`].
    pub fn step<'t, D, O, G>(
        &self,
        optimizer: &mut O,
        grads: G,
    ) -> Result<StepOutcome<D, AllReduced>, AmpError>
    where
        D: AmpDevice,
        G: Unscaled<'t, D>,
        G::Kind: ReducedAcrossRanks,
        O: MasterOptimizer<<G::Target as TrainTarget<D>>::Master, D>,
    {
        let grads = grads.into_unscaled();
        if !grads.scaler_ids().any(|id| id == self.scaler.id()) {
            return Err(AmpError::ScalerMismatch(
                "these gradients were unscaled by another scaler",
            ));
        }
        // `G::Kind` is `AllReduced`, the only kind with `ReducedAcrossRanks`.
        let outcome = grads.take_step(optimizer)?;
        Ok(outcome.into_kind())
    }

    /// Ends the iteration on every rank alike: backs the scale off when any rank's gradients
    /// overflowed (the flag [`DataParallel::all_reduce`] reduced), else counts a clean step; returns
    /// the zeroed gradients for the next iteration.
    pub fn update<D: AmpDevice, O: ReducedOutcomes<D>>(
        &mut self,
        outcomes: O,
    ) -> Result<O::Grads, AmpError> {
        let mut found_inf = false;
        let mut foreign = false;
        let id = self.scaler.id();
        outcomes.for_each_flag(&mut |scaler, found| {
            foreign |= scaler != id;
            found_inf |= found;
        });
        if foreign {
            return Err(AmpError::ScalerMismatch(
                "an outcome of another scaler was passed to this one's update",
            ));
        }
        self.scaler.record(found_inf)?;
        Ok(outcomes.into_grads())
    }

    /// Copies rank 0's master weights (and buffers) to every rank and refreshes the working
    /// copies, so that every rank starts from the same model. Collective.
    pub fn broadcast_master<D: AmpDevice, T: TrainTarget<D>>(
        &self,
        target: &mut T,
    ) -> Result<(), AmpError> {
        self.broadcast_params(target, Params::All)
    }

    /// Copies rank 0's buffers (batch norm running statistics: what no optimizer updates) to
    /// every rank, as PyTorch's `DistributedDataParallel` does. Each rank's training forwards
    /// update its buffers from its own shard, so they part between calls (the weights do not);
    /// call it before evaluating or saving. Collective.
    pub fn sync_buffers<D: AmpDevice, T: TrainTarget<D>>(
        &self,
        target: &mut T,
    ) -> Result<(), AmpError> {
        if !target.layout().iter().any(|p| !p.trainable) {
            return Ok(());
        }
        target.sync_buffers_to_master()?;
        self.broadcast_params(target, Params::Buffers)
    }

    fn broadcast_params<D: AmpDevice, T: TrainTarget<D>>(
        &self,
        target: &mut T,
        params: Params,
    ) -> Result<(), AmpError> {
        if self.comm.size() == 1 {
            return Ok(());
        }
        let mut bytes = Vec::new();
        if self.is_root() {
            target
                .master()
                .visit_params(&mut ReadBytes(&mut bytes, params))?;
        }
        self.comm.broadcast_bytes(0, &mut bytes)?;
        if !self.is_root() {
            let mut write = WriteBytes {
                bytes: &bytes,
                at: 0,
                params,
            };
            target.master_mut().visit_params_mut(&mut write)?;
            if write.at != bytes.len() {
                return Err(AmpError::Collective(format!(
                    "rank 0's model has {} bytes of parameters, this rank's {}",
                    bytes.len(),
                    write.at
                )));
            }
            target.reload_working()?;
        }
        Ok(())
    }

    /// A digest of this rank's master weights (and buffers) and loss-scaler state: equal on two
    /// ranks exactly when they hold the same bits (barring a 64-bit hash collision).
    pub fn fingerprint<D: AmpDevice, T: TrainTarget<D>>(
        &self,
        target: &T,
    ) -> Result<u64, AmpError> {
        let mut bytes = master_digest(target)?.to_le_bytes().to_vec();
        bytes.extend(scaler_digest(&self.scaler.state()));
        Ok(fnv1a(&bytes))
    }

    /// Checks that every rank holds the same master weights and loss-scaler state as rank 0,
    /// bit for bit; errors on every rank ([`AmpError::RanksDiverged`]) if any differs.
    /// Collective.
    pub fn check_in_sync<D: AmpDevice, T: TrainTarget<D>>(
        &self,
        target: &T,
    ) -> Result<(), AmpError> {
        let digest = self.fingerprint(target)?;
        self.check_same(&digest.to_le_bytes(), "master weights or loss-scaler state")
    }

    /// Errors on every rank unless every rank's `bytes` equal rank 0's.
    fn check_same(&self, bytes: &[u8], what: &str) -> Result<(), AmpError> {
        if self.comm.size() == 1 {
            return Ok(());
        }
        let mut root = bytes.to_vec();
        self.comm.broadcast_bytes(0, &mut root)?;
        let differs = root != bytes;
        if self.comm.any(differs)? {
            return Err(AmpError::RanksDiverged(format!(
                "the {what} differs between ranks{}",
                if differs {
                    format!(" (rank {} differs from rank 0)", self.comm.rank())
                } else {
                    String::new()
                }
            )));
        }
        Ok(())
    }
}

/// A 64-bit digest (FNV-1a) of a model's master weights and buffers, bit for bit.
pub fn master_digest<D: AmpDevice, T: TrainTarget<D>>(target: &T) -> Result<u64, AmpError> {
    let mut bytes = Vec::new();
    target
        .master()
        .visit_params(&mut ReadBytes(&mut bytes, Params::All))?;
    Ok(fnv1a(&bytes))
}

/// Sums the trainable master gradients across ranks in FP32 and divides by the number of ranks.
fn average_master_grads<D, T, C>(
    comm: &C,
    target: &T,
    master: &mut MixedGradients<D>,
) -> Result<(), AmpError>
where
    D: AmpDevice,
    T: TrainTarget<D>,
    C: AllReduce<D>,
{
    /// Copies every gradient, widened to FP32, into buffers of its own.
    struct Gather<D: AmpDevice>(Vec<<D as Storage<f32>>::Vec>);
    impl<D: AmpDevice> GradOp<D> for Gather<D> {
        fn apply<E: AmpElem>(
            &mut self,
            dev: &D,
            _slot: usize,
            grad: &mut <D as Storage<E>>::Vec,
        ) -> Result<(), D::Err>
        where
            D: Kernels<E>,
        {
            let len = Storage::<E>::len(dev, grad);
            let mut buf = Storage::<f32>::try_alloc_len(dev, len)?;
            CastKernel::<E, f32>::try_copy_cast(dev, grad, &mut buf)?;
            self.0.push(buf);
            Ok(())
        }
    }
    /// Writes the sums back, divided by the number of ranks, rounded once to each gradient's
    /// precision.
    struct Scatter<D: AmpDevice> {
        sums: Vec<<D as Storage<f32>>::Vec>,
        inv_ranks: f32,
    }
    impl<D: AmpDevice> GradOp<D> for Scatter<D> {
        fn apply<E: AmpElem>(
            &mut self,
            dev: &D,
            slot: usize,
            grad: &mut <D as Storage<E>>::Vec,
        ) -> Result<(), D::Err>
        where
            D: Kernels<E>,
        {
            let sum = &mut self.sums[slot];
            FillKernel::<f32>::try_scale(dev, sum, self.inv_ranks)?;
            CastKernel::<f32, E>::try_copy_cast(dev, sum, grad)
        }
    }
    let mut gather = Gather::<D>(Vec::new());
    let Some(dev) = for_each_trainable_grad(target.master(), master, &mut gather)? else {
        return Ok(());
    };
    let mut sums = gather.0;
    comm.all_reduce_sum(&dev, &mut sums)?;
    let mut scatter = Scatter::<D> {
        sums,
        inv_ranks: 1.0 / comm.size() as f32,
    };
    for_each_trainable_grad(target.master(), master, &mut scatter)?;
    Ok(())
}

/// Every parameter's bits (or only the buffers', the parameters no optimizer updates), in
/// visiting order.
struct ReadBytes<'b>(&'b mut Vec<u8>, Params);

/// Which parameters a copy covers.
#[derive(Clone, Copy, PartialEq)]
enum Params {
    All,
    Buffers,
}

impl<D: AmpDevice> ParamVisitor<D> for ReadBytes<'_> {
    type Error = AmpError;
    fn visit<S: Shape, E: AmpElem>(
        &mut self,
        _path: &str,
        param: &Tensor<S, E, D>,
        trainable: bool,
    ) -> Result<(), AmpError>
    where
        D: Kernels<E>,
    {
        if trainable && self.1 == Params::Buffers {
            return Ok(());
        }
        let values =
            HostKernel::<E>::try_read(param.device(), param.storage()).map_err(AmpError::device)?;
        self.0
            .extend(values.into_iter().flat_map(AmpElem::to_le_bytes));
        Ok(())
    }
}

/// Writes parameters from bytes [`ReadBytes`] made.
struct WriteBytes<'b> {
    bytes: &'b [u8],
    at: usize,
    params: Params,
}

impl<D: AmpDevice> ParamVisitorMut<D> for WriteBytes<'_> {
    type Error = AmpError;
    fn visit_mut<S: Shape, E: AmpElem>(
        &mut self,
        path: &str,
        param: &mut Tensor<S, E, D>,
        trainable: bool,
    ) -> Result<(), AmpError>
    where
        D: Kernels<E>,
    {
        if trainable && self.params == Params::Buffers {
            return Ok(());
        }
        let size = std::mem::size_of::<E>();
        let len = Storage::<E>::len(param.device(), param.storage());
        let end = self.at + len * size;
        let chunk = self.bytes.get(self.at..end).ok_or_else(|| {
            AmpError::Collective(format!(
                "rank 0's model has fewer parameter bytes than this rank's, at `{path}`"
            ))
        })?;
        let values: Vec<E> = chunk.chunks_exact(size).map(E::from_le_bytes).collect();
        self.at = end;
        let dev = param.device().clone();
        HostKernel::<E>::try_write(&dev, param.storage_mut(), &values).map_err(AmpError::device)
    }
}

/// The loss-scaler state as bytes, bit for bit.
fn scaler_digest(state: &ScalerState) -> Vec<u8> {
    format!("{state:?}|{}", state.scale.to_bits()).into_bytes()
}

/// FNV-1a, 64 bits.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The checkpoint metadata key holding the number of ranks that trained a run.
pub const WORLD_SIZE_KEY: &str = "world_size";

/// Records the number of ranks in checkpoint metadata (a checkpoint without it was written by a
/// single process).
pub fn record_world_size(meta: &mut BTreeMap<String, String>, size: usize) {
    meta.insert(WORLD_SIZE_KEY.to_string(), size.to_string());
}

/// Checks that a checkpoint was written by a run of `size` ranks: resuming with another number
/// of ranks would change the global batch and the shards, so it is refused
/// ([`AmpError::WorldSize`]). A checkpoint without the key counts as one rank's.
pub fn check_world_size(meta: &BTreeMap<String, String>, size: usize) -> Result<(), AmpError> {
    let saved = match meta.get(WORLD_SIZE_KEY) {
        None => 1,
        Some(v) => v.parse().map_err(|_| {
            AmpError::Collective(format!("the checkpoint's `{WORLD_SIZE_KEY}` is `{v}`"))
        })?,
    };
    if saved == size {
        Ok(())
    } else {
        Err(AmpError::WorldSize {
            saved,
            current: size,
        })
    }
}

/// Rank `rank`'s shard of `order` among `size` ranks, as PyTorch's `DistributedSampler`: `order`
/// is padded with its own first elements to a multiple of `size`, and rank `r` takes elements
/// `r, r + size, r + 2·size, ...`. Every rank gets the same number of examples, so every rank
/// takes the same number of steps.
pub fn shard<T: Clone>(order: &[T], rank: usize, size: usize) -> Vec<T> {
    assert!(size > 0 && rank < size, "rank {rank} of {size}");
    if order.is_empty() {
        return Vec::new();
    }
    let per_rank = order.len().div_ceil(size);
    (0..per_rank)
        .map(|i| order[(i * size + rank) % order.len()].clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_every_example_and_have_equal_sizes() {
        let order: Vec<usize> = (0..10).collect();
        let shards: Vec<Vec<usize>> = (0..3).map(|r| shard(&order, r, 3)).collect();
        assert!(shards.iter().all(|s| s.len() == 4));
        let mut all: Vec<usize> = shards.concat();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all, order);
        assert_eq!(shard(&order, 0, 1), order);
    }

    #[test]
    fn world_size_is_checked() {
        let mut meta = BTreeMap::new();
        assert!(check_world_size(&meta, 1).is_ok());
        record_world_size(&mut meta, 2);
        assert!(check_world_size(&meta, 2).is_ok());
        let err = check_world_size(&meta, 3).unwrap_err();
        assert!(
            matches!(
                err,
                AmpError::WorldSize {
                    saved: 2,
                    current: 3
                }
            ),
            "{err}"
        );
    }
}
