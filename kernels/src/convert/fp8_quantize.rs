//! FP8 quantisation's passes over a tensor: its amax ([`amax`]) and the scaled cast that
//! finds the amax on the way ([`quantize_fp8`]), vectorised and split over rayon's threads for
//! large tensors. Where the scale is known before the data is read (delayed scaling, from
//! earlier steps' amaxes) one pass does both; current scaling needs [`amax`] first.
//!
//! The cast's arithmetic is `F(x · scale)`: the source widened to f32 exactly, one f32
//! multiplication, then [`super::fp8`]'s narrowing (nearest even, saturating), so each code is
//! the one [`f32_to_fp8`](super::f32_to_fp8) gives for `x · scale`, at every level. The amax
//! is the largest `|x|` of the source (before the scaling), NaN if the source holds a NaN, inf
//! if it holds an inf and no NaN, 0 for an empty slice.

use half::{bf16, f16};
use rayon::prelude::*;

use crate::level::{level, Level};

use super::fp8_format::{tail, Fp8Format};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// What FP8 codes are quantised from: `f32`, [`bf16`] or [`f16`](struct@f16) (widened to f32 exactly).
pub trait QuantizeSource: sealed::Sealed + Copy + Send + Sync + 'static {
    #[doc(hidden)]
    /// The source tag of the conversion loops: 0 f32, 1 bf16, 2 f16.
    const TAG: u8;
}
impl QuantizeSource for f32 {
    const TAG: u8 = 0;
}
impl QuantizeSource for bf16 {
    const TAG: u8 = 1;
}
impl QuantizeSource for f16 {
    const TAG: u8 = 2;
}

/// Below this many elements a pass runs on the calling thread.
const PARALLEL_MIN: usize = 1 << 16;
/// Elements per rayon task above it.
const CHUNK: usize = 1 << 15;

/// The largest magnitude of the f32 bits `m` of the source's largest `|x|` bits, as the
/// module documentation says: NaN above inf's bits.
fn amax_of(m: u32) -> f32 {
    if m > 0x7F80_0000 {
        f32::NAN
    } else {
        f32::from_bits(m)
    }
}

/// The largest `|x|` of `src`: NaN if it holds a NaN, 0 if it is empty.
pub fn amax<S: QuantizeSource>(src: &[S]) -> f32 {
    let one = |s: &[S]| {
        // SAFETY: `s` holds `s.len()` elements of `S`, whose tag is `S::TAG`; `level()` is
        // supported by the CPU; nothing is written (`CAST` false, no destination).
        unsafe {
            pass_raw::<super::E4M3, false>(
                S::TAG,
                level(),
                s.as_ptr() as *const u8,
                1.0,
                std::ptr::null_mut(),
                s.len(),
            )
        }
    };
    amax_of(if src.len() < PARALLEL_MIN {
        one(src)
    } else {
        src.par_chunks(CHUNK).map(one).reduce(|| 0, u32::max)
    })
}

/// `dst[i] = F(src[i] · scale)` (see the module documentation), returning the amax of `src`.
/// Panics if the lengths differ.
pub fn quantize_fp8<S: QuantizeSource, F: Fp8Format>(src: &[S], scale: f32, dst: &mut [F]) -> f32 {
    assert_eq!(src.len(), dst.len(), "quantize_fp8: length mismatch");
    let one = |(s, d): (&[S], &mut [F])| {
        // SAFETY: `s` and `d` hold `s.len()` elements each (zipped chunks of equal-length
        // slices), `F` is a `repr(transparent)` byte, and they cannot overlap (`&mut`);
        // `level()` is supported by the CPU.
        unsafe {
            pass_raw::<F, true>(
                S::TAG,
                level(),
                s.as_ptr() as *const u8,
                scale,
                d.as_mut_ptr() as *mut u8,
                s.len(),
            )
        }
    };
    amax_of(if src.len() < PARALLEL_MIN {
        one((src, dst))
    } else {
        src.par_chunks(CHUNK)
            .zip(dst.par_chunks_mut(CHUNK))
            .map(one)
            .reduce(|| 0, u32::max)
    })
}

/// One pass over `n` source elements of tag `tag`: the largest `|x|` bits, and with `CAST`
/// the codes of `x · scale` into `dst`.
///
/// # Safety
/// `src` readable for `n` elements of the tag's type; with `CAST`, `dst` writable for `n`
/// bytes, not overlapping it; `lvl` supported by the CPU.
unsafe fn pass_raw<F: Fp8Format, const CAST: bool>(
    tag: u8,
    lvl: Level,
    src: *const u8,
    scale: f32,
    dst: *mut u8,
    n: usize,
) -> u32 {
    // SAFETY: the contract, handed on with the tag as the loops' const parameter.
    unsafe {
        match tag {
            0 => pass_src::<F, 0, CAST>(lvl, src, scale, dst, n),
            1 => pass_src::<F, 1, CAST>(lvl, src, scale, dst, n),
            _ => pass_src::<F, 2, CAST>(lvl, src, scale, dst, n),
        }
    }
}

/// # Safety
/// As [`pass_raw`], for source tag `SRC`.
unsafe fn pass_src<F: Fp8Format, const SRC: u8, const CAST: bool>(
    lvl: Level,
    src: *const u8,
    scale: f32,
    dst: *mut u8,
    n: usize,
) -> u32 {
    // SAFETY: `lvl` is supported by the CPU (the contract), so the vector routines' features
    // are present; the buffers cover `n` elements (the contract).
    unsafe {
        #[cfg(target_arch = "x86_64")]
        if lvl >= Level::Avx512 {
            return super::fp8_x86::quantize_avx512::<F, SRC, CAST>(src, scale, dst, n);
        }
        #[cfg(target_arch = "x86_64")]
        if lvl >= Level::Avx2 {
            return super::fp8_x86::quantize_avx2::<F, SRC, CAST>(src, scale, dst, n);
        }
        let _ = lvl;
        tail::<F, SRC, CAST>(src, scale, dst, 0, n, 0)
    }
}
