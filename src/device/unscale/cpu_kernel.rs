use dfdx::prelude::{Cpu, CpuError};
use rayon::prelude::*;

use super::{UnscaleKernel, GRADIENT_LIMIT_BITS};
use crate::device::utilities::cpu::{
    as_f32_mut, check_lengths, for_each_f32_chunk, map_f32_chunks, slot_of, CHUNK, TASK,
};
use crate::precision::AmpElem;

/// Whether any value is inf, NaN, or larger in magnitude than
/// [`GRADIENT_LIMIT`](super::GRADIENT_LIMIT), written so that the loop vectorises.
#[inline]
fn any_overflowing(values: &[f32]) -> bool {
    values.iter().fold(0u32, |acc, v| {
        acc | u32::from(v.to_bits() & 0x7fff_ffff > GRADIENT_LIMIT_BITS)
    }) != 0
}

/// `buf *= inv_scale` and whether any result overflows (inf, NaN, or above
/// [`GRADIENT_LIMIT`](super::GRADIENT_LIMIT) in magnitude): chunk by chunk (each scaled and
/// checked while in L1), in parallel tasks for large buffers (the master gradients are this
/// pass's bulk: 2 MiB for the MLP, read and written once a step), and with no write at all for
/// a scale of 1 (FP32 and BF16 steps without a loss scale), where `x * 1.0` is `x`.
fn unscale_f32(buf: &mut [f32], inv_scale: f32) -> bool {
    let pass = |task: &mut [f32]| {
        task.chunks_mut(CHUNK).fold(false, |non_finite, chunk| {
            if inv_scale != 1.0 {
                chunk.iter_mut().for_each(|x| *x *= inv_scale);
            }
            non_finite | any_overflowing(chunk)
        })
    };
    if buf.len() <= TASK {
        pass(buf)
    } else {
        buf.par_chunks_mut(TASK)
            .map(pass)
            .reduce(|| false, |a, b| a | b)
    }
}

impl<E: AmpElem> UnscaleKernel<E> for Cpu {
    fn try_unscale_to_f32(
        &self,
        src: &<Self as dfdx::prelude::Storage<E>>::Vec,
        dst: &mut <Self as dfdx::prelude::Storage<f32>>::Vec,
        inv_scale: f32,
        stats: &mut Vec<f32>,
        slot: usize,
    ) -> Result<(), CpuError> {
        check_lengths(src.len(), dst.len())?;
        slot_of(stats, slot)?;
        let mut non_finite = false;
        for_each_f32_chunk::<E>(src, |at, chunk| {
            let out = &mut dst[at..at + chunk.len()];
            for (d, s) in out.iter_mut().zip(chunk) {
                *d = *s * inv_scale;
            }
            // The result is checked, not only the input: see the trait's documentation.
            non_finite |= any_overflowing(out);
        });
        *slot_of(stats, slot)? = f32::from(u8::from(non_finite));
        Ok(())
    }

    fn try_unscale_in_place(
        &self,
        buf: &mut <Self as dfdx::prelude::Storage<E>>::Vec,
        inv_scale: f32,
        stats: &mut Vec<f32>,
        slot: usize,
    ) -> Result<(), CpuError> {
        slot_of(stats, slot)?;
        if let Some(buf) = as_f32_mut(buf) {
            *slot_of(stats, slot)? = f32::from(u8::from(unscale_f32(buf, inv_scale)));
            return Ok(());
        }
        let mut non_finite = false;
        // Chunked, so each chunk is scaled and checked while it is in cache. The check runs on
        // the FP32 result before it is rounded back: a finite FP32 product that overflows `E`
        // becomes inf in the buffer, so it is checked again after rounding.
        map_f32_chunks::<E>(buf, |chunk| {
            chunk.iter_mut().for_each(|x| *x *= inv_scale);
            non_finite |= any_overflowing(chunk);
        });
        if !non_finite && !E::FULL_RANGE {
            for_each_f32_chunk::<E>(buf, |_, chunk| non_finite |= any_overflowing(chunk));
        }
        *slot_of(stats, slot)? = f32::from(u8::from(non_finite));
        Ok(())
    }

    unsafe fn try_queue_unscale_in_place(
        &self,
        (): &mut (),
        buf: &mut <Self as dfdx::prelude::Storage<E>>::Vec,
        inv_scale: f32,
        stats: &mut Vec<f32>,
        slot: usize,
    ) -> Result<(), CpuError> {
        UnscaleKernel::<E>::try_unscale_in_place(self, buf, inv_scale, stats, slot)
    }

