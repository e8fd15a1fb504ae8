//! AVX-512 packing: panels of A and B copied (and widened) into the micro-kernels' layout,
//! transposed in registers where the source runs the other way; bf16 pairs for `vdpbf16ps`.

use std::arch::x86_64::*;

use crate::gemm::elem::load1;
use crate::gemm::Kind;

use super::lanes::{lane_mask, load16, load16_masked, widen_fp8_512};

/// In-register 16 × 16 transpose: unpack pairs, then 4 × 4 blocks within 128-bit lanes, then
/// two rounds of 128-bit lane shuffles. 64 shuffles for 256 elements.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) fn transpose16(r: &mut [__m512; 16]) {
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4g + c] holds column (4·lane + c) of rows 4g..4g+4.
    for g in 0..4 {
        let (lo, hi) = (t[4 * g], t[4 * g + 1]);
        let (lo2, hi2) = (t[4 * g + 2], t[4 * g + 3]);
        r[4 * g] = _mm512_shuffle_ps::<0x44>(lo, lo2);
        r[4 * g + 1] = _mm512_shuffle_ps::<0xEE>(lo, lo2);
        r[4 * g + 2] = _mm512_shuffle_ps::<0x44>(hi, hi2);
        r[4 * g + 3] = _mm512_shuffle_ps::<0xEE>(hi, hi2);
    }
    for q in 0..4 {
        t[q] = _mm512_shuffle_f32x4::<0x88>(r[q], r[q + 4]);
        t[q + 4] = _mm512_shuffle_f32x4::<0xDD>(r[q], r[q + 4]);
        t[q + 8] = _mm512_shuffle_f32x4::<0x88>(r[q + 8], r[q + 12]);
        t[q + 12] = _mm512_shuffle_f32x4::<0xDD>(r[q + 8], r[q + 12]);
    }
    for q in 0..8 {
        r[q] = _mm512_shuffle_f32x4::<0x88>(t[q], t[q + 8]);
        r[q + 8] = _mm512_shuffle_f32x4::<0xDD>(t[q], t[q + 8]);
    }
}

/// `panel`'s transposing case (each lane contiguous along k), 16 lanes × 16 k at a time.
///
/// # Safety
/// As `pack::panel`, with `k_stride == 1`; the CPU must have AVX-512F.
#[target_feature(enable = "avx512f")]
pub(in crate::gemm) unsafe fn pack_transpose_avx512(
    kind: Kind,
    src: *const u8,
    lane_stride: isize,
    lanes: usize,
    kc: usize,
    dst: *mut f32,
    dst_stride: usize,
) {
    // SAFETY: lanes `l0 + l < lanes` and k steps `p < kc` of the view, and panel slots
    // `p·dst_stride + l0 + l` below `kc·dst_stride`; the masked stores write only lanes
    // `< lanes`.
    unsafe {
        let esz = kind.size();
        let mut l0 = 0;
        while l0 < lanes {
            let lb = (lanes - l0).min(16);
            let mask: __mmask16 = if lb == 16 { 0xFFFF } else { (1u16 << lb) - 1 };
            let row = |l: usize| src.offset((l0 + l) as isize * lane_stride * esz);
            let mut p = 0;
            while p + 16 <= kc {
                let mut r = [_mm512_setzero_ps(); 16];
                for (l, x) in r.iter_mut().enumerate().take(lb) {
                    *x = load16(kind, row(l).offset(p as isize * esz));
                }
                transpose16(&mut r);
                for (q, &x) in r.iter().enumerate() {
                    _mm512_mask_storeu_ps(dst.add((p + q) * dst_stride + l0), mask, x);
                }
                p += 16;
            }
            if p < kc {
                for l in 0..lb {
                    let s = row(l);
                    for pp in p..kc {
                        *dst.add(pp * dst_stride + l0 + l) =
                            load1(kind, s.offset(pp as isize * esz));
                    }
                }
            }
            l0 += 16;
        }
    }
}

/// `panel`'s contiguous-lanes case: each k step is a run of `lanes` elements.
///
/// # Safety
/// As `pack::panel`, with `lane_stride == 1`; the CPU must have AVX-512F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(in crate::gemm) unsafe fn pack_rows_avx512(
    kind: Kind,
    src: *const u8,
    k_stride: isize,
    lanes: usize,
    kc: usize,
    dst: *mut f32,
    dst_stride: usize,
) {
    // SAFETY: lanes below `lanes` (masked) of k steps below `kc`, in the view and the panel.
    unsafe {
        let esz = kind.size();
        for p in 0..kc {
            let s = src.offset(p as isize * k_stride * esz);
            let d = dst.add(p * dst_stride);
            let mut l = 0;
            while l < lanes {
                let mask = lane_mask(lanes - l);
                let v = load16_masked(kind, s.offset(l as isize * esz), mask);
                _mm512_mask_storeu_ps(d.add(l), mask, v);
                l += 16;
            }
        }
    }
}

