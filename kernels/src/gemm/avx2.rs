//! The AVX2 store of finished tiles into C (`store::store_tile` with contiguous rows): eight
//! lanes at a time, the ragged edge element by element; and the AVX2 packing of panels
//! (`pack::panel`'s two unit-stride layouts, for every kind).
//!
//! With a short k (im2col, the conv backward's f32-out products from 16-bit operands) the
//! store is a large share of a product; the slice-conversion path it replaces spent about a
//! third of the CNN's O2 step on an AVX2-only CPU in per-run calls and scalar checks.
//! The arithmetic is `TileEpi::apply` followed by the slice conversions' rounding, in the same
//! order on each element, so the results are those of every other store path.

use std::arch::x86_64::*;

use super::elem::{load1, store1};
use super::tile::TileEpi;
use super::Kind;

use super::types::{TAG_BF16 as OUT_BF16, TAG_F16 as OUT_F16, TAG_F32 as OUT_F32};

/// `store::tile_non_finite` on AVX2: any ±inf or NaN in an f32 tile, rows `c_rs` apart, eight
/// lanes at a time and the ragged edge element by element. The kernels write full-width tiles
/// straight into a row-major f32 C; the scalar check with its early exit (which kept it from
/// being vectorised) was 4% of the small GPT's O0 step on Zen 3 (`perf`).
///
/// # Safety
/// The tile readable; the CPU has AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile_non_finite_avx2(
    c: *const f32,
    c_rs: isize,
    rows: usize,
    cols: usize,
) -> bool {
    let full = cols / 8 * 8;
    // SAFETY: rows below `rows`, columns below `cols`, inside the tile.
    unsafe {
        let exp = _mm256_set1_epi32(0x7F80_0000);
        let mut bad = _mm256_setzero_si256();
        let mut edge = false;
        for r in 0..rows {
            let cr = c.offset(r as isize * c_rs);
            let mut j = 0;
            while j < full {
                let bits = _mm256_and_si256(_mm256_loadu_si256(cr.add(j) as *const __m256i), exp);
                bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(bits, exp));
                j += 8;
            }
            for j in full..cols {
                edge |= (*cr.add(j)).to_bits() & 0x7F80_0000 == 0x7F80_0000;
            }
        }
        edge || _mm256_testz_si256(bad, bad) == 0
    }
}

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
            (Kind::E4M3 | Kind::E5M2, _, _) => unreachable!("C is never FP8"),
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
    let kind = Kind::of_tag(K);
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

/// Eight elements of `kind` as f32 (16-bit and FP8 ones widened as the slice conversions do).
///
/// # Safety
/// `s` readable for eight elements of `kind`; AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn load8(kind: Kind, s: *const u8) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        if kind == Kind::F32 {
            return _mm256_loadu_ps(s as *const f32);
        }
        if kind.is_fp8() {
            return widen8_fp8(kind, _mm_loadl_epi64(s as *const __m128i));
        }
        widen8_16(kind, _mm_loadu_si128(s as *const __m128i))
    }
}

/// The eight FP8 codes of `kind` in the low bytes of `c` widened to f32, exactly, with the bits
/// of `convert`'s decoding (those of widening the codes to bf16 and the bf16 to f32), through
/// F16C: an FP8 code is an f16's top bits. E5M2 is the top byte of the f16 of the same value
/// (its NaNs included: `vcvtph2ps` sets the quiet bit and keeps the payload, as the decoding
/// does). E4M3's exponent and mantissa, moved down one bit, are an f16 of 2^-8 times the value
/// (subnormals included), so the f32 is scaled by 256, exactly; its one NaN pattern per sign
/// would read as ±480 and is set to the decoding's NaN (`±0x7FF0_0000`). Half the work of the
/// integer decoding, in the packing of every FP8 operand.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn widen8_fp8(kind: Kind, c: __m128i) -> __m256 {
    let c = _mm_cvtepu8_epi16(c);
    if kind == Kind::E5M2 {
        return _mm256_cvtph_ps(_mm_slli_epi16::<8>(c));
    }
    let mag = _mm_and_si128(c, _mm_set1_epi16(0x7F));
    let sign = _mm_slli_epi16::<8>(_mm_and_si128(c, _mm_set1_epi16(0x80)));
    let h = _mm_or_si128(_mm_slli_epi16::<7>(mag), sign);
    let x = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0));
    // 480 (0x43F0_0000) or-ed with 0x7FF0_0000 is the NaN's bits; the sign stays.
    let nan = _mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7F)));
    let nan = _mm256_and_si256(nan, _mm256_set1_epi32(0x7FF0_0000));
    _mm256_or_ps(x, _mm256_castsi256_ps(nan))
}

