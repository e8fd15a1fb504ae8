//! The NCCL backend (feature `nccl`; type-checked by `cuda` + `ci-check`): NVIDIA's collective
//! library through cudarc, reducing CUDA buffers on the device, on dfdx's stream.
//!
//! One process per GPU. The ranks need a common NCCL id before they can talk: rank 0 makes one
//! and sends it to the others over another collective ([`NcclCollective::bootstrap`], e.g. over
//! `MpiCollective` (feature `mpi`) under `mpirun`), or the caller carries it
//! ([`NcclCollective::unique_id`], [`NcclCollective::from_id`]).

use std::sync::Arc;

use cudarc::driver::{CudaDevice, CudaSlice, DeviceSlice};
use cudarc::nccl::{group_end, group_start, Comm, Id, ReduceOp};
use dfdx::prelude::{Cuda, Storage};

use super::{AllReduce, Collective};
use crate::error::AmpError;

/// Bytes of an NCCL unique id.
pub const NCCL_ID_BYTES: usize = 128;

fn nccl_err(what: &str) -> impl Fn(cudarc::nccl::result::NcclError) -> AmpError + '_ {
    move |e| AmpError::Collective(format!("NCCL {what}: {:?}", e.0))
}

fn driver_err(e: cudarc::driver::DriverError) -> AmpError {
    AmpError::device(e)
}

/// An NCCL communicator over one GPU per rank.
///
/// Gradient buffers are summed with `ncclAllReduce` (one group call for the whole list) on the
/// stream dfdx's kernels run on, so the reduction is ordered with the backward pass and the
/// step without synchronisation; NCCL's ring gives every rank the same bits. Flags, metrics and
/// bytes go through small device buffers.
pub struct NcclCollective {
    comm: Comm,
    device: Arc<CudaDevice>,
}

impl std::fmt::Debug for NcclCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclCollective")
            .field("rank", &self.comm.rank())
            .field("size", &self.comm.world_size())
            .finish()
    }
}

impl NcclCollective {
    /// A new NCCL unique id, to be made by rank 0 and given to every rank.
    pub fn unique_id() -> Result<[u8; NCCL_ID_BYTES], AmpError> {
        let id = Id::new().map_err(nccl_err("unique id"))?;
        Ok(id.internal().map(|c| c as u8))
    }

    /// Joins the communicator of `size` ranks identified by `id`, as rank `rank`, on `dev`'s
    /// GPU. Every rank calls it with the same id.
    pub fn from_id(
        dev: &Cuda,
        rank: usize,
        size: usize,
        id: [u8; NCCL_ID_BYTES],
    ) -> Result<Self, AmpError> {
        let device = dev.cuda_device().clone();
        let comm = Comm::from_rank(
            device.clone(),
            rank,
            size,
            Id::uninit(id.map(|b| b as std::ffi::c_char)),
        )
        .map_err(nccl_err("communicator"))?;
        Ok(Self { comm, device })
    }

    /// Joins a communicator with the same ranks as `via` (e.g. an
    /// `MpiCollective` (feature `mpi`)), rank 0 sending the NCCL id over it.
    pub fn bootstrap(dev: &Cuda, via: &impl Collective) -> Result<Self, AmpError> {
        let mut id = if via.is_root() {
            Self::unique_id()?.to_vec()
        } else {
            Vec::new()
        };
        via.broadcast_bytes(0, &mut id)?;
        let id: [u8; NCCL_ID_BYTES] = id.try_into().map_err(|_| {
            AmpError::Collective("the NCCL id from rank 0 has the wrong length".to_string())
        })?;
        Self::from_id(dev, via.rank(), via.size(), id)
    }

