use dfdx::prelude::{Cpu, CpuError, Storage};
use typed_amp_kernels::Epilogue;

use super::{LinearDims, LinearKernel};
use crate::device::utilities::cpu::{as_f32, as_f32_mut};
use crate::device::utilities::cpu_gemm::{gemm, gemm_into, gemm_new};
use crate::precision::AmpElem;

fn check(ok: bool) -> Result<(), CpuError> {
    if ok {
        Ok(())
    } else {
        Err(CpuError::WrongNumElements)
    }
}

/// Whether `rows` rows of `cols` elements, `rs` apart, fit a buffer of `len`.
fn fits(len: usize, rows: usize, cols: usize, rs: usize) -> bool {
    rows == 0
        || cols == 0
        || (rows - 1)
            .checked_mul(rs)
            .and_then(|x| x.checked_add(cols))
            .is_some_and(|end| end <= len)
}

impl<E: AmpElem> LinearKernel<E> for Cpu {
    fn try_linear_forward(
        &self,
        d: LinearDims,
        x: &<Self as Storage<E>>::Vec,
        x_rs: usize,
        w: &<Self as Storage<E>>::Vec,
        b: Option<&<Self as Storage<E>>::Vec>,
        y: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), CpuError> {
        // The same product into a new buffer (no reason to keep this one's memory).
        check(y.len() == d.rows * d.outputs)?;
        *y = self.try_linear_forward_new(d, x, x_rs, w, b)?;
        Ok(())
    }

    fn try_linear_forward_new(
        &self,
        d: LinearDims,
        x: &<Self as Storage<E>>::Vec,
        x_rs: usize,
        w: &<Self as Storage<E>>::Vec,
        b: Option<&<Self as Storage<E>>::Vec>,
    ) -> Result<<Self as Storage<E>>::Vec, CpuError> {
        check(
            fits(x.len(), d.rows, d.inputs, x_rs)
                && w.len() == d.outputs * d.inputs
                && b.is_none_or(|b| b.len() == d.outputs),
        )?;
        // The bias in FP32, added in the product's store before its one rounding.
        let bias = b.map(|b| {
            let mut bias = vec![0f32; d.outputs];
            E::slice_to_f32(b, &mut bias);
            bias
        });
        let epilogue = Epilogue {
            bias: bias.as_deref(),
            ..Epilogue::STORE
        };
        let y = gemm_new::<E, E>(
            (d.rows, d.inputs, d.outputs),
            (x, x_rs, 1),
            (w, 1, d.inputs),
            &epilogue,
        )?;
        Ok(self.storage_from_vec(y))
    }

    fn try_linear_backward_bias(
        &self,
        d: LinearDims,
        relu_out: Option<&<Self as Storage<E>>::Vec>,
        dy: &mut <Self as Storage<E>>::Vec,
        db: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
    ) -> Result<(), CpuError> {
        let n = d.outputs;
        check(
            dy.len() == d.rows * n
                && relu_out.is_none_or(|y| y.len() == dy.len())
                && db.as_ref().is_none_or(|(db, _)| db.len() == n),
        )?;
        if relu_out.is_none() && db.is_none() {
            return Ok(());
        }
        let mut sums = vec![0f32; n];
        let mut mask = vec![0f32; n];
        // One row at a time, in FP32: mask it by the ReLU's output, add it to the column sums.
        let mut pass = |g: &mut [f32], r: usize| {
            if let Some(y) = relu_out {
                let y = &y[r * n..(r + 1) * n];
                let y: &[f32] = match as_f32::<E>(y) {
                    Some(y) => y,
                    None => {
                        E::slice_to_f32(y, &mut mask);
                        &mask
                    }
                };
                // The ReLU's derivative, by its output: positive where its input was.
                g.iter_mut()
                    .zip(y)
                    .for_each(|(g, y)| *g = if *y > 0.0 { *g } else { 0.0 });
            }
            sums.iter_mut().zip(g.iter()).for_each(|(s, g)| *s += g);
        };
        if let Some(dy) = as_f32_mut::<E>(dy) {
            for (r, row) in dy.chunks_mut(n).enumerate() {
                pass(row, r);
            }
        } else {
            let mut g = vec![0f32; n];
            for (r, row) in dy.chunks_mut(n).enumerate() {
                E::slice_to_f32(row, &mut g);
                pass(&mut g, r);
                if relu_out.is_some() {
                    E::slice_from_f32(&g, row);
                }
            }
        }
        if let Some((db, fresh)) = db {
            if fresh {
                db.copy_from_slice(&sums);
            } else {
                db.iter_mut().zip(&sums).for_each(|(d, s)| *d += s);
            }
        }
        Ok(())
    }

    fn try_linear_backward_weight(
        &self,
        d: LinearDims,
        dz: &<Self as Storage<E>>::Vec,
        x: &<Self as Storage<E>>::Vec,
        x_rs: usize,
        (dw, fresh): (&mut <Self as Storage<f32>>::Vec, bool),
    ) -> Result<(), CpuError> {
        check(
            dz.len() == d.rows * d.outputs
                && fits(x.len(), d.rows, d.inputs, x_rs)
                && dw.len() == d.outputs * d.inputs,
        )?;
        // Accumulated in FP32 and stored in FP32: never rounded to the layer's precision.
        let epilogue = Epilogue {
            accumulate: !fresh,
            ..Epilogue::STORE
        };
        gemm_into::<E, f32>(
            (d.outputs, d.rows, d.inputs),
            (dz, 1, d.outputs),
            (x, x_rs, 1),
            (dw, d.inputs, 1),
            &epilogue,
        );
        Ok(())
    }

    fn try_linear_backward_input(
        &self,
        d: LinearDims,
        dz: &<Self as Storage<E>>::Vec,
        w: &<Self as Storage<E>>::Vec,
        dx: &mut <Self as Storage<E>>::Vec,
        dx_rs: usize,
    ) -> Result<(), CpuError> {
        check(
            dz.len() == d.rows * d.outputs
                && w.len() == d.outputs * d.inputs
                && fits(dx.len(), d.rows, d.inputs, dx_rs),
        )?;
        gemm::<E>(
            (d.rows, d.outputs, d.inputs),
            (dz, d.outputs, 1),
            (w, d.inputs, 1),
            (dx, dx_rs, 1),
            true,
        );
        Ok(())
    }

    fn try_linear_backward_input_new(
        &self,
        d: LinearDims,
        dz: &<Self as Storage<E>>::Vec,
        w: &<Self as Storage<E>>::Vec,
    ) -> Result<<Self as Storage<E>>::Vec, CpuError> {
        check(dz.len() == d.rows * d.outputs && w.len() == d.outputs * d.inputs)?;
        let dx = gemm_new::<E, E>(
            (d.rows, d.outputs, d.inputs),
            (dz, d.outputs, 1),
            (w, d.inputs, 1),
            &Epilogue::STORE,
        )?;
        Ok(self.storage_from_vec(dx))
    }
}
