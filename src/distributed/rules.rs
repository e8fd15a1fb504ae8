//! The data-parallel step's rules: only gradients and outcomes reduced across ranks are stepped
//! and update the scale.

use crate::device::AmpDevice;

use crate::step::{AllReduced, ReadyForStep};

/// Gradient kinds a data-parallel step takes: [`AllReduced`] alone.
#[diagnostic::on_unimplemented(
    message = "a data-parallel step takes gradients averaged across ranks, not gradients of kind `{Self}`",
    label = "not all-reduced across ranks",
    note = "in a data-parallel run: `dist.unscale(&mut model, grads)?`, then `dist.all_reduce(..)?`, then `dist.step(&mut opt, ..)`"
)]
pub trait ReducedAcrossRanks: ReadyForStep {}
impl ReducedAcrossRanks for AllReduced {}

/// The outcomes of one data-parallel iteration's steps, consumed by [`DataParallel::update`](super::DataParallel::update):
/// one [`StepOutcome`](crate::step::StepOutcome) of kind [`AllReduced`], a tuple of them, an array or a `Vec`.
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
