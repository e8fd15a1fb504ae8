//! CPU kernels: single passes over contiguous buffers, FP16 converted in cache-sized chunks with
//! `half`'s vectorised slice conversions (F16C where the CPU has it).

use dfdx::prelude::{Cpu, CpuError};
use half::f16;

use super::AmpDevice;
use crate::precision::{AmpElem, AnyBuf, AnyBufMut};

/// Elements converted per chunk: 4 KiB of FP32, small enough to stay in L1.
const CHUNK: usize = 1024;

/// Exponent bits of an FP32 value; all set means inf or NaN.
const F32_EXPONENT: u32 = 0x7f80_0000;

/// Whether any value is inf or NaN, written so that the loop vectorises.
#[inline]
fn any_non_finite(values: &[f32]) -> bool {
    values.iter().fold(0u32, |acc, v| {
        acc | u32::from(v.to_bits() & F32_EXPONENT == F32_EXPONENT)
    }) != 0
}

/// Calls `f` on consecutive FP32 chunks of a buffer of either precision.
#[inline]
fn for_each_f32_chunk(src: &AnyBuf<'_, Cpu>, mut f: impl FnMut(usize, &[f32])) {
    match src {
        AnyBuf::F32(buf) => {
            for (i, chunk) in buf.chunks(CHUNK).enumerate() {
                f(i * CHUNK, chunk);
            }
        }
        AnyBuf::F16(buf) => {
            let mut tmp = [0f32; CHUNK];
            for (i, chunk) in buf.chunks(CHUNK).enumerate() {
                let tmp = &mut tmp[..chunk.len()];
                f16::slice_to_f32(chunk, tmp);
                f(i * CHUNK, tmp);
            }
        }
    }
}

fn len_of(buf: &AnyBuf<'_, Cpu>) -> usize {
    match buf {
        AnyBuf::F16(b) => b.len(),
        AnyBuf::F32(b) => b.len(),
    }
}

fn len_of_mut(buf: &AnyBufMut<'_, Cpu>) -> usize {
    match buf {
        AnyBufMut::F16(b) => b.len(),
        AnyBufMut::F32(b) => b.len(),
    }
}

/// The stats slot `slot`, or an error if the buffer has no such slot.
fn slot_of(stats: &mut [f32], slot: usize) -> Result<&mut f32, CpuError> {
    stats.get_mut(slot).ok_or(CpuError::WrongNumElements)
}

fn check_lengths(src: usize, dst: usize) -> Result<(), CpuError> {
    if src == dst {
        Ok(())
    } else {
        // Buffers are paired by typed-amp itself; a mismatch is a bug, reported rather than
        // read out of bounds.
        Err(CpuError::WrongNumElements)
    }
}

impl AmpDevice for Cpu {
    type Stats = Vec<f32>;

    fn try_alloc_stats(&self, slots: usize) -> Result<Self::Stats, CpuError> {
        Ok(vec![0.0; slots])
    }

    fn try_read_stats(&self, stats: &Self::Stats) -> Result<Vec<f32>, CpuError> {
        Ok(stats.clone())
    }

    fn try_read_f32(&self, buf: AnyBuf<'_, Self>) -> Result<Vec<f32>, CpuError> {
        let mut out = vec![0f32; len_of(&buf)];
        for_each_f32_chunk(&buf, |at, chunk| {
            out[at..at + chunk.len()].copy_from_slice(chunk)
        });
        Ok(out)
    }

    fn try_write_f32(&self, buf: AnyBufMut<'_, Self>, values: &[f32]) -> Result<(), CpuError> {
        check_lengths(values.len(), len_of_mut(&buf))?;
        match buf {
            AnyBufMut::F32(b) => b.copy_from_slice(values),
            AnyBufMut::F16(b) => f16::slice_from_f32(values, b),
        }
        Ok(())
    }

    fn try_fill(&self, buf: AnyBufMut<'_, Self>, value: f32) -> Result<(), CpuError> {
        match buf {
            AnyBufMut::F32(b) => b.fill(value),
            AnyBufMut::F16(b) => b.fill(f16::from_f32(value)),
        }
        Ok(())
    }

