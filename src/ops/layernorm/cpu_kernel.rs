use dfdx::prelude::{Cpu, CpuError, Storage};
use rayon::prelude::*;

use super::{MixedLayerNormKernel, RowStats};
use crate::ops::utilities::cpu::check_lengths;
use crate::precision::AmpElem;

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
                    // Two passes in f64: the mean, then the squared deviations from it.
                    let m = v.iter().map(|x| f64::from(*x)).sum::<f64>() / width as f64;
                    let var =
                        v.iter().map(|x| (f64::from(*x) - m).powi(2)).sum::<f64>() / width as f64;
                    let (m, s) = (m as f32, (1.0 / (var + epsilon).sqrt()) as f32);
                    for ((v, g), b) in v.iter_mut().zip(gamma.iter()).zip(beta) {
                        *v = (*v - m) * s * g + b;
                    }
                    E::slice_from_f32(&v, y);
                    (mean[r], rstd[r]) = (m, s);
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
        // x̂ = (x − mean)·rstd and ĝ = dy·γ; then dx = rstd·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂)).
        let (mut sum_g, mut sum_gx) = (0f64, 0f64);
        for c in 0..width {
            xh[c] = (xh[c] - m) * s;
            dgamma[c] += f64::from(g[c] * xh[c]);
            dbeta[c] += f64::from(g[c]);
            g[c] *= gamma[c];
            sum_g += f64::from(g[c]);
            sum_gx += f64::from(g[c] * xh[c]);
        }
        let Some((gx, accumulate)) = gx.as_mut() else {
            continue;
        };
        let (mg, mgx) = (
            (sum_g / width as f64) as f32,
            (sum_gx / width as f64) as f32,
        );
        for c in 0..width {
            g[c] = s * (g[c] - mg - xh[c] * mgx);
        }
        let out = &mut gx[row];
        if *accumulate {
            E::slice_to_f32(out, &mut old);
            g.iter_mut().zip(&old).for_each(|(g, o)| *g += o);
        }
        E::slice_from_f32(&g, out);
    }
    [dgamma, dbeta]
}
