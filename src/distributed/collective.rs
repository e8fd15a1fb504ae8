//! The collective operations a data-parallel run needs ([`Collective`], [`AllReduce`]), and
//! [`SingleProcess`], the group of one.

use dfdx::prelude::Storage;

use crate::device::AmpDevice;
use crate::error::AmpError;

/// The operations of a process group that do not touch a device's buffers: who is who, flags,
/// small host values, bytes from one rank to all, and a barrier.
///
/// Every rank must call the same operations in the same order (they are collective).
pub trait Collective {
    /// This process's rank, from 0.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn size(&self) -> usize;

    /// Whether `flag` is true on any rank (a logical OR across ranks); every rank gets the same
    /// answer.
    fn any(&self, flag: bool) -> Result<bool, AmpError>;

    /// Sums `values` element by element across ranks, in place, on the host (metrics: loss sums,
    /// counts). Every rank gets the same bits.
    fn sum_f64(&self, values: &mut [f64]) -> Result<(), AmpError>;

    /// Sends `bytes` of rank `root` to every rank (whose `bytes` are replaced, whatever their
    /// length).
    fn broadcast_bytes(&self, root: usize, bytes: &mut Vec<u8>) -> Result<(), AmpError>;

    /// Returns when every rank has called it.
    fn barrier(&self) -> Result<(), AmpError>;

    /// Whether this is rank 0, the rank that prints and writes checkpoints.
    fn is_root(&self) -> bool {
        self.rank() == 0
    }
}

/// A [`Collective`] that sums FP32 buffers of device `D` across ranks: the gradient reduction.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot all-reduce buffers of `{D}`",
    label = "no reduction for this device",
    note = "`MpiCollective` reduces host copies of any device's buffers, `NcclCollective` reduces CUDA buffers in place, `SingleProcess` has nothing to reduce"
)]
pub trait AllReduce<D: AmpDevice>: Collective {
    /// Sums each buffer element by element across ranks, in place. The buffers have the same
    /// lengths, in the same order, on every rank; every rank receives the same bits. One
    /// collective operation for the whole list.
    fn all_reduce_sum(
        &self,
        dev: &D,
        bufs: &mut [<D as Storage<f32>>::Vec],
    ) -> Result<(), AmpError>;
}

/// One process alone: rank 0 of 1. Every operation returns its input; [`DataParallel`](super::DataParallel) over it
/// trains exactly as a [`GradScaler`](crate::scaler::GradScaler) does (it is how tests and examples run the data-parallel
/// stages without a launcher).
#[derive(Debug, Clone, Copy, Default)]
pub struct SingleProcess;

impl Collective for SingleProcess {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn any(&self, flag: bool) -> Result<bool, AmpError> {
        Ok(flag)
    }
    fn sum_f64(&self, _values: &mut [f64]) -> Result<(), AmpError> {
        Ok(())
    }
    fn broadcast_bytes(&self, _root: usize, _bytes: &mut Vec<u8>) -> Result<(), AmpError> {
        Ok(())
    }
    fn barrier(&self) -> Result<(), AmpError> {
        Ok(())
    }
}

impl<D: AmpDevice> AllReduce<D> for SingleProcess {
    fn all_reduce_sum(
        &self,
        _dev: &D,
        _bufs: &mut [<D as Storage<f32>>::Vec],
    ) -> Result<(), AmpError> {
        Ok(())
    }
}

impl<C: Collective + ?Sized> Collective for &C {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn size(&self) -> usize {
        (**self).size()
    }
    fn any(&self, flag: bool) -> Result<bool, AmpError> {
        (**self).any(flag)
    }
    fn sum_f64(&self, values: &mut [f64]) -> Result<(), AmpError> {
        (**self).sum_f64(values)
    }
    fn broadcast_bytes(&self, root: usize, bytes: &mut Vec<u8>) -> Result<(), AmpError> {
        (**self).broadcast_bytes(root, bytes)
    }
    fn barrier(&self) -> Result<(), AmpError> {
        (**self).barrier()
    }
}

impl<D: AmpDevice, C: AllReduce<D> + ?Sized> AllReduce<D> for &C {
    fn all_reduce_sum(
        &self,
        dev: &D,
        bufs: &mut [<D as Storage<f32>>::Vec],
    ) -> Result<(), AmpError> {
        (**self).all_reduce_sum(dev, bufs)
    }
}
