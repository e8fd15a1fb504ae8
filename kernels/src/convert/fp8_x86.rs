//! AVX-512 and AVX2 loops of the FP8 conversions: sixteen or eight lanes of the scalar
//! reference's integer and float operations ([`super::fp8::encode`], [`super::fp8::decode`]), so that every element
//! comes out with the scalar code's bits. The tails run the scalar code.

use std::arch::x86_64::*;

use super::fp8_format::tail;
use super::fp8_format::{decode, encode, source_bits, Fp8Format, Spec};

/// Sixteen f32 bit patterns to FP8 codes (in the low byte of each lane), as `encode` does one.
#[target_feature(enable = "avx512f")]
#[inline]
fn encode_512<F: Fp8Format>(x: __m512i) -> __m512i {
    let s = Spec::<F>::SHIFT;
    let sign = _mm512_and_si512(_mm512_srli_epi32::<24>(x), _mm512_set1_epi32(0x80));
    let abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFF_FFFF));
    let nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7F80_0000));
    let a = _mm512_min_epu32(abs, _mm512_set1_epi32(Spec::<F>::MAX_BITS as i32));
    // Normal results: round to nearest even at bit `s`, then rebias.
    let lsb = _mm512_and_si512(
        _mm512_srlv_epi32(a, _mm512_set1_epi32(s as i32)),
        _mm512_set1_epi32(1),
    );
    let r = _mm512_add_epi32(
        _mm512_add_epi32(a, _mm512_set1_epi32((1 << (s - 1)) - 1)),
        lsb,
    );
    let normal = _mm512_sub_epi32(
        _mm512_srlv_epi32(r, _mm512_set1_epi32(s as i32)),
        _mm512_set1_epi32(Spec::<F>::REBIAS as i32),
    );
    // Subnormal results: exact scaling, then the nearest integer, ties to even.
    let scaled = _mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(Spec::<F>::SUB_SCALE));
    let sub = _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(scaled);
    let is_sub = _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(Spec::<F>::MIN_NORMAL_BITS as i32));
    let mag = _mm512_mask_blend_epi32(is_sub, normal, sub);
    let nan_mag = if F::HAS_INFINITY {
        let payload = _mm512_and_si512(
            _mm512_srlv_epi32(x, _mm512_set1_epi32(s as i32)),
            _mm512_set1_epi32((Spec::<F>::QUIET - 1) as i32),
        );
        _mm512_or_si512(
            payload,
            _mm512_set1_epi32((Spec::<F>::SPECIAL | Spec::<F>::QUIET) as i32),
        )
    } else {
        _mm512_set1_epi32(0x7F)
    };
    let mag = _mm512_mask_blend_epi32(nan, mag, nan_mag);
    _mm512_or_si512(mag, sign)
}

/// Sixteen FP8 codes (one per 32-bit lane) to f32 bit patterns, as `decode` does one.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn decode_512<F: Fp8Format>(c: __m512i) -> __m512i {
    let s = _mm512_set1_epi32(Spec::<F>::SHIFT as i32);
    let sign = _mm512_slli_epi32::<24>(_mm512_and_si512(c, _mm512_set1_epi32(0x80)));
    let mag = _mm512_and_si512(c, _mm512_set1_epi32(0x7F));
    let m = _mm512_and_si512(mag, _mm512_set1_epi32((1 << F::MANTISSA_BITS) - 1));
    let normal = _mm512_add_epi32(
        _mm512_sllv_epi32(mag, s),
        _mm512_set1_epi32((Spec::<F>::REBIAS << Spec::<F>::SHIFT) as i32),
    );
    let sub = _mm512_castps_si512(_mm512_mul_ps(
        _mm512_cvtepi32_ps(mag),
        _mm512_set1_ps(Spec::<F>::SUB_UNIT),
    ));
    let is_sub = _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(1 << F::MANTISSA_BITS));
    let bits = _mm512_mask_blend_epi32(is_sub, normal, sub);
    let nan = _mm512_or_si512(_mm512_set1_epi32(0x7FC0_0000), _mm512_sllv_epi32(m, s));
    let special = if F::HAS_INFINITY {
        let is_inf = _mm512_cmpeq_epi32_mask(m, _mm512_setzero_si512());
        _mm512_mask_blend_epi32(is_inf, nan, _mm512_set1_epi32(0x7F80_0000))
    } else {
        nan
    };
    let is_special = _mm512_cmpge_epu32_mask(mag, _mm512_set1_epi32(Spec::<F>::SPECIAL as i32));
    _mm512_or_si512(_mm512_mask_blend_epi32(is_special, bits, special), sign)
}

