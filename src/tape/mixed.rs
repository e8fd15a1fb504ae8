//! [`MixedTape`]: one tape for ops of every precision, run in one global reverse order, and
//! [`TraceMixed`], which puts it on a model's input.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};

use dfdx::prelude::{Device, Gradients, Merge, NoneTape, PutTape, Shape, Tape, Tensor};
use dfdx::tensor::{TrainingTape, UniqueId};

use super::grads::MixedGradients;
use super::probe::ActivationRecord;
use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::precision::AmpElem;

type BackwardOp<D> =
    Box<dyn FnOnce(&mut MixedGradients<D>) -> Result<(), <D as dfdx::prelude::HasErr>::Err>>;

/// Orders recorded ops across every tape of every precision, the way dfdx's tensor ids order a
/// single-dtype tape.
pub(crate) fn next_op_order() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// A tape that records ops of every precision in one global order.
///
/// Put it on an input with [`TraceMixed::traced_mixed`]; every dfdx op and module then records
/// onto it. A loss's `backward` runs it (see [`crate::scaler::GradScaler::scale`]).
pub struct MixedTape<D: AmpDevice> {
    ops: Vec<(u64, BackwardOp<D>)>,
    grads: Option<MixedGradients<D>>,
    /// Activation magnitudes recorded by layer probes during forward.
    activations: Vec<ActivationRecord>,
    /// Tensors whose gradient nobody reads: the traced input (unless its gradient is kept) and
    /// what casts make of it. Linear layers skip computing it, as PyTorch does for inputs that
    /// do not require gradients.
    unwanted: Vec<UniqueId>,
    /// Set when two tapes that each carried gradients were merged: their stores cannot be joined,
    /// so backward reports it instead of silently dropping one.
    conflicting_grads: bool,
    /// The last op recorded, if it offered to fuse an activation of its output: the output's
    /// id and the op's record of the fusion.
    fusion: Option<(UniqueId, std::rc::Rc<dyn Any>)>,
}

impl<D: AmpDevice> Default for MixedTape<D> {
    fn default() -> Self {
        Self {
            ops: Vec::new(),
            grads: None,
            activations: Vec::new(),
            unwanted: Vec::new(),
            conflicting_grads: false,
            fusion: None,
        }
    }
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

    /// Records an op that reads or writes gradients of several precisions.
    pub fn add_mixed_backward_op<F>(&mut self, op: F)
    where
        F: 'static + FnOnce(&mut MixedGradients<D>) -> Result<(), D::Err>,
    {
        // Another op came between: an offered fusion would skip it.
        self.fusion = None;
        self.ops.push((next_op_order(), Box::new(op)));
    }

    /// See [`AmpTape::offer_activation`](crate::tape::AmpTape::offer_activation).
    pub(crate) fn offer_activation(&mut self, output: UniqueId, slot: std::rc::Rc<dyn Any>) {
        self.fusion = Some((output, slot));
    }

    /// See [`AmpTape::take_activation`](crate::tape::AmpTape::take_activation).
    pub(crate) fn take_activation(&mut self, output: UniqueId) -> Option<std::rc::Rc<dyn Any>> {
        match self.fusion.take() {
            Some((id, slot)) if id == output => Some(slot),
            _ => None,
        }
    }

    /// Whether layer probes should record (see [`MixedGradients::watch_layers`]).
    pub(crate) fn watching(&self) -> bool {
        self.grads.as_ref().is_some_and(|g| g.watch_layers)
    }

    /// Records a layer's activation magnitude (forward).
    pub(crate) fn record_activation(&mut self, record: ActivationRecord) {
        self.activations.push(record);
    }

    /// Whether nobody reads tensor `id`'s gradient.
    pub(crate) fn is_unwanted(&self, id: UniqueId) -> bool {
        self.unwanted.contains(&id)
    }

    /// Marks tensor `id`'s gradient as read by nobody.
    pub(crate) fn mark_unwanted(&mut self, id: UniqueId) {
        self.unwanted.push(id);
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
        grads.begin_pass(&self.unwanted);
        seed(&mut grads).map_err(AmpError::device)?;
        self.ops.sort_unstable_by_key(|(order, _)| *order);
        let ops = self.ops.len();
        let was_backward = typed_amp_kernels::timing::set_backward(true);
        let ran = self
            .ops
            .into_iter()
            .rev()
            .try_for_each(|(_, op)| op(&mut grads));
        typed_amp_kernels::timing::set_backward(was_backward);
        ran.map_err(AmpError::device)?;
        // Gradients allocated for a model whose parameters this pass never reached: the forward
        // ran through another model (whose gradients these stores do not keep), so the owner
        // would step on zeros and the other model never train.
        let reached_owner = grads.take_param_written();
        grads.end_pass(self.activations);
        if !reached_owner && ops > 0 && grads.owned_with_params() {
            return Err(AmpError::ForeignForward);
        }
        Ok(grads)
    }
}

impl<E: AmpElem, D: AmpDevice + Device<E>> Tape<E, D> for MixedTape<D> {
    const OWNS_TAPE: bool = true;
    fn add_backward_op<F>(&mut self, operation: F)
    where
        F: 'static + FnOnce(&mut Gradients<E, D>) -> Result<(), D::Err>,
    {
        self.add_mixed_backward_op(move |grads| operation(grads.store_mut::<E>()));
    }
}

impl<E: AmpElem, D: AmpDevice + Device<E>> TrainingTape<E, D> for MixedTape<D> {}

impl<D: AmpDevice> Merge<NoneTape> for MixedTape<D> {
    fn merge(self, _: NoneTape) -> Self {
        self
    }
}

impl<D: AmpDevice> Merge<MixedTape<D>> for MixedTape<D> {
    fn merge(mut self, mut other: Self) -> Self {
        // Ops of two tapes now interleave: no op is the last one any more.
        self.fusion = None;
        self.conflicting_grads |= other.conflicting_grads;
        self.activations.append(&mut other.activations);
        self.unwanted.append(&mut other.unwanted);
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

// Any element type: float inputs, and the token ids an embedding gathers with (whose tape
// carries the embedding's gradient).
impl<S: Shape, E: dfdx::prelude::Unit, D: AmpDevice + dfdx::prelude::Storage<E>> TraceMixed<D>
    for Tensor<S, E, D, NoneTape>
{
    type Traced = Tensor<S, E, D, MixedTape<D>>;
    fn traced_mixed(self, grads: MixedGradients<D>) -> Self::Traced {
        // The input's gradient is wanted only where every gradient is kept (leaky gradients)
        // or the input is itself a kept parameter.
        let wanted = grads.keeps(self.id());
        let mut tape = MixedTape::new(grads);
        if !wanted {
            tape.mark_unwanted(self.id());
        }
        self.put_tape(tape)
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
