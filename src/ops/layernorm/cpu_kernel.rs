use dfdx::prelude::{Cpu, CpuError, Storage};
use rayon::prelude::*;

use super::kernel::OutputAndStats;
use super::{MixedLayerNormKernel, RowStats};
use crate::device::utilities::cpu::{as_f32, as_f32_mut, check_lengths, copied_into};
use crate::device::utilities::cpu_scratch::with_f32_scratch;
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

/// The forward's checks; `beta`, or zeros in its place, and zeroed statistics.
fn forward_parts<'a>(
    dev: &Cpu,
    width: usize,
    len: usize,
    gamma: &[f32],
    beta: Option<&'a [f32]>,
) -> Result<(std::borrow::Cow<'a, [f32]>, RowStats<Cpu>), CpuError> {
    let rows = rows_of(width, len)?;
    check_lengths(width, gamma.len())?;
    let beta = match beta {
        Some(beta) => {
            check_lengths(width, beta.len())?;
            std::borrow::Cow::Borrowed(beta)
        }
        None => std::borrow::Cow::Owned(vec![0f32; width]),
    };
    let stats = RowStats::<Cpu> {
        mean: Storage::<f32>::try_alloc_len(dev, rows)?,
        rstd: Storage::<f32>::try_alloc_len(dev, rows)?,
    };
    Ok((beta, stats))
}

/// One task's rows of the forward: `y` normalised from `x`, each row's statistics stored.
#[allow(clippy::too_many_arguments)]
fn rows_forward<E: AmpElem>(
    width: usize,
    x: &[E],
    y: &mut [E],
    (mean, rstd): (&mut [f32], &mut [f32]),
    gamma: &[f32],
    beta: &[f32],
    epsilon: f64,
) {
    with_f32_scratch(width, |[v]| {
        for (r, (x, y)) in x.chunks(width).zip(y.chunks_mut(width)).enumerate() {
            E::slice_to_f32(x, v);
            (mean[r], rstd[r]) = layer_norm_forward_row(v, gamma, beta, epsilon);
            E::slice_from_f32(v, y);
        }
    });
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
        check_lengths(x.len(), y.len())?;
        let (beta, mut stats) = forward_parts(self, width, x.len(), gamma, beta.map(|b| &b[..]))?;
        let block = ROWS * width;
        x.par_chunks(block)
            .zip(y.par_chunks_mut(block))
            .zip(stats.mean.par_chunks_mut(ROWS))
            .zip(stats.rstd.par_chunks_mut(ROWS))
            .for_each(|(((x, y), mean), rstd)| {
                rows_forward(width, x, y, (mean, rstd), gamma, &beta, epsilon);
            });
        Ok(stats)
    }

    fn try_ln_forward_new(
        &self,
        width: usize,
        x: &<Self as Storage<E>>::Vec,
        gamma: &<Self as Storage<f32>>::Vec,
        beta: Option<&<Self as Storage<f32>>::Vec>,
        epsilon: f64,
    ) -> Result<OutputAndStats<Self, E>, CpuError> {
        let (beta, mut stats) = forward_parts(self, width, x.len(), gamma, beta.map(|b| &b[..]))?;
        let len = x.len();
        let mut y: Vec<E> = Vec::new();
        y.try_reserve_exact(len)
            .map_err(|_| CpuError::OutOfMemory)?;
        let block = ROWS * width;
        y.spare_capacity_mut()[..len]
            .par_chunks_mut(block)
            .zip(x.par_chunks(block))
            .zip(stats.mean.par_chunks_mut(ROWS))
            .zip(stats.rstd.par_chunks_mut(ROWS))
            .for_each(|(((y, x), mean), rstd)| {
                let y = copied_into(y, x);
                rows_forward(width, x, y, (mean, rstd), gamma, &beta, epsilon);
            });
        // SAFETY: the blocks cover `0..len`, each initialised whole by `copied_into`.
        unsafe { y.set_len(len) };
        Ok((self.storage_from_vec(y), stats))
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
        check_lengths(x.len(), dy.len())?;
        let grads = match gx {
            Some((gx, accumulate)) => {
                check_lengths(x.len(), gx.len())?;
                Grads::Into(dy, gx, accumulate)
            }
            None => Grads::Read(dy),
        };
        backward(width, x, grads, gamma, stats, dgamma, dbeta)
    }

    fn try_ln_backward_in_place(
        &self,
        width: usize,
        x: &<Self as Storage<E>>::Vec,
        dy: &mut <Self as Storage<E>>::Vec,
        gamma: &<Self as Storage<f32>>::Vec,
        stats: &RowStats<Self>,
        dgamma: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
        dbeta: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
    ) -> Result<(), CpuError> {
        check_lengths(x.len(), dy.len())?;
        backward(width, x, Grads::InPlace(dy), gamma, stats, dgamma, dbeta)
    }
}

