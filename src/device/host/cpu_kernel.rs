use dfdx::prelude::{Cpu, CpuError};

use super::HostKernel;
use crate::device::utilities::cpu::check_lengths;
use crate::precision::AmpElem;

impl<E: AmpElem> HostKernel<E> for Cpu {
    fn try_read(&self, buf: &Self::Vec) -> Result<Vec<E>, CpuError> {
        Ok(buf.to_vec())
    }

    fn try_write(&self, buf: &mut Self::Vec, values: &[E]) -> Result<(), CpuError> {
        check_lengths(values.len(), buf.len())?;
        buf.copy_from_slice(values);
        Ok(())
    }
}
