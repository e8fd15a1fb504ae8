//! typed-amp patch: fused CPU softmax along the last axis of a contiguous `f32` or `f64`
//! tensor of two or more dimensions (anything else runs the composition).
//!
//! Forward, per row: the maximum, `e = exp(x − max)` into the output, the sum of `e` in order,
//! then `y = e / sum`: the composition's operations in the composition's order (its maximum
//! and sum along the last axis also run over each row in order), so the output is the
//! composition's bit for bit. Backward, per row: `dx += y · (dy − Σ dy·y)`, the sum in order,
//! in one pass, where the composition runs the backward ops of the division, the sum, the exp
//! and two broadcasts. Rows run in parallel pieces; each row's arithmetic is the same whatever
//! the pieces, so results do not depend on the thread count.

use super::{softmax_composed, SoftmaxKernel};
use crate::{
    shapes::*,
    tensor::*,
    tensor_ops::{utilities::cpu_f32::par_elementwise, Device},
};

/// `y = softmax(x)` over each row of `width` elements.
fn forward_rows<E: num_traits::Float + Send + Sync>(width: usize, x: &[E], y: &mut [E]) {
    par_elementwise(y, width, |off, piece| {
        for (yr, xr) in piece.chunks_mut(width).zip(x[off..].chunks(width)) {
            let mut max = E::neg_infinity();
            for v in xr {
                max = max.max(*v);
            }
            let mut sum = E::zero();
            for (e, v) in yr.iter_mut().zip(xr) {
                *e = (*v - max).exp();
                sum = sum + *e;
            }
            for e in yr.iter_mut() {
                *e = *e / sum;
            }
        }
    });
}

/// `dx += y · (dy − Σ dy·y)` over each row of `width` elements.
fn backward_rows<E: num_traits::Float + Send + Sync>(
    width: usize,
    y: &[E],
    dx: &mut [E],
    dy: &[E],
) {
    par_elementwise(dx, width, |off, piece| {
        let rows = y[off..].chunks(width).zip(dy[off..].chunks(width));
        for (dxr, (yr, dyr)) in piece.chunks_mut(width).zip(rows) {
            let mut dot = E::zero();
            for (g, v) in dyr.iter().zip(yr) {
                dot = dot + *g * *v;
            }
            for ((d, g), v) in dxr.iter_mut().zip(dyr).zip(yr) {
                *d = *d + *v * (*g - dot);
            }
        }
    });
}

macro_rules! fused_softmax {
    ($($e:ty),*) => {$(
        impl SoftmaxKernel<$e> for Cpu {
            fn try_softmax_along<S: Shape, T: Tape<$e, Self>, Ax: Axes>(
                x: Tensor<S, $e, Self, T>,
            ) -> Result<Tensor<S, $e, Self, T>, Self::Err>
            where
                Self: Device<$e>,
                S: ReduceShape<Ax>,
            {
                let last = S::NUM_DIMS as isize - 1;
                let contiguous = x.strides == x.shape.strides()
                    && x.data.len() == x.shape.num_elements();
                if S::NUM_DIMS < 2
                    || !Ax::as_array().into_iter().eq([last])
                    || !contiguous
                    || x.shape.num_elements() == 0
                {
                    return softmax_composed::<Ax, S, $e, Self, T>(x);
                }
                let width = x.shape.concrete()[S::NUM_DIMS - 1];
                let (x, mut tape) = x.split_tape();
                let dev = x.device.clone();
                let mut y: Tensor<S, $e, Self> = dev.try_zeros_like(&x.shape)?;
                let out = std::sync::Arc::make_mut(&mut y.data);
                forward_rows(width, &x.data, &mut out[..]);
                let (x_ghost, y_ghost, y_kept) = (x.ghost(), y.ghost(), y.clone());
                tape.add_backward_op(move |grads| {
                    grads.try_alloc_for(&x_ghost)?;
                    grads.try_alloc_for(&y_ghost)?;
                    let (dx, dy) = grads.mut_and_ref(&x_ghost, &y_ghost);
                    backward_rows(width, &y_kept.data, dx, dy);
                    Ok(())
                });
                Ok(y.put_tape(tape))
            }
        }
    )*};
}

fused_softmax!(f32, f64);

// 16-bit types keep the composition in their own precision.
#[cfg(feature = "f16")]
impl SoftmaxKernel<crate::dtypes::f16> for Cpu {}
#[cfg(feature = "f16")]
impl SoftmaxKernel<crate::dtypes::bf16> for Cpu {}
#[cfg(feature = "f16")]
impl SoftmaxKernel<crate::dtypes::AMP<crate::dtypes::f16>> for Cpu {}
