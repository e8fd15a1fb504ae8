//! The fused update: Adam and SGD over each master/working pair, refreshing the working copy
//! in the same pass. The walk queues each pair's update and runs them all after it
//! ([`UpdateBatchKernel`]: on CUDA one launch per working precision).

use dfdx::optim::{Adam, Sgd};
use dfdx::prelude::{AdamConfig, Gradients, SgdConfig, Shape, Tensor, WeightDecay};

use crate::device::{AmpDevice, CastKernel, Kernels, UpdateBatchKernel, UpdateKernel};
use crate::error::AmpError;
use crate::master::{PairVisitor, Paired};
use crate::precision::AmpElem;
use crate::tape::MixedGradients;

/// The state store of an optimizer over FP32 masters, as the FP32 store it is (rule
/// [`UpdatablePrecision`] admits `E = f32` only).
pub(super) fn fp32_state<E: AmpElem, D: AmpDevice + Kernels<E>>(
    store: &mut Gradients<E, D>,
) -> &mut Gradients<f32, D> {
    (store as &mut dyn std::any::Any)
        .downcast_mut()
        .expect("optimizers over master weights hold FP32 state (rule UpdatablePrecision)")
}

/// Counts the parameters without a gradient, as dfdx's optimizers do.
pub(super) fn unused_error(unused: usize) -> Result<(), AmpError> {
    if unused == 0 {
        Ok(())
    } else {
        Err(AmpError::Optimizer(format!(
            "{unused} parameters had no gradient: was the optimizer built for this model?"
        )))
    }
}

/// Adam's update fused with the refresh, pair by pair.
pub(super) fn fused_adam<M, W, E, D>(
    opt: &mut Adam<M, E, D>,
    master: &mut M,
    working: &mut W,
    grads: &MixedGradients<D>,
) -> Result<(), AmpError>
where
    M: Paired<W, D>,
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
{
    struct Visit<'a, D: AmpDevice> {
        t: i32,
        cfg: AdamConfig,
        moments: (&'a mut Gradients<f32, D>, &'a mut Gradients<f32, D>),
        grads: &'a Gradients<f32, D>,
        unused: usize,
        batch: Batch<D>,
    }
    impl<D: AmpDevice> PairVisitor<D> for Visit<'_, D> {
        type Error = AmpError;
        fn visit_pair<Sm: Shape, Sw: Shape, W: AmpElem>(
            &mut self,
            path: &str,
            master: &mut Tensor<Sm, f32, D>,
            working: &mut Tensor<Sw, W, D>,
            trainable: bool,
        ) -> Result<(), AmpError>
        where
            D: Kernels<W>,
        {
            let Some(grad) = self.grads.get_ref_checked(master).filter(|_| trainable) else {
                self.unused += usize::from(trainable);
                return refresh_one(path, master, working, trainable);
            };
            let dev = master.device().clone();
            let m1 = self
                .moments
                .0
                .get_or_alloc_mut(master)
                .map_err(AmpError::device)?;
            let m2 = self
                .moments
                .1
                .get_or_alloc_mut(master)
                .map_err(AmpError::device)?;
            // Matrices-only decay, resolved by the master's rank (as dfdx's own update does).
            let cfg = AdamConfig {
                weight_decay: WeightDecay::for_rank(self.cfg.weight_decay, Sm::NUM_DIMS),
                ..self.cfg
            };
            self.batch.1.get_or_insert_with(|| dev.clone());
            // SAFETY: the master, its moments, its gradient and the working copy stay where
            // they are, untouched, until `flush` runs the batch after the walk.
            unsafe {
                UpdateKernel::<W>::try_queue_adam_refresh(
                    &dev,
                    &mut self.batch.0,
                    self.t,
                    &cfg,
                    master,
                    m1,
                    m2,
                    grad,
                    working.storage_mut(),
                )
            }
            .map_err(AmpError::device)
        }
    }
    // dfdx counts the step before updating, and keeps the count if a parameter had no gradient.
    let t = opt
        .step_count()
        .checked_add(1)
        .ok_or_else(|| AmpError::Optimizer("Adam's step count overflowed".to_string()))?;
    opt.set_step_count(t);
    let cfg = opt.cfg;
    let (m1, m2) = opt.moments_mut();
    let empty = Gradients::leaky();
    let mut visit = Visit {
        t,
        cfg,
        moments: (fp32_state(m1), fp32_state(m2)),
        grads: grads.store::<f32>().unwrap_or(&empty),
        unused: 0,
        batch: Default::default(),
    };
    master.visit_pairs(working, &mut visit)?;
    flush(visit.batch)?;
    unused_error(visit.unused)
}

