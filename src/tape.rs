//! The mixed-precision tape: one tape that records dfdx ops of every precision and runs their
//! backward passes in one global reverse order.
//!
//! dfdx's own tape and gradient store hold a single dtype. [`MixedTape`] implements dfdx's public
//! [`Tape`] trait once, generically over the element type, so every dfdx op and module records
//! onto it unchanged, whichever precision it runs in. Each recorded op gets a number from one
//! global counter; backward sorts by it and runs in reverse, so a 16-bit layer's backward runs
//! after the FP32 loss's backward that feeds it, across any number of casts. Gradients land in a
//! [`MixedGradients`]: one dfdx [`Gradients`] store per precision, each parameter's gradient in
//! the parameter's own precision. The stores are indexed by the precision's position in
//! [`with_precisions!`](crate::with_precisions), so nothing here names a precision.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use dfdx::prelude::{
    Device, Gradients, HasShape, Merge, NoneTape, PutTape, Shape, Storage, Tape, Tensor, TryAdd,
};
use dfdx::tensor::{TrainingTape, UniqueId};

use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::params::{ParamVisitor, Parameters};
use crate::precision::{AmpElem, PRECISIONS};

/// Identifies what a set of gradients belongs to: the training target whose parameters they
/// were allocated for. Unscaling gradients into another target is refused with a typed error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TargetId(u64);

