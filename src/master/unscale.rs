//! Working gradients into master gradients: divided by the loss scale and checked for inf and
//! NaN, one flag per trainable parameter.
//!
//! A parameter's gradient comes in up to two parts: the FP32 gradient typed-amp's fused ops
//! keep ([`MixedGradients::param_grad`]) and the gradient dfdx's own ops leave in the store of
//! the parameter's precision. An FP32 part is moved into the master gradients, not copied (the
//! master's previous buffer is kept for the next pass to overwrite), a 16-bit part is widened
//! into them, and whatever the sum, it is unscaled and checked in place once.
//!
//! The walk queues each unscale ([`UnscaleBatchKernel`]) and [`UnscalePairs::finish`] runs them
//! all at once (on CUDA one launch per pair of precisions over a table of the tensors, Apex's
//! `multi_tensor_apply`; on the CPU each as it is queued).

use dfdx::prelude::{Shape, Storage, Tensor};

use super::pair::PairVisitor;
use crate::device::{
    AmpDevice, CastKernel, FillKernel, Kernels, StatsDevice, UnscaleBatchKernel, UnscaleKernel,
};
use crate::error::AmpError;
use crate::params::{ParamVisitor, Parameters};
use crate::precision::AmpElem;
use crate::tape::MixedGradients;

/// Unscales a working copy's gradients into its master's, pair by pair.
pub(crate) struct UnscalePairs<'a, D: AmpDevice> {
    pub(crate) working: &'a mut MixedGradients<D>,
    pub(crate) master: &'a mut MixedGradients<D>,
    pub(crate) inv_scale: f32,
    pub(crate) stats: &'a mut <D as StatsDevice>::Stats,
    pub(crate) slot: usize,
    /// The unscales queued by the walk, and the device that runs them.
    pub(crate) batch: (<D as UnscaleBatchKernel>::Batch, Option<D>),
}

impl<'a, D: AmpDevice> UnscalePairs<'a, D> {
    /// A walk that unscales `working`'s gradients into `master`, its flags from slot 0.
    pub(crate) fn new(
        working: &'a mut MixedGradients<D>,
        master: &'a mut MixedGradients<D>,
        inv_scale: f32,
        stats: &'a mut <D as StatsDevice>::Stats,
    ) -> Self {
        UnscalePairs {
            working,
            master,
            inv_scale,
            stats,
            slot: 0,
            batch: Default::default(),
        }
    }

    /// Runs the unscales the walk queued.
    pub(crate) fn finish(self) -> Result<(), AmpError> {
        match self.batch {
            (batch, Some(dev)) => dev
                .try_flush_unscale(batch, self.stats)
                .map_err(AmpError::device),
            (_, None) => Ok(()),
        }
    }
}

impl<D: AmpDevice> PairVisitor<D> for UnscalePairs<'_, D> {
    type Error = AmpError;

    fn visit_pair<Sm: Shape, Sw: Shape, E: AmpElem>(
        &mut self,
        _path: &str,
        master: &mut Tensor<Sm, f32, D>,
        working: &mut Tensor<Sw, E, D>,
        trainable: bool,
    ) -> Result<(), AmpError>
    where
        D: Kernels<E>,
    {
        if !trainable {
            return Ok(());
        }
        let slot = self.slot;
        self.slot += 1;
        let dev = master.device().clone();
        let fp32 = self.working.take_param_grad(working.id());
        let stored = self.working.store_mut::<E>().remove(working.id());
        let grads = self.master.store_mut::<f32>();
        let (inv, stats) = (self.inv_scale, &mut *self.stats);
        let batch = &mut self.batch.0;
        self.batch.1.get_or_insert_with(|| dev.clone());
        let result = match (fp32, stored) {
            (Some(fp32), stored) => {
                if let Some(old) = grads.insert(master.id(), fp32) {
                    self.working.keep_spare(working.id(), old);
                }
                let dst = grads.get_or_alloc_mut(master).map_err(AmpError::device)?;
                if let Some(stored) = stored {
                    CastKernel::<E, f32>::try_add_cast(&dev, &stored, dst)
                        .map_err(AmpError::device)?;
                }
                // SAFETY: `dst` stays in the master gradients, and `stats` with the caller,
                // untouched until `finish` runs the batch.
                unsafe {
                    UnscaleKernel::<f32>::try_queue_unscale_in_place(
                        &dev, batch, dst, inv, stats, slot,
                    )
                }
            }
            (None, Some(stored)) => {
                let dst = grads.get_or_alloc_mut(master).map_err(AmpError::device)?;
                // SAFETY: as above; the batch keeps `stored`.
                unsafe {
                    UnscaleKernel::<E>::try_queue_unscale_to_f32(
                        &dev, batch, stored, dst, inv, stats, slot,
                    )
                }
            }
            // A parameter the loss did not reach gets a zero gradient, as dfdx gives it, and its
            // flag is written too: the flag buffer is reused across steps.
            (None, None) => {
                let dst = grads.get_or_alloc_mut(master).map_err(AmpError::device)?;
                FillKernel::<f32>::try_fill(&dev, dst, 0.0).and_then(|()| {
                    UnscaleKernel::<f32>::try_unscale_in_place(&dev, dst, 1.0, stats, slot)
                })
            }
        };
        result.map_err(AmpError::device)
    }
}

