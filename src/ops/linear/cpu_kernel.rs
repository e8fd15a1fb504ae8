use dfdx::prelude::{Cpu, CpuError, Storage};
use typed_amp_kernels::Epilogue;

use super::{LinearDims, LinearKernel};
use crate::device::utilities::cpu::{as_f32, as_f32_mut};
use crate::device::utilities::cpu_gemm::{gemm, gemm_into, gemm_new};
use crate::device::utilities::cpu_scratch::with_f32_scratch;
use crate::precision::AmpElem;
use rayon::prelude::*;

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

/// Rows per parallel task of the bias gradient's column sums.
const BIAS_ROWS: usize = 64;

/// One task's rows of the bias gradient: each row of `dy` (`n` wide) masked by the ReLU's
/// output where one fused here (and written back so), then added to `sums` in FP32.
fn bias_rows<E: AmpElem>(n: usize, dy: &mut [E], relu_out: Option<&[E]>, sums: &mut [f32]) {
    with_f32_scratch(n, |[g, mask]| {
        for (r, row) in dy.chunks_mut(n).enumerate() {
            let relu_row = relu_out.map(|y| &y[r * n..(r + 1) * n]);
            if let Some(g) = as_f32_mut::<E>(row) {
                mask_and_add(g, relu_row, mask, sums);
            } else {
                E::slice_to_f32(row, g);
                mask_and_add(g, relu_row, mask, sums);
                if relu_row.is_some() {
                    E::slice_from_f32(g, row);
                }
            }
        }
    });
}

/// `g` masked by the ReLU's derivative (by its output `y`: positive where its input was) where
/// one fused, then added to `sums`. `mask` is room to widen `y` in.
fn mask_and_add<E: AmpElem>(g: &mut [f32], y: Option<&[E]>, mask: &mut [f32], sums: &mut [f32]) {
    if let Some(y) = y {
        let y: &[f32] = match as_f32::<E>(y) {
            Some(y) => y,
            None => {
                E::slice_to_f32(y, mask);
                mask
            }
        };
        g.iter_mut()
            .zip(y)
            .for_each(|(g, y)| *g = if *y > 0.0 { *g } else { 0.0 });
    }
    sums.iter_mut().zip(g.iter()).for_each(|(s, g)| *s += g);
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
        // Rows in tasks of a fixed count (so that the partial sums, added in task order, do not
        // depend on the thread count) on the pool: one thread summed them while the others
        // waited (~2.5% of the ViT's O2-BF16 samples in `perf`, session 50; within noise on
        // the step's time).
        let per_task = BIAS_ROWS * n;
        let mut partials = vec![0f32; d.rows.div_ceil(BIAS_ROWS) * n];
        dy.par_chunks_mut(per_task.max(1))
            .zip(partials.par_chunks_mut(n.max(1)))
            .enumerate()
            .for_each(|(t, (rows, sums))| {
                let relu_rows = relu_out.map(|y| &y[t * per_task..t * per_task + rows.len()]);
                bias_rows(n, rows, relu_rows, sums);
            });
        let mut sums = vec![0f32; n];
        for part in partials.chunks(n.max(1)) {
            sums.iter_mut().zip(part).for_each(|(s, p)| *s += p);
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

#[cfg(test)]
mod tests {
    use dfdx::prelude::Cpu;
    use half::bf16;

    use super::{LinearDims, LinearKernel, BIAS_ROWS};
    use crate::precision::AmpElem;

    /// The bias gradient of `dy` (`rows × n`, FP32 or narrowed to `E`), computed on a pool of
    /// `threads`.
    fn bias_gradient<E: AmpElem>(dy: &[f32], rows: usize, n: usize, threads: usize) -> Vec<f32> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let dev = Cpu::default();
            let narrow: Vec<E> = dy.iter().map(|&x| <E as AmpElem>::from_f32(x)).collect();
            let mut dy = dev.storage_from_vec(narrow);
            let mut db = dev.storage_from_vec(vec![f32::NAN; n]);
            let dims = LinearDims {
                rows,
                inputs: 1,
                outputs: n,
            };
            LinearKernel::<E>::try_linear_backward_bias(
                &dev,
                dims,
                None,
                &mut dy,
                Some((&mut db, true)),
            )
            .unwrap();
            db.to_vec()
        })
    }

    /// Fixed tasks of [`BIAS_ROWS`] rows, their partial sums added in task order: the same bits
    /// on 1 and 3 threads, and each column within γ(rows)·Σ|g| of its f64 sum (Higham's bound
    /// for `rows` FP32 additions in any order).
    fn same_bits_on_any_thread_count<E: AmpElem>() {
        let (rows, n) = (3 * BIAS_ROWS + 11, 37);
        let dy: Vec<f32> = (0..rows * n)
            .map(|i| <E as AmpElem>::from_f32(((i * 7919 % 1009) as f32 - 504.0) / 97.0))
            .map(<E as AmpElem>::to_f32)
            .collect();
        let one = bias_gradient::<E>(&dy, rows, n, 1);
        let three = bias_gradient::<E>(&dy, rows, n, 3);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&one), bits(&three), "{}", std::any::type_name::<E>());
        let nu = rows as f64 * 2f64.powi(-24);
        let gamma = nu / (1.0 - nu);
        for (c, &got) in one.iter().enumerate() {
            let column = (0..rows).map(|r| f64::from(dy[r * n + c]));
            let (exact, magnitude) = column.fold((0.0, 0.0), |(s, m), g| (s + g, m + g.abs()));
            assert!(
                (f64::from(got) - exact).abs() <= gamma * magnitude,
                "column {c}: {got} vs {exact}"
            );
        }
    }

    #[test]
    fn the_bias_gradient_has_the_same_bits_on_any_thread_count() {
        same_bits_on_any_thread_count::<f32>();
        same_bits_on_any_thread_count::<bf16>();
    }
}
