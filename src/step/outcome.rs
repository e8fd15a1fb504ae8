//! What a step did ([`StepOutcome`]), and the outcomes an update consumes ([`StepOutcomes`]).

use std::marker::PhantomData;

use crate::device::AmpDevice;
use crate::scaler::{ScalerId, StepVerdict};
use crate::tape::MixedGradients;

use super::kind::{FromScaler, ScaleFree, StepKind};

/// What a step did, and the gradients for the next iteration.
///
/// With a scaler ([`FromScaler`]), the only way to the next gradients is
/// [`GradScaler::update`](crate::scaler::GradScaler::update), which consumes every outcome of the iteration; without one
/// ([`ScaleFree`]), [`StepOutcome::into_grads`].
///
/// Never `Clone` (rule `OutcomesAreNeverCloned`, which `outcome.clone()` fails on): an outcome
/// carries its step's overflow verdict and the next gradients to the update exactly once, and a
/// copy would count the step twice or hand out its gradients twice.
#[must_use = "pass the outcome to `scaler.update(..)`: it returns the gradients for the next iteration"]
pub struct StepOutcome<D: AmpDevice, K: StepKind = FromScaler> {
    /// The step's kind. Named for the rule: a struct literal of an outcome, refused for its
    /// private fields, names this one as not provided.
    pub(crate) only_a_step_makes_outcomes: PhantomData<K>,
    pub(crate) found_inf: bool,
    pub(crate) non_finite_params: Vec<String>,
    pub(crate) layers: Vec<crate::watch::LayerReport>,
    pub(crate) overflow: Option<crate::watch::Overflow>,
    /// Each scaler's part in the step (one, or one per loss merged in).
    pub(crate) verdicts: Vec<StepVerdict>,
    pub(crate) grads: MixedGradients<D>,
}

/// The rule that a step's outcome is never cloned: it carries the step's verdict to the
/// scaler's update exactly once, and a copy would count the step twice or hand out its
/// gradients twice. No type implements it, so `outcome.clone()` is a compile error that says so.
#[doc(hidden)] // no type meets it, so no user names it: `StepOutcome`'s documentation states the rule.
#[diagnostic::on_unimplemented(
    message = "a step's outcome is never cloned: `{Self}` carries its step's overflow verdict and the next gradients to the scaler's update exactly once",
    label = "outcomes are not `Clone`",
    note = "pass the outcome itself to `scaler.update(outcome)?` (several optimizers: a tuple, array or Vec of their outcomes); read what it says through a reference (`outcome.skipped()`, `outcome.non_finite_params()`)"
)]
pub trait OutcomesAreNeverCloned: sealed::NeverCloned {}

impl<D: AmpDevice, K: StepKind> Clone for StepOutcome<D, K>
where
    Self: OutcomesAreNeverCloned,
{
    fn clone(&self) -> Self {
        unreachable!("no type implements `OutcomesAreNeverCloned`")
    }
}

impl<D: AmpDevice, K: StepKind> std::fmt::Debug for StepOutcome<D, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepOutcome")
            .field("skipped", &self.found_inf)
            .field("non_finite_params", &self.non_finite_params)
            .finish_non_exhaustive()
    }
}

impl<D: AmpDevice, K: StepKind> StepOutcome<D, K> {
    /// Whether the optimizer step was skipped because a gradient was inf or NaN.
    pub fn skipped(&self) -> bool {
        self.found_inf
    }

    /// Paths of the parameters whose gradients were inf or NaN.
    pub fn non_finite_params(&self) -> &[String] {
        &self.non_finite_params
    }

    /// Per-layer magnitudes of the pass, when watching ([`MixedGradients::watch_layers`]).
    pub fn layers(&self) -> &[crate::watch::LayerReport] {
        &self.layers
    }

    /// The layer where values first stopped being finite, when watching.
    pub fn overflow(&self) -> Option<&crate::watch::Overflow> {
        self.overflow.as_ref()
    }
}

impl<D: AmpDevice> StepOutcome<D, ScaleFree> {
    /// The zeroed gradients, to trace the next iteration with.
    pub fn into_grads(self) -> MixedGradients<D> {
        self.grads
    }
}

/// The outcomes of one iteration's steps, consumed by [`GradScaler::update`](crate::scaler::GradScaler::update): one
/// [`StepOutcome`], a tuple of them, an array or a `Vec` (several optimizers sharing a scaler).
///
/// Sealed: implemented for those shapes of [`StepOutcome`]s only, and what an update reads of
/// them (the overflow verdicts, the next gradients) is the crate's alone, so that no value
/// other than a step's own outcome can clear a verdict or give the next gradients.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not the outcome of a step taken with a loss scaler",
    note = "`scaler.update(..)` takes what `scaler.step(..)` returned: one outcome, or a tuple, array or Vec of the outcomes of every optimizer that shared the scaler"
)]
pub trait StepOutcomes<D: AmpDevice>: sealed::OutcomeSet<D> {}

/// The seal of [`StepOutcomes`] and the data-parallel `ReducedOutcomes`: a trait public in a
/// private module, which no other crate can name, implement or call.
pub(crate) mod sealed {
    use crate::device::AmpDevice;
    use crate::scaler::ScalerId;

    /// The seal of [`OutcomesAreNeverCloned`](super::OutcomesAreNeverCloned), implemented by no
    /// type.
    pub trait NeverCloned {}