/// # Safety
/// `src` readable for `n` elements of the `SRC` type (0 f32, 1 bf16, 2 f16), `dst` writable
/// for `n` bytes, not overlapping; the CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn narrow_avx512<F: Fp8Format, const SRC: u8>(
    src: *const u8,
    dst: *mut u8,
    n: usize,
) {
    // SAFETY: every access is at an index below `n` (the vector loop runs while a whole vector
    // fits, the tail one element at a time), inside the contract's buffers.
    unsafe {
        let mut i = 0;
        while i + 16 <= n {
            let x = match SRC {
                0 => _mm512_loadu_si512((src as *const u32).add(i) as *const _),
                // bf16: the top half of the f32 (a NaN's quiet bit is not set here, but the
                // encoding never reads it: bit 22 is above E5M2's payload bit).
                1 => _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                    (src as *const u16).add(i) as *const __m256i,
                ))),
                _ => _mm512_castps_si512(_mm512_cvtph_ps(_mm256_loadu_si256(
                    (src as *const u16).add(i) as *const __m256i,
                ))),
            };
            let codes = _mm512_cvtepi32_epi8(encode_512::<F>(x));
            _mm_storeu_si128(dst.add(i) as *mut __m128i, codes);
            i += 16;
        }
        while i < n {
            *dst.add(i) = encode::<F>(source_bits::<SRC>(src, i));
            i += 1;
        }
    }
}

/// # Safety
/// `src` readable for `n` bytes, `dst` writable for `n` elements (f32, or bf16 when `BF16`),
/// not overlapping; the CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn widen_avx512<F: Fp8Format, const BF16: bool>(
    src: *const u8,
    dst: *mut u8,
    n: usize,
) {
    // SAFETY: as in `narrow_avx512`.
    unsafe {
        let mut i = 0;
        while i + 16 <= n {
            let c = _mm512_cvtepu8_epi32(_mm_loadu_si128(src.add(i) as *const __m128i));
            let bits = decode_512::<F>(c);
            if BF16 {
                let h = _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(bits));
                _mm256_storeu_si256((dst as *mut u16).add(i) as *mut __m256i, h);
            } else {
                _mm512_storeu_si512((dst as *mut u32).add(i) as *mut _, bits);
            }
            i += 16;
        }
        while i < n {
            let bits = decode::<F>(*src.add(i));
            if BF16 {
                (dst as *mut u16)
                    .add(i)
                    .write_unaligned((bits >> 16) as u16);
            } else {
                (dst as *mut u32).add(i).write_unaligned(bits);
            }
            i += 1;
        }
    }
}

/// Eight f32 bit patterns to FP8 codes (in the low byte of each lane), as `encode` does one.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn encode_256<F: Fp8Format>(x: __m256i) -> __m256i {
    let s = _mm256_set1_epi32(Spec::<F>::SHIFT as i32);
    let sign = _mm256_and_si256(_mm256_srli_epi32::<24>(x), _mm256_set1_epi32(0x80));
    let abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFF_FFFF));
    // Every `abs` is at most 0x7FFF_FFFF, so signed comparisons order them as unsigned ones.
    let nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F80_0000));
    let a = _mm256_min_epu32(abs, _mm256_set1_epi32(Spec::<F>::MAX_BITS as i32));
    let lsb = _mm256_and_si256(_mm256_srlv_epi32(a, s), _mm256_set1_epi32(1));
    let half = _mm256_set1_epi32((1 << (Spec::<F>::SHIFT - 1)) - 1);
    let r = _mm256_add_epi32(_mm256_add_epi32(a, half), lsb);
    let normal = _mm256_sub_epi32(
        _mm256_srlv_epi32(r, s),
        _mm256_set1_epi32(Spec::<F>::REBIAS as i32),
    );
    let scaled = _mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(Spec::<F>::SUB_SCALE));
    // The nearest integer, ties to even, whatever MXCSR says; then an exact conversion.
    let rounded = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(scaled);
    let sub = _mm256_cvttps_epi32(rounded);
    let is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(Spec::<F>::MIN_NORMAL_BITS as i32), a);
    let mag = _mm256_blendv_epi8(normal, sub, is_sub);
    let nan_mag = if F::HAS_INFINITY {
        let payload = _mm256_and_si256(
            _mm256_srlv_epi32(x, s),
            _mm256_set1_epi32((Spec::<F>::QUIET - 1) as i32),
        );
        _mm256_or_si256(
            payload,
            _mm256_set1_epi32((Spec::<F>::SPECIAL | Spec::<F>::QUIET) as i32),
        )
    } else {
        _mm256_set1_epi32(0x7F)
    };
    _mm256_or_si256(_mm256_blendv_epi8(mag, nan_mag, nan), sign)
}

