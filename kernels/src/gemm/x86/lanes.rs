//! Loading 16 lanes widened to f32 (all of them, or those a mask sets), the one widening
//! every x86 path uses.

use std::arch::x86_64::*;

use crate::convert::{fp8_decode_avx512, E4M3, E5M2};
use crate::gemm::Kind;

/// 16 consecutive elements widened to f32.
///
/// # Safety
/// `s` readable for 16 `kind` elements; the CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn load16(kind: Kind, s: *const u8) -> __m512 {
    // SAFETY: the contract: 16 readable elements at `s`.
    unsafe {
        match kind {
            Kind::F32 => _mm512_loadu_ps(s as *const f32),
            Kind::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(s as *const __m256i)),
            Kind::Bf16 => widen_bf16_512(_mm256_loadu_si256(s as *const __m256i)),
            Kind::E4M3 | Kind::E5M2 => widen_fp8_512(kind, _mm_loadu_si128(s as *const __m128i)),
        }
    }
}

/// Sixteen FP8 codes of `kind` (the bytes of `c`) to f32, exactly: `convert`'s decoding, whose
/// results are those of widening the codes to bf16 and the bf16 to f32.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) fn widen_fp8_512(kind: Kind, c: __m128i) -> __m512 {
    let c = _mm512_cvtepu8_epi32(c);
    _mm512_castsi512_ps(if kind == Kind::E5M2 {
        fp8_decode_avx512::<E5M2>(c)
    } else {
        fp8_decode_avx512::<E4M3>(c)
    })
}

/// Sixteen bf16 to f32 by the crate's one rule (`convert`'s module docs): a shift, and the
/// quiet bit for NaN. What follows is always arithmetic, which would quieten a signalling NaN
/// anyway, but then no widening in the crate differs from the others, even in bits nobody sees.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) fn widen_bf16_512(h: __m256i) -> __m512 {
    let x = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h));
    let nan = _mm512_cmpgt_epi32_mask(
        _mm512_and_si512(x, _mm512_set1_epi32(0x7FFF_FFFF)),
        _mm512_set1_epi32(0x7F80_0000),
    );
    _mm512_castsi512_ps(_mm512_mask_or_epi32(
        x,
        nan,
        x,
        _mm512_set1_epi32(0x0040_0000),
    ))
}

#[inline(always)]
pub(super) fn lane_mask(w: usize) -> __mmask16 {
    if w >= 16 {
        0xFFFF
    } else {
        (1u16 << w) - 1
    }
}

/// Up to 16 consecutive elements widened to f32 (zeros where `mask` is clear; nothing is read
/// there).
///
/// # Safety
/// `s` readable for the `kind` elements whose lanes are set in `mask`; the CPU has
/// AVX-512F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
pub(super) unsafe fn load16_masked(kind: Kind, s: *const u8, mask: __mmask16) -> __m512 {
    // SAFETY: the masked load reads only lanes set in `mask`, which the contract makes readable.
    unsafe {
        match kind {
            Kind::F32 => _mm512_maskz_loadu_ps(mask, s as *const f32),
            Kind::F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, s as *const i16)),
            Kind::Bf16 => widen_bf16_512(_mm256_maskz_loadu_epi16(mask, s as *const i16)),
            Kind::E4M3 | Kind::E5M2 => {
                widen_fp8_512(kind, _mm_maskz_loadu_epi8(mask, s as *const i8))
            }
        }
    }
}
