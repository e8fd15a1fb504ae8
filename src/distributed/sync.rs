//! Keeping ranks the same: rank 0's model broadcast to every rank, batch-norm buffers synced,
//! and a check that weights and scale are identical everywhere.

use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::master::TrainTarget;
use crate::params::Parameters;

use super::bytes::{Params, ReadBytes, WriteBytes};
use super::collective::Collective;
use super::data_parallel::DataParallel;
use super::digest::{fnv1a, master_digest, scaler_digest};

impl<C: Collective> DataParallel<C> {
    /// Copies rank 0's master weights (and buffers) to every rank and refreshes the working
    /// copies, so that every rank starts from the same model. Collective.
    ///
    /// The model is marked as trained across ranks: a single-process step of it
    /// ([`RawGrads::check`](crate::step::RawGrads::check), [`GradScaler::unscale`](crate::scaler::GradScaler::unscale)),
    /// which would never all-reduce its gradients, is [`AmpError::NotAllReduced`] from then on.
    pub fn broadcast_master<D: AmpDevice, T: TrainTarget<D>>(
        &self,
        target: &mut T,
    ) -> Result<(), AmpError> {
        // From here on, a step of this model that skips the all-reduce is refused.
        target.mark_data_parallel();
        self.broadcast_params(target, Params::All)
    }

    /// Copies rank 0's buffers (batch norm running statistics: what no optimizer updates) to
    /// every rank, as PyTorch's `DistributedDataParallel` does. Each rank's training forwards
    /// update its buffers from its own shard, so they part between calls (the weights do not);
    /// call it before evaluating or saving. Collective.
    pub fn sync_buffers<D: AmpDevice, T: TrainTarget<D>>(
        &self,
        target: &mut T,
    ) -> Result<(), AmpError> {
        if !target.layout().iter().any(|p| !p.trainable) {
            return Ok(());
        }
        target.sync_buffers_to_master()?;
        self.broadcast_params(target, Params::Buffers)
    }

    fn broadcast_params<D: AmpDevice, T: TrainTarget<D>>(
        &self,
        target: &mut T,
        params: Params,
    ) -> Result<(), AmpError> {
        if self.comm.size() == 1 {
            return Ok(());
        }
        let mut bytes = Vec::new();
        if self.is_root() {
            target
                .master()
                .visit_params(&mut ReadBytes(&mut bytes, params))?;
        }
        self.comm.broadcast_bytes(0, &mut bytes)?;
        if !self.is_root() {
            let mut write = WriteBytes {
                bytes: &bytes,
                at: 0,
                params,
            };
            target.master_mut().visit_params_mut(&mut write)?;
            if write.at != bytes.len() {
                return Err(AmpError::Collective(format!(
                    "rank 0's model has {} bytes of parameters, this rank's {}",
                    bytes.len(),
                    write.at
                )));
            }
            target.reload_working()?;
        }
        Ok(())
    }

    /// A digest of this rank's master weights (and buffers) and loss-scaler state: equal on two
    /// ranks exactly when they hold the same bits (barring a 64-bit hash collision).
    pub fn fingerprint<D: AmpDevice, T: TrainTarget<D>>(
        &self,
        target: &T,
    ) -> Result<u64, AmpError> {
        let mut bytes = master_digest(target)?.to_le_bytes().to_vec();
        bytes.extend(scaler_digest(&self.scaler.state()));
        Ok(fnv1a(&bytes))
    }

    /// Checks that every rank holds the same master weights and loss-scaler state as rank 0,
    /// bit for bit; errors on every rank ([`AmpError::RanksDiverged`]) if any differs.
    /// Collective.
    pub fn check_in_sync<D: AmpDevice, T: TrainTarget<D>>(
        &self,
        target: &T,
    ) -> Result<(), AmpError> {
        let digest = self.fingerprint(target)?;
        self.check_same(&digest.to_le_bytes(), "master weights or loss-scaler state")
    }

    /// Errors on every rank unless every rank's `bytes` equal rank 0's.
    pub(super) fn check_same(&self, bytes: &[u8], what: &str) -> Result<(), AmpError> {
        if self.comm.size() == 1 {
            return Ok(());
        }
        let mut root = bytes.to_vec();
        self.comm.broadcast_bytes(0, &mut root)?;
        let differs = root != bytes;
        if self.comm.any(differs)? {
            return Err(AmpError::RanksDiverged(format!(
                "the {what} differs between ranks{}",
                if differs {
                    format!(" (rank {} differs from rank 0)", self.comm.rank())
                } else {
                    String::new()
                }
            )));
        }
        Ok(())
    }
}
