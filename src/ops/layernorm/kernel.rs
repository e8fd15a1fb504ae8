//! The mixed layer norm's kernels' trait.

use dfdx::prelude::{HasErr, Storage};
use dfdx::tensor::CpuError;

use crate::precision::AmpElem;

/// Each row's FP32 statistics, kept by the forward for the backward.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowStats {
    /// The row's mean.
    pub mean: Vec<f32>,
    /// `1 / √(variance + ε)`, the variance biased (divided by the width).
    pub rstd: Vec<f32>,
}

/// The passes of layer norm over rows of `width` activations of element type `E`, with FP32
/// parameters (`gamma`, `beta`, one per column) and FP32 arithmetic.
pub trait MixedLayerNormKernel<E: AmpElem>:
    Storage<E> + Storage<f32> + HasErr<Err: From<CpuError>>
{
    /// Whether the device has these kernels; without them no method here is called.
    const FUSED: bool = false;

    /// `y = (x − mean) · rstd · gamma + beta` per row, rounded once to `E`; returns each row's
    /// statistics.
    fn try_ln_forward(
        &self,
        width: usize,
        x: &<Self as Storage<E>>::Vec,
        y: &mut <Self as Storage<E>>::Vec,
        params: [&[f32]; 2],
        epsilon: f64,
    ) -> Result<RowStats, Self::Err> {
        let _ = (width, x, y, params, epsilon);
        Err(CpuError::WrongNumElements.into())
    }

    /// The gradients from `dy`: the input's written into `gx` (or added to it, if its flag
    /// says so; `None` when nobody reads it), and `[Σ dy·x̂, Σ dy]` per column (`gamma`'s and
    /// `beta`'s), summed in f64 in an order that does not depend on the thread count.
    fn try_ln_backward(
        &self,
        width: usize,
        x: &<Self as Storage<E>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        gx: Option<(&mut <Self as Storage<E>>::Vec, bool)>,
        gamma: &[f32],
        stats: &RowStats,
    ) -> Result<[Vec<f64>; 2], Self::Err> {
        let _ = (width, x, dy, gx, gamma, stats);
        Err(CpuError::WrongNumElements.into())
    }
}

#[cfg(feature = "cuda")]
impl<E: AmpElem> MixedLayerNormKernel<E> for dfdx::prelude::Cuda where
    dfdx::prelude::Cuda: Storage<E>
{
}
