use dfdx::prelude::{Cpu, CpuError};

use super::FillKernel;
use crate::device::utilities::cpu::map_f32_chunks;
use crate::precision::AmpElem;

impl<E: AmpElem> FillKernel<E> for Cpu {
    fn try_fill(&self, buf: &mut Self::Vec, value: f32) -> Result<(), CpuError> {
        buf.fill(<E as AmpElem>::from_f32(value));
        Ok(())
    }

    fn try_scale(&self, buf: &mut Self::Vec, factor: f32) -> Result<(), CpuError> {
        map_f32_chunks::<E>(buf, |chunk| chunk.iter_mut().for_each(|x| *x *= factor));
        Ok(())
    }

    fn try_clamp(&self, buf: &mut Self::Vec, limit: f32) -> Result<(), CpuError> {
        map_f32_chunks::<E>(buf, |chunk| {
            chunk.iter_mut().for_each(|x| *x = x.clamp(-limit, limit))
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dfdx::prelude::*;
    use half::f16;

    #[test]
    fn scale_and_clamp_compute_in_fp32_and_round_once() {
        let dev = Cpu::default();
        let t: Tensor<Rank1<3>, f32, Cpu> = dev.tensor([3.0, -4.0, f32::NAN]);
        let mut buf = t.storage().clone();
        FillKernel::<f32>::try_clamp(&dev, &mut buf, 3.5).unwrap();
        assert_eq!(&buf[..2], &[3.0, -3.5]);
        assert!(buf[2].is_nan());
        FillKernel::<f32>::try_scale(&dev, &mut buf, 2.0).unwrap();
        assert_eq!(&buf[..2], &[6.0, -7.0]);
        let h: Tensor<Rank1<2>, f16, Cpu> = dev.tensor([f16::ONE, f16::from_f32(-9.0)]);
        let mut buf = h.storage().clone();
        FillKernel::<f16>::try_clamp(&dev, &mut buf, 2.0).unwrap();
        assert_eq!(buf[1].to_f32(), -2.0);
        FillKernel::<f16>::try_fill(&dev, &mut buf, 0.1).unwrap();
        assert_eq!(buf[0], f16::from_f32(0.1));
    }
}
