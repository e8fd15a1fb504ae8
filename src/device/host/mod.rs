//! Exact copies between a device buffer and the host, in the buffer's own precision: what
//! checkpoints read and write, bit for bit.

mod cpu_kernel;
#[cfg(feature = "cuda")]
mod cuda_kernel;

use dfdx::prelude::Storage;

use crate::precision::AmpElem;

/// Copies buffers of element type `E` to and from the host without conversion.
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait HostKernel<E: AmpElem>: Storage<E> {
    /// The buffer's elements, on the host.
    fn try_read(&self, buf: &Self::Vec) -> Result<Vec<E>, Self::Err>;

    /// Overwrites the buffer with `values`, which has the buffer's length.
    fn try_write(&self, buf: &mut Self::Vec, values: &[E]) -> Result<(), Self::Err>;
}
