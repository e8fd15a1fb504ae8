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

/// A forward's output and the statistics it keeps for the backward.
pub(crate) type OutputAndStats<D, E> = (<D as Storage<E>>::Vec, RowStats<D>);

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

    /// [`try_ln_forward`](Self::try_ln_forward) into a new buffer. The default zero-fills one
    /// for it; the CPU writes a new one whole without that pass.
    fn try_ln_forward_new(
        &self,
        width: usize,
        x: &<Self as Storage<E>>::Vec,
        gamma: &<Self as Storage<f32>>::Vec,
        beta: Option<&<Self as Storage<f32>>::Vec>,
        epsilon: f64,
    ) -> Result<OutputAndStats<Self, E>, Self::Err> {
        let mut y = Storage::<E>::try_alloc_len(self, Storage::<E>::len(self, x))?;
        let stats = self.try_ln_forward(width, x, &mut y, gamma, beta, epsilon)?;
        Ok((y, stats))
    }

    /// [`try_ln_backward`](Self::try_ln_backward) for an input with no gradient yet, written
    /// over `dy` (which then holds the input's gradient): no buffer to allocate. The default
    /// writes a new buffer and moves it into `dy`; the CPU works row by row in place.
    #[allow(clippy::too_many_arguments)]
    fn try_ln_backward_in_place(
        &self,
        width: usize,
        x: &<Self as Storage<E>>::Vec,
        dy: &mut <Self as Storage<E>>::Vec,
        gamma: &<Self as Storage<f32>>::Vec,
        stats: &RowStats<Self>,
        dgamma: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
        dbeta: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
    ) -> Result<(), Self::Err> {
        let mut gx = Storage::<E>::try_alloc_len(self, Storage::<E>::len(self, dy))?;
        let gx_arg = Some((&mut gx, false));
        self.try_ln_backward(width, x, dy, gx_arg, gamma, stats, dgamma, dbeta)?;
        *dy = gx;
        Ok(())
    }
}
