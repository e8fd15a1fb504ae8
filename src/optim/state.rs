//! An optimizer's state by name, for checkpoints ([`OptimizerState`]).

use dfdx::optim::{Adam, Sgd};
use dfdx::prelude::Gradients;

use crate::device::{AmpDevice, Kernels};
use crate::error::AmpError;
use crate::precision::AmpElem;

use super::low_precision::LowPrecisionUpdates;

/// A borrowed optimizer state store (momentum, a moment), in the optimizer's precision.
pub struct StateRef<'a>(&'a dyn std::any::Any);

/// A mutably borrowed optimizer state store.
pub struct StateMut<'a>(&'a mut dyn std::any::Any);

impl<'a> StateRef<'a> {
    /// Wraps a store.
    pub fn new<E: AmpElem, D: AmpDevice + Kernels<E>>(store: &'a Gradients<E, D>) -> Self {
        StateRef(store)
    }

    /// The store, if it is of precision `E`.
    pub fn get<E: AmpElem, D: AmpDevice + Kernels<E>>(&self) -> Option<&'a Gradients<E, D>> {
        self.0.downcast_ref()
    }
}

impl<'a> StateMut<'a> {
    /// Wraps a store.
    pub fn new<E: AmpElem, D: AmpDevice + Kernels<E>>(store: &'a mut Gradients<E, D>) -> Self {
        StateMut(store)
    }

    /// The store, if it is of precision `E`.
    pub fn get<E: AmpElem, D: AmpDevice + Kernels<E>>(&mut self) -> Option<&mut Gradients<E, D>> {
        self.0.downcast_mut()
    }
}

/// What every value of an optimizer's state store must satisfy, beyond the precision and shape
/// of its parameter: checked when a checkpoint is loaded (before anything changes) and when one
/// is saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreInvariant {
    /// Finite (SGD's velocity, Adam's first moment).
    Finite,
    /// Finite and not negative (Adam's second moment, a weighted average of squares: a
    /// negative value would make `sqrt(v)` NaN and the next update NaN).
    FiniteNonNegative,
}

impl StoreInvariant {
    /// Which kind of value `value` is that breaks this invariant (`"non-finite"`,
    /// `"negative"`), if it breaks it.
    pub fn violation(self, value: f32) -> Option<&'static str> {
        if !value.is_finite() {
            Some("non-finite")
        } else if self == StoreInvariant::FiniteNonNegative && value < 0.0 {
            Some("negative")
        } else {
            None
        }
    }
}

