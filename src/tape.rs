//! The mixed-precision tape: one tape that records dfdx ops of both precisions and runs their
//! backward passes in one global reverse order.
//!
//! dfdx's own tape and gradient store hold a single dtype. [`MixedTape`] implements dfdx's public
//! [`Tape`] trait for `f16` and `f32` at once, so every dfdx op and module records onto it
//! unchanged, whichever precision it runs in. Each recorded op gets a number from one global
//! counter; backward sorts by it and runs in reverse, so an FP16 layer's backward runs after the
//! FP32 loss's backward that feeds it, across any number of casts. Gradients land in a
//! [`MixedGradients`], one dfdx [`Gradients`] per precision, each parameter's gradient in the
//! parameter's own precision.

use std::sync::atomic::{AtomicU64, Ordering};

use dfdx::prelude::{Device, Gradients, Merge, NoneTape, PutTape, Shape, Tape, Tensor};
use dfdx::tensor::{TrainingTape, UniqueId};
use half::f16;

use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::params::{ParamVisitor, Parameters};
use crate::precision::AmpElem;

/// Gradients of both precisions: each tensor's gradient is kept in that tensor's precision.
#[derive(Clone)]
pub struct MixedGradients<D: AmpDevice> {
    pub(crate) f32: Gradients<f32, D>,
    pub(crate) f16: Gradients<f16, D>,
    /// Whether `#[amp]` models record per-layer activation and gradient magnitudes.
    pub(crate) watch_layers: bool,
    /// Gradient magnitudes recorded by layer probes during backward, by probe.
    pub(crate) probe_grads: Vec<(u64, f32)>,
    /// The last backward's per-layer report (empty unless watching).
    pub(crate) layer_report: Vec<crate::watch::LayerReport>,
}

impl<D: AmpDevice> std::fmt::Debug for MixedGradients<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MixedGradients").finish_non_exhaustive()
    }
}

impl<D: AmpDevice> Default for MixedGradients<D> {
    fn default() -> Self {
        Self::leaky()
    }
}

impl<D: AmpDevice> MixedGradients<D> {
    /// Gradients that keep every tensor's gradient, temporaries included (dfdx's
    /// [`Gradients::leaky`]). Prefer [`MixedGradients::for_params`], which frees temporaries.
    pub fn leaky() -> Self {
        Self {
            f32: Gradients::leaky(),
            f16: Gradients::leaky(),
            watch_layers: false,
            probe_grads: Vec::new(),
            layer_report: Vec::new(),
        }
    }

    /// Turns per-layer watching on or off for the passes traced with these gradients: each
    /// layer of an `#[amp]` model then records the largest magnitude of its output and of the
    /// gradient of its output, and a step that overflows can name the layer that overflowed
    /// ([`crate::watch::overflowing_layer`]). Costs a reduction and a device→host read per
    /// layer per pass, so it is off by default.
    pub fn watch_layers(&mut self, on: bool) {
        self.watch_layers = on;
    }

    /// The last backward pass's per-layer report (empty unless watching).
    pub fn layer_report(&self) -> &[crate::watch::LayerReport] {
        &self.layer_report
    }

    /// Zeroed gradients for every trainable parameter of `module`, in each parameter's own
    /// precision. Only these survive a backward pass; gradients of temporaries are freed.
    pub fn for_params<M: Parameters<D>>(module: &M) -> Result<Self, AmpError> {
        let mut grads = Self::leaky();
        grads.zero_params(module)?;
        Ok(grads)
    }

