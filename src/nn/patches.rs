//! Cutting square images into square patches: a vision transformer's tokens.

use dfdx::nn::{Module, NonMutableModule, ZeroSizedModule};
use dfdx::prelude::*;

/// Cuts flattened square images, `(batch, side²)` in row-major order, into `TOKENS` square
/// patches of `PATCH` pixels each, `(batch, TOKENS, PATCH)`, patches in row-major order and
/// each patch's pixels in row-major order (PyTorch's `unfold`, and a stride-`p` convolution's
/// view of the image). `Patches<16, 49>` turns 28×28 images into 16 tokens of 7×7.
///
/// `PATCH` must be a square, and the image `TOKENS · PATCH` pixels with `√TOKENS` patches to a
/// side; an input of another size is an error (the device's "wrong number of elements"), not a
/// panic.
#[derive(Debug, Clone, Copy, Default)]
pub struct Patches<const TOKENS: usize, const PATCH: usize>;

impl<const TOKENS: usize, const PATCH: usize> ZeroSizedModule for Patches<TOKENS, PATCH> {}
impl<const TOKENS: usize, const PATCH: usize> NonMutableModule for Patches<TOKENS, PATCH> {}

/// The exact integer square root of `n`, if `n` is a square.
fn exact_sqrt(n: usize) -> Option<usize> {
    let r = (n as f64).sqrt().round() as usize;
    (r * r == n).then_some(r)
}

impl<const TOKENS: usize, const PATCH: usize, const N: usize, B, E, D, T>
    Module<Tensor<(B, Const<N>), E, D, T>> for Patches<TOKENS, PATCH>
where
    B: Dim,
    E: Dtype,
    D: Device<E>,
    T: Tape<E, D>,
    D::Err: From<dfdx::tensor::CpuError>,
{
    type Output = Tensor<(B, Const<TOKENS>, Const<PATCH>), E, D, T>;
    type Error = D::Err;

    fn try_forward(&self, x: Tensor<(B, Const<N>), E, D, T>) -> Result<Self::Output, D::Err> {
        let (Some(p), Some(grid)) = (exact_sqrt(PATCH), exact_sqrt(TOKENS)) else {
            return Err(dfdx::tensor::CpuError::WrongNumElements.into());
        };
        if N != TOKENS * PATCH {
            return Err(dfdx::tensor::CpuError::WrongNumElements.into());
        }
        let batch = x.shape().0;
        // (batch, patch row, pixel row, patch column, pixel column) → patches first.
        x.try_reshape_like(&(batch, grid, p, grid, p))?
            .try_permute::<_, Axes5<0, 1, 3, 2, 4>>()?
            .try_reshape_like(&(batch, Const::<TOKENS>, Const::<PATCH>))
    }
}

crate::params::parameterless_params!([const TOKENS: usize, const PATCH: usize,] Patches<TOKENS, PATCH>;);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_4x4_image_becomes_four_2x2_patches_in_row_major_order() {
        let dev = Cpu::default();
        let pixels: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let x: Tensor<Rank2<1, 16>, f32, _> = dev.tensor(pixels);
        let y = Patches::<4, 4>.forward(x);
        #[rustfmt::skip]
        let want = vec![
            0.0, 1.0, 4.0, 5.0,
            2.0, 3.0, 6.0, 7.0,
            8.0, 9.0, 12.0, 13.0,
            10.0, 11.0, 14.0, 15.0,
        ];
        assert_eq!(y.as_vec(), want);
    }

    #[test]
    fn gradients_return_to_their_pixels() {
        let dev = Cpu::default();
        let x: Tensor<Rank2<2, 784>, f32, _> = dev.sample_normal();
        let y = Patches::<16, 49>.forward(x.leaky_trace());
        // Weight each patch value by its source pixel's index: the gradient is that index.
        let index: Vec<f32> = (0..2 * 784).map(|i| i as f32).collect();
        let index: Tensor<Rank2<2, 784>, f32, _> = dev.tensor(index);
        let weights = Patches::<16, 49>.forward(index.clone());
        let grads = (y * weights).sum().backward();
        assert_eq!(grads.get(&x).as_vec(), index.as_vec());
    }

    #[test]
    fn images_of_another_size_are_an_error() {
        let dev = Cpu::default();
        let x: Tensor<Rank2<1, 784>, f32, _> = dev.zeros();
        assert!(matches!(
            Patches::<9, 49>.try_forward(x.clone()),
            Err(dfdx::tensor::CpuError::WrongNumElements)
        ));
        let wrong: Tensor<Rank2<1, 768>, f32, _> = dev.zeros();
        assert!(matches!(
            Patches::<16, 48>.try_forward(wrong),
            Err(dfdx::tensor::CpuError::WrongNumElements)
        ));
    }
}
