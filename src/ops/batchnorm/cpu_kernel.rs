//! The mixed batch norm on the CPU: the passes of the fork's fused batch norm
//! (`dfdx::tensor_ops::batchnorm_parts`: f32 run sums in 16 lanes added in f64, in parallel
//! over pieces of the batch added in piece order), with the per-channel arithmetic between them
//! here.

use dfdx::prelude::{Cpu, CpuError, Storage};
use dfdx::tensor_ops::batchnorm_parts as parts;
use dfdx::tensor_ops::batchnorm_parts::BatchNormLayout;

use super::{ChannelStats, MixedBatchNormKernel, RunningUpdate};
use crate::device::utilities::cpu::check_lengths;
use crate::precision::AmpElem;

fn check_layout(lay: &BatchNormLayout, len: usize) -> Result<(), CpuError> {
    check_lengths(lay.outer * lay.chan * lay.inner, len)
}

fn check_channels(lay: &BatchNormLayout, per_channel: &[&[f32]]) -> Result<(), CpuError> {
    per_channel
        .iter()
        .try_for_each(|v| check_lengths(lay.chan, v.len()))
}

/// `g = g + v` in f64, rounded once (`g` read as 0 when `fresh`: its contents are left from an
/// earlier pass).
fn add_rounded(g: Option<(&mut [f32], bool)>, v: impl Fn(usize) -> f64) {
    if let Some((g, fresh)) = g {
        for (c, g) in g.iter_mut().enumerate() {
            let old = if fresh { 0.0 } else { f64::from(*g) };
            *g = (old + v(c)) as f32;
        }
    }
}

impl<E: AmpElem> MixedBatchNormKernel<E> for Cpu {
    fn try_bn_train_forward(
        &self,
        lay: &BatchNormLayout,
        x: &<Self as Storage<E>>::Vec,
        y: &mut <Self as Storage<E>>::Vec,
        scale: &<Self as Storage<f32>>::Vec,
        bias: &<Self as Storage<f32>>::Vec,
        running: RunningUpdate<'_, Self>,
        epsilon: f64,
    ) -> Result<ChannelStats<Self>, CpuError> {
        check_layout(lay, x.len())?;
        check_layout(lay, y.len())?;
        check_channels(lay, &[scale, bias, running.mean, running.var])?;
        if lay.per_chan() < 2 {
            // The unbiased variance divides by n − 1.
            return Err(CpuError::WrongNumElements);
        }
        let n = lay.per_chan() as f64;
        let (mean64, var64) = parts::batch_stats(lay, x);
        // The running statistics as dfdx's `axpy` updates them: `a·α + b·β` in f32, with α and
        // β rounded from f64 and the batch statistics rounded to f32.
        let alpha = (1.0 - running.momentum) as f32;
        let beta_mean = running.momentum as f32;
        let beta_var = (running.momentum * n / (n - 1.0)) as f32;
        for (r, m) in running.mean.iter_mut().zip(&mean64) {
            *r = *r * alpha + (*m as f32) * beta_mean;
        }
        for (r, v) in running.var.iter_mut().zip(&var64) {
            *r = *r * alpha + (*v as f32) * beta_var;
        }
        let mean32: Vec<f32> = mean64.iter().map(|m| *m as f32).collect();
        let var32: Vec<f32> = var64.iter().map(|v| *v as f32).collect();
        let (std32, a32) = parts::std_and_scale(&var32, scale, epsilon);
        parts::normalize(lay, x, y, &mean32, &a32, bias);
        let mut stats = ChannelStats::<Self> {
            mean: Storage::<f32>::try_alloc_len(self, lay.chan)?,
            std: Storage::<f32>::try_alloc_len(self, lay.chan)?,
        };
        stats.mean.copy_from_slice(&mean32);
        stats.std.copy_from_slice(&std32);
        Ok(stats)
    }

    fn try_bn_infer_forward(
        &self,
        lay: &BatchNormLayout,
        x: &<Self as Storage<E>>::Vec,
        y: &mut <Self as Storage<E>>::Vec,
        scale: &<Self as Storage<f32>>::Vec,
        bias: &<Self as Storage<f32>>::Vec,
        running_mean: &<Self as Storage<f32>>::Vec,
        running_var: &<Self as Storage<f32>>::Vec,
        epsilon: f64,
    ) -> Result<(), CpuError> {
        check_layout(lay, x.len())?;
        check_layout(lay, y.len())?;
        check_channels(lay, &[scale, bias, running_mean, running_var])?;
        let (_, a32) = parts::std_and_scale(running_var, scale, epsilon);
        parts::normalize(lay, x, y, running_mean, &a32, bias);
        Ok(())
    }

    fn try_bn_backward(
        &self,
        lay: &BatchNormLayout,
        x: &<Self as Storage<E>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        mask: Option<&<Self as Storage<E>>::Vec>,
        gx: Option<(&mut <Self as Storage<E>>::Vec, bool)>,
        scale: &<Self as Storage<f32>>::Vec,
        stats: &ChannelStats<Self>,
        dscale: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
        dbias: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
    ) -> Result<(), CpuError> {
        check_layout(lay, x.len())?;
        check_layout(lay, dy.len())?;
        if let Some(m) = mask {
            check_layout(lay, m.len())?;
        }
        if let Some((g, _)) = &gx {
            check_layout(lay, g.len())?;
        }
        check_channels(lay, &[scale, &stats.mean, &stats.std])?;
        for g in [&dscale, &dbias].into_iter().flatten() {
            check_lengths(lay.chan, g.0.len())?;
        }
        let n = lay.per_chan() as f64;
        let mask = mask.map(|m| &m[..]);
        let sums = parts::grad_sums(lay, x, dy, mask, &stats.mean);
        // dx = (scale / std) · (dy − mean(dy) − (x − mean) · Σ dy·(x − mean) / (n · std²))
        let inv_std: Vec<f64> = stats.std.iter().map(|s| 1.0 / f64::from(*s)).collect();
        if let Some((gx, accumulate)) = gx {
            let k1: Vec<f32> = (0..lay.chan)
                .map(|c| (f64::from(scale[c]) * inv_std[c]) as f32)
                .collect();
            let mdy: Vec<f32> = sums.iter().map(|s| (s[0] / n) as f32).collect();
            let k2: Vec<f32> = (0..lay.chan)
                .map(|c| (sums[c][1] * inv_std[c] * inv_std[c] / n) as f32)
                .collect();
            parts::input_grad(
                lay,
                x,
                dy,
                mask,
                gx,
                accumulate,
                &stats.mean,
                &k1,
                &mdy,
                &k2,
            );
        }
        // d scale = Σ dy·(x − mean) / std, d bias = Σ dy.
        add_rounded(dscale.map(|(g, f)| (&mut g[..], f)), |c| {
            sums[c][1] * inv_std[c]
        });
        add_rounded(dbias.map(|(g, f)| (&mut g[..], f)), |c| sums[c][0]);
        Ok(())
    }
}