    /// Zeroes the gradients of `module`'s trainable parameters (allocating any that are missing)
    /// and marks them as the gradients to keep.
    pub fn zero_params<M: Parameters<D>>(&mut self, module: &M) -> Result<(), AmpError> {
        struct Zero<'g, D: AmpDevice> {
            grads: &'g mut MixedGradients<D>,
            ids: Vec<UniqueId>,
        }
        impl<D: AmpDevice> ParamVisitor<D> for Zero<'_, D> {
            type Error = D::Err;
            fn visit<S: Shape, E: AmpElem>(
                &mut self,
                _path: &str,
                param: &Tensor<S, E, D>,
                trainable: bool,
            ) -> Result<(), D::Err>
            where
                D: Device<E>,
            {
                if trainable {
                    let buf = E::grads_mut(self.grads).get_or_alloc_mut(param)?;
                    param.device().try_fill(E::erase_mut::<D>(buf), 0.0)?;
                    self.ids.push(param.id());
                }
                Ok(())
            }
        }
        let mut zero = Zero {
            grads: self,
            ids: Vec::new(),
        };
        module.visit_params(&mut zero).map_err(AmpError::device)?;
        // One `retain_leafs` per store, not per parameter: each call sweeps the whole store.
        // Both stores keep only parameters' gradients, even a store no parameter is in: an FP16
        // model's FP32 store still receives the gradients of FP32 temporaries (the input before
        // its cast, the logits), which must not outlive the backward pass. Ids are unique across
        // precisions, so one list serves both stores.
        let ids = zero.ids;
        self.f32.retain_leafs(&ids);
        self.f16.retain_leafs(&ids);
        Ok(())
    }

    /// The gradients of one precision, as dfdx's [`Gradients`].
    pub fn of<E: AmpElem>(&self) -> &Gradients<E, D>
    where
        D: Device<E>,
    {
        E::grads(self)
    }

    /// A copy of `t`'s gradient as a tensor, if it has one.
    pub fn get<S: Shape, E: AmpElem, T>(&self, t: &Tensor<S, E, D, T>) -> Option<Tensor<S, E, D>>
    where
        D: Device<E>,
    {
        let grads = E::grads(self);
        grads.get_ref_checked(t)?;
        Some(grads.get(&t.retaped::<NoneTape>()))
    }

    /// Frees every gradient not marked as a parameter's (see [`MixedGradients::for_params`]).
    pub(crate) fn drop_non_leafs(&mut self) {
        self.f32.drop_non_leafs();
        self.f16.drop_non_leafs();
    }
}

type Op<G, Err> = Box<dyn FnOnce(&mut G) -> Result<(), Err>>;

/// A backward op of one precision, or one that reads and writes both (a cast).
enum BackwardOp<D: AmpDevice> {
    F32(Op<Gradients<f32, D>, D::Err>),
    F16(Op<Gradients<f16, D>, D::Err>),
    Mixed(Op<MixedGradients<D>, D::Err>),
}

/// Orders recorded ops across every tape of both precisions, the way dfdx's tensor ids order a
/// single-dtype tape.
pub(crate) fn next_op_order() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// A tape that records ops of both precisions in one global order.
///
/// Put it on an input with [`TraceMixed::traced_mixed`]; every dfdx op and module then records
/// onto it. A scaled loss's `backward` runs it (see [`crate::GradScaler::scale`]).
#[derive(Default)]
pub struct MixedTape<D: AmpDevice> {
    ops: Vec<(u64, BackwardOp<D>)>,
    grads: Option<MixedGradients<D>>,
    /// Activation magnitudes recorded by layer probes during forward.
    activations: Vec<crate::watch::ActivationRecord>,
    /// Set when two tapes that each carried gradients were merged: their stores cannot be joined,
    /// so backward reports it instead of silently dropping one.
    conflicting_grads: bool,
}

impl<D: AmpDevice> std::fmt::Debug for MixedTape<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MixedTape")
            .field("num_ops", &self.ops.len())
            .field("has_grads", &self.grads.is_some())
            .finish()
    }
}

impl<D: AmpDevice> MixedTape<D> {
    /// A tape that accumulates into `grads`.
    pub fn new(grads: MixedGradients<D>) -> Self {
        Self {
            grads: Some(grads),
            ..Self::default()
        }
    }

    /// Records an op that reads or writes gradients of both precisions.
    pub fn add_mixed_backward_op<F>(&mut self, op: F)
    where
        F: 'static + FnOnce(&mut MixedGradients<D>) -> Result<(), D::Err>,
    {
        self.ops
            .push((next_op_order(), BackwardOp::Mixed(Box::new(op))));
    }

    /// Whether layer probes should record (see [`MixedGradients::watch_layers`]).
    pub(crate) fn watching(&self) -> bool {
        self.grads.as_ref().is_some_and(|g| g.watch_layers)
    }

    /// Records a layer's activation magnitude (forward).
    pub(crate) fn record_activation(&mut self, record: crate::watch::ActivationRecord) {
        self.activations.push(record);
    }

    /// Number of recorded backward ops.
    pub fn num_ops(&self) -> usize {
        self.ops.len()
    }

