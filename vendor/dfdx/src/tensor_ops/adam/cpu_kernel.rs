use super::{AdamConfig, AdamKernel, WeightDecay};
use crate::{
    dtypes::{Dtype, NotMixedPrecision, OptimCompute},
    tensor::Cpu,
};
#[allow(unused_imports)]
use num_traits::{Float, FromPrimitive, One}; // typed-amp patch

#[cfg(feature = "f16")]
impl AdamKernel<crate::dtypes::AMP<crate::dtypes::f16>> for Cpu {
    fn adam_kernel(
        &self,
        t: i32,
        cfg: &AdamConfig,
        param: &mut Self::Vec,
        moment1: &mut Self::Vec,
        moment2: &mut Self::Vec,
        grad: &Self::Vec,
    ) -> Result<(), Self::Err> {
        let betas = cfg.betas.map(|x| x as f32);
        let eps = cfg.eps as f32;
        let lr = cfg.lr as f32;

        for ((p, g), (m, v)) in param
            .iter_mut()
            .zip(grad.iter().cloned())
            .zip(moment1.iter_mut().zip(moment2.iter_mut()))
        {
            let p_f32 = p.0.to_f32();
            let mut g_f32 = g.0.to_f32();
            let mut m_f32 = m.0.to_f32();
            let mut v_f32 = v.0.to_f32();

            if let Some(WeightDecay::L2(wd)) = cfg.weight_decay {
                g_f32 += (wd as f32) * p_f32;
            }

            m_f32 = m_f32 * betas[0] + g_f32 * (1.0 - betas[0]);
            v_f32 = v_f32 * betas[1] + g_f32.powi(2) * (1.0 - betas[1]);
            let m_hat = m_f32 * (1.0 - betas[0].powi(t)).recip();
            let v_hat = v_f32 * (1.0 - betas[1].powi(t)).recip();
            g_f32 = lr * m_hat / (v_hat.sqrt() + eps);

            if let Some(WeightDecay::Decoupled(wd)) = cfg.weight_decay {
                g_f32 += (wd * cfg.lr) as f32 * p_f32;
            }

            p.0 = crate::dtypes::f16::from_f32(p_f32 - g_f32);
            m.0 = crate::dtypes::f16::from_f32(m_f32);
            v.0 = crate::dtypes::f16::from_f32(v_f32);
        }
        Ok(())
    }
}

// typed-amp patch: computes in `E::Compute` (f32 for f16 and bf16, `E` otherwise, see
// [OptimCompute]) and rounds `p`, `m` and `v` once each; for every dtype but the 16-bit ones the
// arithmetic is upstream's.
impl<E: Dtype + NotMixedPrecision + OptimCompute> AdamKernel<E> for Cpu
where
    E::Compute: num_traits::Float,
{
    fn adam_kernel(
        &self,
        t: i32,
        cfg: &AdamConfig,
        param: &mut Self::Vec,
        moment1: &mut Self::Vec,
        moment2: &mut Self::Vec,
        grad: &Self::Vec,
    ) -> Result<(), Self::Err> {
        // typed-amp patch: f32 runs typed-amp-kernels' vectorised Adam (the operations below in
        // the same order, so the same bits) in parallel pieces.
        #[cfg(feature = "cpu")]
        if adam_f32(t, cfg, param, moment1, moment2, grad) {
            return Ok(());
        }
        type C<E> = <E as OptimCompute>::Compute;
        let betas = cfg.betas.map(C::<E>::from_f64).map(Option::unwrap);
        let eps = C::<E>::from_f64(cfg.eps).unwrap();
        let lr = C::<E>::from_f64(cfg.lr).unwrap();

        for ((p_e, g), (m_e, v_e)) in param
            .iter_mut()
            .zip(grad.iter().cloned())
            .zip(moment1.iter_mut().zip(moment2.iter_mut()))
        {
            let (mut p, mut g, mut m, mut v) = (p_e.widen(), g.widen(), m_e.widen(), v_e.widen());
            if let Some(WeightDecay::L2(wd)) = cfg.weight_decay {
                g += C::<E>::from_f64(wd).unwrap() * p;
            }

            m = m * betas[0] + g * (C::<E>::one() - betas[0]);
            v = v * betas[1] + g.powi(2) * (C::<E>::one() - betas[1]);
            let m_hat = m * (C::<E>::one() - betas[0].powi(t)).recip();
            let v_hat = v * (C::<E>::one() - betas[1].powi(t)).recip();
            g = lr * m_hat / (v_hat.sqrt() + eps);

            if let Some(WeightDecay::Decoupled(wd)) = cfg.weight_decay {
                g += C::<E>::from_f64(wd * cfg.lr).unwrap() * p;
            }

            p -= g;
            *p_e = E::narrow(p);
            *m_e = E::narrow(m);
            *v_e = E::narrow(v);
        }
        Ok(())
    }
}