    /// What an update reads of the outcomes it is given.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` is not the outcome of a step",
        note = "an update takes what the step returned: one outcome, or a tuple, array or Vec of the outcomes of every optimizer that shared the scaler"
    )]
    pub trait OutcomeSet<D: AmpDevice> {
        /// The next iteration's gradients, one per outcome, in the outcomes' shape.
        type Grads;
        /// Calls `f` with each scaler's part in each step: the scaler, its number for the step,
        /// and whether that scaler's loss overflowed.
        fn for_each_verdict(&self, f: &mut dyn FnMut(ScalerId, u64, bool));
        /// The gradients, in the same shape as the outcomes.
        fn into_grads(self) -> Self::Grads;
    }
}

use sealed::OutcomeSet;

impl<D: AmpDevice, K: StepKind> OutcomeSet<D> for StepOutcome<D, K> {
    type Grads = MixedGradients<D>;
    fn for_each_verdict(&self, f: &mut dyn FnMut(ScalerId, u64, bool)) {
        for v in &self.verdicts {
            f(v.scaler, v.step, v.found_inf);
        }
    }
    fn into_grads(self) -> MixedGradients<D> {
        self.grads
    }
}

macro_rules! tuple_outcome_set {
    ($($name:ident $idx:tt),+) => {
        impl<D: AmpDevice, $($name: OutcomeSet<D>),+> OutcomeSet<D> for ($($name,)+) {
            type Grads = ($($name::Grads,)+);
            fn for_each_verdict(&self, f: &mut dyn FnMut(ScalerId, u64, bool)) {
                $(self.$idx.for_each_verdict(f);)+
            }
            fn into_grads(self) -> Self::Grads {
                ($(self.$idx.into_grads(),)+)
            }
        }
    };
}
tuple_outcome_set!(A 0, B 1);
tuple_outcome_set!(A 0, B 1, C 2);
tuple_outcome_set!(A 0, B 1, C 2, F 3);

impl<D: AmpDevice, O: OutcomeSet<D>, const N: usize> OutcomeSet<D> for [O; N] {
    type Grads = [O::Grads; N];
    fn for_each_verdict(&self, f: &mut dyn FnMut(ScalerId, u64, bool)) {
        for o in self {
            o.for_each_verdict(f);
        }
    }
    fn into_grads(self) -> Self::Grads {
        self.map(OutcomeSet::into_grads)
    }
}

impl<D: AmpDevice, O: OutcomeSet<D>> OutcomeSet<D> for Vec<O> {
    type Grads = Vec<O::Grads>;
    fn for_each_verdict(&self, f: &mut dyn FnMut(ScalerId, u64, bool)) {
        for o in self {
            o.for_each_verdict(f);
        }
    }
    fn into_grads(self) -> Self::Grads {
        self.into_iter().map(OutcomeSet::into_grads).collect()
    }
}

/// The verdicts of `outcomes`: each scaler's part in each step.
pub(crate) fn verdicts<D: AmpDevice, O: OutcomeSet<D>>(outcomes: &O) -> Vec<StepVerdict> {
    let mut verdicts = Vec::new();
    outcomes.for_each_verdict(&mut |scaler, step, found_inf| {
        verdicts.push(StepVerdict {
            scaler,
            step,
            found_inf,
        })
    });
    verdicts
}

/// Implements an outcomes trait ([`StepOutcomes`], or the data-parallel `ReducedOutcomes`)
/// for one [`StepOutcome`] of step kind `$kind`, and for tuples, arrays and `Vec`s of outcomes.
/// The traits stay apart so that each names its own rule when an outcome does not fit; what
/// an update reads of them is their sealed supertrait's.
macro_rules! outcome_impls {
    ($outcomes:ident, $kind:ty) => {
        impl<D: $crate::device::AmpDevice> $outcomes<D> for $crate::step::StepOutcome<D, $kind> {}

        $crate::step::outcome_impls!(@tuple $outcomes [A, B]);
        $crate::step::outcome_impls!(@tuple $outcomes [A, B, C]);
        $crate::step::outcome_impls!(@tuple $outcomes [A, B, C, F]);

        impl<D: $crate::device::AmpDevice, O: $outcomes<D>, const N: usize> $outcomes<D> for [O; N] {}

        impl<D: $crate::device::AmpDevice, O: $outcomes<D>> $outcomes<D> for Vec<O> {}
    };
    (@tuple $outcomes:ident [$($name:ident),+]) => {
        impl<D: $crate::device::AmpDevice, $($name: $outcomes<D>),+> $outcomes<D> for ($($name,)+) {}
    };
}

pub(crate) use outcome_impls;

outcome_impls!(StepOutcomes, FromScaler);

impl<D: AmpDevice, K: StepKind> StepOutcome<D, K> {
    /// The same outcome as kind `K2`.
    pub(crate) fn into_kind<K2: StepKind>(self) -> StepOutcome<D, K2> {
        let StepOutcome {
            found_inf,
            non_finite_params,
            layers,
            overflow,
            verdicts,
            grads,
            ..
        } = self;
        StepOutcome {
            only_a_step_makes_outcomes: PhantomData,
            found_inf,
            non_finite_params,
            layers,
            overflow,
            verdicts,
            grads,
        }
    }
}
