use dfdx::prelude::{Cpu, CpuError, Storage};
use dfdx::tensor_ops::batchnorm_parts as parts;
use dfdx::tensor_ops::batchnorm_parts::BatchNormLayout;

use super::MixedBatchNormKernel;
use crate::device::utilities::cpu::check_lengths;
use crate::precision::AmpElem;

fn check_layout(lay: &BatchNormLayout, len: usize) -> Result<(), CpuError> {
    check_lengths(lay.outer * lay.chan * lay.inner, len)
}

impl<E: AmpElem> MixedBatchNormKernel<E> for Cpu {
    const FUSED: bool = true;

    fn try_bn_stats(
        &self,
        lay: &BatchNormLayout,
        x: &<Self as Storage<E>>::Vec,
    ) -> Result<(Vec<f64>, Vec<f64>), CpuError> {
        check_layout(lay, x.len())?;
        Ok(parts::batch_stats(lay, x))
    }

    fn try_bn_normalize(
        &self,
        lay: &BatchNormLayout,
        x: &<Self as Storage<E>>::Vec,
        y: &mut <Self as Storage<E>>::Vec,
        [mean, a, b]: [&[f32]; 3],
    ) -> Result<(), CpuError> {
        check_layout(lay, x.len())?;
        check_layout(lay, y.len())?;
        parts::normalize(lay, x, y, mean, a, b);
        Ok(())
    }

    fn try_bn_grad_sums(
        &self,
        lay: &BatchNormLayout,
        x: &<Self as Storage<E>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        mask: Option<&<Self as Storage<E>>::Vec>,
        mean: &[f32],
    ) -> Result<Vec<[f64; 2]>, CpuError> {
        check_layout(lay, x.len())?;
        check_layout(lay, dy.len())?;
        if let Some(m) = mask {
            check_layout(lay, m.len())?;
        }
        Ok(parts::grad_sums(lay, x, dy, mask.map(|m| &m[..]), mean))
    }

    fn try_bn_input_grad(
        &self,
        lay: &BatchNormLayout,
        x: &<Self as Storage<E>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        mask: Option<&<Self as Storage<E>>::Vec>,
        (gx, accumulate): (&mut <Self as Storage<E>>::Vec, bool),
        [mean, k1, mdy, k2]: [&[f32]; 4],
    ) -> Result<(), CpuError> {
        for len in [x.len(), dy.len(), gx.len()] {
            check_layout(lay, len)?;
        }
        if let Some(m) = mask {
            check_layout(lay, m.len())?;
        }
        let mask = mask.map(|m| &m[..]);
        parts::input_grad(lay, x, dy, mask, gx, accumulate, mean, k1, mdy, k2);
        Ok(())
    }
}
