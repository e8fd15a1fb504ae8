use dfdx::prelude::{AdamConfig, Cpu, CpuError, SgdConfig, Shape, Tensor};
use dfdx::tensor_ops::{Momentum, WeightDecay};
use rayon::prelude::*;

use typed_amp_kernels::optim::AdamStep;

use super::UpdateKernel;
use crate::device::utilities::cpu::{check_lengths, TASK};
use crate::precision::AmpElem;

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
        let (l2, decoupled) = match cfg.weight_decay {
            Some(WeightDecay::L2(wd)) => (Some(wd), None),
            // Matrices-only decay was resolved by the tensor's rank before the kernel.
            Some(WeightDecay::Decoupled(wd) | WeightDecay::DecoupledMatrices(wd)) => {
                (None, Some(wd))
            }
            None => (None, None),
        };
        let adam = AdamStep::new(t, cfg.betas, cfg.eps, cfg.lr, l2, decoupled);
        fused(param, (moment1, moment2), grad, working, |p, m, v, g| {
            adam.update(p, m, v, g)
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
        let (l2, decoupled) = match cfg.weight_decay {
            Some(WeightDecay::L2(wd)) => (Some(wd as f32), None),
            // Matrices-only decay was resolved by the tensor's rank before the kernel.
            Some(WeightDecay::Decoupled(wd) | WeightDecay::DecoupledMatrices(wd)) => {
                (None, Some((wd * cfg.lr) as f32))
            }
            None => (None, None),
        };
        let sgd = SgdStep {
            lr: cfg.lr as f32,
            l2: l2.unwrap_or(0.0),
            decoupled: decoupled.unwrap_or(0.0),
        };
        // One loop per configuration, chosen outside the loop, so that each vectorises.
        macro_rules! run {
            ($l2:literal, $dec:literal) => {
                match cfg.momentum {
                    None => fused_one(param, velocity, grad, working, |p, v, g| {
                        sgd.run::<$l2, $dec, 0>(p, v, g, 0.0)
                    }),
                    Some(Momentum::Classic(u)) => {
                        fused_one(param, velocity, grad, working, |p, v, g| {
                            sgd.run::<$l2, $dec, 1>(p, v, g, u as f32)
                        })
                    }
                    Some(Momentum::Nesterov(u)) => {
                        fused_one(param, velocity, grad, working, |p, v, g| {
                            sgd.run::<$l2, $dec, 2>(p, v, g, u as f32)
                        })
                    }
                }
            };
        }
        match (l2.is_some(), decoupled.is_some()) {
            (false, false) => run!(false, false),
            (true, _) => run!(true, false),
            (false, true) => run!(false, true),
        }
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

/// SGD's constants for one step.
struct SgdStep {
    lr: f32,
    l2: f32,
    decoupled: f32,
}

impl SgdStep {
    /// dfdx's f32 SGD (`tensor_ops/sgd/cpu_kernel.rs`), operation for operation; `MOMENTUM` is
    /// 0 (none), 1 (classic) or 2 (Nesterov) with coefficient `u`.
    #[inline(always)]
    fn run<const L2: bool, const DECOUPLED: bool, const MOMENTUM: u8>(
        &self,
        p: &mut [f32],
        v: &mut [f32],
        g: &[f32],
        u: f32,
    ) {
        for ((p, v), &g) in p.iter_mut().zip(v).zip(g) {
            let mut g = g;
            if L2 {
                g += self.l2 * *p;
            }
            match MOMENTUM {
                1 => {
                    *v = g + u * *v;
                    g = *v * self.lr;
                }
                2 => {
                    *v = g + u * *v;
                    g = (g + u * *v) * self.lr;
                }
                _ => g *= self.lr,
            }
            if DECOUPLED {
                g += self.decoupled * *p;
            }
            *p -= g;
        }
    }
}
