//! Digests of a model's weights and a scaler's state, to check ranks are in sync.

use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::master::TrainTarget;
use crate::params::Parameters;
use crate::scaler::ScalerState;

use super::bytes::{Params, ReadBytes};

/// A 64-bit digest (FNV-1a) of a model's master weights and buffers, bit for bit.
pub fn master_digest<D: AmpDevice, T: TrainTarget<D>>(target: &T) -> Result<u64, AmpError> {
    let mut bytes = Vec::new();
    target
        .master()
        .visit_params(&mut ReadBytes(&mut bytes, Params::All))?;
    Ok(fnv1a(&bytes))
}

/// The loss-scaler state as bytes, bit for bit.
pub(super) fn scaler_digest(state: &ScalerState) -> Vec<u8> {
    format!("{state:?}|{}", state.scale.to_bits()).into_bytes()
}

/// FNV-1a, 64 bits.
pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