impl TargetId {
    /// A fresh id, distinct from every other in this process.
    pub(crate) fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        TargetId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// A gradient store of one precision, with its element type erased so that stores of every
/// precision fit one array.
trait ErasedStore: Any {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn clone_box(&self) -> Box<dyn ErasedStore>;
    fn retain_leafs(&mut self, ids: &[UniqueId]);
    fn mark_unwanted(&mut self, ids: &[UniqueId]);
    fn clear_unwanted(&mut self);
    fn drop_non_leafs(&mut self);
}

impl<E: AmpElem, D: AmpDevice + Device<E>> ErasedStore for Gradients<E, D> {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn clone_box(&self) -> Box<dyn ErasedStore> {
        Box::new(self.clone())
    }
    fn retain_leafs(&mut self, ids: &[UniqueId]) {
        Gradients::retain_leafs(self, ids);
    }
    fn mark_unwanted(&mut self, ids: &[UniqueId]) {
        Gradients::mark_unwanted(self, ids);
    }
    fn clear_unwanted(&mut self) {
        Gradients::clear_unwanted(self);
    }
    fn drop_non_leafs(&mut self) {
        Gradients::drop_non_leafs(self);
    }
}

/// Gradients of every precision: each tensor's gradient is kept in that tensor's precision.
pub struct MixedGradients<D: AmpDevice> {
    /// One store per precision, created on first use.
    stores: [Option<Box<dyn ErasedStore>>; PRECISIONS],
    /// Ids whose gradients survive a backward pass (parameters); `None` keeps all.
    retained: Option<Vec<UniqueId>>,
    /// Ids whose gradients nobody reads (the traced input, and what only it feeds): backward
    /// ops that check may skip computing them.
    unwanted: Vec<UniqueId>,
    /// The training target these gradients were allocated for.
    pub(crate) owner: Option<TargetId>,
    /// Whether `#[amp]` models record per-layer activation and gradient magnitudes.
    pub(crate) watch_layers: bool,
    /// Gradient magnitudes recorded by layer probes during backward, by probe.
    pub(crate) probe_grads: Vec<(u64, f32)>,
    /// The last backward's per-layer report (empty unless watching).
    pub(crate) layer_report: Vec<crate::watch::LayerReport>,
    /// FP32 gradients of parameters, written by typed-amp's fused ops (a matrix product
    /// accumulates in FP32, so a 16-bit weight's gradient is never rounded to 16 bits), keyed
    /// by the parameter's id whatever the parameter's own precision. A parameter's gradient is
    /// the sum of its entry here and its entry in the store of its precision (where dfdx's own
    /// ops put it), either of which may be absent.
    param_grads: BTreeMap<UniqueId, <D as Storage<f32>>::Vec>,
    /// Buffers of earlier passes' parameter gradients, kept for reuse: a fused op overwrites
    /// one instead of adding into a zeroed buffer.
    spare_param_grads: BTreeMap<UniqueId, <D as Storage<f32>>::Vec>,
    device: std::marker::PhantomData<D>,
}

impl<D: AmpDevice> Clone for MixedGradients<D> {
    fn clone(&self) -> Self {
        Self {
            stores: std::array::from_fn(|i| self.stores[i].as_ref().map(|s| s.clone_box())),
            retained: self.retained.clone(),
            unwanted: self.unwanted.clone(),
            owner: self.owner,
            watch_layers: self.watch_layers,
            probe_grads: self.probe_grads.clone(),
            layer_report: self.layer_report.clone(),
            param_grads: self.param_grads.clone(),
            spare_param_grads: BTreeMap::new(),
            device: std::marker::PhantomData,
        }
    }
}

impl<D: AmpDevice> std::fmt::Debug for MixedGradients<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MixedGradients")
            .field("owner", &self.owner)
            .finish_non_exhaustive()
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
            stores: std::array::from_fn(|_| None),
            retained: None,
            unwanted: Vec::new(),
            owner: None,
            watch_layers: false,
            probe_grads: Vec::new(),
            layer_report: Vec::new(),
            param_grads: BTreeMap::new(),
            spare_param_grads: BTreeMap::new(),
            device: std::marker::PhantomData,
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
                D: crate::device::Kernels<E>,
            {
                if trainable {
                    let buf = self.grads.store_mut::<E>().get_or_alloc_mut(param)?;
                    crate::ops::fill::FillKernel::<E>::try_fill(param.device(), buf, 0.0)?;
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
        // Every store keeps only parameters' gradients, even a store no parameter is in: an
        // FP16 model's FP32 store still receives the gradients of FP32 temporaries (the input
        // before its cast, the logits), which must not outlive the backward pass. Ids are unique
        // across precisions, so one list serves every store; one `retain_leafs` per store, not
        // per parameter, because each call sweeps the whole store.
        let ids = zero.ids;
        for store in self.stores.iter_mut().flatten() {
            store.retain_leafs(&ids);
        }
        self.retained = Some(ids);
        Ok(())
    }

    /// The gradients of precision `E`, if any tensor of that precision has one.
    pub fn store<E: AmpElem>(&self) -> Option<&Gradients<E, D>>
    where
        D: Device<E>,
    {
        let store = self.stores[E::INDEX].as_ref()?;
        store.as_any().downcast_ref()
    }

    /// The gradients of precision `E`, mutably, created (empty) if there were none.
    pub fn store_mut<E: AmpElem>(&mut self) -> &mut Gradients<E, D>
    where
        D: Device<E>,
    {
        let (retained, unwanted) = (&self.retained, &self.unwanted);
        let store = self.stores[E::INDEX].get_or_insert_with(|| {
            let mut store = Gradients::<E, D>::leaky();
            if let Some(ids) = retained {
                store.retain_leafs(ids);
            }
            store.mark_unwanted(unwanted);
            Box::new(store)
        });
        store
            .as_any_mut()
            .downcast_mut()
            .expect("the store at a precision's index holds that precision")
    }

    /// The store of precision `A` (if any) beside the store of another precision `B`, mutably
    /// (created if there was none): what a cast's backward reads and writes.
    pub(crate) fn pair_mut<A: AmpElem, B: AmpElem>(
        &mut self,
    ) -> (Option<&Gradients<A, D>>, &mut Gradients<B, D>)
    where
        D: Device<A> + Device<B>,
    {
        assert_ne!(A::INDEX, B::INDEX, "a pair of stores holds two precisions");
        self.store_mut::<B>();
        let (low, high) = self.stores.split_at_mut(A::INDEX.max(B::INDEX));
        let (a, b) = if A::INDEX < B::INDEX {
            (&low[A::INDEX], &mut high[0])
        } else {
            (&high[0], &mut low[B::INDEX])
        };
        let a = a.as_ref().and_then(|s| s.as_any().downcast_ref());
        let b = b
            .as_mut()
            .and_then(|s| s.as_any_mut().downcast_mut())
            .expect("created above");
        (a, b)
    }

    /// Takes the store of precision `E` out, leaving an empty one with the same retained ids.
    pub(crate) fn take_store<E: AmpElem>(&mut self) -> Gradients<E, D>
    where
        D: Device<E>,
    {
        let mut empty = Gradients::<E, D>::leaky();
        if let Some(ids) = &self.retained {
            empty.retain_leafs(ids);
        }
        std::mem::replace(self.store_mut::<E>(), empty)
    }

    /// A copy of `t`'s gradient as a tensor, if it has one: for a parameter whose fused op kept
    /// its gradient in FP32 ([`MixedGradients::param_grad`]), that gradient rounded once to
    /// `t`'s precision; for a parameter these gradients keep that no backward has reached yet
    /// (after [`MixedGradients::for_params`], or as a step returns them), zeros.
    pub fn get<S: Shape, E: AmpElem, T>(&self, t: &Tensor<S, E, D, T>) -> Option<Tensor<S, E, D>>
    where
        D: Device<E>,
    {
        let stored = self
            .store::<E>()
            .filter(|g| g.get_ref_checked(t).is_some())
            .map(|g| g.get(&t.retaped::<NoneTape>()));
        let Some(fp32) = self.param_grads.get(&t.id()) else {
            // A kept parameter that no backward has reached yet has a zero gradient; its buffer
            // is made when an op writes it.
            let kept = self
                .retained
                .as_ref()
                .is_some_and(|ids| ids.contains(&t.id()));
            if stored.is_none() && kept {
                return t.device().try_zeros_like(t.shape()).ok();
            }
            return stored;
        };
        let mut sum: Tensor<S, f32, D> = t.device().try_zeros_like(t.shape()).ok()?;
        *sum.storage_mut() = fp32.clone();
        if let Some(stored) = stored {
            sum = sum.try_add(stored.try_to_dtype::<f32>().ok()?).ok()?;
        }
        sum.try_to_dtype::<E>().ok()
    }

    /// The FP32 gradient a fused op keeps for parameter `id`, if any (see
    /// [`MixedGradients::get`] for the whole gradient).
    pub fn param_grad(&self, id: UniqueId) -> Option<&<D as Storage<f32>>::Vec> {
        self.param_grads.get(&id)
    }

    /// The FP32 gradient buffer of parameter `id` (`len` elements) for a fused op's backward to
    /// write, and whether it is fresh: a fresh buffer holds no gradient (its contents are left
    /// from an earlier pass), so the op overwrites it; otherwise the op adds to it. `None` if
    /// nobody reads `id`'s gradient (it is not a kept parameter).
    pub(crate) fn param_grad_mut(
        &mut self,
        id: UniqueId,
        len: usize,
        dev: &D,
    ) -> Result<Option<FreshBuf<'_, D>>, D::Err> {
        if !self.keeps(id) || self.unwanted.contains(&id) {
            return Ok(None);
        }
        let fresh = !self.param_grads.contains_key(&id);
        if fresh {
            let buf = match self.spare_param_grads.remove(&id) {
                Some(buf) if Storage::<f32>::len(dev, &buf) == len => buf,
                _ => Storage::<f32>::try_alloc_len(dev, len)?,
            };
            self.param_grads.insert(id, buf);
        }
        let buf = self.param_grads.get_mut(&id).expect("inserted above");
        Ok(Some((buf, fresh)))
    }

