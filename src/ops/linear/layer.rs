//! What the linear op takes: the input shapes it maps row by row, and a layer's weight and bias.

use dfdx::nn::modules::{Linear, UnbiasedLinear};
use dfdx::prelude::{Const, Dim, Dtype, Rank1, Rank2, Shape, Storage, Tensor};

/// An input shape a linear layer of `I` inputs and `O` outputs maps row by row: `(B, I)` and
/// `(B, S, I)`.
#[doc(hidden)] // machinery of the bounds above it.
pub trait LinearInput<const I: usize, const O: usize>: Shape {
    /// The output shape.
    type Output: Shape;
    /// The output shape for this input.
    fn output(&self) -> Self::Output;
    /// The row stride of a view whose rows are each contiguous and evenly spaced, if it is one.
    fn row_stride(&self, strides: Self::Concrete) -> Option<usize>;
}

impl<B: Dim, const I: usize, const O: usize> LinearInput<I, O> for (B, Const<I>) {
    type Output = (B, Const<O>);
    fn output(&self) -> Self::Output {
        (self.0, Const)
    }
    fn row_stride(&self, strides: [usize; 2]) -> Option<usize> {
        (strides[1] == 1 && (strides[0] >= I || self.0.size() <= 1)).then_some(strides[0].max(I))
    }
}

impl<B: Dim, S: Dim, const I: usize, const O: usize> LinearInput<I, O> for (B, S, Const<I>) {
    type Output = (B, S, Const<O>);
    fn output(&self) -> Self::Output {
        (self.0, self.1, Const)
    }
    fn row_stride(&self, strides: [usize; 3]) -> Option<usize> {
        // Rows of the flattened (B·S) × I view are evenly spaced only when contiguous.
        (strides == [self.1.size() * I, I, 1]).then_some(I)
    }
}

/// A layer the fused linear op runs: an `O × I` weight and, if it has one, a bias of `O`.
#[doc(hidden)] // machinery of the bounds above it.
pub trait LinearParts<const I: usize, const O: usize, E: Dtype, D: Storage<E>> {
    /// The weight, `O × I`.
    fn weight(&self) -> &Tensor<Rank2<O, I>, E, D>;
    /// The bias, if the layer has one.
    fn bias(&self) -> Option<&Tensor<Rank1<O>, E, D>>;
}

impl<const I: usize, const O: usize, E: Dtype, D: Storage<E>> LinearParts<I, O, E, D>
    for Linear<I, O, E, D>
{
    fn weight(&self) -> &Tensor<Rank2<O, I>, E, D> {
        &self.weight
    }
    fn bias(&self) -> Option<&Tensor<Rank1<O>, E, D>> {
        Some(&self.bias)
    }
}

impl<const I: usize, const O: usize, E: Dtype, D: Storage<E>> LinearParts<I, O, E, D>
    for UnbiasedLinear<I, O, E, D>
{
    fn weight(&self) -> &Tensor<Rank2<O, I>, E, D> {
        &self.weight
    }
    fn bias(&self) -> Option<&Tensor<Rank1<O>, E, D>> {
        None
    }
}
