//! The crate's one conversion layer between `f32` and the 16-bit float formats: slice
//! functions ([`f16_to_f32`], [`f32_to_f16`], [`bf16_to_f32`], [`f32_to_bf16`]) and scalar
//! ones ([`widen_f16`], [`narrow_f16`], [`widen_bf16`], [`narrow_bf16`]). Other code should
//! convert through these rather than through `half` directly, so that one set of rules (and
//! one set of exhaustive tests) covers every conversion.
//!
//! # Rules
//! Every function here, scalar or vector, at every [`Level`], gives the same
//! bits as `half`'s scalar conversion of each element (`f16::to_f32`, `f16::from_f32`,
//! `bf16::to_f32`, `bf16::from_f32`), and so does every conversion the matrix products do on
//! the way in (packing, reading C's old value) and out (storing C):
//!
//! * Widening is exact.
//! * Narrowing rounds to nearest, ties to even; subnormal results are kept (no flush to
//!   zero); a value that rounds beyond the largest finite one becomes ±inf (f16: `|x| ≥
//!   65520`, the midpoint above 65504).
//! * **NaN** stays NaN, with its sign, and always comes out quiet. Widening keeps the payload
//!   bits (moved to the top of the f32 significand) and sets the quiet bit, so a signalling
//!   NaN arrives quiet. Narrowing keeps the sign and the top payload bits that fit (9 of f16's,
//!   6 of bf16's, below the quiet bit) and sets the quiet bit, so a NaN whose payload lies only
//!   in the dropped bits stays a NaN and never rounds into ±inf. (This is also what x86's F16C
//!   instructions do.) Where two NaNs meet in arithmetic, which payload survives is
//!   unspecified, as in IEEE 754.
//!
//! The vector code is chosen at run time, like the matrix products (see [`crate::Level`]).
//!
//! # FP8
//! The two 8-bit formats, [`E4M3`] and [`E5M2`], have their own rules (saturating narrowing,
//! their NaN codes): see [`fp8`]. Their slice functions ([`f32_to_fp8`], [`bf16_to_fp8`],
//! [`f16_to_fp8`], [`fp8_to_f32`], [`fp8_to_bf16`]) are generic over the format and re-exported
//! here.

use half::{bf16, f16};

pub mod fp8;
mod fp8_format;
mod fp8_quantize;
#[cfg(target_arch = "x86_64")]
mod fp8_x86;
mod scalar;

pub use fp8::{
    bf16_to_fp8, f16_to_fp8, f32_to_fp8, fp8_to_bf16, fp8_to_f32, Fp8Format, E4M3, E5M2,
};
pub use fp8_quantize::{amax, quantize_fp8, QuantizeSource};

/// Sixteen FP8 codes (one per 32-bit lane) to f32 bits, for the GEMM's AVX-512 packing.
#[cfg(target_arch = "x86_64")]
pub(crate) use fp8_x86::decode_512 as fp8_decode_avx512;
pub(crate) use scalar::{bf16_bits_to_f32_bits, f32_bits_to_bf16_bits};
pub use scalar::{narrow_bf16, narrow_f16, widen_bf16, widen_f16};

use crate::level::{level, Level};

/// Widens `src` into `dst` (exact). Panics if the lengths differ.
pub fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "f16_to_f32: length mismatch");
    // SAFETY: both slices hold `src.len()` elements and cannot overlap (`&mut`).
    unsafe { f16_to_f32_raw(level(), src.as_ptr(), dst.as_mut_ptr(), src.len()) }
}

/// Narrows `src` into `dst`, rounding to nearest even. Panics if the lengths differ.
pub fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len(), "f32_to_f16: length mismatch");
    // SAFETY: as in `f16_to_f32`.
    unsafe { f32_to_f16_raw(level(), src.as_ptr(), dst.as_mut_ptr(), src.len()) }
}

/// Widens `src` into `dst` (exact). Panics if the lengths differ.
pub fn bf16_to_f32(src: &[bf16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "bf16_to_f32: length mismatch");
    // SAFETY: as in `f16_to_f32`.
    unsafe { bf16_to_f32_raw(level(), src.as_ptr(), dst.as_mut_ptr(), src.len()) }
}

/// Narrows `src` into `dst`, rounding to nearest even. Panics if the lengths differ.
pub fn f32_to_bf16(src: &[f32], dst: &mut [bf16]) {
    assert_eq!(src.len(), dst.len(), "f32_to_bf16: length mismatch");
    // SAFETY: as in `f16_to_f32`.
    unsafe { f32_to_bf16_raw(level(), src.as_ptr(), dst.as_mut_ptr(), src.len()) }
}

