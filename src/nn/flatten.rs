//! Flattening image features for a linear layer.

use dfdx::nn::{NonMutableModule, ZeroSizedModule};
use dfdx::prelude::*;

/// Flattens `(batch, channels, height, width)` into `(batch, N)`, the input a `Linear<N, _>`
/// takes. `N` must equal `channels · height · width`: it is fixed by the architecture, so a
/// mismatch is a bug in the model definition and panics, naming both sizes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Flatten<const N: usize>;

impl<const N: usize> ZeroSizedModule for Flatten<N> {}
impl<const N: usize> NonMutableModule for Flatten<N> {}

impl<const N: usize, B, C, H, W, E, D, T> Module<Tensor<(B, C, H, W), E, D, T>> for Flatten<N>
where
    B: Dim,
    C: Dim,
    H: Dim,
    W: Dim,
    E: Dtype,
    D: Device<E>,
    T: Tape<E, D>,
{
    type Output = Tensor<(B, Const<N>), E, D, T>;
    type Error = D::Err;

    fn try_forward(&self, x: Tensor<(B, C, H, W), E, D, T>) -> Result<Self::Output, D::Err> {
        let (batch, c, h, w) = *x.shape();
        let features = c.size() * h.size() * w.size();
        assert_eq!(
            features, N,
            "Flatten<{N}> received {c:?}×{h:?}×{w:?} = {features} features per example",
        );
        x.try_reshape_like(&(batch, Const::<N>))
    }
}

crate::params::parameterless_params!([const N: usize,] Flatten<N>;);
