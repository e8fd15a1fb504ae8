//! [`MixedGradients`]: one dfdx gradient store per precision, and the FP32 gradients that
//! typed-amp's fused ops write for parameters of any precision.

use std::collections::BTreeMap;

use dfdx::prelude::{Device, Gradients, HasShape, NoneTape, Shape, Storage, Tensor, TryAdd};
use dfdx::tensor::UniqueId;

use super::computed::ComputedPrecisions;
use super::erased_store::ErasedStore;
use super::identity::{ScaledAt, TargetId};
use super::probe::{report, ActivationRecord, LayerReport};
use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::params::{ParamVisitor, Parameters};
use crate::precision::{AmpElem, PRECISIONS};

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
    /// The loss scaler whose backward pass last wrote these gradients, and how many updates it
    /// had counted then: a copy of them kept past that scaler's next update is last
    /// iteration's gradients (checked by the scaler's step, which sets it).
    pub(crate) scaled_at: Option<ScaledAt>,
    /// Whether a fused op wrote a kept parameter's FP32 gradient in the current pass (dfdx's
    /// stores record the same for their own writes).
    param_written: bool,
    /// Whether `#[amp]` models record per-layer activation and gradient magnitudes.
    pub(crate) watch_layers: bool,
    /// Gradient magnitudes recorded by layer probes during backward, by probe.
    pub(crate) probe_grads: Vec<(u64, f32)>,
    /// The last backward's per-layer report (empty unless watching).
    pub(crate) layer_report: Vec<LayerReport>,
    /// FP32 gradients of parameters, written by typed-amp's fused ops (a matrix product
    /// accumulates in FP32, so a 16-bit weight's gradient is never rounded to 16 bits), keyed
    /// by the parameter's id whatever the parameter's own precision. A parameter's gradient is
    /// the sum of its entry here and its entry in the store of its precision (where dfdx's own
    /// ops put it), either of which may be absent.
    param_grads: BTreeMap<UniqueId, <D as Storage<f32>>::Vec>,
    /// Buffers of earlier passes' parameter gradients, kept for reuse: a fused op overwrites
    /// one instead of adding into a zeroed buffer.
    spare_param_grads: BTreeMap<UniqueId, <D as Storage<f32>>::Vec>,
    /// The precisions backward passes computed gradients in since the last unscale.
    pub(crate) computed: ComputedPrecisions,
    device: std::marker::PhantomData<D>,
}

impl<D: AmpDevice> Clone for MixedGradients<D> {
    fn clone(&self) -> Self {
        Self {
            stores: std::array::from_fn(|i| self.stores[i].as_ref().map(|s| s.clone_box())),
            retained: self.retained.clone(),
            unwanted: self.unwanted.clone(),
            owner: self.owner,
            scaled_at: self.scaled_at,
            param_written: self.param_written,
            watch_layers: self.watch_layers,
            probe_grads: self.probe_grads.clone(),
            layer_report: self.layer_report.clone(),
            param_grads: self.param_grads.clone(),
            spare_param_grads: BTreeMap::new(),
            computed: self.computed,
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
            scaled_at: None,
            param_written: false,
            watch_layers: false,
            probe_grads: Vec::new(),
            layer_report: Vec::new(),
            param_grads: BTreeMap::new(),
            spare_param_grads: BTreeMap::new(),
            computed: ComputedPrecisions::default(),
            device: std::marker::PhantomData,
        }
    }