    /// Takes parameter `id`'s FP32 gradient out (to unscale it into its master's gradient).
    pub(crate) fn take_param_grad(&mut self, id: UniqueId) -> Option<<D as Storage<f32>>::Vec> {
        self.param_grads.remove(&id)
    }

    /// Keeps `buf` for reuse as parameter `id`'s FP32 gradient in a later pass.
    pub(crate) fn keep_spare(&mut self, id: UniqueId, buf: <D as Storage<f32>>::Vec) {
        self.spare_param_grads.insert(id, buf);
    }

    /// Moves every FP32 parameter gradient to the spares (the gradients of the next pass start
    /// from nothing).
    pub(crate) fn clear_param_grads(&mut self) {
        let live = std::mem::take(&mut self.param_grads);
        self.spare_param_grads.extend(live);
    }

    /// Whether the gradient of tensor `id` survives backward (is a parameter's, or every
    /// gradient is kept).
    pub(crate) fn keeps(&self, id: UniqueId) -> bool {
        self.retained.as_ref().is_none_or(|ids| ids.contains(&id))
    }

    /// Marks gradients nobody reads, in every store (see [`MixedTape`]'s traced input).
    fn mark_unwanted(&mut self, ids: &[UniqueId]) {
        self.unwanted.extend_from_slice(ids);
        for store in self.stores.iter_mut().flatten() {
            store.mark_unwanted(ids);
        }
    }

