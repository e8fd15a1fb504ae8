//! The fused head on the CPU: the products on `typed_amp_kernels`' GEMM (the logits stored in
//! FP32 from the f32 accumulation), the cross-entropy row by row in parallel with vectorised
//! exponentials, the loss summed in f64 in row order.

use dfdx::prelude::{Cpu, CpuError, Storage};
use rayon::prelude::*;
use typed_amp_kernels::math::exp_slice;
use typed_amp_kernels::Epilogue;

use super::{LmHeadDims, LmHeadKernel};
use crate::device::utilities::cpu_gemm::{gemm, gemm_into};
use crate::precision::AmpElem;

fn check(ok: bool) -> Result<(), CpuError> {
    ok.then_some(()).ok_or(CpuError::WrongNumElements)
}

fn check_dims(d: &LmHeadDims) -> Result<(usize, usize), CpuError> {
    let hidden = d.rows.checked_mul(d.width);
    let logits = d.rows.checked_mul(d.vocab);
    match (hidden, logits) {
        (Some(h), Some(l)) if d.vocab > 0 => Ok((h, l)),
        _ => Err(CpuError::WrongNumElements),
    }
}

/// Rows per parallel task of the cross-entropy passes.
const ROWS: usize = 64;

impl<E: AmpElem> LmHeadKernel<E> for Cpu {
    fn try_head_logits(
        &self,
        d: LmHeadDims,
        h: &<Self as Storage<E>>::Vec,
        w: &<Self as Storage<E>>::Vec,
        logits: &mut <Self as Storage<f32>>::Vec,
    ) -> Result<(), CpuError> {
        let (hidden, n) = check_dims(&d)?;
        check(h.len() == hidden && w.len() == d.vocab * d.width && logits.len() == n)?;
        gemm_into::<E, f32>(
            (d.rows, d.width, d.vocab),
            (h, d.width, 1),
            (w, 1, d.width),
            (logits, d.vocab, 1),
            &Epilogue::STORE,
        );
        Ok(())
    }

    fn try_cross_entropy_forward(
        &self,
        d: LmHeadDims,
        logits: &<Self as Storage<f32>>::Vec,
        targets: &<Self as Storage<usize>>::Vec,
        loss: &mut <Self as Storage<f32>>::Vec,
        lse: &mut <Self as Storage<f32>>::Vec,
    ) -> Result<(), CpuError> {
        let (_, n) = check_dims(&d)?;
        check(
            logits.len() == n
                && targets.len() == d.rows
                && loss.len() == 1
                && lse.len() == d.rows
                && targets.iter().all(|&t| t < d.vocab),
        )?;
        let v = d.vocab;
        let partial: Vec<f64> = logits
            .par_chunks(ROWS * v)
            .zip(targets.par_chunks(ROWS))
            .zip(lse.par_chunks_mut(ROWS))
            .map(|((logits, targets), lse)| {
                let mut e = vec![0f32; v];
                let mut sum = 0f64;
                for ((row, &t), lse) in logits.chunks(v).zip(targets).zip(lse) {
                    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                    e.iter_mut().zip(row).for_each(|(e, x)| *e = x - max);
                    exp_slice(&mut e);
                    // NaN logits make NaN sums (`max` skips NaN, the exponentials keep it).
                    *lse = max + e.iter().map(|&x| f64::from(x)).sum::<f64>().ln() as f32;
                    sum += f64::from(*lse - row[t]);
                }
                sum
            })
            .collect();
        loss[0] = (partial.iter().sum::<f64>() / d.rows.max(1) as f64) as f32;
        Ok(())
    }

    fn try_cross_entropy_backward(
        &self,
        d: LmHeadDims,
        logits: &<Self as Storage<f32>>::Vec,
        lse: &<Self as Storage<f32>>::Vec,
        targets: &<Self as Storage<usize>>::Vec,
        g: &<Self as Storage<f32>>::Vec,
        dlogits: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), CpuError> {
        let (_, n) = check_dims(&d)?;
        check(
            logits.len() == n
                && dlogits.len() == n
                && targets.len() == d.rows
                && lse.len() == d.rows
                && g.len() == 1
                && targets.iter().all(|&t| t < d.vocab),
        )?;
        let v = d.vocab;
        let weight = g[0] / d.rows.max(1) as f32;
        logits
            .par_chunks(ROWS * v)
            .zip(dlogits.par_chunks_mut(ROWS * v))
            .zip(targets.par_chunks(ROWS).zip(lse.par_chunks(ROWS)))
            .for_each(|((logits, dlogits), (targets, lse))| {
                let mut p = vec![0f32; v];
                for (((row, out), &t), &l) in logits
                    .chunks(v)
                    .zip(dlogits.chunks_mut(v))
                    .zip(targets)
                    .zip(lse)
                {
                    p.iter_mut().zip(row).for_each(|(p, x)| *p = x - l);
                    exp_slice(&mut p);
                    p[t] -= 1.0;
                    p.iter_mut().for_each(|p| *p *= weight);
                    E::slice_from_f32(&p, out);
                }
            });
        Ok(())
    }

    fn try_head_backward(
        &self,
        d: LmHeadDims,
        dlogits: &<Self as Storage<E>>::Vec,
        h: &<Self as Storage<E>>::Vec,
        w: &<Self as Storage<E>>::Vec,
        dh: Option<(&mut <Self as Storage<E>>::Vec, bool)>,
        dw: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
    ) -> Result<(), CpuError> {
        let (hidden, n) = check_dims(&d)?;
        check(
            dlogits.len() == n
                && h.len() == hidden
                && w.len() == d.vocab * d.width
                && dh.as_ref().is_none_or(|(dh, _)| dh.len() == hidden)
                && dw
                    .as_ref()
                    .is_none_or(|(dw, _)| dw.len() == d.vocab * d.width),
        )?;
        if let Some((dh, accumulate)) = dh {
            gemm::<E>(
                (d.rows, d.vocab, d.width),
                (dlogits, d.vocab, 1),
                (w, d.width, 1),
                (dh, d.width, 1),
                accumulate,
            );
        }
        if let Some((dw, fresh)) = dw {
            // Accumulated in FP32 and stored in FP32: never rounded to the weight's precision.
            gemm_into::<E, f32>(
                (d.vocab, d.rows, d.width),
                (dlogits, 1, d.vocab),
                (h, d.width, 1),
                (dw, d.width, 1),
                &Epilogue {
                    accumulate: !fresh,
                    ..Epilogue::STORE
                },
            );
        }
        Ok(())
    }
}
