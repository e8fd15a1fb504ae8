use dfdx::prelude::{Cpu, CpuError};

use super::ReduceKernel;
use crate::device::utilities::cpu::{for_each_f32_chunk, slot_of};
use crate::precision::AmpElem;

impl<E: AmpElem> ReduceKernel<E> for Cpu {
    fn try_sum_squares(
        &self,
        buf: &Self::Vec,
        stats: &mut Vec<f32>,
        slot: usize,
    ) -> Result<(), CpuError> {
        // Eight FP32 lanes, summed at the end, keep the rounding error near FP32's epsilon for
        // the buffer sizes of real layers, and vectorise.
        let mut lanes = [0f32; 8];
        let mut tail = 0f32;
        for_each_f32_chunk::<E>(buf, |_, chunk| {
            let blocks = chunk.chunks_exact(8);
            tail += blocks.remainder().iter().map(|x| x * x).sum::<f32>();
            for block in blocks {
                for (l, x) in lanes.iter_mut().zip(block) {
                    *l += x * x;
                }
            }
        });
        *slot_of(stats, slot)? = lanes.iter().sum::<f32>() + tail;
        Ok(())
    }

    fn try_max_abs(
        &self,
        buf: &Self::Vec,
        stats: &mut Vec<f32>,
        slot: usize,
    ) -> Result<(), CpuError> {
        // With the sign bit cleared, the bits of non-negative floats order as the floats do and
        // every NaN orders above inf: an integer max over the bits is the max of |x|, NaN if any
        // element is NaN, and vectorises.
        let mut max = 0u32;
        for_each_f32_chunk::<E>(buf, |_, chunk| {
            for x in chunk {
                max = max.max(x.to_bits() & 0x7fff_ffff);
            }
        });
        *slot_of(stats, slot)? = f32::from_bits(max);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dfdx::prelude::*;
    use half::f16;

    #[test]
    fn reductions_for_clipping_and_probes() {
        let dev = Cpu::default();
        let mut stats = vec![0.0; 3];
        let t: Tensor<Rank1<9>, f32, Cpu> =
            dev.tensor([3.0, -4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 12.0]);
        ReduceKernel::<f32>::try_sum_squares(&dev, t.storage(), &mut stats, 0).unwrap();
        ReduceKernel::<f32>::try_max_abs(&dev, t.storage(), &mut stats, 1).unwrap();
        let h: Tensor<Rank1<3>, f16, Cpu> = dev.tensor([f16::ONE, f16::NAN, f16::INFINITY]);
        ReduceKernel::<f16>::try_max_abs(&dev, h.storage(), &mut stats, 2).unwrap();
        assert_eq!(&stats[..2], &[169.0, 12.0]);
        assert!(stats[2].is_nan());
        assert!(ReduceKernel::<f32>::try_max_abs(&dev, t.storage(), &mut stats, 3).is_err());
    }
}
