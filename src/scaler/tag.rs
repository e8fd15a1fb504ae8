//! What the step's values carry of the scaler that scaled them: its identity and its ledger
//! and whether it scales ([`ScalerTag`]), and, once stepped, the step's verdict for it ([`StepVerdict`]).

use super::grad_scaler::ScalerId;
use super::ledger::Ledger;

/// The scaler of a loss, as its scaled loss, gradients and unscaled gradients carry it: which
/// scaler it is, and its ledger, in which the step taken with them is written down.
#[derive(Debug, Clone)]
pub(crate) struct ScalerTag {
    pub(crate) id: ScalerId,
    pub(crate) ledger: Ledger,
    /// Whether the scaler scales (not disabled): FP16 gradients need it to.
    pub(crate) scaling: bool,
}

/// One scaler's part in a step, as the outcome carries it to the update: which scaler, which of
/// its steps (the ledger's number), and whether that scaler's loss overflowed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepVerdict {
    pub(crate) scaler: ScalerId,
    pub(crate) step: u64,
    pub(crate) found_inf: bool,
}