/// The updates a walk queued, and the device that runs them.
type Batch<D> = (<D as UpdateBatchKernel>::Batch, Option<D>);

/// Runs the updates a walk queued.
fn flush<D: AmpDevice>(batch: Batch<D>) -> Result<(), AmpError> {
    match batch {
        (batch, Some(dev)) => dev.try_flush_update(batch).map_err(AmpError::device),
        (_, None) => Ok(()),
    }
}

/// SGD's update fused with the refresh, pair by pair.
pub(super) fn fused_sgd<M, W, E, D>(
    opt: &mut Sgd<M, E, D>,
    master: &mut M,
    working: &mut W,
    grads: &MixedGradients<D>,
) -> Result<(), AmpError>
where
    M: Paired<W, D>,
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
{
    struct Visit<'a, D: AmpDevice> {
        cfg: SgdConfig,
        velocity: &'a mut Gradients<f32, D>,
        grads: &'a Gradients<f32, D>,
        unused: usize,
        batch: Batch<D>,
    }
    impl<D: AmpDevice> PairVisitor<D> for Visit<'_, D> {
        type Error = AmpError;
        fn visit_pair<Sm: Shape, Sw: Shape, W: AmpElem>(
            &mut self,
            path: &str,
            master: &mut Tensor<Sm, f32, D>,
            working: &mut Tensor<Sw, W, D>,
            trainable: bool,
        ) -> Result<(), AmpError>
        where
            D: Kernels<W>,
        {
            let Some(grad) = self.grads.get_ref_checked(master).filter(|_| trainable) else {
                self.unused += usize::from(trainable);
                return refresh_one(path, master, working, trainable);
            };
            let dev = master.device().clone();
            let v = self
                .velocity
                .get_or_alloc_mut(master)
                .map_err(AmpError::device)?;
            let cfg = SgdConfig {
                weight_decay: WeightDecay::for_rank(self.cfg.weight_decay, Sm::NUM_DIMS),
                ..self.cfg
            };
            self.batch.1.get_or_insert_with(|| dev.clone());
            // SAFETY: as Adam's, above.
            unsafe {
                UpdateKernel::<W>::try_queue_sgd_refresh(
                    &dev,
                    &mut self.batch.0,
                    &cfg,
                    master,
                    v,
                    grad,
                    working.storage_mut(),
                )
            }
            .map_err(AmpError::device)
        }
    }
    let cfg = opt.cfg;
    let empty = Gradients::leaky();
    let mut visit = Visit {
        cfg,
        velocity: fp32_state(opt.velocity_mut()),
        grads: grads.store::<f32>().unwrap_or(&empty),
        unused: 0,
        batch: Default::default(),
    };
    master.visit_pairs(working, &mut visit)?;
    flush(visit.batch)?;
    unused_error(visit.unused)
}

/// The refresh of one pair that the optimizer did not update: a buffer (working → master), or
/// a weight without a gradient (master → working).
pub(super) fn refresh_one<Sm: Shape, Sw: Shape, W: AmpElem, D: AmpDevice + Kernels<W>>(
    _path: &str,
    master: &mut Tensor<Sm, f32, D>,
    working: &mut Tensor<Sw, W, D>,
    trainable: bool,
) -> Result<(), AmpError> {
    let dev = master.device().clone();
    if trainable {
        CastKernel::<f32, W>::try_copy_cast(&dev, master.storage(), working.storage_mut())
    } else {
        CastKernel::<W, f32>::try_copy_cast(&dev, working.storage(), master.storage_mut())
    }
    .map_err(AmpError::device)
}
