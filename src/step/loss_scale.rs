//! The rule that FP16 gradients need a loss scale ([`FullRange`](crate::precision::FullRange)), checked at run time on what
//! the gradients went through: the compiler checks it against the precision a model declares
//! ([`RawGrads::check`](super::RawGrads::check)); the gradients themselves record whether a
//! backward pass computed them in FP16 ([`MixedGradients::computed_in_narrow_range`]), which
//! catches what no declaration shows (a `ToF16` layer or a `.to_f16()` cast in an FP32 model)
//! and a scaler that is there but disabled.

use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::master::TrainTarget;
use crate::precision::Precision;
use crate::tape::MixedGradients;

/// Errors with [`AmpError::Fp16GradientsNeedALossScale`] if `grads` need a loss scale and got
/// none: `scaled` says whether an enabled scaler (dynamic or static) scaled them. Gradients need
/// one if the target's declared precision is FP16 or a backward pass computed them in FP16.
/// Checked before anything is unscaled, so weights, optimizer state and scale are untouched.
pub(crate) fn check_loss_scale<T: TrainTarget<D>, D: AmpDevice>(
    grads: &MixedGradients<D>,
    scaled: bool,
) -> Result<(), AmpError> {
    if scaled {
        return Ok(());
    }
    let declared_fp16 = !<T::Precision as Precision>::DTYPE.has_full_range();
    let computed_fp16 = grads.computed_in_narrow_range().is_some();
    let reason = match (declared_fp16, computed_fp16) {
        (false, false) => return Ok(()),
        // Only through a scaler: the scaler-free path needs `T::Precision: FullRange`.
        (true, _) => {
            "the model's working precision is F16 and its scaler is disabled \
             (`GradScaler::disabled()`)"
        }
        (false, true) => {
            "the backward pass computed gradients in FP16 (an FP16 op is on the tape: an FP16 \
             layer, a `ToF16` layer or a `.to_f16()` cast) although the model declares a \
             precision with FP32's range, and no enabled scaler scaled the loss"
        }
    };
    Err(AmpError::Fp16GradientsNeedALossScale { reason })
}