/// # Safety
/// `src` readable and `dst` writable for `n` elements, not overlapping; `lvl` supported by the
/// CPU (any value returned by [`level`] is).
pub(crate) unsafe fn f16_to_f32_raw(lvl: Level, src: *const f16, dst: *mut f32, n: usize) {
    // SAFETY: `lvl` is supported by the CPU (the contract), so the features each x86 routine
    // needs are present; `src` and `dst` cover `n` elements each (the contract).
    unsafe {
        #[cfg(target_arch = "x86_64")]
        {
            if lvl >= Level::Avx512 {
                return x86::f16_to_f32_avx512(src, dst, n);
            }
            if lvl >= Level::Avx2 {
                return x86::f16_to_f32_avx2(src, dst, n);
            }
        }
        let _ = lvl;
        for i in 0..n {
            *dst.add(i) = widen_f16(*src.add(i));
        }
    }
}

/// # Safety
/// As [`f16_to_f32_raw`].
pub(crate) unsafe fn f32_to_f16_raw(lvl: Level, src: *const f32, dst: *mut f16, n: usize) {
    // SAFETY: `lvl` is supported by the CPU (the contract), so the features each x86 routine
    // needs are present; `src` and `dst` cover `n` elements each (the contract).
    unsafe {
        #[cfg(target_arch = "x86_64")]
        {
            if lvl >= Level::Avx512 {
                return x86::f32_to_f16_avx512(src, dst, n);
            }
            if lvl >= Level::Avx2 {
                return x86::f32_to_f16_avx2(src, dst, n);
            }
        }
        let _ = lvl;
        for i in 0..n {
            *dst.add(i) = narrow_f16(*src.add(i));
        }
    }
}

/// # Safety
/// As [`f16_to_f32_raw`].
pub(crate) unsafe fn bf16_to_f32_raw(lvl: Level, src: *const bf16, dst: *mut f32, n: usize) {
    // SAFETY: `lvl` is supported by the CPU (the contract), so the features each x86 routine
    // needs are present; `src` and `dst` cover `n` elements each (the contract).
    unsafe {
        #[cfg(target_arch = "x86_64")]
        {
            if lvl >= Level::Avx512 {
                return x86::bf16_to_f32_avx512(src, dst, n);
            }
            if lvl >= Level::Avx2 {
                return x86::bf16_to_f32_avx2(src, dst, n);
            }
        }
        let _ = lvl;
        let (src, dst) = (src as *const u16, dst as *mut u32);
        for i in 0..n {
            *dst.add(i) = bf16_bits_to_f32_bits(*src.add(i));
        }
    }
}