    fn try_add_cast(
        &self,
        src: AnyBuf<'_, Self>,
        dst: AnyBufMut<'_, Self>,
    ) -> Result<(), CpuError> {
        check_lengths(len_of(&src), len_of_mut(&dst))?;
        match dst {
            AnyBufMut::F32(dst) => for_each_f32_chunk(&src, |at, chunk| {
                for (d, s) in dst[at..at + chunk.len()].iter_mut().zip(chunk) {
                    *d += *s;
                }
            }),
            AnyBufMut::F16(dst) => {
                let mut acc = [0f32; CHUNK];
                for_each_f32_chunk(&src, |at, chunk| {
                    let out = &mut dst[at..at + chunk.len()];
                    let acc = &mut acc[..chunk.len()];
                    f16::slice_to_f32(out, acc);
                    for (a, s) in acc.iter_mut().zip(chunk) {
                        *a += *s;
                    }
                    f16::slice_from_f32(acc, out);
                })
            }
        }
        Ok(())
    }

    fn try_copy_cast(
        &self,
        src: AnyBuf<'_, Self>,
        dst: AnyBufMut<'_, Self>,
    ) -> Result<(), CpuError> {
        check_lengths(len_of(&src), len_of_mut(&dst))?;
        match (src, dst) {
            (AnyBuf::F32(s), AnyBufMut::F32(d)) => d.copy_from_slice(s),
            (AnyBuf::F16(s), AnyBufMut::F16(d)) => d.copy_from_slice(s),
            (AnyBuf::F16(s), AnyBufMut::F32(d)) => f16::slice_to_f32(s, d),
            (AnyBuf::F32(s), AnyBufMut::F16(d)) => f16::slice_from_f32(s, d),
        }
        Ok(())
    }

    fn try_unscale(
        &self,
        src: AnyBuf<'_, Self>,
        dst: AnyBufMut<'_, Self>,
        inv_scale: f32,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), CpuError> {
        check_lengths(len_of(&src), len_of_mut(&dst))?;
        slot_of(stats, slot)?;
        let mut non_finite = false;
        match dst {
            AnyBufMut::F32(dst) => for_each_f32_chunk(&src, |at, chunk| {
                non_finite |= any_non_finite(chunk);
                for (d, s) in dst[at..at + chunk.len()].iter_mut().zip(chunk) {
                    *d = *s * inv_scale;
                }
            }),
            AnyBufMut::F16(dst) => {
                let mut tmp = [0f32; CHUNK];
                for_each_f32_chunk(&src, |at, chunk| {
                    non_finite |= any_non_finite(chunk);
                    let tmp = &mut tmp[..chunk.len()];
                    for (t, s) in tmp.iter_mut().zip(chunk) {
                        *t = *s * inv_scale;
                    }
                    f16::slice_from_f32(tmp, &mut dst[at..at + chunk.len()]);
                })
            }
        }
        *slot_of(stats, slot)? = f32::from(u8::from(non_finite));
        Ok(())
    }

    fn try_unscale_in_place(
        &self,
        buf: AnyBufMut<'_, Self>,
        inv_scale: f32,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), CpuError> {
        slot_of(stats, slot)?;
        let non_finite = match buf {
            AnyBufMut::F32(buf) => {
                // Chunked, so each chunk is checked and scaled while it is in cache.
                let mut non_finite = false;
                for chunk in buf.chunks_mut(CHUNK) {
                    non_finite |= any_non_finite(chunk);
                    chunk.iter_mut().for_each(|x| *x *= inv_scale);
                }
                non_finite
            }
            AnyBufMut::F16(buf) => {
                let mut non_finite = false;
                let mut tmp = [0f32; CHUNK];
                for chunk in buf.chunks_mut(CHUNK) {
                    let tmp = &mut tmp[..chunk.len()];
                    f16::slice_to_f32(chunk, tmp);
                    non_finite |= any_non_finite(tmp);
                    tmp.iter_mut().for_each(|x| *x *= inv_scale);
                    f16::slice_from_f32(tmp, chunk);
                }
                non_finite
            }
        };
        *slot_of(stats, slot)? = f32::from(u8::from(non_finite));
        Ok(())
    }