    /// Sums a host vector across ranks through the device.
    fn all_reduce_host<T>(&self, values: Vec<T>, op: &ReduceOp) -> Result<Vec<T>, AmpError>
    where
        T: cudarc::nccl::NcclType
            + cudarc::driver::DeviceRepr
            + cudarc::driver::ValidAsZeroBits
            + Unpin,
    {
        let send = self.device.htod_copy(values).map_err(driver_err)?;
        let mut recv: CudaSlice<T> = self.device.alloc_zeros(send.len()).map_err(driver_err)?;
        self.comm
            .all_reduce(&send, &mut recv, op)
            .map_err(nccl_err("all-reduce"))?;
        self.device.dtoh_sync_copy(&recv).map_err(driver_err)
    }
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn size(&self) -> usize {
        self.comm.world_size()
    }

    fn any(&self, flag: bool) -> Result<bool, AmpError> {
        let any = self.all_reduce_host(vec![u8::from(flag)], &ReduceOp::Max)?;
        Ok(any[0] != 0)
    }

    fn sum_f64(&self, values: &mut [f64]) -> Result<(), AmpError> {
        if values.is_empty() {
            return Ok(());
        }
        let sums = self.all_reduce_host(values.to_vec(), &ReduceOp::Sum)?;
        values.copy_from_slice(&sums);
        Ok(())
    }

    fn broadcast_bytes(&self, root: usize, bytes: &mut Vec<u8>) -> Result<(), AmpError> {
        let root = i32::try_from(root)
            .ok()
            .filter(|r| (*r as usize) < self.size())
            .ok_or_else(|| AmpError::Collective(format!("no rank {root}")))?;
        let is_root = self.rank() == root as usize;
        // The length first (as eight bytes), then the bytes.
        let mut len = (bytes.len() as u64).to_le_bytes().to_vec();
        self.broadcast_raw(root, is_root, &mut len)?;
        let len = u64::from_le_bytes(len.try_into().expect("eight bytes")) as usize;
        bytes.resize(len, 0);
        if len > 0 {
            self.broadcast_raw(root, is_root, bytes)?;
        }
        Ok(())
    }

    fn barrier(&self) -> Result<(), AmpError> {
        self.any(false)?;
        Ok(())
    }
}

impl NcclCollective {
    fn broadcast_raw(&self, root: i32, is_root: bool, bytes: &mut [u8]) -> Result<(), AmpError> {
        let send = if is_root {
            Some(self.device.htod_copy(bytes.to_vec()).map_err(driver_err)?)
        } else {
            None
        };
        let mut recv: CudaSlice<u8> = self.device.alloc_zeros(bytes.len()).map_err(driver_err)?;
        self.comm
            .broadcast(&send, &mut recv, root)
            .map_err(nccl_err("broadcast"))?;
        let received = self.device.dtoh_sync_copy(&recv).map_err(driver_err)?;
        bytes.copy_from_slice(&received);
        Ok(())
    }
}

impl AllReduce<Cuda> for NcclCollective {
    fn all_reduce_sum(
        &self,
        _dev: &Cuda,
        bufs: &mut [<Cuda as Storage<f32>>::Vec],
    ) -> Result<(), AmpError> {
        // cudarc's safe all-reduce takes distinct send and receive buffers: the sums land in new
        // buffers, which then take the place of the inputs.
        let mut sums = Vec::with_capacity(bufs.len());
        for buf in bufs.iter() {
            let sum: CudaSlice<f32> = self.device.alloc_zeros(buf.len()).map_err(driver_err)?;
            sums.push(sum);
        }
        group_start().map_err(nccl_err("group start"))?;
        let mut result = Ok(());
        for (buf, sum) in bufs.iter().zip(sums.iter_mut()) {
            if let Err(e) = self.comm.all_reduce(&**buf, sum, &ReduceOp::Sum) {
                result = Err(e);
                break;
            }
        }
        // The group is closed whatever happened inside it.
        let end = group_end();
        result.map_err(nccl_err("all-reduce"))?;
        end.map_err(nccl_err("group end"))?;
        for (buf, sum) in bufs.iter_mut().zip(sums.iter_mut()) {
            std::mem::swap(&mut **buf, sum);
        }
        Ok(())
    }
}
