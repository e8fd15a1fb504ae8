//! The fused embedding on the CPU: rows in parallel forward; backward, the tables' gradients
//! split by columns across tasks, each summing every row in row order (deterministic).

use dfdx::prelude::{Cpu, CpuError, Storage};
use rayon::prelude::*;

use super::{EmbeddingDims, EmbeddingKernel};
use crate::precision::AmpElem;

fn check(ok: bool) -> Result<(), CpuError> {
    ok.then_some(()).ok_or(CpuError::WrongNumElements)
}

fn check_dims(d: &EmbeddingDims, tokens: &[usize]) -> Result<usize, CpuError> {
    let rows = d
        .batch
        .checked_mul(d.tokens)
        .ok_or(CpuError::WrongNumElements)?;
    check(
        d.tokens <= d.positions
            && tokens.len() == rows
            && tokens.iter().all(|&t| t < d.vocab)
            && rows.checked_mul(d.width).is_some(),
    )?;
    Ok(rows)
}

/// Columns per task of the backward.
const COLUMNS: usize = 16;

impl<E: AmpElem> EmbeddingKernel<E> for Cpu {
    fn try_embed_forward(
        &self,
        d: EmbeddingDims,
        tokens: &<Self as Storage<usize>>::Vec,
        wte: &<Self as Storage<E>>::Vec,
        wpe: &<Self as Storage<E>>::Vec,
        y: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), CpuError> {
        let rows = check_dims(&d, tokens)?;
        let w = d.width;
        check(wte.len() == d.vocab * w && wpe.len() == d.positions * w && y.len() == rows * w)?;
        if rows == 0 || w == 0 {
            return Ok(());
        }
        y.par_chunks_mut(w)
            .zip(tokens.par_iter())
            .enumerate()
            .for_each_init(
                || (vec![0f32; w], vec![0f32; w]),
                |(a, p), (r, (out, &t))| {
                    let pos = r % d.tokens;
                    E::slice_to_f32(&wte[t * w..(t + 1) * w], a);
                    E::slice_to_f32(&wpe[pos * w..(pos + 1) * w], p);
                    a.iter_mut().zip(p.iter()).for_each(|(a, p)| *a += p);
                    E::slice_from_f32(a, out);
                },
            );
        Ok(())
    }

    fn try_embed_backward(
        &self,
        d: EmbeddingDims,
        tokens: &<Self as Storage<usize>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        dwte: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
        dwpe: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
    ) -> Result<(), CpuError> {
        let rows = check_dims(&d, tokens)?;
        let w = d.width;
        check(
            dy.len() == rows * w
                && dwte.as_ref().is_none_or(|(g, _)| g.len() == d.vocab * w)
                && dwpe
                    .as_ref()
                    .is_none_or(|(g, _)| g.len() == d.positions * w),
        )?;
        if w == 0 {
            return Ok(());
        }
        // One table's gradient: `index(row)` is the table row that input row adds into.
        let accumulate = |(grad, fresh): (&mut <Self as Storage<f32>>::Vec, bool),
                          table_rows: usize,
                          index: &(dyn Fn(usize) -> usize + Sync)| {
            if fresh {
                grad.fill(0.0);
            }
            let columns: Vec<usize> = (0..w).step_by(COLUMNS).collect();
            // Each task owns a band of columns of every table row: disjoint writes.
            let bands: Vec<Vec<f32>> = columns
                .par_iter()
                .map(|&c0| {
                    let c1 = (c0 + COLUMNS).min(w);
                    let mut band = vec![0f32; table_rows * (c1 - c0)];
                    let mut tmp = vec![0f32; c1 - c0];
                    for r in 0..rows {
                        E::slice_to_f32(&dy[r * w + c0..r * w + c1], &mut tmp);
                        let at = index(r) * (c1 - c0);
                        band[at..at + c1 - c0]
                            .iter_mut()
                            .zip(&tmp)
                            .for_each(|(b, g)| *b += g);
                    }
                    band
                })
                .collect();
            for (&c0, band) in columns.iter().zip(&bands) {
                let width = (c0 + COLUMNS).min(w) - c0;
                for (row, sums) in band.chunks(width).enumerate() {
                    grad[row * w + c0..row * w + c0 + width]
                        .iter_mut()
                        .zip(sums)
                        .for_each(|(g, s)| *g += s);
                }
            }
        };
        if let Some(dwte) = dwte {
            accumulate(dwte, d.vocab, &|r| tokens[r]);
        }
        if let Some(dwpe) = dwpe {
            accumulate(dwpe, d.positions, &|r| r % d.tokens.max(1));
        }
        Ok(())
    }
}
