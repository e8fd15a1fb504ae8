use dfdx::prelude::{AdamConfig, Cpu, CpuError, SgdConfig, Shape, Tensor};
use dfdx::tensor_ops::{Momentum, WeightDecay};
use rayon::prelude::*;

use super::UpdateKernel;
use crate::device::cpu::check_lengths;
use crate::precision::AmpElem;

/// Elements per parallel task: large enough that rayon's overhead is noise, small enough that
/// a 512 × 512 weight splits across two cores.
const TASK: usize = 1 << 15;

/// Elements updated before their rounding into the working copy: the FP32 values are still in
/// L1 when converted.
const BLOCK: usize = 1024;

/// Runs `update` on matching blocks of the five buffers, in parallel for large tensors, then
/// rounds each updated block of `param` into `working`.
fn fused<E: AmpElem>(
    param: &mut [f32],
    state: (&mut [f32], &mut [f32]),
    grad: &[f32],
    working: &mut [E],
    update: impl Fn(&mut [f32], &mut [f32], &mut [f32], &[f32]) + Sync,
) {
    let (s1, s2) = state;
    let run = |p: &mut [f32], a: &mut [f32], b: &mut [f32], g: &[f32], w: &mut [E]| {
        for ((((p, a), b), g), w) in p
            .chunks_mut(BLOCK)
            .zip(a.chunks_mut(BLOCK))
            .zip(b.chunks_mut(BLOCK))
            .zip(g.chunks(BLOCK))
            .zip(w.chunks_mut(BLOCK))
        {
            update(p, a, b, g);
            E::slice_from_f32(p, w);
        }
    };
    if param.len() <= TASK {
        return run(param, s1, s2, grad, working);
    }
    param
        .par_chunks_mut(TASK)
        .zip(s1.par_chunks_mut(TASK))
        .zip(s2.par_chunks_mut(TASK))
        .zip(grad.par_chunks(TASK))
        .zip(working.par_chunks_mut(TASK))
        .for_each(|((((p, a), b), g), w)| run(p, a, b, g, w));
}

impl<E: AmpElem> UpdateKernel<E> for Cpu {
    fn try_adam_refresh<S: Shape>(
        &self,
        t: i32,
        cfg: &AdamConfig,
        param: &mut Tensor<S, f32, Self>,
        moment1: &mut <Self as dfdx::prelude::Storage<f32>>::Vec,
        moment2: &mut <Self as dfdx::prelude::Storage<f32>>::Vec,
        grad: &<Self as dfdx::prelude::Storage<f32>>::Vec,
        working: &mut <Self as dfdx::prelude::Storage<E>>::Vec,
    ) -> Result<(), CpuError> {
        let param = param.storage_mut();
        for len in [moment1.len(), moment2.len(), grad.len(), working.len()] {
            check_lengths(param.len(), len)?;
        }
        // dfdx's f32 Adam (`tensor_ops/adam/cpu_kernel.rs`), operation for operation: the same
        // constants (converted from f64 the same way) and the same expression order, so the
        // master and the moments match the unfused update bit for bit.
        let betas = cfg.betas.map(|b| b as f32);
        let (eps, lr) = (cfg.eps as f32, cfg.lr as f32);
        let one = 1.0f32;
        let correction = (
            (one - betas[0].powi(t)).recip(),
            (one - betas[1].powi(t)).recip(),
        );
        let l2 = match cfg.weight_decay {
            Some(WeightDecay::L2(wd)) => Some(wd as f32),
            _ => None,
        };
        let decoupled = match cfg.weight_decay {
            Some(WeightDecay::Decoupled(wd)) => Some((wd * cfg.lr) as f32),
            _ => None,
        };
        fused(param, (moment1, moment2), grad, working, |p, m, v, g| {
            for (((p, m), v), &g) in p.iter_mut().zip(m).zip(v).zip(g) {
                let mut g = g;
                if let Some(wd) = l2 {
                    g += wd * *p;
                }
                *m = *m * betas[0] + g * (one - betas[0]);
                *v = *v * betas[1] + g.powi(2) * (one - betas[1]);
                let m_hat = *m * correction.0;
                let v_hat = *v * correction.1;
                g = lr * m_hat / (v_hat.sqrt() + eps);
                if let Some(wd) = decoupled {
                    g += wd * *p;
                }
                *p -= g;
            }
        });
        Ok(())
    }

    fn try_sgd_refresh<S: Shape>(
        &self,
        cfg: &SgdConfig,
        param: &mut Tensor<S, f32, Self>,
        velocity: &mut <Self as dfdx::prelude::Storage<f32>>::Vec,
        grad: &<Self as dfdx::prelude::Storage<f32>>::Vec,
        working: &mut <Self as dfdx::prelude::Storage<E>>::Vec,
    ) -> Result<(), CpuError> {
        let param = param.storage_mut();
        for len in [velocity.len(), grad.len(), working.len()] {
            check_lengths(param.len(), len)?;
        }
        // dfdx's f32 SGD (`tensor_ops/sgd/cpu_kernel.rs`), operation for operation.
        let lr = cfg.lr as f32;
        let l2 = match cfg.weight_decay {
            Some(WeightDecay::L2(wd)) => Some(wd as f32),
            _ => None,
        };
        let decoupled = match cfg.weight_decay {
            Some(WeightDecay::Decoupled(wd)) => Some((wd * cfg.lr) as f32),
            _ => None,
        };
        let momentum = cfg.momentum;
        let update = |p: &mut [f32], v: &mut [f32], g: &[f32]| {
            for ((p, v), &g) in p.iter_mut().zip(v).zip(g) {
                let mut g = g;
                if let Some(wd) = l2 {
                    g += wd * *p;
                }
                match momentum {
                    Some(Momentum::Classic(u)) => {
                        let u = u as f32;
                        *v = g + u * *v;
                        g = *v * lr;
                    }
                    Some(Momentum::Nesterov(u)) => {
                        let u = u as f32;
                        *v = g + u * *v;
                        g = (g + u * *v) * lr;
                    }
                    None => g *= lr,
                }
                if let Some(wd) = decoupled {
                    g += wd * *p;
                }
                *p -= g;
            }
        };
        fused_one(param, velocity, grad, working, update);
        Ok(())
    }
}

/// [`fused`] for optimizers with one state buffer.
fn fused_one<E: AmpElem>(
    param: &mut [f32],
    state: &mut [f32],
    grad: &[f32],
    working: &mut [E],
    update: impl Fn(&mut [f32], &mut [f32], &[f32]) + Sync,
) {
    let run = |p: &mut [f32], s: &mut [f32], g: &[f32], w: &mut [E]| {
        for (((p, s), g), w) in p
            .chunks_mut(BLOCK)
            .zip(s.chunks_mut(BLOCK))
            .zip(g.chunks(BLOCK))
            .zip(w.chunks_mut(BLOCK))
        {
            update(p, s, g);
            E::slice_from_f32(p, w);
        }
    };
    if param.len() <= TASK {
        return run(param, state, grad, working);
    }
    param
        .par_chunks_mut(TASK)
        .zip(state.par_chunks_mut(TASK))
        .zip(grad.par_chunks(TASK))
        .zip(working.par_chunks_mut(TASK))
        .for_each(|(((p, s), g), w)| run(p, s, g, w));
}
