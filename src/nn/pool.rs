//! 2-D max pooling that builds on stable Rust.

use dfdx::nn::{NonMutableModule, ZeroSizedModule};
use dfdx::prelude::*;
use dfdx::tensor_ops::{ConvDevice, Pool2DKind, TryPool2D};

/// Max pooling over `KERNEL`×`KERNEL` windows moved by `STRIDE` (default: `KERNEL`, so windows
/// do not overlap), without padding. Takes `(batch, channels, height, width)`; the output's
/// spatial sizes are run-time dimensions.
#[derive(Debug, Clone, Copy, Default)]
pub struct MaxPool2D<const KERNEL: usize, const STRIDE: usize = KERNEL>;

impl<const K: usize, const S: usize> ZeroSizedModule for MaxPool2D<K, S> {}
impl<const K: usize, const S: usize> NonMutableModule for MaxPool2D<K, S> {}

impl<const K: usize, const S: usize, B, C, H, W, E, D, T> Module<Tensor<(B, C, H, W), E, D, T>>
    for MaxPool2D<K, S>
where
    B: Dim,
    C: Dim,
    H: Dim,
    W: Dim,
    E: Dtype,
    D: Device<E> + ConvDevice<E>,
    T: Tape<E, D>,
{
    type Output = Tensor<(B, C, usize, usize), E, D, T>;
    type Error = D::Err;

    fn try_forward(&self, x: Tensor<(B, C, H, W), E, D, T>) -> Result<Self::Output, D::Err> {
        let (batch, chan, h, w) = *x.shape();
        let x = x.try_reshape_like(&(batch, chan, h.size(), w.size()))?;
        x.try_pool2d(
            Pool2DKind::Max,
            Const::<K>,
            Const::<S>,
            Const::<0>,
            Const::<1>,
        )
    }
}

crate::params::parameterless_params!([const K: usize, const S: usize,] MaxPool2D<K, S>;);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_the_maximum_of_each_window() {
        let dev = Cpu::default();
        let x: Tensor<Rank4<1, 1, 2, 4>, f32, _> =
            dev.tensor([[[[1.0, 5.0, -1.0, 0.0], [2.0, 3.0, -2.0, -3.0]]]]);
        let y = MaxPool2D::<2>.forward(x);
        assert_eq!(y.shape(), &(Const::<1>, Const::<1>, 1, 2));
        assert_eq!(y.as_vec(), vec![5.0, 0.0]);
    }
}
