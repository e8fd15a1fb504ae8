//! [`DataParallel`]: the typed step with the reduction across ranks in it.

use std::cell::Cell;

use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::loss::Loss;
use crate::master::TrainTarget;
use crate::optim::MasterOptimizer;
use crate::scaler::GradScaler;
use crate::step::{
    verdicts, Accumulation, Scaled, ScaledLoss, StepOutcome, Unscaled, UnscaledGrads,
};
use crate::tape::MixedGradients;

use super::collective::{AllReduce, Collective};
use super::digest::scaler_digest;
use super::reduce::{average_master_grads, reduce_fp8_amaxes};
use super::rules::{AllReducedOnce, ReducedAcrossRanks, ReducedOutcomes};
use super::{AllReduced, Unreduced};

/// A loss scaler for data-parallel training over the collective `C`: the typed step of a
/// [`GradScaler`] with the reduction across ranks in it (see the [module](super) documentation).
///
/// It keeps its [`GradScaler`] to itself: the scale changes only in [`DataParallel::update`],
/// from overflow flags reduced across ranks, so it stays the same on every rank.
#[derive(Debug)]
pub struct DataParallel<C> {
    pub(super) scaler: GradScaler,
    pub(super) comm: C,
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
    /// Takes a rank's own gradients only, of kind [`Unreduced`] (what [`DataParallel::unscale`]
    /// returns; rule `AllReducedOnce`): all-reducing its result again would divide the average by
    /// the number of ranks again, and a single-process scaler's gradients are not this run's.
    ///
    /// Collective: every rank calls it once per optimizer step.
    pub fn all_reduce<'t, D, T, K>(
        &self,
        mut grads: UnscaledGrads<'t, T, D, K>,
    ) -> Result<UnscaledGrads<'t, T, D, AllReduced>, AmpError>
    where
        D: AmpDevice,
        T: TrainTarget<D>,
        K: AllReducedOnce,
        C: AllReduce<D>,
    {
        if grads.scaler_ids().any(|id| id != self.scaler.id()) {
            return Err(AmpError::ScalerMismatch(
                "these gradients were unscaled by another scaler",
            ));
        }
        let found_inf = self.comm.any(grads.found_inf())?;
        // The FP8 recipe's amaxes of this step, reduced (max) before the step commits them to
        // the histories the next scales come from: every rank then scales alike.
        reduce_fp8_amaxes(
            &self.comm,
            grads.target_and_master().0.working().fp8_scaling(),
        )?;
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
    ///
    /// Takes gradients of kind [`AllReduced`] only (what [`DataParallel::all_reduce`] returns;
    /// rule `ReducedAcrossRanks`).
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
    ///
    /// Errors, before the scale changes, as [`GradScaler::update`] does: with
    /// [`AmpError::NoOutcomes`] if there are none, and with [`AmpError::OutcomeNotUpdated`] if a
    /// step taken since the last update is missing from them.
    pub fn update<D: AmpDevice, O: ReducedOutcomes<D>>(
        &mut self,
        outcomes: O,
    ) -> Result<O::Grads, AmpError> {
        self.scaler.count(&verdicts(&outcomes))?;
        Ok(outcomes.into_grads())
    }
}
