use dfdx::prelude::Storage;
use dfdx::tensor::{Cuda, CudaError};

use super::HostKernel;
use crate::device::utilities::cuda::{check_lengths, raw, raw_mut, CudaElem, Raw};

impl<E: CudaElem> HostKernel<E> for Cuda {
    fn try_read(&self, buf: &<Cuda as Storage<E>>::Vec) -> Result<Vec<E>, CudaError> {
        if raw(self, &**buf)?.len == 0 {
            return Ok(Vec::new());
        }
        // Counted with dfdx's copies (`Cuda::transfer_counts`).
        self.read_to_host(&**buf)
    }

    fn try_write(
        &self,
        buf: &mut <Cuda as Storage<E>>::Vec,
        values: &[E],
    ) -> Result<(), CudaError> {
        let b = raw_mut(self, &mut **buf)?;
        // As for kernels: a mismatch is reported, never copied past the buffer's end.
        check_lengths(
            Raw {
                ptr: 0,
                len: values.len(),
            },
            b,
        )?;
        if b.len == 0 {
            return Ok(());
        }
        // Synchronous, because `values` is only borrowed; counted with dfdx's copies.
        self.write_from_host(values, &mut **buf)
    }
}
