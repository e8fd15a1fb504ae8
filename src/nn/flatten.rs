//! Flattening image features for a linear layer.

use dfdx::nn::{NonMutableModule, ZeroSizedModule};
use dfdx::prelude::*;

/// Flattens `(batch, channels, height, width)` into `(batch, N)`, the input a `Linear<N, _>`
/// takes. `N` must equal `channels · height · width`; an input of another size is an error
/// (the device's "wrong number of elements", [`dfdx::tensor::CpuError::WrongNumElements`]),
/// not a panic: image sizes are run-time values and may come from data.
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
    D::Err: From<dfdx::tensor::CpuError>,
{
    type Output = Tensor<(B, Const<N>), E, D, T>;
    type Error = D::Err;

    fn try_forward(&self, x: Tensor<(B, C, H, W), E, D, T>) -> Result<Self::Output, D::Err> {
        let (batch, c, h, w) = *x.shape();
        if c.size() * h.size() * w.size() != N {
            return Err(dfdx::tensor::CpuError::WrongNumElements.into());
        }
        x.try_reshape_like(&(batch, Const::<N>))
    }
}

crate::params::parameterless_params!([const N: usize,] Flatten<N>;);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_of_the_wrong_size_is_an_error() {
        let dev = Cpu::default();
        let x: Tensor<(usize, usize, usize, usize), f32, Cpu> = dev.zeros_like(&(2, 3, 4, 4));
        let flat = Flatten::<48>.try_forward(x.clone()).unwrap();
        assert_eq!(flat.shape().0, 2);
        assert!(matches!(
            Flatten::<47>.try_forward(x),
            Err(dfdx::tensor::CpuError::WrongNumElements)
        ));
    }
}
