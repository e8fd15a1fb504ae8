//! The fused linear layer's kernels' trait and its sizes.

use dfdx::prelude::{HasErr, Storage};

use crate::precision::AmpElem;

/// The fused linear layer's kernels for element type `E`: rows of `x` (`rows × i`, row-major
/// with rows `x_rs` apart), a weight `o × i` and a bias of `o`, all contiguous.
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait LinearKernel<E: AmpElem>: Storage<E> + Storage<f32> + HasErr {
    /// `y = x · Wᵀ + b`, `y` contiguous `rows × o`.
    #[allow(clippy::too_many_arguments)]
    fn try_linear_forward(
        &self,
        dims: LinearDims,
        x: &<Self as Storage<E>>::Vec,
        x_rs: usize,
        w: &<Self as Storage<E>>::Vec,
        b: Option<&<Self as Storage<E>>::Vec>,
        y: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), Self::Err>;

    /// [`try_linear_forward`](Self::try_linear_forward) into a new contiguous `rows × o` buffer.
    /// The default zero-fills one for it; a device whose product writes new memory whole
    /// overrides it and skips that pass.
    fn try_linear_forward_new(
        &self,
        dims: LinearDims,
        x: &<Self as Storage<E>>::Vec,
        x_rs: usize,
        w: &<Self as Storage<E>>::Vec,
        b: Option<&<Self as Storage<E>>::Vec>,
    ) -> Result<<Self as Storage<E>>::Vec, Self::Err> {
        let mut y = Storage::<E>::try_alloc_len(self, dims.rows * dims.outputs)?;
        self.try_linear_forward(dims, x, x_rs, w, b, &mut y)?;
        Ok(y)
    }

    /// The output gradient `dy` (`rows × o`) masked in place by the ReLU (where `relu_out`, the
    /// layer's output, is not positive), and in the same pass, if `db` is given, the bias
    /// gradient: column sums in FP32, written if `fresh`, else added.
    fn try_linear_backward_bias(
        &self,
        dims: LinearDims,
        relu_out: Option<&<Self as Storage<E>>::Vec>,
        dy: &mut <Self as Storage<E>>::Vec,
        db: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
    ) -> Result<(), Self::Err>;

    /// The weight gradient `dzᵀ · x` (`o × i`) into FP32 `dw`: written if `fresh`, else added.
    fn try_linear_backward_weight(
        &self,
        dims: LinearDims,
        dz: &<Self as Storage<E>>::Vec,
        x: &<Self as Storage<E>>::Vec,
        x_rs: usize,
        dw: (&mut <Self as Storage<f32>>::Vec, bool),
    ) -> Result<(), Self::Err>;

    /// The input gradient `dx += dz · W` (`rows × i`, rows `dx_rs` apart, as the input's).
    fn try_linear_backward_input(
        &self,
        dims: LinearDims,
        dz: &<Self as Storage<E>>::Vec,
        w: &<Self as Storage<E>>::Vec,
        dx: &mut <Self as Storage<E>>::Vec,
        dx_rs: usize,
    ) -> Result<(), Self::Err>;

    /// The input gradient `dx = dz · W` into a new contiguous `rows × i` buffer, for an input
    /// that has no gradient yet. The default adds it to a zero-filled one; a device whose
    /// product writes new memory whole overrides it.
    fn try_linear_backward_input_new(
        &self,
        dims: LinearDims,
        dz: &<Self as Storage<E>>::Vec,
        w: &<Self as Storage<E>>::Vec,
    ) -> Result<<Self as Storage<E>>::Vec, Self::Err> {
        let mut dx = Storage::<E>::try_alloc_len(self, dims.rows * dims.inputs)?;
        self.try_linear_backward_input(dims, dz, w, &mut dx, dims.inputs)?;
        Ok(dx)
    }
}

/// The sizes of a fused linear op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearDims {
    /// Rows of the input (the batch, or batch × sequence).
    pub rows: usize,
    /// Input features.
    pub inputs: usize,
    /// Output features.
    pub outputs: usize,
}