    /// Runs every recorded op in reverse order of recording, after `seed` has initialised the
    /// output's gradient; returns the gradients with temporaries freed.
    pub(crate) fn execute(
        mut self,
        seed: impl FnOnce(&mut MixedGradients<D>) -> Result<(), D::Err>,
    ) -> Result<MixedGradients<D>, AmpError> {
        if self.conflicting_grads {
            return Err(AmpError::ConflictingGradients);
        }
        let mut grads = self.grads.take().unwrap_or_default();
        grads.probe_grads.clear();
        seed(&mut grads).map_err(AmpError::device)?;
        self.ops.sort_unstable_by_key(|(order, _)| *order);
        for (_, op) in self.ops.into_iter().rev() {
            match op {
                BackwardOp::F32(op) => op(&mut grads.f32),
                BackwardOp::F16(op) => op(&mut grads.f16),
                BackwardOp::Mixed(op) => op(&mut grads),
            }
            .map_err(AmpError::device)?;
        }
        grads.drop_non_leafs();
        grads.layer_report =
            crate::watch::report(self.activations, std::mem::take(&mut grads.probe_grads));
        Ok(grads)
    }
}

impl<D: AmpDevice> Tape<f32, D> for MixedTape<D> {
    const OWNS_TAPE: bool = true;
    fn add_backward_op<F>(&mut self, operation: F)
    where
        F: 'static + FnOnce(&mut Gradients<f32, D>) -> Result<(), D::Err>,
    {
        self.ops
            .push((next_op_order(), BackwardOp::F32(Box::new(operation))));
    }
}

impl<D: AmpDevice> Tape<f16, D> for MixedTape<D> {
    const OWNS_TAPE: bool = true;
    fn add_backward_op<F>(&mut self, operation: F)
    where
        F: 'static + FnOnce(&mut Gradients<f16, D>) -> Result<(), D::Err>,
    {
        self.ops
            .push((next_op_order(), BackwardOp::F16(Box::new(operation))));
    }
}

impl<D: AmpDevice> TrainingTape<f32, D> for MixedTape<D> {}
impl<D: AmpDevice> TrainingTape<f16, D> for MixedTape<D> {}

impl<D: AmpDevice> Merge<NoneTape> for MixedTape<D> {
    fn merge(self, _: NoneTape) -> Self {
        self
    }
}

impl<D: AmpDevice> Merge<MixedTape<D>> for MixedTape<D> {
    fn merge(mut self, mut other: Self) -> Self {
        self.conflicting_grads |= other.conflicting_grads;
        self.activations.append(&mut other.activations);
        match (&self.grads, other.grads.take()) {
            (_, None) => {}
            (None, Some(grads)) => self.grads = Some(grads),
            (Some(_), Some(_)) => self.conflicting_grads = true,
        }
        self.ops.append(&mut other.ops);
        self
    }
}

/// Starts recording a mixed-precision graph from a tensor.
pub trait TraceMixed<D: AmpDevice>: Sized {
    /// The same tensor carrying a [`MixedTape`].
    type Traced;

    /// Records onto a tape that accumulates into `grads` (see [`MixedGradients::for_params`]).
    fn traced_mixed(self, grads: MixedGradients<D>) -> Self::Traced;

    /// Clones `self` and records onto a tape that accumulates into `grads`.
    fn trace_mixed(&self, grads: MixedGradients<D>) -> Self::Traced
    where
        Self: Clone,
    {
        self.clone().traced_mixed(grads)
    }

    /// Records onto a tape that keeps every gradient, temporaries included.
    fn leaky_traced_mixed(self) -> Self::Traced {
        self.traced_mixed(MixedGradients::leaky())
    }
}

impl<S: Shape, E: AmpElem, D: AmpDevice + Device<E>> TraceMixed<D> for Tensor<S, E, D, NoneTape> {
    type Traced = Tensor<S, E, D, MixedTape<D>>;
    fn traced_mixed(self, grads: MixedGradients<D>) -> Self::Traced {
        self.put_tape(MixedTape::new(grads))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dfdx::prelude::*;

    #[test]
    fn merging_two_gradient_stores_is_reported() {
        let dev = Cpu::default();
        let a: Tensor<Rank1<2>, f32, Cpu> = dev.ones();
        let b: Tensor<Rank1<2>, f32, Cpu> = dev.ones();
        let y = (a.leaky_traced_mixed() + b.leaky_traced_mixed()).sum();
        let (_, tape) = y.split_tape();
        let result = tape.execute(|_| Ok(()));
        assert!(matches!(result, Err(AmpError::ConflictingGradients)));
    }

    #[test]
    fn a_tape_without_gradients_merges_into_one_with_them() {
        let dev = Cpu::default();
        let a: Tensor<Rank1<2>, f32, Cpu> = dev.ones();
        let b: Tensor<Rank1<2>, f32, Cpu> = dev.ones();
        let y = (a.leaky_traced_mixed() * b.retaped::<MixedTape<Cpu>>()).sum();
        let (_, tape) = y.split_tape();
        assert!(tape.num_ops() >= 2);
        assert!(tape.execute(|_| Ok(())).is_ok());
    }
}
