//! A 2-D convolution layer that builds on stable Rust.

use dfdx::nn::{
    BuildModule, BuildOnDevice, ModuleVisitor, NonMutableModule, TensorCollection, TensorOptions,
};
use dfdx::prelude::*;
use num_traits::Float;
use rand_distr::uniform::SampleUniform;
use rand_distr::Uniform;

/// Architecture type for [`Conv2D`](super::modules::Conv2D).
pub mod builder {
    /// `IN` → `OUT` channels, `KERNEL`×`KERNEL` filters, `STRIDE` and zero `PADDING` on each side.
    #[derive(Debug, Clone, Copy, Default)]
    pub struct Conv2D<
        const IN: usize,
        const OUT: usize,
        const KERNEL: usize,
        const STRIDE: usize = 1,
        const PADDING: usize = 0,
    >;
}

impl<const I: usize, const O: usize, const K: usize, const S: usize, const P: usize, E, D>
    BuildOnDevice<D, E> for builder::Conv2D<I, O, K, S, P>
where
    E: Dtype,
    D: Device<E>,
    Conv2D<I, O, K, S, P, E, D>: BuildModule<D, E>,
{
    type Built = Conv2D<I, O, K, S, P, E, D>;
}

/// 2-D convolution (cross-correlation, as PyTorch's `Conv2d` with `groups=1`, `dilation=1`),
/// with a bias per output channel.
///
/// Takes `(batch, IN, height, width)` images and returns `(batch, OUT, h', w')` with
/// `h' = (height + 2·PADDING − KERNEL) / STRIDE + 1`. Height and width may be compile-time or
/// run-time dimensions; the output's are run-time (`usize`). Weights and bias are initialised
/// uniformly in `±1/√(IN·KERNEL²)`, as in PyTorch and dfdx.
#[derive(Debug, Clone)]
pub struct Conv2D<
    const IN: usize,
    const OUT: usize,
    const KERNEL: usize,
    const STRIDE: usize,
    const PADDING: usize,
    E: Dtype,
    D: Storage<E>,
> {
    /// Filters, `(OUT, IN, KERNEL, KERNEL)`.
    pub weight: Tensor<Rank4<OUT, IN, KERNEL, KERNEL>, E, D>,
    /// One bias per output channel.
    pub bias: Tensor<Rank1<OUT>, E, D>,
}

/// PyTorch's (and dfdx's) initialisation bound for weights and bias: `1/√fan_in`.
fn init_bound<E: Dtype + Float>(fan_in: usize) -> E {
    E::ONE / E::from_usize(fan_in).unwrap().sqrt()
}

impl<const I: usize, const O: usize, const K: usize, const S: usize, const P: usize, E, D>
    TensorCollection<E, D> for Conv2D<I, O, K, S, P, E, D>
where
    E: Dtype + Float + SampleUniform,
    D: Device<E>,
{
    type To<E2: Dtype, D2: Device<E2>> = Conv2D<I, O, K, S, P, E2, D2>;

    fn iter_tensors<V: ModuleVisitor<Self, E, D>>(
        visitor: &mut V,
    ) -> Result<Option<Self::To<V::E2, V::D2>>, V::Err> {
        visitor.visit_fields(
            (
                Self::tensor(
                    "weight",
                    |s| &s.weight,
                    |s| &mut s.weight,
                    TensorOptions::reset_with(|t| {
                        let b = init_bound::<E>(I * K * K);
                        t.try_fill_with_distr(Uniform::new(-b, b))
                    }),
                ),
                Self::tensor(
                    "bias",
                    |s| &s.bias,
                    |s| &mut s.bias,
                    TensorOptions::reset_with(|t| {
                        let b = init_bound::<E>(I * K * K);
                        t.try_fill_with_distr(Uniform::new(-b, b))
                    }),
                ),
            ),
            |(weight, bias)| Conv2D { weight, bias },
        )
    }
}

impl<const I: usize, const O: usize, const K: usize, const S: usize, const P: usize, E, D>
    NonMutableModule for Conv2D<I, O, K, S, P, E, D>
where
    E: Dtype,
    D: Storage<E>,
{
}

impl<
        const I: usize,
        const O: usize,
        const K: usize,
        const S: usize,
        const P: usize,
        B,
        H,
        W,
        E,
        D,
        T,
    > Module<Tensor<(B, Const<I>, H, W), E, D, T>> for Conv2D<I, O, K, S, P, E, D>
where
    B: Dim,
    H: Dim,
    W: Dim,
    E: Dtype,
    D: Device<E> + dfdx::tensor_ops::ConvDevice<E>,
    T: Tape<E, D>,
{
    type Output = Tensor<(B, Const<O>, usize, usize), E, D, T>;
    type Error = D::Err;

    fn try_forward(&self, x: Tensor<(B, Const<I>, H, W), E, D, T>) -> Result<Self::Output, D::Err> {
        let (batch, chan, h, w) = *x.shape();
        // Run-time spatial sizes select dfdx's stable convolution; reshaping a contiguous
        // tensor only relabels its shape.
        let x = x.try_reshape_like(&(batch, chan, h.size(), w.size()))?;
        // One op for the convolution and its bias: on the CPU the bias is added as each image's
        // output is produced, and its gradient summed as the convolution's backward reads the
        // output gradient, with no intermediate tensor (dfdx's `FUSED_BIAS`; elsewhere a
        // broadcast add, as before).
        (x, self.weight.clone(), self.bias.clone())
            .try_conv2d(Const::<S>, Const::<P>, Const::<1>, Const::<1>)
    }
}

crate::params::collection_params!(
    [const I: usize, const O: usize, const K: usize, const S: usize, const P: usize,]
    Conv2D<I, O, K, S, P, E, D>;
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_direct_computation() {
        let dev = Cpu::default();
        let mut conv = dev.build_module::<builder::Conv2D<1, 1, 2, 1, 0>, f32>();
        conv.weight = dev.tensor([[[[1.0, 2.0], [3.0, 4.0]]]]);
        conv.bias = dev.tensor([0.5]);
        let x: Tensor<Rank4<1, 1, 2, 3>, f32, _> =
            dev.tensor([[[[1.0, 0.0, -1.0], [2.0, 1.0, 0.0]]]]);
        let y = conv.forward(x);
        assert_eq!(y.shape(), &(Const::<1>, Const::<1>, 1, 2));
        // [1·1 + 0·2 + 2·3 + 1·4, 0·1 − 1·2 + 1·3 + 0·4] + 0.5
        assert_eq!(y.as_vec(), vec![11.5, 1.5]);
    }

    #[test]
    fn stride_and_padding_set_the_output_size() {
        let dev = Cpu::default();
        let conv = dev.build_module::<builder::Conv2D<3, 8, 3, 2, 1>, f32>();
        let x: Tensor<Rank4<2, 3, 28, 28>, f32, _> = dev.sample_normal();
        assert_eq!(conv.forward(x).shape(), &(Const::<2>, Const::<8>, 14, 14));
    }
}
