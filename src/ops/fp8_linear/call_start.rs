//! What every device's FP8 linear op does first: take the layer's recipe state and check that
//! the input's rows are laid out as the FP8 products read them.

use crate::fp8::{Fp8Recipe, LayerScaling, ScalingMode};
use crate::ops::linear::LinearInput;

/// The recipe state of the layer this call runs (delayed scaling: its amax histories), taken
/// first whatever path the call then runs, so that each layer keeps its index in the forward
/// order; `None` under current scaling. Both devices' ops start here.
pub(super) fn layer_state<R: Fp8Recipe>() -> Option<LayerScaling> {
    let history = <R::Scaling as ScalingMode>::HISTORY;
    if history > 0 {
        LayerScaling::next_in_forward(history)
    } else {
        None
    }
}

/// The input's number of rows when its rows are contiguous (`I` elements apart), the layout
/// the FP8 products read; `None` sends the call to the 16-bit op, which has its own fallback.
pub(super) fn contiguous_rows<S: LinearInput<I, O>, const I: usize, const O: usize>(
    shape: &S,
    strides: S::Concrete,
) -> Option<usize> {
    (shape.row_stride(strides) == Some(I)).then(|| shape.num_elements() / I.max(1))
}