/// The eight 16-bit elements of `h` widened to f32 as the slice conversions do.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn widen8_16(kind: Kind, h: __m128i) -> __m256 {
    if kind == Kind::F16 {
        _mm256_cvtph_ps(h)
    } else {
        _mm256_castsi256_ps(crate::convert::widen_bf16_avx2(h))
    }
}

/// Up to eight elements of `kind` (`n <= 8`) as f32, zeros beyond `n`; reads only `n`.
///
/// In registers: the pairs through a masked 32-bit load (masked-out lanes are not read), an odd
/// last element blended in. (Copying them to a stack buffer first cost a `memcpy` call and a
/// failed store forward per call: an A micro-panel of six rows takes this path at every k step.)
///
/// # Safety
/// `s` readable for `n` elements of `kind`; AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn load_n(kind: Kind, s: *const u8, n: usize) -> __m256 {
    // SAFETY: the masked loads read the first `n` f32, or the first `n / 2` pairs and (the
    // scalar read) element `n - 1` of a 16-bit kind, or the first `n` bytes of FP8 codes (the
    // runs of four, two and one stop at `n`), all below `n`.
    unsafe {
        if n >= 8 {
            return load8(kind, s);
        }
        if kind == Kind::F32 {
            return _mm256_maskload_ps(s as *const f32, first_lanes(n));
        }
        if kind.is_fp8() {
            // Runs of four, two and one bytes, the lowest first, into one 64-bit lane.
            let mut bytes = 0u64;
            let mut at = 0;
            if n >= 4 {
                bytes = (s as *const u32).read_unaligned() as u64;
                at = 4;
            }
            if n - at >= 2 {
                bytes |= ((s.add(at) as *const u16).read_unaligned() as u64) << (8 * at);
                at += 2;
            }
            if n > at {
                bytes |= (*s.add(at) as u64) << (8 * at);
            }
            return widen8_fp8(kind, _mm_cvtsi64_si128(bytes as i64));
        }
        let pairs = _mm_cmpgt_epi32(_mm_set1_epi32((n / 2) as i32), _mm_setr_epi32(0, 1, 2, 3));
        let mut h = _mm_maskload_epi32(s as *const i32, pairs);
        if n % 2 == 1 {
            let last = (s as *const u16).add(n - 1).read_unaligned();
            let at = _mm_cmpeq_epi16(
                _mm_set1_epi16((n - 1) as i16),
                _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7),
            );
            h = _mm_blendv_epi8(h, _mm_set1_epi16(last as i16), at);
        }
        widen8_16(kind, h)
    }
}

/// Stores the first `n` lanes of `v` (all eight if `n >= 8`) with plain stores of four, two
/// and one: AMD's masked store (`vmaskmovps`) is microcoded, and an A micro-panel of six rows
/// takes this path at every k step.
///
/// # Safety
/// `d` writable for `n.min(8)` f32; AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn store_n(d: *mut f32, v: __m256, n: usize) {
    // SAFETY: each store writes lanes below `n.min(8)`.
    unsafe {
        if n >= 8 {
            return _mm256_storeu_ps(d, v);
        }
        let mut x = _mm256_castps256_ps128(v);
        let mut at = 0;
        if n >= 4 {
            _mm_storeu_ps(d, x);
            x = _mm256_extractf128_ps::<1>(v);
            at = 4;
        }
        if n - at >= 2 {
            _mm_store_sd(d.add(at) as *mut f64, _mm_castps_pd(x));
            x = _mm_movehl_ps(x, x);
            at += 2;
        }
        if n > at {
            _mm_store_ss(d.add(at), x);
        }
    }
}

/// A mask for `_mm256_maskload_ps` selecting the first `n` lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn first_lanes(n: usize) -> __m256i {
    let n = n.min(8) as i32;
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// `pack::panel`'s contiguous-lanes case (each k step a run of `lanes` elements) on AVX2.
///
/// For f32 this is a copy, but an inline one: a `memcpy` call per k step of a 6- or 16-lane
/// panel cost more than the copy (about 8% of a ViT's FP32 step).
///
/// # Safety
/// As `pack::panel`, with `lane_stride == 1`; AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pack_rows(
    kind: Kind,
    src: *const u8,
    k_stride: isize,
    lanes: usize,
    kc: usize,
    dst: *mut f32,
    dst_stride: usize,
) {
    let esz = kind.size() as usize;
    // SAFETY: lanes below `lanes` of k steps below `kc`, in the view (`load_n` reads only
    // those) and the panel (full vectors inside `lanes`, the rest by `store_n`).
    unsafe {
        for p in 0..kc {
            let s = src.offset(p as isize * k_stride * esz as isize);
            let d = dst.add(p * dst_stride);
            let mut l = 0;
            while l + 8 <= lanes {
                _mm256_storeu_ps(d.add(l), load8(kind, s.add(l * esz)));
                l += 8;
            }
            if l < lanes {
                let v = load_n(kind, s.add(l * esz), lanes - l);
                store_n(d.add(l), v, lanes - l);
            }
        }
    }
}