/// Unscales a single-precision model's gradients in place: the model is its own master, so
/// `grads` (the store of its precision, moved out of the working gradients) becomes the master
/// gradients, with every FP32 part of `working` added in.
pub(crate) fn unscale_in_place<M: Parameters<D>, D: AmpDevice>(
    module: &M,
    working: &mut MixedGradients<D>,
    grads: &mut MixedGradients<D>,
    inv_scale: f32,
    stats: &mut <D as StatsDevice>::Stats,
) -> Result<(), AmpError> {
    struct Visit<'a, D: AmpDevice> {
        working: &'a mut MixedGradients<D>,
        grads: &'a mut MixedGradients<D>,
        inv_scale: f32,
        stats: &'a mut <D as StatsDevice>::Stats,
        slot: usize,
        batch: (<D as UnscaleBatchKernel>::Batch, Option<D>),
    }
    impl<D: AmpDevice> ParamVisitor<D> for Visit<'_, D> {
        type Error = AmpError;
        fn visit<S: Shape, E: AmpElem>(
            &mut self,
            _path: &str,
            param: &Tensor<S, E, D>,
            trainable: bool,
        ) -> Result<(), AmpError>
        where
            D: Kernels<E>,
        {
            if !trainable {
                return Ok(());
            }
            let slot = self.slot;
            self.slot += 1;
            let dev = param.device();
            self.batch.1.get_or_insert_with(|| dev.clone());
            let store = self.grads.store_mut::<E>();
            if let Some(fp32) = self.working.take_param_grad(param.id()) {
                match same_buf::<f32, E, D>(fp32) {
                    // An FP32 model: the fused op's buffer is the gradient, or adds to it.
                    Ok(fp32) => {
                        if let Some(stored) = store.insert(param.id(), fp32) {
                            let dst = store.get_or_alloc_mut(param).map_err(AmpError::device)?;
                            CastKernel::<E, E>::try_add_cast(dev, &stored, dst)
                                .map_err(AmpError::device)?;
                        }
                    }
                    // A 16-bit model (O3): the FP32 gradient is rounded once into it.
                    Err(fp32) => {
                        let dst = store.get_or_alloc_mut(param).map_err(AmpError::device)?;
                        CastKernel::<f32, E>::try_add_cast(dev, &fp32, dst)
                            .map_err(AmpError::device)?;
                        self.working.keep_spare(param.id(), fp32);
                    }
                }
            }
            let grad = store.get_or_alloc_mut(param).map_err(AmpError::device)?;
            let (inv, stats, batch) = (self.inv_scale, &mut *self.stats, &mut self.batch.0);
            // SAFETY: `grad` stays in the store, and `stats` with the caller, untouched until
            // the batch runs below.
            unsafe {
                UnscaleKernel::<E>::try_queue_unscale_in_place(dev, batch, grad, inv, stats, slot)
            }
            .map_err(AmpError::device)
        }
    }
    let mut visit = Visit {
        working,
        grads,
        inv_scale,
        stats,
        slot: 0,
        batch: Default::default(),
    };
    module.visit_params(&mut visit)?;
    match visit.batch {
        (batch, Some(dev)) => dev
            .try_flush_unscale(batch, visit.stats)
            .map_err(AmpError::device),
        (_, None) => Ok(()),
    }
}

/// After a single-precision model's step: its gradients leave the store (FP32 buffers are kept
/// for the next pass to overwrite, 16-bit ones dropped), so the next backward starts from
/// nothing instead of from buffers zeroed in a pass of their own.
pub(crate) fn release_grads<M: Parameters<D>, D: AmpDevice>(
    module: &M,
    working: &mut MixedGradients<D>,
) -> Result<(), AmpError> {
    struct Visit<'a, D: AmpDevice>(&'a mut MixedGradients<D>);
    impl<D: AmpDevice> ParamVisitor<D> for Visit<'_, D> {
        type Error = AmpError;
        fn visit<S: Shape, E: AmpElem>(
            &mut self,
            _path: &str,
            param: &Tensor<S, E, D>,
            trainable: bool,
        ) -> Result<(), AmpError>
        where
            D: Kernels<E>,
        {
            if !trainable {
                return Ok(());
            }
            if let Some(buf) = self.0.store_mut::<E>().remove(param.id()) {
                if let Ok(buf) = same_buf::<E, f32, D>(buf) {
                    self.0.keep_spare(param.id(), buf);
                }
            }
            Ok(())
        }
    }
    working.clear_param_grads();
    module.visit_params(&mut Visit(working))
}

/// A buffer of element type `A` as one of `B`: `Ok` exactly when they are the same type (an
/// FP32 gradient of an FP32 parameter), else the buffer back.
fn same_buf<A: AmpElem, B: AmpElem, D: Storage<A> + Storage<B>>(
    buf: <D as Storage<A>>::Vec,
) -> Result<<D as Storage<B>>::Vec, <D as Storage<A>>::Vec> {
    if A::INDEX != B::INDEX {
        return Err(buf);
    }
    let boxed: Box<dyn std::any::Any> = Box::new(buf);
    Ok(*boxed
        .downcast::<<D as Storage<B>>::Vec>()
        .unwrap_or_else(|_| unreachable!("equal indices name equal element types")))
}