/// `pack::pairs` where each k step is a contiguous run of lanes (`lane_stride == 1`, a B
/// panel of a row-major B): rows `2q` and `2q + 1` are zero-extended to 32 bits and the second
/// is shifted into the high half, 16 lanes per vector. Masked loads stop at `lanes`; with
/// `fill` the store runs on to `dst_stride` with the zeros the masked loads left.
///
/// # Safety
/// As `pack::panel` (a valid `lanes × kc` view of bf16 at `src` with these strides; `dst`
/// writable for `ceil(kc / 2) * dst_stride` u32), with `lane_stride == 1`; the CPU must have
/// AVX-512F/BW/VL.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(in crate::gemm) unsafe fn pack_pairs_rows_avx512(
    src: *const u16,
    k_stride: isize,
    lanes: usize,
    kc: usize,
    dst: *mut u32,
    dst_stride: usize,
    fill: bool,
) {
    // SAFETY: rows `2q` and `2q + 1` (only when `2q + 1 < kc`) of the view, lanes below
    // `lanes` (masked loads, and no pointer is formed past `lanes`), and panel slots below
    // `ceil(kc / 2)·dst_stride` (the store mask stops at `width <= dst_stride`).
    unsafe {
        let width = if fill { dst_stride } else { lanes };
        for q in 0..kc.div_ceil(2) {
            let r0 = src.offset(2 * q as isize * k_stride);
            // An odd kc: the last pair has no k + 1 row (its pointer may lie outside the view).
            let r1 = (2 * q + 1 < kc).then(|| src.offset((2 * q + 1) as isize * k_stride));
            let d = dst.add(q * dst_stride);
            let mut l = 0;
            while l < width {
                let v = if l < lanes {
                    let mask = lane_mask(lanes - l);
                    let lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, r0.add(l) as _));
                    match r1 {
                        Some(r1) => {
                            let hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                                mask,
                                r1.add(l) as _,
                            ));
                            _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi))
                        }
                        None => lo,
                    }
                } else {
                    _mm512_setzero_si512()
                };
                _mm512_mask_storeu_epi32(d.add(l) as *mut i32, lane_mask(width - l), v);
                l += 16;
            }
        }
    }
}

/// `pack::pairs` where each lane is contiguous along k (`k_stride == 1`, an A panel of a
/// row-major A): a (k, k + 1) pair is already one 32-bit word in memory, so this is a 32-bit
/// transpose of the `lanes × ceil(kc / 2)` block, 16 × 16 words at a time. The loads are
/// masked at 16-bit granularity, so an odd kc reads nothing past the view and leaves the last
/// pair's high half zero.
///
/// # Safety
/// As `pack::panel`, with `k_stride == 1`; the CPU must have AVX-512F/BW/VL.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(in crate::gemm) unsafe fn pack_pairs_transpose_avx512(
    src: *const u16,
    lane_stride: isize,
    lanes: usize,
    kc: usize,
    dst: *mut u32,
    dst_stride: usize,
    fill: bool,
) {
    // SAFETY: lanes below `lanes`, each read from k = 2·q0 for at most `kc − 2·q0` elements
    // (the 16-bit load mask), and panel rows below `ceil(kc / 2)`, lanes below `width`.
    unsafe {
        let kp = kc.div_ceil(2);
        let width = if fill { dst_stride } else { lanes };
        let mut l0 = 0;
        while l0 < width {
            let lb = lanes.saturating_sub(l0).min(16);
            let store_mask = lane_mask(width - l0);
            let mut q0 = 0;
            while q0 < kp {
                let qb = (kp - q0).min(16);
                let mut r = [_mm512_setzero_ps(); 16];
                if lb > 0 {
                    // 16-bit elements left in this lane from k = 2·q0: up to 32 per vector.
                    let ne = (kc - 2 * q0).min(32);
                    let emask: __mmask32 = if ne == 32 { !0 } else { (1u32 << ne) - 1 };
                    for (l, x) in r.iter_mut().enumerate().take(lb) {
                        let p = src.offset((l0 + l) as isize * lane_stride).add(2 * q0);
                        *x = _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(emask, p as _));
                    }
                    // Shuffles move bits without interpreting them, so the f32 transpose is a
                    // 32-bit one.
                    transpose16(&mut r);
                }
                for (q, &x) in r.iter().enumerate().take(qb) {
                    let d = dst.add((q0 + q) * dst_stride + l0) as *mut f32;
                    _mm512_mask_storeu_ps(d, store_mask, x);
                }
                q0 += 16;
            }
            l0 += 16;
        }
    }
}

