//! Gradient clipping, by global norm or by value, on unscaled gradients only.

use dfdx::prelude::Storage;

use crate::device::FillKernel;
use crate::device::ReduceKernel;
use crate::device::{AmpDevice, Kernels};
use crate::error::AmpError;
use crate::master::{for_each_trainable_grad, GradOp, TrainTarget};
use crate::precision::AmpElem;
use crate::tape::MixedGradients;

use super::kind::{ReadyForStep, StepKind};
use super::markers::Unscaled;
use super::unscaled::UnscaledGrads;

impl<'t, T: TrainTarget<D>, D: AmpDevice, K: StepKind> UnscaledGrads<'t, T, D, K> {
    /// The global 2-norm of all master gradients (inf or NaN if any gradient is).
    pub fn global_norm(&mut self) -> Result<f32, AmpError> {
        let squares = master_sums_of_squares(self.target, &mut self.master)?;
        Ok(squares.iter().map(|s| f64::from(*s)).sum::<f64>().sqrt() as f32)
    }

    fn clip_norm(&mut self, max_norm: f32) -> Result<f32, AmpError> {
        check_clip_limit(max_norm, "max_norm")?;
        let norm = self.global_norm()?;
        let factor = max_norm / (norm + 1e-6);
        if factor < 1.0 {
            struct Scale(f32);
            impl<D: AmpDevice> GradOp<D> for Scale {
                fn apply<E: AmpElem>(
                    &mut self,
                    dev: &D,
                    _slot: usize,
                    grad: &mut <D as Storage<E>>::Vec,
                ) -> Result<(), D::Err>
                where
                    D: Kernels<E>,
                {
                    FillKernel::<E>::try_scale(dev, grad, self.0)
                }
            }
            for_each_trainable_grad(self.target.master(), &mut self.master, &mut Scale(factor))?;
        }
        Ok(norm)
    }

    fn clip_value(&mut self, clip_value: f32) -> Result<(), AmpError> {
        check_clip_limit(clip_value, "clip_value")?;
        struct Clamp(f32);
        impl<D: AmpDevice> GradOp<D> for Clamp {
            fn apply<E: AmpElem>(
                &mut self,
                dev: &D,
                _slot: usize,
                grad: &mut <D as Storage<E>>::Vec,
            ) -> Result<(), D::Err>
            where
                D: Kernels<E>,
            {
                FillKernel::<E>::try_clamp(dev, grad, self.0)
            }
        }
        for_each_trainable_grad(
            self.target.master(),
            &mut self.master,
            &mut Clamp(clip_value),
        )?;
        Ok(())
    }
}

fn check_clip_limit(limit: f32, name: &str) -> Result<(), AmpError> {
    if limit.is_finite() && limit > 0.0 {
        Ok(())
    } else {
        Err(AmpError::InvalidClip(format!(
            "{name} must be finite and positive, got {limit}"
        )))
    }
}

/// Per trainable master parameter, the sum of squares of its gradient, computed on the device
/// and read back once.
fn master_sums_of_squares<D: AmpDevice, T: TrainTarget<D>>(
    target: &T,
    grads: &mut MixedGradients<D>,
) -> Result<Vec<f32>, AmpError> {
    struct SumSquares<D: AmpDevice> {
        slots: usize,
        stats: Option<<D as crate::device::utilities::StatsDevice>::Stats>,
    }
    impl<D: AmpDevice> GradOp<D> for SumSquares<D> {
        fn apply<E: AmpElem>(
            &mut self,
            dev: &D,
            slot: usize,
            grad: &mut <D as Storage<E>>::Vec,
        ) -> Result<(), D::Err>
        where
            D: Kernels<E>,
        {
            let stats = match &mut self.stats {
                Some(stats) => stats,
                None => self.stats.insert(dev.try_alloc_stats(self.slots)?),
            };
            ReduceKernel::<E>::try_sum_squares(dev, grad, stats, slot)
        }
    }
    let mut op = SumSquares::<D> {
        slots: target.layout().iter().filter(|p| p.trainable).count(),
        stats: None,
    };
    let device = for_each_trainable_grad(target.master(), grads, &mut op)?;
    match (device, op.stats) {
        (Some(dev), Some(stats)) => dev.try_read_stats(&stats).map_err(AmpError::device),
        _ => Ok(Vec::new()),
    }
}

/// Scales all master gradients so that their global 2-norm is at most `max_norm`, as PyTorch's
/// `clip_grad_norm_`: the factor is `max_norm / (norm + 1e-6)`, applied only when below 1.
/// Returns the norm before clipping (inf or NaN after an overflow, in which case the step will
/// be skipped anyway).
///
/// Takes only unscaled gradients: clipping scaled ones would clip at `max_norm × scale`; in a
/// data-parallel run, only gradients averaged across ranks (not [`Unreduced`](super::Unreduced)
/// ones; rule `ReadyForStep`), so that every rank clips the same average by the same norm.
pub fn clip_grad_norm<'t, D: AmpDevice, G: Unscaled<'t, D>>(
    grads: &mut G,
    max_norm: f32,
) -> Result<f32, AmpError>
where
    G::Kind: ReadyForStep,
{
    grads.as_unscaled_mut().clip_norm(max_norm)
}

/// Clamps every master gradient element to `[-clip_value, clip_value]`, as PyTorch's
/// `clip_grad_value_`. Takes only unscaled gradients, and in a data-parallel run only gradients
/// averaged across ranks (rule `ReadyForStep`), as [`clip_grad_norm`].
pub fn clip_grad_value<'t, D: AmpDevice, G: Unscaled<'t, D>>(
    grads: &mut G,
    clip_value: f32,
) -> Result<(), AmpError>
where
    G::Kind: ReadyForStep,
{
    grads.as_unscaled_mut().clip_value(clip_value)
}
