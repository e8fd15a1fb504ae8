//! What a step did ([`StepOutcome`]), and the outcomes an update consumes ([`StepOutcomes`]).

use std::marker::PhantomData;

use crate::device::AmpDevice;
use crate::scaler::ScalerId;
use crate::tape::MixedGradients;

use super::kind::{FromScaler, ScaleFree, StepKind};

/// What a step did, and the gradients for the next iteration.
///
/// With a scaler ([`FromScaler`]), the only way to the next gradients is
/// [`GradScaler::update`](crate::scaler::GradScaler::update), which consumes every outcome of the iteration; without one
/// ([`ScaleFree`]), [`StepOutcome::into_grads`].
#[must_use = "pass the outcome to `scaler.update(..)`: it returns the gradients for the next iteration"]
pub struct StepOutcome<D: AmpDevice, K: StepKind = FromScaler> {
    pub(crate) found_inf: bool,
    pub(crate) non_finite_params: Vec<String>,
    pub(crate) layers: Vec<crate::watch::LayerReport>,
    pub(crate) overflow: Option<crate::watch::Overflow>,
    pub(crate) scalers: Vec<(ScalerId, bool)>,
    pub(crate) grads: MixedGradients<D>,
    pub(crate) kind: PhantomData<K>,
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
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not the outcome of a step taken with a loss scaler",
    note = "`scaler.update(..)` takes what `scaler.step(..)` returned: one outcome, or a tuple, array or Vec of the outcomes of every optimizer that shared the scaler"
)]
pub trait StepOutcomes<D: AmpDevice> {
    /// The next iteration's gradients, one per outcome.
    type Grads;
    /// Calls `f` with each outcome's scalers and flags.
    #[doc(hidden)]
    fn for_each_flag(&self, f: &mut dyn FnMut(ScalerId, bool));
    /// The gradients, in the same shape as the outcomes.
    #[doc(hidden)]
    fn into_grads(self) -> Self::Grads;
}

/// Implements an outcomes trait ([`StepOutcomes`], or the data-parallel `ReducedOutcomes`)
/// for one [`StepOutcome`] of step kind `$kind`, and for tuples, arrays and `Vec`s of outcomes.
/// The traits stay apart so that each names its own rule when an outcome does not fit.
macro_rules! outcome_impls {
    ($outcomes:ident, $kind:ty) => {
        impl<D: $crate::device::AmpDevice> $outcomes<D> for $crate::step::StepOutcome<D, $kind> {
            type Grads = $crate::tape::MixedGradients<D>;
            fn for_each_flag(&self, f: &mut dyn FnMut($crate::scaler::ScalerId, bool)) {
                for (id, found) in self.scaler_flags() {
                    f(*id, *found);
                }
            }
            fn into_grads(self) -> $crate::tape::MixedGradients<D> {
                self.into_next_grads()
            }
        }

        $crate::step::outcome_impls!(@tuple $outcomes [A 0, B 1]);
        $crate::step::outcome_impls!(@tuple $outcomes [A 0, B 1, C 2]);
        $crate::step::outcome_impls!(@tuple $outcomes [A 0, B 1, C 2, F 3]);

        impl<D: $crate::device::AmpDevice, O: $outcomes<D>, const N: usize> $outcomes<D> for [O; N] {
            type Grads = [O::Grads; N];
            fn for_each_flag(&self, f: &mut dyn FnMut($crate::scaler::ScalerId, bool)) {
                for o in self {
                    o.for_each_flag(f);
                }
            }
            fn into_grads(self) -> Self::Grads {
                self.map($outcomes::into_grads)
            }
        }

        impl<D: $crate::device::AmpDevice, O: $outcomes<D>> $outcomes<D> for Vec<O> {
            type Grads = Vec<O::Grads>;
            fn for_each_flag(&self, f: &mut dyn FnMut($crate::scaler::ScalerId, bool)) {
                for o in self {
                    o.for_each_flag(f);
                }
            }
            fn into_grads(self) -> Self::Grads {
                self.into_iter().map($outcomes::into_grads).collect()
            }
        }
    };
    (@tuple $outcomes:ident [$($name:ident $idx:tt),+]) => {
        impl<D: $crate::device::AmpDevice, $($name: $outcomes<D>),+> $outcomes<D> for ($($name,)+) {
            type Grads = ($($name::Grads,)+);
            fn for_each_flag(&self, f: &mut dyn FnMut($crate::scaler::ScalerId, bool)) {
                $(self.$idx.for_each_flag(f);)+
            }
            fn into_grads(self) -> Self::Grads {
                ($(self.$idx.into_grads(),)+)
            }
        }
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
            scalers,
            grads,
            ..
        } = self;
        StepOutcome {
            found_inf,
            non_finite_params,
            layers,
            overflow,
            scalers,
            grads,
            kind: PhantomData,
        }
    }

    /// The scalers of the step, with their overflow flags.
    pub(crate) fn scaler_flags(&self) -> &[(ScalerId, bool)] {
        &self.scalers
    }

    /// The zeroed gradients for the next iteration.
    pub(crate) fn into_next_grads(self) -> MixedGradients<D> {
        self.grads
    }
}
