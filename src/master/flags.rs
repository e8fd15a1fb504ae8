//! Per-parameter non-finite flags of an unscale, kept on the device and read back once a step.

use crate::device::{AmpDevice, StatsDevice};
use crate::error::AmpError;
use crate::params::ParamInfo;

/// The per-parameter non-finite flags of an unscale, kept on the device between steps.
pub(crate) struct NonFiniteFlags<D: AmpDevice> {
    device: D,
    slots: usize,
    stats: Option<<D as StatsDevice>::Stats>,
}

impl<D: AmpDevice> NonFiniteFlags<D> {
    pub(crate) fn new(device: &D, layout: &[ParamInfo]) -> Self {
        Self {
            device: device.clone(),
            slots: layout.iter().filter(|p| p.trainable).count(),
            stats: None,
        }
    }

    /// Runs `unscale` with the flag buffer, then reads the flags back (once).
    pub(crate) fn record(
        &mut self,
        unscale: impl FnOnce(&mut <D as StatsDevice>::Stats) -> Result<(), AmpError>,
    ) -> Result<Vec<bool>, AmpError> {
        let mut stats = match self.stats.take() {
            Some(stats) => stats,
            None => self
                .device
                .try_alloc_stats(self.slots)
                .map_err(AmpError::device)?,
        };
        let flags = unscale(&mut stats).and_then(|()| {
            self.device
                .try_read_stats(&stats)
                .map_err(AmpError::device)
                .map(|values| values.into_iter().map(|flag| flag != 0.0).collect())
        });
        self.stats = Some(stats);
        flags
    }
}