/// Transposes eight vectors of eight f32 in place.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn transpose8(r: &mut [__m256; 8]) {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    r[0] = _mm256_permute2f128_ps::<0x20>(u0, u4);
    r[1] = _mm256_permute2f128_ps::<0x20>(u1, u5);
    r[2] = _mm256_permute2f128_ps::<0x20>(u2, u6);
    r[3] = _mm256_permute2f128_ps::<0x20>(u3, u7);
    r[4] = _mm256_permute2f128_ps::<0x31>(u0, u4);
    r[5] = _mm256_permute2f128_ps::<0x31>(u1, u5);
    r[6] = _mm256_permute2f128_ps::<0x31>(u2, u6);
    r[7] = _mm256_permute2f128_ps::<0x31>(u3, u7);
}

/// `pack::panel`'s transposing case (each lane contiguous along k) on AVX2, eight lanes ×
/// eight k at a time.
///
/// # Safety
/// As `pack::panel`, with `k_stride == 1`; AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pack_transpose(
    kind: Kind,
    src: *const u8,
    lane_stride: isize,
    lanes: usize,
    kc: usize,
    dst: *mut f32,
    dst_stride: usize,
) {
    let esz = kind.size() as usize;
    // SAFETY: lanes `l0 + l < lanes` and k steps `p < kc` of the view, and panel slots
    // `p·dst_stride + l0 + l` below `kc·dst_stride`; `store_n` writes only lanes
    // `< lanes`.
    unsafe {
        let mut l0 = 0;
        while l0 < lanes {
            let lb = (lanes - l0).min(8);
            let row = |l: usize| src.offset((l0 + l) as isize * lane_stride * esz as isize);
            let mut p = 0;
            while p + 8 <= kc {
                let mut r = [_mm256_setzero_ps(); 8];
                for (l, x) in r.iter_mut().enumerate().take(lb) {
                    *x = load8(kind, row(l).add(p * esz));
                }
                transpose8(&mut r);
                for (q, &x) in r.iter().enumerate() {
                    store_n(dst.add((p + q) * dst_stride + l0), x, lb);
                }
                p += 8;
            }
            if p < kc {
                for l in 0..lb {
                    let s = row(l);
                    for pp in p..kc {
                        *dst.add(pp * dst_stride + l0 + l) = load1(kind, s.add(pp * esz));
                    }
                }
            }
            l0 += 8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{load8, load_n};
    use crate::convert::{Fp8Format, E4M3, E5M2};
    use crate::gemm::elem::load1;
    use crate::gemm::Kind;
    use crate::level::{detected_level, Level};
    use std::arch::x86_64::*;

    /// The packing's FP8 widening in registers (whole vectors and every short run) gives the
    /// scalar decoding's bits for all 256 codes of both formats, NaN and inf included.
    #[test]
    fn fp8_widening_in_registers_gives_the_scalar_bits() {
        if detected_level() < Level::Avx2 {
            println!("fp8_widening_in_registers_gives_the_scalar_bits: no AVX2, skipped");
            return;
        }
        let codes: Vec<u8> = (0..=255u8).chain(0..8).collect();
        for kind in [Kind::E4M3, Kind::E5M2] {
            let want = |c: u8| match kind {
                Kind::E4M3 => E4M3(c).to_f32().to_bits(),
                _ => E5M2(c).to_f32().to_bits(),
            };
            for start in 0..256 {
                for n in 1..=8 {
                    let mut got = [0u32; 8];
                    // SAFETY: `codes` has 8 readable bytes from every start below 256; AVX2,
                    // FMA and F16C are present (the detected level).
                    unsafe {
                        let p = codes.as_ptr().add(start);
                        let v = if n == 8 {
                            load8(kind, p)
                        } else {
                            load_n(kind, p, n)
                        };
                        _mm256_storeu_si256(
                            got.as_mut_ptr() as *mut __m256i,
                            _mm256_castps_si256(v),
                        );
                        assert_eq!(load1(kind, p).to_bits(), want(codes[start]));
                    }
                    for (l, &g) in got.iter().enumerate() {
                        let w = if l < n { want(codes[start + l]) } else { 0 };
                        assert_eq!(g, w, "{kind:?} from code {start}, {n} lanes, lane {l}");
                    }
                }
            }
        }
    }
}
