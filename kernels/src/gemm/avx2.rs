//! The AVX2 store of finished tiles into C (`store::store_tile` with contiguous rows): eight
//! lanes at a time, the ragged edge element by element.
//!
//! With a short k (im2col, the conv backward's f32-out products from 16-bit operands) the
//! store is a large share of a product; the slice-conversion path it replaces spent about a
//! third of the CNN's O2 step on an AVX2-only CPU in per-run calls and scalar checks.
//! The arithmetic is `TileEpi::apply` followed by the slice conversions' rounding, in the same
//! order on each element, so the results are those of every other store path.

use std::arch::x86_64::*;

use super::store::{load1, store1, TileEpi};
use super::Kind;

const OUT_F32: u8 = 0;
const OUT_F16: u8 = 1;
const OUT_BF16: u8 = 2;

/// `store::store_tile` for C with contiguous rows (`c_cs == 1`) on AVX2; returns whether any
/// stored element is non-finite (only looked for with `e.check`).
///
/// # Safety
/// As `store::store_tile`, with `c_cs == 1`; the CPU has AVX2, FMA and F16C.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn store_rows_avx2(
    out: Kind,
    src: *const f32,
    src_rs: usize,
    rows: usize,
    cols: usize,
    c: *mut u8,
    c_rs: isize,
    e: &TileEpi,
) -> bool {
    let plain = !e.scale && e.bias.is_null() && !e.relu;
    let args = (src, src_rs, rows, cols, c, c_rs, e);
    // SAFETY: the caller's contract, handed on.
    unsafe {
        match (out, plain, e.check) {
            (Kind::F32, true, false) => rows_k::<OUT_F32, true, false>(args),
            (Kind::F32, true, true) => rows_k::<OUT_F32, true, true>(args),
            (Kind::F32, false, _) => rows_k::<OUT_F32, false, true>(args),
            (Kind::F16, true, false) => rows_k::<OUT_F16, true, false>(args),
            (Kind::F16, true, true) => rows_k::<OUT_F16, true, true>(args),
            (Kind::F16, false, _) => rows_k::<OUT_F16, false, true>(args),
            (Kind::Bf16, true, false) => rows_k::<OUT_BF16, true, false>(args),
            (Kind::Bf16, true, true) => rows_k::<OUT_BF16, true, true>(args),
            (Kind::Bf16, false, _) => rows_k::<OUT_BF16, false, true>(args),
        }
    }
}

type RowsArgs<'a> = (*const f32, usize, usize, usize, *mut u8, isize, &'a TileEpi);

/// `store_rows_avx2` for one C type.
///
/// # Safety
/// As `store_rows_avx2`, with `K` C's type, `PLAIN` only if `e` has no alpha, bias or
/// activation, and `CHECK` unless nobody reads the result.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_k<const K: u8, const PLAIN: bool, const CHECK: bool>(
    (src, src_rs, rows, cols, c, c_rs, e): RowsArgs<'_>,
) -> bool {
    let kind = match K {
        OUT_F32 => Kind::F32,
        OUT_F16 => Kind::F16,
        _ => Kind::Bf16,
    };
    let esz: isize = if K == OUT_F32 { 4 } else { 2 };
    let full = cols / 8 * 8;
    // Lanes whose stored bits were ±inf or NaN (all ones), accumulated over the tile.
    let mut bad32 = _mm256_setzero_si256();
    let mut bad16 = _mm_setzero_si128();
    let mut bad_scalar = false;
    // SAFETY: rows below `rows` and columns below `cols` of the tile, C and the bias (whose
    // entry for (r, j) is at `r·bias_rs + j·bias_cs`, one stride 0 and the other 1), all
    // inside what the contract provides; vectors cover columns j..j+8 <= `full` <= `cols`.
    unsafe {
        for r in 0..rows {
            let s = src.add(r * src_rs);
            let cr = c.offset(r as isize * c_rs * esz);
            let mut j = 0;
            while j < full {
                let mut v = _mm256_loadu_ps(s.add(j));
                let cj = cr.offset(j as isize * esz);
                if !PLAIN && e.scale {
                    v = _mm256_mul_ps(_mm256_set1_ps(e.alpha), v);
                }
                if e.add_c {
                    let old = match K {
                        OUT_F32 => _mm256_loadu_ps(cj as *const f32),
                        OUT_F16 => _mm256_cvtph_ps(_mm_loadu_si128(cj as *const __m128i)),
                        // A bare shift, as the AVX-512 store: this value only feeds the
                        // addition, which quietens a signalling NaN itself.
                        _ => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                            _mm_loadu_si128(cj as *const __m128i),
                        ))),
                    };
                    v = _mm256_add_ps(v, old);
                }
                if !PLAIN && !e.bias.is_null() {
                    let b = e
                        .bias
                        .offset(r as isize * e.bias_rs + j as isize * e.bias_cs);
                    let b = if e.bias_cs == 0 {
                        _mm256_set1_ps(*b)
                    } else {
                        _mm256_loadu_ps(b)
                    };
                    v = _mm256_add_ps(v, b);
                }
                if !PLAIN && e.relu {
                    // `x < 0 ? +0 : x` as the scalar path: ordered, so NaN and -0 are kept.
                    let zero = _mm256_setzero_ps();
                    v = _mm256_blendv_ps(v, zero, _mm256_cmp_ps::<_CMP_LT_OQ>(v, zero));
                }
                match K {
                    OUT_F32 => {
                        _mm256_storeu_ps(cj as *mut f32, v);
                        if CHECK {
                            let abs = _mm256_and_si256(
                                _mm256_castps_si256(v),
                                _mm256_set1_epi32(0x7FFF_FFFF),
                            );
                            let nf = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F7F_FFFF));
                            bad32 = _mm256_or_si256(bad32, nf);
                        }
                    }
                    _ => {
                        let h = if K == OUT_F16 {
                            _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v)
                        } else {
                            let w = crate::convert::narrow_bf16_avx2(_mm256_castps_si256(v));
                            _mm_packus_epi32(
                                _mm256_castsi256_si128(w),
                                _mm256_extracti128_si256::<1>(w),
                            )
                        };
                        _mm_storeu_si128(cj as *mut __m128i, h);
                        if CHECK {
                            let limit = if K == OUT_F16 { 0x7BFF } else { 0x7F7F };
                            let abs = _mm_and_si128(h, _mm_set1_epi16(0x7FFF));
                            let nf = _mm_cmpgt_epi16(abs, _mm_set1_epi16(limit));
                            bad16 = _mm_or_si128(bad16, nf);
                        }
                    }
                }
                j += 8;
            }
            for j in full..cols {
                let cp = cr.offset(j as isize * esz);
                let old = if e.add_c { load1(kind, cp) } else { 0.0 };
                let b = if PLAIN || e.bias.is_null() {
                    0.0
                } else {
                    *e.bias
                        .offset(r as isize * e.bias_rs + j as isize * e.bias_cs)
                };
                let x = e.apply(*s.add(j), old, b);
                store1(kind, cp, x);
                if CHECK {
                    let back = load1(kind, cp);
                    bad_scalar |= !back.is_finite();
                }
            }
        }
    }
    CHECK && (bad_scalar || _mm256_movemask_epi8(bad32) != 0 || _mm_movemask_epi8(bad16) != 0)
}
