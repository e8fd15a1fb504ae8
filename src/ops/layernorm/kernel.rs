//! The mixed layer norm's kernels' trait and the statistics it keeps.

use dfdx::prelude::{HasErr, Storage};

use crate::precision::AmpElem;

/// Each row's FP32 statistics, kept on the device by the forward for the backward.
pub struct RowStats<D: Storage<f32>> {
    /// The row's mean.
    pub mean: <D as Storage<f32>>::Vec,
    /// `1 / √(variance + ε)`, the variance biased (divided by the width).
    pub rstd: <D as Storage<f32>>::Vec,
}

/// The passes of layer norm over rows of `width` activations of element type `E`, with FP32
/// parameters (`gamma`, and `beta` if there is one, per column) and FP32 arithmetic.
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait MixedLayerNormKernel<E: AmpElem>: Storage<E> + Storage<f32> + HasErr {
    /// `y = (x − mean) · rstd · gamma + beta` per row, rounded once to `E`; returns each row's
    /// statistics.
    fn try_ln_forward(
        &self,
        width: usize,
        x: &<Self as Storage<E>>::Vec,
        y: &mut <Self as Storage<E>>::Vec,
        gamma: &<Self as Storage<f32>>::Vec,
        beta: Option<&<Self as Storage<f32>>::Vec>,
        epsilon: f64,
    ) -> Result<RowStats<Self>, Self::Err>;

    /// The gradients from `dy`: the input's written into `gx` (or added to it if its flag says
    /// so; `None` when nobody reads it), and `gamma`'s (`Σ dy·x̂` per column) and `beta`'s
    /// (`Σ dy`) added to their FP32 gradients (written over a fresh one), summed in an order that
    /// does not depend on the thread count.
    #[allow(clippy::too_many_arguments)]
    fn try_ln_backward(
        &self,
        width: usize,
        x: &<Self as Storage<E>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        gx: Option<(&mut <Self as Storage<E>>::Vec, bool)>,
        gamma: &<Self as Storage<f32>>::Vec,
        stats: &RowStats<Self>,
        dgamma: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
        dbeta: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
    ) -> Result<(), Self::Err>;
}