    /// Frees every gradient not marked as a parameter's (see [`MixedGradients::for_params`]).
    pub(crate) fn drop_non_leafs(&mut self) {
        for store in self.stores.iter_mut().flatten() {
            store.drop_non_leafs();
        }
    }
}

/// An FP32 gradient buffer for a fused op, and whether it is fresh (to overwrite) or holds a
/// gradient already (to add to); see [`MixedGradients::param_grad_mut`].
pub(crate) type FreshBuf<'a, D> = (&'a mut <D as Storage<f32>>::Vec, bool);

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
/// onto it. A loss's `backward` runs it (see [`crate::GradScaler::scale`]).
pub struct MixedTape<D: AmpDevice> {
    ops: Vec<(u64, BackwardOp<D>)>,
    grads: Option<MixedGradients<D>>,
    /// Activation magnitudes recorded by layer probes during forward.
    activations: Vec<crate::watch::ActivationRecord>,
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

    /// See [`AmpTape::offer_activation`](crate::ops::cast::AmpTape::offer_activation).
    pub(crate) fn offer_activation(&mut self, output: UniqueId, slot: std::rc::Rc<dyn Any>) {
        self.fusion = Some((output, slot));
    }

    /// See [`AmpTape::take_activation`](crate::ops::cast::AmpTape::take_activation).
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
    pub(crate) fn record_activation(&mut self, record: crate::watch::ActivationRecord) {
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
        grads.probe_grads.clear();
        grads.mark_unwanted(&self.unwanted);
        seed(&mut grads).map_err(AmpError::device)?;
        self.ops.sort_unstable_by_key(|(order, _)| *order);
        let was_backward = typed_amp_kernels::timing::set_backward(true);
        let ran = self
            .ops
            .into_iter()
            .rev()
            .try_for_each(|(_, op)| op(&mut grads));
        typed_amp_kernels::timing::set_backward(was_backward);
        ran.map_err(AmpError::device)?;
        grads.drop_non_leafs();
        grads.unwanted.clear();
        for store in grads.stores.iter_mut().flatten() {
            // The marks belong to this pass's tensors; the stores live on.
            store.clear_unwanted();
        }
        grads.layer_report =
            crate::watch::report(self.activations, std::mem::take(&mut grads.probe_grads));
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

    #[test]
    fn stores_are_created_on_first_use_and_keep_the_retained_ids() {
        let dev = Cpu::default();
        let p: Tensor<Rank1<2>, half::f16, Cpu> = dev.zeros();
        let grads = MixedGradients::<Cpu>::for_params(&p).unwrap();
        assert!(grads.store::<f32>().is_none());
        assert!(grads.store::<half::f16>().is_some());
        let mut grads = grads;
        let t: Tensor<Rank1<2>, f32, Cpu> = dev.zeros();
        grads.store_mut::<f32>().get_or_alloc_mut(&t).unwrap();
        grads.drop_non_leafs();
        assert!(grads.store::<f32>().unwrap().get_ref_checked(&t).is_none());
        assert!(grads.get(&p).is_some());
    }
}