    unsafe fn try_queue_unscale_to_f32(
        &self,
        (): &mut (),
        src: <Self as dfdx::prelude::Storage<E>>::Vec,
        dst: &mut <Self as dfdx::prelude::Storage<f32>>::Vec,
        inv_scale: f32,
        stats: &mut Vec<f32>,
        slot: usize,
    ) -> Result<(), CpuError> {
        UnscaleKernel::<E>::try_unscale_to_f32(self, &src, dst, inv_scale, stats, slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::utilities::cpu::CHUNK;
    use dfdx::prelude::*;
    use half::f16;

    fn f32_buf(dev: &Cpu, values: &[f32]) -> <Cpu as Storage<f32>>::Vec {
        let t: Tensor<(usize,), f32, Cpu> = dev.tensor_from_vec(values.to_vec(), (values.len(),));
        t.storage().clone()
    }

    fn f16_buf(dev: &Cpu, values: &[f32]) -> <Cpu as Storage<f16>>::Vec {
        let v: Vec<f16> = values.iter().map(|x| f16::from_f32(*x)).collect();
        let t: Tensor<(usize,), f16, Cpu> = dev.tensor_from_vec(v, (values.len(),));
        t.storage().clone()
    }

    #[test]
    fn unscale_flags_non_finite_in_either_precision_across_chunks() {
        let dev = Cpu::default();
        let mut values = vec![2.0f32; 3 * CHUNK + 7];
        let mut stats = vec![0.0; 4];
        let mut dst = f32_buf(&dev, &values);

        let src = f32_buf(&dev, &values);
        UnscaleKernel::<f32>::try_unscale_to_f32(&dev, &src, &mut dst, 0.25, &mut stats, 0)
            .unwrap();
        assert!(dst.iter().all(|x| *x == 0.5));

        *values.last_mut().unwrap() = f32::INFINITY;
        let src = f16_buf(&dev, &values);
        UnscaleKernel::<f16>::try_unscale_to_f32(&dev, &src, &mut dst, 0.25, &mut stats, 1)
            .unwrap();
        assert!(dst.last().unwrap().is_infinite());

        values[CHUNK + 1] = f32::NAN;
        let mut src = f16_buf(&dev, &values);
        UnscaleKernel::<f16>::try_unscale_in_place(&dev, &mut src, 0.5, &mut stats, 2).unwrap();
        assert_eq!(src[0].to_f32(), 1.0);

        // A scale below 2^-126 has an infinite reciprocal in FP32: 0 · inf is NaN, flagged,
        // though the input held no inf or NaN.
        let zeros = f32_buf(&dev, &[0.0; 5]);
        let inv = (1.0f64 / f64::from(f32::from_bits(1))) as f32;
        assert!(inv.is_infinite());
        UnscaleKernel::<f32>::try_unscale_to_f32(
            &dev,
            &zeros,
            &mut dst.clone(),
            inv,
            &mut stats,
            3,
        )
        .unwrap_err();
        let mut dst5 = f32_buf(&dev, &[0.0; 5]);
        UnscaleKernel::<f32>::try_unscale_to_f32(&dev, &zeros, &mut dst5, inv, &mut stats, 3)
            .unwrap();
        assert_eq!(stats, vec![0.0, 1.0, 1.0, 1.0]);
    }

    #[test]
    fn unscaling_in_place_into_fp16_flags_a_result_that_overflows_it() {
        let dev = Cpu::default();
        let mut stats = vec![0.0; 1];
        let mut buf = f16_buf(&dev, &[60000.0]);
        UnscaleKernel::<f16>::try_unscale_in_place(&dev, &mut buf, 2.0, &mut stats, 0).unwrap();
        assert!(buf[0].is_infinite());
        assert_eq!(stats, vec![1.0]);
    }

    /// The FP32 in-place pass (parallel tasks, no write at scale 1) against the plain product,
    /// bit for bit, on sizes around the task boundaries, with one non-finite value in each
    /// position class (first task, last task's tail, none).
    #[test]
    fn unscaling_fp32_in_place_matches_the_plain_product_across_tasks() {
        let dev = Cpu::default();
        for len in [1, CHUNK + 3, TASK, TASK + 1, 3 * TASK + 17] {
            for bad in [None, Some(0), Some(len - 1)] {
                for (inv, what) in [(0.5f32, "halve"), (1.0, "one"), (3.0e-5, "1/2^15-ish")] {
                    let mut values: Vec<f32> = (0..len)
                        .map(|i| ((i as f32) * 0.37).sin() * 1.0e4)
                        .collect();
                    if let Some(at) = bad {
                        values[at] = f32::NAN;
                    }
                    let expected: Vec<u32> = values.iter().map(|v| (v * inv).to_bits()).collect();
                    let mut buf = f32_buf(&dev, &values);
                    let mut stats = vec![0.5; 1];
                    UnscaleKernel::<f32>::try_unscale_in_place(&dev, &mut buf, inv, &mut stats, 0)
                        .unwrap();
                    let got: Vec<u32> = buf.iter().map(|v| v.to_bits()).collect();
                    let ctx = format!("len {len}, bad {bad:?}, {what}");
                    // NaN payloads may differ (x86 quiets them): compare NaN-ness there.
                    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                        let (g, e) = (f32::from_bits(*g), f32::from_bits(*e));
                        assert!(
                            g.to_bits() == e.to_bits() || (g.is_nan() && e.is_nan()),
                            "{ctx} at {i}"
                        );
                    }
                    assert_eq!(stats[0], if bad.is_some() { 1.0 } else { 0.0 }, "{ctx}");
                }
            }
        }
    }
}