/// typed-amp patch: elements below which [adam_f32] runs on the calling thread (one piece).
#[cfg(feature = "cpu")]
const ADAM_PIECE_MIN: usize = 8192;

/// typed-amp patch: dfdx's f32 Adam on typed-amp-kernels' update (`optim::AdamStep`: the
/// generic loop's operations in its order, compiled for AVX-512 or AVX2 where the CPU has them,
/// so the same bits), in parallel pieces of the four buffers (at most 16, of at least
/// [ADAM_PIECE_MIN] elements). The generic loop ran on one thread four SSE lanes at a time:
/// 3.3% of the small GPT's O0 step, with the pool's other thread idle. Returns `false`
/// (nothing done) unless `E` is f32 and the four buffers have one length.
#[cfg(feature = "cpu")]
fn adam_f32<E: Dtype>(
    t: i32,
    cfg: &AdamConfig,
    param: &mut [E],
    moment1: &mut [E],
    moment2: &mut [E],
    grad: &[E],
) -> bool {
    use crate::tensor_ops::utilities::cpu_f32::{
        as_f32, as_f32_mut, par_chunks_mut, pieces, SendPtr,
    };
    let (Some(p), Some(m), Some(v), Some(g)) = (
        as_f32_mut(param),
        as_f32_mut(moment1),
        as_f32_mut(moment2),
        as_f32(grad),
    ) else {
        return false;
    };
    let n = p.len();
    if m.len() != n || v.len() != n || g.len() != n {
        return false;
    }
    let (l2, decoupled) = match cfg.weight_decay {
        Some(WeightDecay::L2(wd)) => (Some(wd), None),
        Some(WeightDecay::Decoupled(wd)) => (None, Some(wd)),
        // The generic loop applies neither (the optimizer resolves matrices-only decay by the
        // tensor's rank before the kernel).
        _ => (None, None),
    };
    let step =
        typed_amp_kernels::optim::AdamStep::new(t, cfg.betas, cfg.eps, cfg.lr, l2, decoupled);
    // A division and a square root an element: pieces of 8,192 elements (a few microseconds
    // each) pay for their hand-off to the pool, and the small GPT's matrices (16,384 to 65,536
    // elements) ran on one thread with `par_elementwise`'s 32,768-element pieces.
    let parts = pieces(n / ADAM_PIECE_MIN);
    if parts == 1 {
        step.update(p, m, v, g);
        return true;
    }
    let chunk = n.div_ceil(parts).div_ceil(16) * 16;
    let (m, v) = (SendPtr(m.as_mut_ptr()), SendPtr(v.as_mut_ptr()));
    // Captured whole (a closure would otherwise capture the raw pointer fields alone).
    let (m, v) = (&m, &v);
    par_chunks_mut(p, chunk, |i, p| {
        let at = i * chunk;
        // SAFETY: `par_chunks_mut`'s pieces are disjoint runs `at..at + p.len()` of `0..n`,
        // and `m` and `v` hold `n` elements each (checked above), borrowed mutably for the
        // whole call: each task reaches only its own run of each.
        let (m, v) = unsafe {
            (
                std::slice::from_raw_parts_mut(m.0.add(at), p.len()),
                std::slice::from_raw_parts_mut(v.0.add(at), p.len()),
            )
        };
        step.update(p, m, v, &g[at..at + p.len()]);
    });
    true
}
