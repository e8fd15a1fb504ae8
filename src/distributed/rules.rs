//! The data-parallel step's rules: only gradients and outcomes reduced across ranks are stepped
//! and update the scale.

use crate::device::AmpDevice;

use crate::step::{AllReduced, OutcomeSet, ReadyForStep, StepKind, Unreduced};

/// Gradient kinds a data-parallel step takes: [`AllReduced`] alone.
#[doc(hidden)] // a rule on the sealed step kinds: users meet `AllReduced`, `Unreduced` and this message.
#[diagnostic::on_unimplemented(
    message = "a data-parallel step takes gradients averaged across ranks, not gradients of kind `{Self}`",
    label = "not all-reduced across ranks",
    note = "in a data-parallel run: `dist.unscale(&mut model, grads)?`, then `dist.all_reduce(..)?`, then `dist.step(&mut opt, ..)`"
)]
pub trait ReducedAcrossRanks: ReadyForStep {}
impl ReducedAcrossRanks for AllReduced {}

/// Gradient kinds [`DataParallel::all_reduce`](super::DataParallel::all_reduce) takes:
/// [`Unreduced`] alone, a rank's own gradients, so that each is all-reduced exactly once (a
/// second all-reduce would divide the average by the number of ranks again).
#[doc(hidden)] // a rule on the sealed step kinds: users meet `AllReduced`, `Unreduced` and this message.
#[diagnostic::on_unimplemented(
    message = "gradients are all-reduced across ranks exactly once, from a rank's own gradients (`Unreduced`), but these are of kind `{Self}`",
    label = "not a rank's own, unreduced gradients",
    note = "`dist.all_reduce(..)` takes what `dist.unscale(..)` returned; what it returns (`AllReduced`) is averaged already: clip it or pass it to `dist.step(..)`. A single-process scaler's (`FromScaler`) or scaler-free (`ScaleFree`) gradients go through `dist.unscale(&mut model, dist.scale(loss).backward()?)?` instead"
)]
pub trait AllReducedOnce: StepKind {}
impl AllReducedOnce for Unreduced {}

/// The outcomes of one data-parallel iteration's steps, consumed by [`DataParallel::update`](super::DataParallel::update):
/// one [`StepOutcome`](crate::step::StepOutcome) of kind [`AllReduced`], a tuple of them, an array or a `Vec`.
///
/// Sealed, as [`StepOutcomes`](crate::step::StepOutcomes) is: implemented for those shapes
/// only, and what an update reads of them is the crate's alone.
#[diagnostic::on_unimplemented(
    message = "`{Self}` carries an overflow flag of one rank alone: a data-parallel update takes the flag reduced across ranks",
    label = "not a data-parallel step's outcome",
    note = "`dist.update(..)` takes what `dist.step(..)` returned (one outcome, or a tuple, array or Vec of them), whose overflow flag `dist.all_reduce(..)` reduced across ranks, so that every rank skips and backs off alike"
)]
pub trait ReducedOutcomes<D: AmpDevice>: OutcomeSet<D> {}

crate::step::outcome_impls!(ReducedOutcomes, AllReduced);