    /// The first precision without FP32's exponent range (FP16) that a backward pass into
    /// these gradients computed in since they were last unscaled, whatever the model declares:
    /// such gradients need a loss scale (rule [`FullRange`](crate::precision::FullRange)).
    pub fn computed_in_narrow_range(&self) -> Option<crate::precision::DType> {
        self.computed.narrow_range()
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
    pub fn layer_report(&self) -> &[LayerReport] {
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
                    crate::device::FillKernel::<E>::try_fill(param.device(), buf, 0.0)?;
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
        // Zeroed, they hold no iteration's gradients.
        self.scaled_at = None;
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

    /// The gradients of precision `E`, mutably, created (empty) if there were none. Inside a
    /// backward pass, notes that gradients were computed in `E`.
    pub fn store_mut<E: AmpElem>(&mut self) -> &mut Gradients<E, D>
    where
        D: Device<E>,
    {
        self.computed.note(E::INDEX);
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
        let Some(fresh) = self.ensure_param_grad(id, len, dev)? else {
            return Ok(None);
        };
        let buf = self.param_grads.get_mut(&id).expect("ensured above");
        Ok(Some((buf, fresh)))
    }

    /// Makes sure parameter `id` has an FP32 gradient buffer of `len` for a fused op to write,
    /// and says whether it is fresh; `None` if nobody reads `id`'s gradient.
    fn ensure_param_grad(
        &mut self,
        id: UniqueId,
        len: usize,
        dev: &D,
    ) -> Result<Option<bool>, D::Err> {
        if !self.keeps(id) || self.unwanted.contains(&id) {
            return Ok(None);
        }
        self.param_written = true;
        let fresh = !self.param_grads.contains_key(&id);
        if fresh {
            let buf = match self.spare_param_grads.remove(&id) {
                Some(buf) if Storage::<f32>::len(dev, &buf) == len => buf,
                _ => Storage::<f32>::try_alloc_len(dev, len)?,
            };
            self.param_grads.insert(id, buf);
        }
        Ok(Some(fresh))
    }

    /// The FP32 gradient buffers of the parameters `params` (each `(id, len)`, distinct ids;
    /// `None` where nobody reads one) beside the store of precision `E`, all at once: what a
    /// fused op's backward writes in one pass (layer norm: the input's gradient and γ's and
    /// β's).
    pub(crate) fn params_and_store_mut<E: AmpElem, const N: usize>(
        &mut self,
        params: [(UniqueId, usize); N],
        dev: &D,
    ) -> Result<ParamsAndStore<'_, D, E, N>, D::Err>
    where
        D: Device<E>,
    {
        self.store_mut::<E>();
        let mut fresh = [None; N];
        for (f, &(id, len)) in fresh.iter_mut().zip(&params) {
            *f = self.ensure_param_grad(id, len, dev)?;
        }
        let mut bufs: [Option<FreshBuf<'_, D>>; N] = std::array::from_fn(|_| None);
        for (id, buf) in self.param_grads.iter_mut() {
            if let Some(i) = params.iter().position(|(p, _)| p == id) {
                bufs[i] = fresh[i].map(|f| (buf, f));
            }
        }
        let store = self.stores[E::INDEX]
            .as_mut()
            .and_then(|s| s.as_any_mut().downcast_mut())
            .expect("created above");
        Ok((bufs, store))
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
    /// Starts a backward pass in which nobody reads the gradients of `unwanted`.
    pub(super) fn begin_pass(&mut self, unwanted: &[UniqueId]) {
        self.computed.begin_pass();
        self.probe_grads.clear();
        self.mark_unwanted(unwanted);
        self.take_param_written();
    }

    /// Whether any kept parameter's gradient was written since the last call (which resets the
    /// record): by a fused op, or by an op of any precision's store.
    pub(super) fn take_param_written(&mut self) -> bool {
        let mut written = std::mem::take(&mut self.param_written);
        for store in self.stores.iter_mut().flatten() {
            written |= store.take_leaf_written();
        }
        written
    }

    /// Whether these gradients belong to a training target with parameters to train (they
    /// were allocated by `alloc_grads`), so that a backward pass through none of them is
    /// another model's forward.
    pub(super) fn owned_with_params(&self) -> bool {
        self.owner.is_some() && self.retained.as_ref().is_some_and(|ids| !ids.is_empty())
    }

    /// Ends a backward pass: frees the temporaries' gradients and forgets the pass's marks
    /// (they name this pass's tensors; the stores live on), and joins the probes' records
    /// into the layer report.
    pub(super) fn end_pass(&mut self, activations: Vec<ActivationRecord>) {
        self.computed.end_pass();
        self.drop_non_leafs();
        self.unwanted.clear();
        for store in self.stores.iter_mut().flatten() {
            store.clear_unwanted();
        }
        self.layer_report = report(activations, std::mem::take(&mut self.probe_grads));
    }

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

/// Parameters' FP32 gradient buffers beside a store, as [`MixedGradients::params_and_store_mut`]
/// hands them out.
pub(crate) type ParamsAndStore<'a, D, E, const N: usize> =
    ([Option<FreshBuf<'a, D>>; N], &'a mut Gradients<E, D>);

/// An FP32 gradient buffer for a fused op, and whether it is fresh (to overwrite) or holds a
/// gradient already (to add to); see [`MixedGradients::param_grad_mut`].
pub(super) type FreshBuf<'a, D> = (&'a mut <D as Storage<f32>>::Vec, bool);

#[cfg(test)]
mod tests {
    use super::*;
    use dfdx::prelude::*;

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