/// Eight FP8 codes (one per 32-bit lane) to f32 bit patterns, as `decode` does one.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn decode_256<F: Fp8Format>(c: __m256i) -> __m256i {
    let s = _mm256_set1_epi32(Spec::<F>::SHIFT as i32);
    let sign = _mm256_slli_epi32::<24>(_mm256_and_si256(c, _mm256_set1_epi32(0x80)));
    let mag = _mm256_and_si256(c, _mm256_set1_epi32(0x7F));
    let m = _mm256_and_si256(mag, _mm256_set1_epi32((1 << F::MANTISSA_BITS) - 1));
    let normal = _mm256_add_epi32(
        _mm256_sllv_epi32(mag, s),
        _mm256_set1_epi32((Spec::<F>::REBIAS << Spec::<F>::SHIFT) as i32),
    );
    let sub = _mm256_castps_si256(_mm256_mul_ps(
        _mm256_cvtepi32_ps(mag),
        _mm256_set1_ps(Spec::<F>::SUB_UNIT),
    ));
    let is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(1 << F::MANTISSA_BITS), mag);
    let bits = _mm256_blendv_epi8(normal, sub, is_sub);
    let nan = _mm256_or_si256(_mm256_set1_epi32(0x7FC0_0000), _mm256_sllv_epi32(m, s));
    let special = if F::HAS_INFINITY {
        let is_inf = _mm256_cmpeq_epi32(m, _mm256_setzero_si256());
        _mm256_blendv_epi8(nan, _mm256_set1_epi32(0x7F80_0000), is_inf)
    } else {
        nan
    };
    let is_special = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(Spec::<F>::SPECIAL as i32 - 1));
    _mm256_or_si256(_mm256_blendv_epi8(bits, special, is_special), sign)
}

/// # Safety
/// As [`narrow_avx512`], with AVX2, FMA and F16C in place of AVX-512F.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn narrow_avx2<F: Fp8Format, const SRC: u8>(
    src: *const u8,
    dst: *mut u8,
    n: usize,
) {
    // SAFETY: every access is at an index below `n` (the vector loop runs while a whole vector
    // fits, the tail one element at a time), inside the contract's buffers.
    unsafe {
        // The low byte of each 32-bit lane, gathered into the low 4 bytes of each 128-bit half.
        let low_bytes = _mm256_setr_epi8(
            0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1,
            -1, -1, -1, -1, -1, -1, -1, -1, -1,
        );
        let mut i = 0;
        while i + 8 <= n {
            let x = match SRC {
                0 => _mm256_loadu_si256((src as *const u32).add(i) as *const __m256i),
                1 => _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(
                    (src as *const u16).add(i) as *const __m128i,
                ))),
                _ => _mm256_castps_si256(_mm256_cvtph_ps(_mm_loadu_si128(
                    (src as *const u16).add(i) as *const __m128i,
                ))),
            };
            let b = _mm256_shuffle_epi8(encode_256::<F>(x), low_bytes);
            let lo = _mm256_castsi256_si128(b);
            let hi = _mm256_extracti128_si256::<1>(b);
            _mm_storel_epi64(dst.add(i) as *mut __m128i, _mm_unpacklo_epi32(lo, hi));
            i += 8;
        }
        while i < n {
            *dst.add(i) = encode::<F>(source_bits::<SRC>(src, i));
            i += 1;
        }
    }
}

/// # Safety
/// As [`widen_avx512`], with AVX2, FMA and F16C in place of AVX-512F.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn widen_avx2<F: Fp8Format, const BF16: bool>(
    src: *const u8,
    dst: *mut u8,
    n: usize,
) {
    // SAFETY: as in `narrow_avx2`.
    unsafe {
        let mut i = 0;
        while i + 8 <= n {
            let c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(src.add(i) as *const __m128i));
            let bits = decode_256::<F>(c);
            if BF16 {
                // Each top half is at most 0xFFFF, so the unsigned saturation never triggers;
                // the permute puts the two 128-bit halves' four results side by side.
                let h = _mm256_srli_epi32::<16>(bits);
                let packed = _mm256_permute4x64_epi64::<0b00_00_10_00>(_mm256_packus_epi32(h, h));
                _mm_storeu_si128(
                    (dst as *mut u16).add(i) as *mut __m128i,
                    _mm256_castsi256_si128(packed),
                );
            } else {
                _mm256_storeu_si256((dst as *mut u32).add(i) as *mut __m256i, bits);
            }
            i += 8;
        }
        while i < n {
            let bits = decode::<F>(*src.add(i));
            if BF16 {
                (dst as *mut u16)
                    .add(i)
                    .write_unaligned((bits >> 16) as u16);
            } else {
                (dst as *mut u32).add(i).write_unaligned(bits);
            }
            i += 1;
        }
    }
}