/// [`pack_pairs_rows_avx512`] for FP8 codes of `kind` (`pack::pairs_fp8`'s contiguous-lanes
/// case): each row of codes widened exactly to f32 in registers, whose top half is the bf16,
/// then paired as the bf16 rows are. Masked-off lanes load code 0, which widens to +0.
///
/// # Safety
/// As `pack::panel` (a valid `lanes × kc` view of one-byte codes at `src`; `dst` writable for
/// `ceil(kc / 2) * dst_stride` u32), with `lane_stride == 1`; the CPU has AVX-512F/BW/VL.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(in crate::gemm) unsafe fn pack_pairs_rows_fp8_avx512(
    kind: Kind,
    src: *const u8,
    k_stride: isize,
    lanes: usize,
    kc: usize,
    dst: *mut u32,
    dst_stride: usize,
    fill: bool,
) {
    // SAFETY: as in `pack_pairs_rows_avx512`, one byte per element.
    unsafe {
        let width = if fill { dst_stride } else { lanes };
        for q in 0..kc.div_ceil(2) {
            let r0 = src.offset(2 * q as isize * k_stride);
            let r1 = (2 * q + 1 < kc).then(|| src.offset((2 * q + 1) as isize * k_stride));
            let d = dst.add(q * dst_stride);
            let mut l = 0;
            while l < width {
                let v = if l < lanes {
                    let mask = lane_mask(lanes - l);
                    let lo = _mm512_castps_si512(widen_fp8_512(
                        kind,
                        _mm_maskz_loadu_epi8(mask, r0.add(l) as *const i8),
                    ));
                    let lo = _mm512_srli_epi32::<16>(lo);
                    match r1 {
                        // The f32 of an FP8 value has a zero low half: it is the bf16 already
                        // in the high half of the pair.
                        Some(r1) => _mm512_or_si512(
                            lo,
                            _mm512_castps_si512(widen_fp8_512(
                                kind,
                                _mm_maskz_loadu_epi8(mask, r1.add(l) as *const i8),
                            )),
                        ),
                        None => lo,
                    }
                } else {
                    _mm512_setzero_si512()
                };
                _mm512_mask_storeu_epi32(d.add(l) as *mut i32, lane_mask(width - l), v);
                l += 16;
            }
        }
    }
}

/// [`pack_pairs_transpose_avx512`] for FP8 codes of `kind` (each lane contiguous along k): 32
/// codes of a lane are loaded as 16 words of two, whose low and high bytes (k even, k odd)
/// are widened exactly and paired, then the 16 × 16 words are transposed. The loads are
/// masked at byte granularity, so nothing past the view is read and an odd kc leaves the last
/// pair's high half zero (code 0 widens to +0).
///
/// # Safety
/// As `pack::panel` (FP8 codes), with `k_stride == 1`; the CPU has AVX-512F/BW/VL.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(in crate::gemm) unsafe fn pack_pairs_transpose_fp8_avx512(
    kind: Kind,
    src: *const u8,
    lane_stride: isize,
    lanes: usize,
    kc: usize,
    dst: *mut u32,
    dst_stride: usize,
    fill: bool,
) {
    // SAFETY: as in `pack_pairs_transpose_avx512`, one byte per element.
    unsafe {
        let kp = kc.div_ceil(2);
        let width = if fill { dst_stride } else { lanes };
        let bytes = _mm512_set1_epi32(0xFF);
        let mut l0 = 0;
        while l0 < width {
            let lb = lanes.saturating_sub(l0).min(16);
            let store_mask = lane_mask(width - l0);
            let mut q0 = 0;
            while q0 < kp {
                let qb = (kp - q0).min(16);
                let mut r = [_mm512_setzero_ps(); 16];
                if lb > 0 {
                    let ne = (kc - 2 * q0).min(32);
                    let emask: __mmask32 = if ne == 32 { !0 } else { (1u32 << ne) - 1 };
                    for (l, x) in r.iter_mut().enumerate().take(lb) {
                        let p = src.offset((l0 + l) as isize * lane_stride).add(2 * q0);
                        // Word q holds codes 2q (low byte) and 2q + 1 (high byte).
                        let w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi8(emask, p as _));
                        let lo = _mm512_and_si512(w, bytes);
                        let hi = _mm512_srli_epi32::<8>(w);
                        let lo = _mm512_srli_epi32::<16>(widen_fp8_codes(kind, lo));
                        *x = _mm512_castsi512_ps(_mm512_or_si512(lo, widen_fp8_codes(kind, hi)));
                    }
                    transpose16(&mut r);
                }
                for (q, &x) in r.iter().enumerate().take(qb) {
                    let d = dst.add((q0 + q) * dst_stride + l0) as *mut f32;
                    _mm512_mask_storeu_ps(d, store_mask, x);
                }
                q0 += 16;
            }
            l0 += 16;
        }
    }
}

/// Sixteen FP8 codes of `kind`, one per 32-bit lane, to f32 bits (exact).
#[target_feature(enable = "avx512f")]
#[inline]
fn widen_fp8_codes(kind: Kind, c: __m512i) -> __m512i {
    use crate::convert::{fp8_decode_avx512, E4M3, E5M2};
    if kind == Kind::E5M2 {
        fp8_decode_avx512::<E5M2>(c)
    } else {
        fp8_decode_avx512::<E4M3>(c)
    }
}