/// An optimizer whose state can be saved and restored, so that a resumed run continues exactly.
///
/// State is a few named per-parameter stores in the optimizer's precision (SGD's `velocity`,
/// Adam's `moment1` and `moment2`) and a few named scalars (Adam's step count).
pub trait OptimizerState<D: AmpDevice> {
    /// A name for checkpoints (`"sgd"`, `"adam"`, `"rmsprop"`).
    fn kind(&self) -> &'static str;
    /// The per-parameter state stores, by name.
    fn stores(&self) -> Vec<(&'static str, StateRef<'_>)>;
    /// The per-parameter state stores, mutably.
    fn stores_mut(&mut self) -> Vec<(&'static str, StateMut<'_>)>;
    /// Scalar state, by name.
    fn scalars(&self) -> Vec<(&'static str, i64)>;
    /// Restores one scalar; errors on a name this optimizer does not have.
    fn set_scalar(&mut self, name: &str, value: i64) -> Result<(), AmpError>;
    /// What every value of the store `name` must satisfy ([`StoreInvariant::Finite`] unless
    /// the optimizer says more).
    fn store_invariant(&self, name: &str) -> StoreInvariant {
        let _ = name;
        StoreInvariant::Finite
    }
    /// Checks that a state is consistent as a whole, before it is loaded: `scalars` are the
    /// state's scalars (by [`OptimizerState::scalars`]' names, each at least 0), `entries` how
    /// many of the `trainable` parameters each store holds state for. Returns why not, as a
    /// sentence. By default any state is.
    fn check_state(
        &self,
        scalars: &[(&'static str, i64)],
        entries: &[(&'static str, usize)],
        trainable: usize,
    ) -> Result<(), String> {
        let _ = (scalars, entries, trainable);
        Ok(())
    }
}

impl<M, E: AmpElem, D: AmpDevice + Kernels<E>> OptimizerState<D> for Sgd<M, E, D> {
    fn kind(&self) -> &'static str {
        "sgd"
    }
    fn stores(&self) -> Vec<(&'static str, StateRef<'_>)> {
        vec![("velocity", StateRef::new(self.velocity()))]
    }
    fn stores_mut(&mut self) -> Vec<(&'static str, StateMut<'_>)> {
        vec![("velocity", StateMut::new(self.velocity_mut()))]
    }
    fn scalars(&self) -> Vec<(&'static str, i64)> {
        Vec::new()
    }
    fn set_scalar(&mut self, name: &str, _value: i64) -> Result<(), AmpError> {
        Err(AmpError::Optimizer(format!(
            "SGD has no scalar state `{name}`"
        )))
    }
}

impl<M, E: AmpElem, D: AmpDevice + Kernels<E>> OptimizerState<D> for Adam<M, E, D> {
    fn kind(&self) -> &'static str {
        "adam"
    }
    fn stores(&self) -> Vec<(&'static str, StateRef<'_>)> {
        let (m1, m2) = self.moments();
        vec![
            ("moment1", StateRef::new(m1)),
            ("moment2", StateRef::new(m2)),
        ]
    }
    fn stores_mut(&mut self) -> Vec<(&'static str, StateMut<'_>)> {
        let (m1, m2) = self.moments_mut();
        vec![
            ("moment1", StateMut::new(m1)),
            ("moment2", StateMut::new(m2)),
        ]
    }
    fn scalars(&self) -> Vec<(&'static str, i64)> {
        vec![("step_count", i64::from(self.step_count()))]
    }
    fn set_scalar(&mut self, name: &str, value: i64) -> Result<(), AmpError> {
        match name {
            "step_count" => {
                let t = i32::try_from(value).map_err(|_| {
                    AmpError::Optimizer(format!("Adam step count {value} is out of range"))
                })?;
                self.set_step_count(t);
                Ok(())
            }
            other => Err(AmpError::Optimizer(format!(
                "Adam has no scalar state `{other}`"
            ))),
        }
    }
    fn store_invariant(&self, name: &str) -> StoreInvariant {
        match name {
            "moment2" => StoreInvariant::FiniteNonNegative,
            _ => StoreInvariant::Finite,
        }
    }
    /// Every update counts a step and writes both moments of every trainable parameter (each
    /// gets a gradient, zero when unused): the moments hold state for the same parameters, and
    /// for some exactly when the step count is above 0.
    fn check_state(
        &self,
        scalars: &[(&'static str, i64)],
        entries: &[(&'static str, usize)],
        trainable: usize,
    ) -> Result<(), String> {
        let count = |name: &str| entries.iter().find(|(n, _)| *n == name).map(|(_, c)| *c);
        let t = scalars
            .iter()
            .find(|(n, _)| *n == "step_count")
            .map_or(0, |(_, t)| *t);
        let (Some(m1), Some(m2)) = (count("moment1"), count("moment2")) else {
            return Ok(());
        };
        if m1 != m2 {
            return Err(format!(
                "Adam's `moment1` holds state for {m1} parameters and its `moment2` for {m2}: every update writes both"
            ));
        }
        if t == 0 && m1 > 0 {
            return Err(format!(
                "Adam's step count is 0, but its moments hold state for {m1} parameters: every update counts a step"
            ));
        }
        if t > 0 && m1 == 0 && trainable > 0 {
            return Err(format!(
                "Adam's step count is {t}, but its moments hold no state: every update writes the moments of all {trainable} trainable parameters"
            ));
        }
        Ok(())
    }
}

impl<O: OptimizerState<D>, D: AmpDevice> OptimizerState<D> for LowPrecisionUpdates<O> {
    fn kind(&self) -> &'static str {
        self.0.kind()
    }
    fn stores(&self) -> Vec<(&'static str, StateRef<'_>)> {
        self.0.stores()
    }
    fn stores_mut(&mut self) -> Vec<(&'static str, StateMut<'_>)> {
        self.0.stores_mut()
    }
    fn scalars(&self) -> Vec<(&'static str, i64)> {
        self.0.scalars()
    }
    fn set_scalar(&mut self, name: &str, value: i64) -> Result<(), AmpError> {
        self.0.set_scalar(name, value)
    }
    fn store_invariant(&self, name: &str) -> StoreInvariant {
        self.0.store_invariant(name)
    }
    fn check_state(
        &self,
        scalars: &[(&'static str, i64)],
        entries: &[(&'static str, usize)],
        trainable: usize,
    ) -> Result<(), String> {
        self.0.check_state(scalars, entries, trainable)
    }
}