/// Sixteen source elements of tag `SRC` (0 f32, 1 bf16, 2 f16) at `src` as f32 bits, as the
/// narrowing loops read them.
///
/// # Safety
/// `src` readable for 16 elements; the CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn source_512<const SRC: u8>(src: *const u8) -> __m512i {
    // SAFETY: the contract.
    unsafe {
        match SRC {
            0 => _mm512_loadu_si512(src as *const _),
            1 => _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                src as *const __m256i,
            ))),
            _ => _mm512_castps_si512(_mm512_cvtph_ps(_mm256_loadu_si256(src as *const __m256i))),
        }
    }
}

/// `fp8_quantize`'s pass on AVX-512: the largest `|x|` bits of `n` source elements, and with
/// `CAST` the codes of `x · scale` (the narrowing of `encode_512`, as [`narrow_avx512`]).
///
/// # Safety
/// `src` readable for `n` elements of the `SRC` type; with `CAST`, `dst` writable for `n`
/// bytes, not overlapping; the CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn quantize_avx512<F: Fp8Format, const SRC: u8, const CAST: bool>(
    src: *const u8,
    scale: f32,
    dst: *mut u8,
    n: usize,
) -> u32 {
    let esz = if SRC == 0 { 4 } else { 2 };
    // SAFETY: every access is at an index below `n` (the vector loop runs while a whole vector
    // fits, the tail one element at a time), inside the contract's buffers.
    unsafe {
        let abs = _mm512_set1_epi32(0x7FFF_FFFF);
        let s = _mm512_set1_ps(scale);
        let mut m = _mm512_setzero_si512();
        let mut i = 0;
        while i + 16 <= n {
            let x = source_512::<SRC>(src.add(i * esz));
            m = _mm512_max_epu32(m, _mm512_and_si512(x, abs));
            if CAST {
                let y = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(x), s));
                let codes = _mm512_cvtepi32_epi8(encode_512::<F>(y));
                _mm_storeu_si128(dst.add(i) as *mut __m128i, codes);
            }
            i += 16;
        }
        let m = _mm512_reduce_max_epu32(m);
        tail::<F, SRC, CAST>(src, scale, dst, i, n, m)
    }
}

/// Eight source elements of tag `SRC` at `src` as f32 bits, as the narrowing loops read them.
///
/// # Safety
/// `src` readable for 8 elements; AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn source_256<const SRC: u8>(src: *const u8) -> __m256i {
    // SAFETY: the contract.
    unsafe {
        match SRC {
            0 => _mm256_loadu_si256(src as *const __m256i),
            1 => _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(
                src as *const __m128i,
            ))),
            _ => _mm256_castps_si256(_mm256_cvtph_ps(_mm_loadu_si128(src as *const __m128i))),
        }
    }
}

/// [`quantize_avx512`] on AVX2 (`encode_256`, as [`narrow_avx2`]).
///
/// # Safety
/// As [`quantize_avx512`], with AVX2, FMA and F16C in place of AVX-512F.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_avx2<F: Fp8Format, const SRC: u8, const CAST: bool>(
    src: *const u8,
    scale: f32,
    dst: *mut u8,
    n: usize,
) -> u32 {
    let esz = if SRC == 0 { 4 } else { 2 };
    // SAFETY: as in `quantize_avx512`.
    unsafe {
        let low_bytes = _mm256_setr_epi8(
            0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1,
            -1, -1, -1, -1, -1, -1, -1, -1, -1,
        );
        let abs = _mm256_set1_epi32(0x7FFF_FFFF);
        let s = _mm256_set1_ps(scale);
        let mut m = _mm256_setzero_si256();
        let mut i = 0;
        while i + 8 <= n {
            let x = source_256::<SRC>(src.add(i * esz));
            m = _mm256_max_epu32(m, _mm256_and_si256(x, abs));
            if CAST {
                let y = _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(x), s));
                let b = _mm256_shuffle_epi8(encode_256::<F>(y), low_bytes);
                let lo = _mm256_castsi256_si128(b);
                let hi = _mm256_extracti128_si256::<1>(b);
                _mm_storel_epi64(dst.add(i) as *mut __m128i, _mm_unpacklo_epi32(lo, hi));
            }
            i += 8;
        }
        let mut lanes = [0u32; 8];
        _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, m);
        let m = lanes.into_iter().max().unwrap_or(0);
        tail::<F, SRC, CAST>(src, scale, dst, i, n, m)
    }
}
