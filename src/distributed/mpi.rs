//! The MPI backend (feature `mpi`): rsmpi over the system's MPI library (OpenMPI's
//! `libopenmpi-dev` on Debian), for processes launched with `mpirun -n N`.

use dfdx::prelude::Storage;
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Root};

use super::{AllReduce, Collective};
use crate::device::{AmpDevice, HostKernel};
use crate::error::AmpError;

/// Elements per MPI call: MPI counts are C `int`s.
const MAX_COUNT: usize = 1 << 28;

/// MPI's world communicator: every process `mpirun` started.
///
/// Gradients are reduced on the host: each device buffer is copied into one contiguous FP32
/// buffer, summed onto rank 0 (`MPI_Reduce`) and broadcast back (`MPI_Bcast`), so that every rank
/// receives the same bits whatever the order in which MPI adds the ranks' values, and copied back
/// to the device. On the CPU the copies are memory copies.
///
/// MPI is initialised by [`MpiCollective::init`] and finalised when the value is dropped; a
/// process initialises it once.
pub struct MpiCollective {
    world: SimpleCommunicator,
    // Dropped last: finalises MPI.
    _universe: Universe,
}

impl std::fmt::Debug for MpiCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiCollective")
            .field("rank", &self.world.rank())
            .field("size", &self.world.size())
            .finish()
    }
}

impl MpiCollective {
    /// Initialises MPI and joins the world communicator. A process started without `mpirun` is
    /// rank 0 of 1.
    pub fn init() -> Result<Self, AmpError> {
        let universe = mpi::initialize().ok_or_else(|| {
            AmpError::Collective("MPI was initialised already in this process".to_string())
        })?;
        let world = universe.world();
        Ok(Self {
            world,
            _universe: universe,
        })
    }

    /// The MPI library's version string (e.g. `Open MPI v4.1.4, ...`).
    pub fn library_version() -> String {
        mpi::environment::library_version().unwrap_or_else(|_| "unknown MPI".to_string())
    }

    /// Sums `values` onto rank 0 and broadcasts the sum back, in place.
    fn reduce_broadcast<T>(&self, values: &mut [T]) -> Result<(), AmpError>
    where
        T: mpi::datatype::Equivalence + Copy + Default,
    {
        let root = self.world.process_at_rank(0);
        for chunk in values.chunks_mut(MAX_COUNT) {
            if self.world.rank() == 0 {
                let mut sum = vec![T::default(); chunk.len()];
                root.reduce_into_root(&*chunk, &mut sum[..], SystemOperation::sum());
                chunk.copy_from_slice(&sum);
            } else {
                root.reduce_into(&*chunk, SystemOperation::sum());
            }
            root.broadcast_into(chunk);
        }
        Ok(())
    }
}

fn rank_of(rank: usize) -> Result<i32, AmpError> {
    i32::try_from(rank).map_err(|_| AmpError::Collective(format!("no rank {rank}")))
}

impl Collective for MpiCollective {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn size(&self) -> usize {
        self.world.size() as usize
    }

    fn any(&self, flag: bool) -> Result<bool, AmpError> {
        let mut any = 0u8;
        self.world
            .all_reduce_into(&u8::from(flag), &mut any, SystemOperation::max());
        Ok(any != 0)
    }

    fn sum_f64(&self, values: &mut [f64]) -> Result<(), AmpError> {
        self.reduce_broadcast(values)
    }

    fn broadcast_bytes(&self, root: usize, bytes: &mut Vec<u8>) -> Result<(), AmpError> {
        if root >= self.size() {
            return Err(AmpError::Collective(format!(
                "broadcast from rank {root} of {}",
                self.size()
            )));
        }
        let root = self.world.process_at_rank(rank_of(root)?);
        let mut len = bytes.len() as u64;
        root.broadcast_into(&mut len);
        bytes.resize(len as usize, 0);
        for chunk in bytes.chunks_mut(MAX_COUNT) {
            root.broadcast_into(chunk);
        }
        Ok(())
    }

    fn barrier(&self) -> Result<(), AmpError> {
        self.world.barrier();
        Ok(())
    }
}

impl<D: AmpDevice> AllReduce<D> for MpiCollective {
    fn all_reduce_sum(
        &self,
        dev: &D,
        bufs: &mut [<D as Storage<f32>>::Vec],
    ) -> Result<(), AmpError> {
        let mut flat = Vec::with_capacity(bufs.iter().map(|b| Storage::<f32>::len(dev, b)).sum());
        for buf in bufs.iter() {
            flat.extend(HostKernel::<f32>::try_read(dev, buf).map_err(AmpError::device)?);
        }
        self.reduce_broadcast(&mut flat)?;
        let mut at = 0;
        for buf in bufs.iter_mut() {
            let len = Storage::<f32>::len(dev, buf);
            HostKernel::<f32>::try_write(dev, buf, &flat[at..at + len])
                .map_err(AmpError::device)?;
            at += len;
        }
        Ok(())
    }
}