    fn try_sum_squares(
        &self,
        buf: AnyBuf<'_, Self>,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), CpuError> {
        // Eight FP32 lanes, summed at the end, keep the rounding error near FP32's epsilon for
        // the buffer sizes of real layers, and vectorise.
        let mut lanes = [0f32; 8];
        let mut tail = 0f32;
        for_each_f32_chunk(&buf, |_, chunk| {
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
        buf: AnyBuf<'_, Self>,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), CpuError> {
        let mut max = 0f32;
        for_each_f32_chunk(&buf, |_, chunk| {
            for x in chunk {
                max = if x.is_nan() || max.is_nan() {
                    f32::NAN
                } else {
                    max.max(x.abs())
                };
            }
        });
        *slot_of(stats, slot)? = max;
        Ok(())
    }

    fn try_scale(&self, buf: AnyBufMut<'_, Self>, factor: f32) -> Result<(), CpuError> {
        map_in_place(buf, |x| x * factor);
        Ok(())
    }

    fn try_clamp(&self, buf: AnyBufMut<'_, Self>, limit: f32) -> Result<(), CpuError> {
        map_in_place(buf, |x| x.clamp(-limit, limit));
        Ok(())
    }
}

/// Applies `f` to every element, computing in FP32.
fn map_in_place(buf: AnyBufMut<'_, Cpu>, f: impl Fn(f32) -> f32) {
    match buf {
        AnyBufMut::F32(buf) => buf.iter_mut().for_each(|x| *x = f(*x)),
        AnyBufMut::F16(buf) => {
            let mut tmp = [0f32; CHUNK];
            for chunk in buf.chunks_mut(CHUNK) {
                let tmp = &mut tmp[..chunk.len()];
                f16::slice_to_f32(chunk, tmp);
                tmp.iter_mut().for_each(|x| *x = f(*x));
                f16::slice_from_f32(tmp, chunk);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dfdx::prelude::*;

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
        let mut stats = dev.try_alloc_stats(3).unwrap();
        let mut dst = f32_buf(&dev, &values);

        let src = f32_buf(&dev, &values);
        dev.try_unscale(
            AnyBuf::F32(&src),
            AnyBufMut::F32(&mut dst),
            0.25,
            &mut stats,
            0,
        )
        .unwrap();
        assert!(dst.iter().all(|x| *x == 0.5));

        *values.last_mut().unwrap() = f32::INFINITY;
        let src = f16_buf(&dev, &values);
        dev.try_unscale(
            AnyBuf::F16(&src),
            AnyBufMut::F32(&mut dst),
            0.25,
            &mut stats,
            1,
        )
        .unwrap();
        assert!(dst.last().unwrap().is_infinite());

        values[CHUNK + 1] = f32::NAN;
        let mut src = f16_buf(&dev, &values);
        dev.try_unscale_in_place(AnyBufMut::F16(&mut src), 0.5, &mut stats, 2)
            .unwrap();
        assert_eq!(src[0].to_f32(), 1.0);
        assert_eq!(dev.try_read_stats(&stats).unwrap(), vec![0.0, 1.0, 1.0]);
    }

    #[test]
    fn casts_round_trip_and_accumulate() {
        let dev = Cpu::default();
        let values: Vec<f32> = (0..CHUNK + 3).map(|i| i as f32 * 0.5).collect();
        let src = f32_buf(&dev, &values);
        let mut half = f16_buf(&dev, &vec![1.0; values.len()]);
        dev.try_add_cast(AnyBuf::F32(&src), AnyBufMut::F16(&mut half))
            .unwrap();
        assert_eq!(half[10].to_f32(), 6.0);
        let mut back = f32_buf(&dev, &vec![0.0; values.len()]);
        dev.try_copy_cast(AnyBuf::F16(&half), AnyBufMut::F32(&mut back))
            .unwrap();
        assert_eq!(back[CHUNK + 2], 1.0 + (CHUNK + 2) as f32 * 0.5);
        let short = f32_buf(&dev, &[1.0]);
        assert!(dev
            .try_copy_cast(AnyBuf::F32(&short), AnyBufMut::F32(&mut back))
            .is_err());
    }

    #[test]
    fn reductions_for_clipping() {
        let dev = Cpu::default();
        let mut stats = dev.try_alloc_stats(2).unwrap();
        let buf = f32_buf(&dev, &[3.0, -4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 12.0]);
        dev.try_sum_squares(AnyBuf::F32(&buf), &mut stats, 0)
            .unwrap();
        dev.try_max_abs(AnyBuf::F32(&buf), &mut stats, 1).unwrap();
        assert_eq!(stats, vec![169.0, 12.0]);
        let mut buf = buf;
        dev.try_clamp(AnyBufMut::F32(&mut buf), 3.5).unwrap();
        assert_eq!(&buf[..2], &[3.0, -3.5]);
        dev.try_scale(AnyBufMut::F32(&mut buf), 2.0).unwrap();
        assert_eq!(buf[8], 7.0);
        let mut half = f16_buf(&dev, &[1.0, -9.0]);
        dev.try_clamp(AnyBufMut::F16(&mut half), 2.0).unwrap();
        assert_eq!(half[1].to_f32(), -2.0);
    }
}
