use dfdx::prelude::{Cpu, CpuError, Storage};

use super::ReluKernel;
use crate::device::utilities::cpu::{as_f32, as_f32_mut, check_lengths, CHUNK};
use crate::precision::AmpElem;

/// ReLU's forward on FP32 values. Not `max`: NaN becomes 0 as with dfdx's `x.max(0)`, and so
/// does -0.
#[inline]
fn relu(v: &mut [f32]) {
    v.iter_mut()
        .for_each(|x| *x = if *x > 0.0 { *x } else { 0.0 });
}

impl<E: AmpElem> ReluKernel<E> for Cpu {
    fn try_relu_in_place(&self, y: &mut <Self as Storage<E>>::Vec) -> Result<(), CpuError> {
        if let Some(y) = as_f32_mut::<E>(y) {
            relu(y);
            return Ok(());
        }
        let mut tmp = [0f32; CHUNK];
        for chunk in y.chunks_mut(CHUNK) {
            let tmp = &mut tmp[..chunk.len()];
            E::slice_to_f32(chunk, tmp);
            relu(tmp);
            E::slice_from_f32(tmp, chunk);
        }
        Ok(())
    }

    fn try_relu_mask(
        &self,
        out: &<Self as Storage<E>>::Vec,
        grad: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), CpuError> {
        check_lengths(out.len(), grad.len())?;
        // Where the output is not positive the input was not either: the gradient is zero
        // there (a select, not a product: an infinite gradient gives 0, not NaN).
        // Selects in FP32, not branches: the mask is as random as the activations' signs.
        let select = |g: &mut [f32], y: &[f32]| {
            g.iter_mut()
                .zip(y)
                .for_each(|(g, y)| *g = if *y > 0.0 { *g } else { 0.0 });
        };
        if let (Some(out), Some(grad)) = (as_f32::<E>(out), as_f32_mut::<E>(grad)) {
            select(grad, out);
            return Ok(());
        }
        let (mut y, mut g) = ([0f32; CHUNK], [0f32; CHUNK]);
        for (gc, yc) in grad.chunks_mut(CHUNK).zip(out.chunks(CHUNK)) {
            let n = yc.len();
            E::slice_to_f32(yc, &mut y[..n]);
            E::slice_to_f32(gc, &mut g[..n]);
            select(&mut g[..n], &y[..n]);
            // Exact: every value is one `E` held, or zero.
            E::slice_from_f32(&g[..n], gc);
        }
        Ok(())
    }
}
