//! A model's parameters as bytes and back, bit for bit, for broadcasts and digests.

use dfdx::prelude::{Shape, Storage, Tensor};

use crate::device::{AmpDevice, HostKernel, Kernels};
use crate::error::AmpError;
use crate::params::{Mutable, ParamVisitor};
use crate::precision::AmpElem;

/// Every parameter's bits (or only the buffers', the parameters no optimizer updates), in
/// visiting order.
pub(super) struct ReadBytes<'b>(pub(super) &'b mut Vec<u8>, pub(super) Params);

/// Which parameters a copy covers.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Params {
    All,
    Buffers,
}

impl<D: AmpDevice> ParamVisitor<D> for ReadBytes<'_> {
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
        if trainable && self.1 == Params::Buffers {
            return Ok(());
        }
        let values =
            HostKernel::<E>::try_read(param.device(), param.storage()).map_err(AmpError::device)?;
        self.0
            .extend(values.into_iter().flat_map(AmpElem::to_le_bytes));
        Ok(())
    }
}

/// Writes parameters from bytes [`ReadBytes`] made.
pub(super) struct WriteBytes<'b> {
    pub(super) bytes: &'b [u8],
    pub(super) at: usize,
    pub(super) params: Params,
}

impl<D: AmpDevice> ParamVisitor<D, Mutable> for WriteBytes<'_> {
    type Error = AmpError;
    fn visit<S: Shape, E: AmpElem>(
        &mut self,
        path: &str,
        param: &mut Tensor<S, E, D>,
        trainable: bool,
    ) -> Result<(), AmpError>
    where
        D: Kernels<E>,
    {
        if trainable && self.params == Params::Buffers {
            return Ok(());
        }
        let size = std::mem::size_of::<E>();
        let len = Storage::<E>::len(param.device(), param.storage());
        let end = self.at + len * size;
        let chunk = self.bytes.get(self.at..end).ok_or_else(|| {
            AmpError::Collective(format!(
                "rank 0's model has fewer parameter bytes than this rank's, at `{path}`"
            ))
        })?;
        let values: Vec<E> = chunk.chunks_exact(size).map(E::from_le_bytes).collect();
        self.at = end;
        let dev = param.device().clone();
        HostKernel::<E>::try_write(&dev, param.storage_mut(), &values).map_err(AmpError::device)
    }
}
