//! Exact GELU's kernels' trait, for fusing it into the op before it.

use dfdx::prelude::{HasErr, Storage};

use crate::precision::AmpElem;

/// Exact GELU's kernels (`x·Φ(x)`, dfdx's `AccurateGeLU`), each in FP32 and rounded once to
/// `E`: the formulas of dfdx's op, so that the fused and the composed paths agree.
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait GeluKernel<E: AmpElem>: Storage<E> + HasErr {
    /// `input = y`, then `y = gelu(y)` in place: one pass over the op's output that keeps its
    /// value before the activation for the backward.
    fn try_gelu_keeping_input(
        &self,
        y: &mut <Self as Storage<E>>::Vec,
        input: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), Self::Err>;

    /// `gelu(input)` in a new buffer, leaving `input` as it is, where the device writes a new
    /// buffer whole without zero-filling it first (one pass, where keeping the input costs a
    /// zero fill and a copy besides); `None` (the default) sends the op to
    /// [`try_gelu_keeping_input`](Self::try_gelu_keeping_input). Same values either way.
    fn try_gelu_new(
        &self,
        input: &<Self as Storage<E>>::Vec,
    ) -> Result<Option<<Self as Storage<E>>::Vec>, Self::Err> {
        let _ = input;
        Ok(None)
    }

    /// GELU's backward in place: `grad = grad · gelu'(input)`, the derivative in FP32 from the
    /// widened input, the product rounded once.
    fn try_gelu_backward(
        &self,
        input: &<Self as Storage<E>>::Vec,
        grad: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), Self::Err>;
}
