use crate::{
    dtypes::{Dtype, NotMixedPrecision, OptimCompute},
    tensor::cpu::Cpu,
};
#[allow(unused_imports)]
use num_traits::{Float, FromPrimitive, One}; // typed-amp patch

use super::{RMSpropConfig, RMSpropKernel, WeightDecay};

#[cfg(feature = "f16")]
impl RMSpropKernel<crate::dtypes::AMP<crate::dtypes::f16>> for Cpu {
    fn rmsprop_kernel(
        &self,
        cfg: &RMSpropConfig,
        param: &mut Self::Vec,
        momentum: &mut Self::Vec,
        square_avg: &mut Self::Vec,
        grad_avg: &mut Self::Vec,
        grad: &Self::Vec,
    ) -> Result<(), Self::Err> {
        let alpha = cfg.alpha as f32;
        let eps = cfg.eps as f32;
        let lr = cfg.lr as f32;

        for ((p, g), (s_avg, (g_avg, m))) in param.iter_mut().zip(grad.iter().cloned()).zip(
            square_avg
                .iter_mut()
                .zip(grad_avg.iter_mut().zip(momentum.iter_mut())),
        ) {
            let p_f32 = p.0.to_f32();
            let mut g_f32 = g.0.to_f32();
            let mut s_avg_f32 = s_avg.0.to_f32();
            let mut g_avg_f32 = g_avg.0.to_f32();
            let mut m_f32 = m.0.to_f32();

            if let Some(WeightDecay::L2(wd)) = cfg.weight_decay {
                g_f32 += wd as f32 * p_f32;
            }

            // sa = a * sa + (1 - a) * g^2
            s_avg_f32 += (1.0 - alpha) * (g_f32 * g_f32 - s_avg_f32);

            let avg = if cfg.centered {
                // ga = a * ga + (1 - a) * g
                g_avg_f32 += (1.0 - alpha) * (g_f32 - g_avg_f32);
                // NOTE: eps in sqrt
                (s_avg_f32 - g_avg_f32.powi(2) + eps).sqrt()
            } else {
                // NOTE: eps in sqrt
                (s_avg_f32 + eps).sqrt()
            };

            g_f32 /= avg;

            match cfg.momentum {
                Some(u) => {
                    m_f32 = m_f32 * (u as f32) + g_f32;
                    g_f32 = m_f32 * lr;
                }
                None => g_f32 *= lr,
            }

            if let Some(WeightDecay::Decoupled(wd)) = cfg.weight_decay {
                g_f32 += (wd * cfg.lr) as f32 * p_f32;
            }

            p.0 = crate::dtypes::f16::from_f32(p_f32 - g_f32);
            s_avg.0 = crate::dtypes::f16::from_f32(s_avg_f32);
            g_avg.0 = crate::dtypes::f16::from_f32(g_avg_f32);
            m.0 = crate::dtypes::f16::from_f32(m_f32);
        }
        Ok(())
    }
}

// typed-amp patch: computes in `E::Compute` (f32 for f16 and bf16, `E` otherwise, see
// [OptimCompute], as Adam's kernel does) and rounds each state once; for every dtype but the
// 16-bit ones the arithmetic is upstream's (f16 computed in f16 before issue 34).
impl<E: Dtype + NotMixedPrecision + OptimCompute> RMSpropKernel<E> for Cpu
where
    E::Compute: num_traits::Float,
{
    fn rmsprop_kernel(
        &self,
        cfg: &RMSpropConfig,
        param: &mut Self::Vec,
        momentum: &mut Self::Vec,
        square_avg: &mut Self::Vec,
        grad_avg: &mut Self::Vec,
        grad: &Self::Vec,
    ) -> Result<(), Self::Err> {
        type C<E> = <E as OptimCompute>::Compute;
        let alpha = C::<E>::from_f64(cfg.alpha).unwrap();
        let eps = C::<E>::from_f64(cfg.eps).unwrap();
        let lr = C::<E>::from_f64(cfg.lr).unwrap();
        for ((p_e, g), (s_avg_e, (g_avg_e, m_e))) in param.iter_mut().zip(grad.iter().cloned()).zip(
            square_avg
                .iter_mut()
                .zip(grad_avg.iter_mut().zip(momentum.iter_mut())),
        ) {
            let (mut p, mut g) = (p_e.widen(), g.widen());
            let (mut s_avg, mut g_avg, mut m) = (s_avg_e.widen(), g_avg_e.widen(), m_e.widen());
            if let Some(WeightDecay::L2(wd)) = cfg.weight_decay {
                g += C::<E>::from_f64(wd).unwrap() * p;
            }

            // sa = a * sa + (1 - a) * g^2
            s_avg += (C::<E>::one() - alpha) * (g * g - s_avg);

            let avg = if cfg.centered {
                // ga = a * ga + (1 - a) * g
                g_avg += (C::<E>::one() - alpha) * (g - g_avg);
                // NOTE: eps in sqrt
                (s_avg - g_avg.powi(2) + eps).sqrt()
            } else {
                // NOTE: eps in sqrt
                (s_avg + eps).sqrt()
            };

            g /= avg;

            match cfg.momentum {
                Some(u) => {
                    m = m * C::<E>::from_f64(u).unwrap() + g;
                    g = m * lr;
                }
                None => g *= lr,
            }

            if let Some(WeightDecay::Decoupled(wd)) = cfg.weight_decay {
                g += C::<E>::from_f64(wd * cfg.lr).unwrap() * p;
            }

            p -= g;
            *p_e = E::narrow(p);
            *s_avg_e = E::narrow(s_avg);
            *g_avg_e = E::narrow(g_avg);
            *m_e = E::narrow(m);
        }
        Ok(())
    }
}
