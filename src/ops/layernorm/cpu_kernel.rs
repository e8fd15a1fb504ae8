use dfdx::prelude::{Cpu, CpuError, Storage};
use rayon::prelude::*;

use super::{MixedLayerNormKernel, RowStats};
use crate::device::utilities::cpu::check_lengths;
use crate::precision::AmpElem;
use typed_amp_kernels::norm::{layer_norm_backward_row, layer_norm_forward_row};

/// Rows per parallel task: fixed, so that the parameter gradients' partial sums, added in task
/// order, do not depend on the thread count.
const ROWS: usize = 32;

/// The number of rows of `width` in a buffer of `len` elements.
fn rows_of(width: usize, len: usize) -> Result<usize, CpuError> {
    if width == 0 || !len.is_multiple_of(width) {
        return Err(CpuError::WrongNumElements);
    }
    Ok(len / width)
}

impl<E: AmpElem> MixedLayerNormKernel<E> for Cpu {
    fn try_ln_forward(
        &self,
        width: usize,
        x: &<Self as Storage<E>>::Vec,
        y: &mut <Self as Storage<E>>::Vec,
        gamma: &<Self as Storage<f32>>::Vec,
        beta: Option<&<Self as Storage<f32>>::Vec>,
        epsilon: f64,
    ) -> Result<RowStats<Self>, CpuError> {
        let rows = rows_of(width, x.len())?;
        check_lengths(x.len(), y.len())?;
        check_lengths(width, gamma.len())?;
        if let Some(beta) = beta {
            check_lengths(width, beta.len())?;
        }
        let zeros;
        let beta: &[f32] = match beta {
            Some(beta) => beta,
            None => {
                zeros = vec![0f32; width];
                &zeros
            }
        };
        let mut stats = RowStats::<Self> {
            mean: Storage::<f32>::try_alloc_len(self, rows)?,
            rstd: Storage::<f32>::try_alloc_len(self, rows)?,
        };
        let block = ROWS * width;
        x.par_chunks(block)
            .zip(y.par_chunks_mut(block))
            .zip(stats.mean.par_chunks_mut(ROWS))
            .zip(stats.rstd.par_chunks_mut(ROWS))
            .for_each(|(((x, y), mean), rstd)| {
                let mut v = vec![0f32; width];
                for (r, (x, y)) in x.chunks(width).zip(y.chunks_mut(width)).enumerate() {
                    E::slice_to_f32(x, &mut v);
                    (mean[r], rstd[r]) = layer_norm_forward_row(&mut v, gamma, beta, epsilon);
                    E::slice_from_f32(&v, y);
                }
            });
        Ok(stats)
    }

    fn try_ln_backward(
        &self,
        width: usize,
        x: &<Self as Storage<E>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        gx: Option<(&mut <Self as Storage<E>>::Vec, bool)>,
        gamma: &<Self as Storage<f32>>::Vec,
        stats: &RowStats<Self>,
        dgamma: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
        dbeta: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
    ) -> Result<(), CpuError> {
        let gamma: &[f32] = gamma;
        let rows = rows_of(width, x.len())?;
        check_lengths(x.len(), dy.len())?;
        check_lengths(width, gamma.len())?;
        check_lengths(rows, stats.mean.len())?;
        check_lengths(rows, stats.rstd.len())?;
        let block = ROWS * width;
        let (mean, rstd) = (stats.mean.par_chunks(ROWS), stats.rstd.par_chunks(ROWS));
        let inputs = x.par_chunks(block).zip(dy.par_chunks(block));
        let partials: Vec<[Vec<f64>; 2]> = match gx {
            Some((gx, accumulate)) => {
                check_lengths(x.len(), gx.len())?;
                inputs
                    .zip(gx.par_chunks_mut(block))
                    .zip(mean.zip(rstd))
                    .map(|(((x, dy), gx), (m, s))| {
                        rows_backward(width, x, dy, Some((gx, accumulate)), gamma, m, s)
                    })
                    .collect()
            }
            None => inputs
                .zip(mean.zip(rstd))
                .map(|((x, dy), (m, s))| rows_backward(width, x, dy, None, gamma, m, s))
                .collect(),
        };
        // Task partial sums added in task order, then each added in f64 to its FP32 gradient
        // and rounded once.
        let mut sums = [vec![0f64; width], vec![0f64; width]];
        for part in &partials {
            for (sum, part) in sums.iter_mut().zip(part) {
                sum.iter_mut().zip(part).for_each(|(s, p)| *s += p);
            }
        }
        for (grad, sums) in [dgamma, dbeta].into_iter().zip(&sums) {
            let Some((grad, fresh)) = grad else {
                continue;
            };
            check_lengths(width, grad.len())?;
            for (g, s) in grad.iter_mut().zip(sums) {
                let old = if fresh { 0.0 } else { f64::from(*g) };
                *g = (old + s) as f32;
            }
        }
        Ok(())
    }
}

/// One task's rows of the backward: `[Σ dy·x̂, Σ dy]` per column over these rows, and the
/// input gradient written over (or, with its flag, added to) `gx` when there is one.
fn rows_backward<E: AmpElem>(
    width: usize,
    x: &[E],
    dy: &[E],
    mut gx: Option<(&mut [E], bool)>,
    gamma: &[f32],
    mean: &[f32],
    rstd: &[f32],
) -> [Vec<f64>; 2] {
    let (mut xh, mut g, mut old) = (vec![0f32; width], vec![0f32; width], vec![0f32; width]);
    let (mut dgamma, mut dbeta) = (vec![0f64; width], vec![0f64; width]);
    for (r, (&m, &s)) in mean.iter().zip(rstd).enumerate() {
        let row = r * width..(r + 1) * width;
        E::slice_to_f32(&x[row.clone()], &mut xh);
        E::slice_to_f32(&dy[row.clone()], &mut g);
        let input_gradient = gx.is_some();
        layer_norm_backward_row(
            &mut xh,
            &mut g,
            gamma,
            (m, s),
            &mut dgamma,
            &mut dbeta,
            input_gradient,
        );
        let Some((gx, accumulate)) = gx.as_mut() else {
            continue;
        };
        let out = &mut gx[row];
        if *accumulate {
            E::slice_to_f32(out, &mut old);
            g.iter_mut().zip(&old).for_each(|(g, o)| *g += o);
        }
        E::slice_from_f32(&g, out);
    }
    [dgamma, dbeta]
}
