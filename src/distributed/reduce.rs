//! The reduction of master gradients across ranks: summed in FP32, divided by the number of
//! ranks.

use dfdx::prelude::Storage;

use crate::device::CastKernel;
use crate::device::FillKernel;
use crate::device::{AmpDevice, Kernels};
use crate::error::AmpError;
use crate::master::{for_each_trainable_grad, GradOp, TrainTarget};
use crate::precision::AmpElem;
use crate::tape::MixedGradients;

use super::collective::{AllReduce, Collective};

/// Sums the trainable master gradients across ranks in FP32 and divides by the number of ranks.
pub(super) fn average_master_grads<D, T, C>(
    comm: &C,
    target: &T,
    master: &mut MixedGradients<D>,
) -> Result<(), AmpError>
where
    D: AmpDevice,
    T: TrainTarget<D>,
    C: AllReduce<D>,
{
    /// Copies every gradient, widened to FP32, into buffers of its own.
    struct Gather<D: AmpDevice>(Vec<<D as Storage<f32>>::Vec>);
    impl<D: AmpDevice> GradOp<D> for Gather<D> {
        fn apply<E: AmpElem>(
            &mut self,
            dev: &D,
            _slot: usize,
            grad: &mut <D as Storage<E>>::Vec,
        ) -> Result<(), D::Err>
        where
            D: Kernels<E>,
        {
            let len = Storage::<E>::len(dev, grad);
            let mut buf = Storage::<f32>::try_alloc_len(dev, len)?;
            CastKernel::<E, f32>::try_copy_cast(dev, grad, &mut buf)?;
            self.0.push(buf);
            Ok(())
        }
    }
    /// Writes the sums back, divided by the number of ranks, rounded once to each gradient's
    /// precision.
    struct Scatter<D: AmpDevice> {
        sums: Vec<<D as Storage<f32>>::Vec>,
        inv_ranks: f32,
    }
    impl<D: AmpDevice> GradOp<D> for Scatter<D> {
        fn apply<E: AmpElem>(
            &mut self,
            dev: &D,
            slot: usize,
            grad: &mut <D as Storage<E>>::Vec,
        ) -> Result<(), D::Err>
        where
            D: Kernels<E>,
        {
            let sum = &mut self.sums[slot];
            FillKernel::<f32>::try_scale(dev, sum, self.inv_ranks)?;
            CastKernel::<f32, E>::try_copy_cast(dev, sum, grad)
        }
    }
    let mut gather = Gather::<D>(Vec::new());
    let Some(dev) = for_each_trainable_grad(target.master(), master, &mut gather)? else {
        return Ok(());
    };
    let mut sums = gather.0;
    comm.all_reduce_sum(&dev, &mut sums)?;
    let mut scatter = Scatter::<D> {
        sums,
        inv_ranks: 1.0 / comm.size() as f32,
    };
    for_each_trainable_grad(target.master(), master, &mut scatter)?;
    Ok(())
}

/// Replaces the pending amaxes of the FP8 recipe's state by their maximum across ranks. The
/// collective sums, so each rank puts its amaxes in its own slot of a `ranks × n` buffer of
/// zeros and the sum gathers them all, exactly (each slot sums one value with zeros); the max
/// is then taken on every rank alike.
pub(super) fn reduce_fp8_amaxes<C: Collective>(
    comm: &C,
    scaling: &crate::fp8::Fp8Scaling,
) -> Result<(), AmpError> {
    let mine = scaling.pending_amaxes();
    let n = mine.len();
    let mut all = vec![0f64; n * comm.size()];
    let slot = comm.rank() * n;
    for (d, &a) in all[slot..slot + n].iter_mut().zip(&mine) {
        *d = f64::from(a);
    }
    if comm.size() > 1 {
        comm.sum_f64(&mut all)?;
    }
    let reduced: Vec<f32> = (0..n)
        .map(|i| {
            (0..comm.size())
                .map(|r| all[r * n + i] as f32)
                .fold(0.0f32, f32::max)
        })
        .collect();
    scaling.set_reduced_amaxes(&reduced)?;
    Ok(())
}