/// Where the backward reads the output's gradient and puts the input's.
enum Grads<'a, E> {
    /// `dy` only: nobody reads the input's gradient.
    Read(&'a [E]),
    /// The input's gradient written into (with the flag, added to) a buffer of its own.
    Into(&'a [E], &'a mut [E], bool),
    /// The input's gradient written over `dy`, row by row.
    InPlace(&'a mut [E]),
}

/// The FP32 rows that can hold the input gradient while it is computed: `dy` written over, or
/// the input gradient's own rows with `dy` copied in (not when adding to them); `None` for 16-bit
/// gradients and when nobody reads the input gradient.
fn f32_gradient_rows<'a>(grads: &'a mut Grads<'_, impl AmpElem>) -> Option<&'a mut [f32]> {
    match grads {
        Grads::InPlace(dy) => as_f32_mut(dy),
        Grads::Into(dy, gx, false) => {
            let (dy, gx) = (as_f32(dy)?, as_f32_mut(gx)?);
            gx.copy_from_slice(dy);
            Some(gx)
        }
        Grads::Into(_, _, true) | Grads::Read(_) => None,
    }
}

/// The backward over all rows in parallel tasks of [`ROWS`], then the parameter gradients.
#[allow(clippy::too_many_arguments)]
fn backward<E: AmpElem>(
    width: usize,
    x: &[E],
    grads: Grads<'_, E>,
    gamma: &[f32],
    stats: &RowStats<Cpu>,
    dgamma: Option<(&mut <Cpu as Storage<f32>>::Vec, bool)>,
    dbeta: Option<(&mut <Cpu as Storage<f32>>::Vec, bool)>,
) -> Result<(), CpuError> {
    let rows = rows_of(width, x.len())?;
    check_lengths(width, gamma.len())?;
    check_lengths(rows, stats.mean.len())?;
    check_lengths(rows, stats.rstd.len())?;
    let block = ROWS * width;
    let (mean, rstd) = (stats.mean.par_chunks(ROWS), stats.rstd.par_chunks(ROWS));
    // Each task's `[Σ dy·x̂, Σ dy]` partial sums, in one buffer allocated once per call.
    let mut partials = vec![0f64; rows.div_ceil(ROWS) * 2 * width];
    let parts = partials.par_chunks_mut(2 * width);
    let per_task = |x, grads, m, s, p| rows_backward(width, x, grads, gamma, m, s, p);
    match grads {
        Grads::Read(dy) => x
            .par_chunks(block)
            .zip(dy.par_chunks(block))
            .zip(mean.zip(rstd))
            .zip(parts)
            .for_each(|(((x, dy), (m, s)), p)| per_task(x, Grads::Read(dy), m, s, p)),
        Grads::Into(dy, gx, accumulate) => x
            .par_chunks(block)
            .zip(dy.par_chunks(block))
            .zip(gx.par_chunks_mut(block))
            .zip(mean.zip(rstd))
            .zip(parts)
            .for_each(|((((x, dy), gx), (m, s)), p)| {
                per_task(x, Grads::Into(dy, gx, accumulate), m, s, p)
            }),
        Grads::InPlace(dy) => x
            .par_chunks(block)
            .zip(dy.par_chunks_mut(block))
            .zip(mean.zip(rstd))
            .zip(parts)
            .for_each(|(((x, dy), (m, s)), p)| per_task(x, Grads::InPlace(dy), m, s, p)),
    };
    // Task partial sums added in task order, then each added in f64 to its FP32 gradient
    // and rounded once.
    let mut sums = vec![0f64; 2 * width];
    for part in partials.chunks(2 * width) {
        sums.iter_mut().zip(part).for_each(|(s, p)| *s += p);
    }
    let (dgamma_sums, dbeta_sums) = sums.split_at(width);
    for (grad, sums) in [dgamma, dbeta].into_iter().zip([dgamma_sums, dbeta_sums]) {
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

/// One task's rows of the backward: `[Σ dy·x̂, Σ dy]` per column over these rows added into
/// `partial` (`2 · width`, zeroed), and the input gradient where `grads` has a place for it.
fn rows_backward<E: AmpElem>(
    width: usize,
    x: &[E],
    mut grads: Grads<'_, E>,
    gamma: &[f32],
    mean: &[f32],
    rstd: &[f32],
    partial: &mut [f64],
) {
    let (dgamma, dbeta) = partial.split_at_mut(width);
    let input_gradient = !matches!(grads, Grads::Read(_));
    // FP32 gradients where the row's gradient may be computed in place: over `dy` itself, or
    // over its copy in the input gradient's row (one copy a row instead of two or three: the
    // copies were 2% of the small GPT's O0 samples). The same operations on the same values.
    if let Some(gradient_rows) = f32_gradient_rows(&mut grads) {
        with_f32_scratch(width, |[xh]| {
            for (r, ((&m, &s), g)) in mean
                .iter()
                .zip(rstd)
                .zip(gradient_rows.chunks_mut(width))
                .enumerate()
            {
                E::slice_to_f32(&x[r * width..(r + 1) * width], xh);
                layer_norm_backward_row(xh, g, gamma, (m, s), dgamma, dbeta, true);
            }
        });
        return;
    }
    with_f32_scratch(width, |[xh, g, old]| {
        for (r, (&m, &s)) in mean.iter().zip(rstd).enumerate() {
            let row = r * width..(r + 1) * width;
            E::slice_to_f32(&x[row.clone()], xh);
            let dy = match &grads {
                Grads::Read(dy) | Grads::Into(dy, _, _) => &dy[row.clone()],
                Grads::InPlace(dy) => &dy[row.clone()],
            };
            E::slice_to_f32(dy, g);
            layer_norm_backward_row(xh, g, gamma, (m, s), dgamma, dbeta, input_gradient);
            match &mut grads {
                Grads::Read(_) => {}
                Grads::Into(_, gx, accumulate) => {
                    let out = &mut gx[row];
                    if *accumulate {
                        E::slice_to_f32(out, old);
                        g.iter_mut().zip(old.iter()).for_each(|(g, o)| *g += o);
                    }
                    E::slice_from_f32(g, out);
                }
                Grads::InPlace(dy) => E::slice_from_f32(g, &mut dy[row]),
            }
        }
    });
}