/// # Safety
/// As [`f16_to_f32_raw`].
pub(crate) unsafe fn f32_to_bf16_raw(lvl: Level, src: *const f32, dst: *mut bf16, n: usize) {
    // SAFETY: `lvl` is supported by the CPU (the contract), so the features each x86 routine
    // needs are present; `src` and `dst` cover `n` elements each (the contract).
    unsafe {
        #[cfg(target_arch = "x86_64")]
        {
            if lvl >= Level::Avx512 {
                return x86::f32_to_bf16_avx512(src, dst, n);
            }
            if lvl >= Level::Avx2 {
                return x86::f32_to_bf16_avx2(src, dst, n);
            }
        }
        let _ = lvl;
        let (src, dst) = (src as *const u32, dst as *mut u16);
        for i in 0..n {
            *dst.add(i) = f32_bits_to_bf16_bits(*src.add(i));
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::narrow_bf16_256 as narrow_bf16_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86::narrow_bf16_512 as narrow_bf16_avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86::widen_bf16_256 as widen_bf16_avx2;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{bf16_bits_to_f32_bits, f32_bits_to_bf16_bits, narrow_f16, widen_f16};
    use half::{bf16, f16};
    use std::arch::x86_64::*;

    // The scalar tails below use the scalar helpers (the same conversion), so a slice's
    // result never depends on where the vector loop stopped.

    /// # Safety
    /// `src` readable and `dst` writable for `n` elements, not overlapping; the CPU has
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn f16_to_f32_avx512(src: *const f16, dst: *mut f32, n: usize) {
        // SAFETY: every access is at an index below `n` (the vector loop runs while a whole
        // vector fits, the tail one element at a time), inside the contract's buffers.
        unsafe {
            let mut i = 0;
            while i + 16 <= n {
                let h = _mm256_loadu_si256(src.add(i) as *const __m256i);
                _mm512_storeu_ps(dst.add(i), _mm512_cvtph_ps(h));
                i += 16;
            }
            while i < n {
                *dst.add(i) = widen_f16(*src.add(i));
                i += 1;
            }
        }
    }

    /// # Safety
    /// `src` readable and `dst` writable for `n` elements, not overlapping; the CPU has
    /// AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn f16_to_f32_avx2(src: *const f16, dst: *mut f32, n: usize) {
        // SAFETY: every access is at an index below `n` (the vector loop runs while a whole
        // vector fits, the tail one element at a time), inside the contract's buffers.
        unsafe {
            let mut i = 0;
            while i + 8 <= n {
                let h = _mm_loadu_si128(src.add(i) as *const __m128i);
                _mm256_storeu_ps(dst.add(i), _mm256_cvtph_ps(h));
                i += 8;
            }
            if i < n {
                // The tail through one vector too (the GEMM packs 6-lane panels: all tail), via
                // buffers so that nothing outside the slices is touched.
                let mut h = [0u16; 8];
                let mut w = [0f32; 8];
                std::ptr::copy_nonoverlapping(src.add(i) as *const u16, h.as_mut_ptr(), n - i);
                let v = _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i));
                _mm256_storeu_ps(w.as_mut_ptr(), v);
                std::ptr::copy_nonoverlapping(w.as_ptr(), dst.add(i), n - i);
            }
        }
    }

    /// # Safety
    /// `src` readable and `dst` writable for `n` elements, not overlapping; the CPU has
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn f32_to_f16_avx512(src: *const f32, dst: *mut f16, n: usize) {
        // SAFETY: every access is at an index below `n` (the vector loop runs while a whole
        // vector fits, the tail one element at a time), inside the contract's buffers.
        unsafe {
            let mut i = 0;
            while i + 16 <= n {
                let x = _mm512_loadu_ps(src.add(i));
                let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
                _mm256_storeu_si256(dst.add(i) as *mut __m256i, h);
                i += 16;
            }
            while i < n {
                *dst.add(i) = narrow_f16(*src.add(i));
                i += 1;
            }
        }
    }

    /// # Safety
    /// `src` readable and `dst` writable for `n` elements, not overlapping; the CPU has
    /// AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn f32_to_f16_avx2(src: *const f32, dst: *mut f16, n: usize) {
        // SAFETY: every access is at an index below `n` (the vector loop runs while a whole
        // vector fits, the tail one element at a time), inside the contract's buffers.
        unsafe {
            let mut i = 0;
            while i + 8 <= n {
                let x = _mm256_loadu_ps(src.add(i));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
                _mm_storeu_si128(dst.add(i) as *mut __m128i, h);
                i += 8;
            }
            while i < n {
                *dst.add(i) = narrow_f16(*src.add(i));
                i += 1;
            }
        }
    }

    /// # Safety
    /// `src` readable and `dst` writable for `n` elements, not overlapping; the CPU has
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn bf16_to_f32_avx512(src: *const bf16, dst: *mut f32, n: usize) {
        // SAFETY: every access is at an index below `n` (the vector loop runs while a whole
        // vector fits, the tail one element at a time), inside the contract's buffers.
        unsafe {
            let (src, dst) = (src as *const u16, dst as *mut u32);
            let abs_mask = _mm512_set1_epi32(0x7FFF_FFFF);
            let inf = _mm512_set1_epi32(0x7F80_0000);
            let quiet = _mm512_set1_epi32(0x0040_0000);
            let mut i = 0;
            while i + 16 <= n {
                let h = _mm256_loadu_si256(src.add(i) as *const __m256i);
                let x = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h));
                let nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, abs_mask), inf);
                let x = _mm512_mask_or_epi32(x, nan, x, quiet);
                _mm512_storeu_si512(dst.add(i) as *mut _, x);
                i += 16;
            }
            while i < n {
                *dst.add(i) = bf16_bits_to_f32_bits(*src.add(i));
                i += 1;
            }
        }
    }

    /// Eight bf16 bit patterns to f32 bit patterns, as `bf16_bits_to_f32_bits` does one (a
    /// NaN comes back quiet, its payload kept).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn widen_bf16_256(h: __m128i) -> __m256i {
        let x = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h));
        let abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFF_FFFF));
        let nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F80_0000));
        _mm256_or_si256(x, _mm256_and_si256(nan, _mm256_set1_epi32(0x0040_0000)))
    }

    /// # Safety
    /// `src` readable and `dst` writable for `n` elements, not overlapping; the CPU has
    /// AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn bf16_to_f32_avx2(src: *const bf16, dst: *mut f32, n: usize) {
        // SAFETY: every access is at an index below `n` (the vector loop runs while a whole
        // vector fits, the tail one element at a time), inside the contract's buffers.
        unsafe {
            let (src, dst) = (src as *const u16, dst as *mut u32);
            let mut i = 0;
            while i + 8 <= n {
                let h = _mm_loadu_si128(src.add(i) as *const __m128i);
                _mm256_storeu_si256(dst.add(i) as *mut __m256i, widen_bf16_256(h));
                i += 8;
            }
            if i < n {
                // The tail through one vector too, via buffers (as `f16_to_f32_avx2`).
                let mut h = [0u16; 8];
                let mut w = [0u32; 8];
                std::ptr::copy_nonoverlapping(src.add(i), h.as_mut_ptr(), n - i);
                let x = widen_bf16_256(_mm_loadu_si128(h.as_ptr() as *const __m128i));
                _mm256_storeu_si256(w.as_mut_ptr() as *mut __m256i, x);
                std::ptr::copy_nonoverlapping(w.as_ptr(), dst.add(i), n - i);
            }
        }
    }

    /// Sixteen f32 bit patterns to bf16, as `f32_bits_to_bf16_bits` does one.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) fn narrow_bf16_512(x: __m512i) -> __m256i {
        let abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFF_FFFF));
        let nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7F80_0000));
        let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(1));
        let rounded = _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), lsb);
        let r = _mm512_srli_epi32::<16>(rounded);
        let q = _mm512_or_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(0x0040));
        _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, q))
    }

    /// # Safety
    /// `src` readable and `dst` writable for `n` elements, not overlapping; the CPU has
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn f32_to_bf16_avx512(src: *const f32, dst: *mut bf16, n: usize) {
        // SAFETY: every access is at an index below `n` (the vector loop runs while a whole
        // vector fits, the tail one element at a time), inside the contract's buffers.
        unsafe {
            let (src, dst) = (src as *const u32, dst as *mut u16);
            let mut i = 0;
            while i + 16 <= n {
                let x = _mm512_loadu_si512(src.add(i) as *const _);
                _mm256_storeu_si256(dst.add(i) as *mut __m256i, narrow_bf16_512(x));
                i += 16;
            }
            while i < n {
                *dst.add(i) = f32_bits_to_bf16_bits(*src.add(i));
                i += 1;
            }
        }
    }

    /// Eight f32 bit patterns to bf16 (each in the low half of its 32-bit lane), as
    /// `f32_bits_to_bf16_bits` does one.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn narrow_bf16_256(x: __m256i) -> __m256i {
        let abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFF_FFFF));
        let nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F80_0000));
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
        let rounded = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb);
        let r = _mm256_srli_epi32::<16>(rounded);
        let q = _mm256_or_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(0x0040));
        _mm256_blendv_epi8(r, q, nan)
    }

    /// # Safety
    /// `src` readable and `dst` writable for `n` elements, not overlapping; the CPU has
    /// AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn f32_to_bf16_avx2(src: *const f32, dst: *mut bf16, n: usize) {
        // SAFETY: every access is at an index below `n` (the vector loop runs while a whole
        // vector fits, the tail one element at a time), inside the contract's buffers.
        unsafe {
            let (src, dst) = (src as *const u32, dst as *mut u16);
            let mut i = 0;
            while i + 16 <= n {
                let lo = narrow_bf16_256(_mm256_loadu_si256(src.add(i) as *const __m256i));
                let hi = narrow_bf16_256(_mm256_loadu_si256(src.add(i + 8) as *const __m256i));
                // packus works within 128-bit lanes; the permute puts the four quarters in order.
                // Every value is at most 0xFFFF, so the unsigned saturation never triggers.
                let packed = _mm256_packus_epi32(lo, hi);
                let ordered = _mm256_permute4x64_epi64::<0b11_01_10_00>(packed);
                _mm256_storeu_si256(dst.add(i) as *mut __m256i, ordered);
                i += 16;
            }
            while i < n {
                *dst.add(i) = f32_bits_to_bf16_bits(*src.add(i));
                i += 1;
            }
        }
    }
}
