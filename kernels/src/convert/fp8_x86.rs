//! AVX-512 loops of the FP8 conversions: sixteen lanes of the scalar reference's integer and
//! float operations ([`super::fp8::encode`], [`super::fp8::decode`]), so that every element
//! comes out with the scalar code's bits. The tails run the scalar code.

use std::arch::x86_64::*;

use super::fp8::{decode, encode, source_bits, Fp8Format, Spec};

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
fn decode_512<F: Fp8Format>(c: __m512i) -> __m512i {
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
