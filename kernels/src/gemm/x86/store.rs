//! AVX-512 stores: finished f32 tiles through the epilogue into C (row- or column-major), and
//! the non-finite check of a stored tile.

use std::arch::x86_64::*;

use crate::gemm::tile::TileEpi;
use crate::gemm::Kind;

use super::lanes::lane_mask;

// C's element type as a const parameter, so that each store loop is compiled for one type.
use crate::gemm::types::{TAG_BF16 as OUT_BF16, TAG_F16 as OUT_F16, TAG_F32 as OUT_F32};

/// The largest `|stored bits|` seen so far, per lane: a value is ±inf or NaN exactly when its
/// bits without the sign reach the infinity pattern, so one unsigned max per vector (and one
/// compare per tile) is the whole non-finite check.
#[derive(Clone, Copy)]
struct Worst {
    w32: __m512i,
    w16: __m256i,
}

impl Worst {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    fn new() -> Worst {
        Worst {
            w32: _mm512_setzero_si512(),
            w16: _mm256_setzero_si256(),
        }
    }

    /// Whether any lane reached the infinity pattern of `K`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    fn any<const K: u8>(self) -> bool {
        match K {
            OUT_F32 => _mm512_cmpge_epu32_mask(self.w32, _mm512_set1_epi32(0x7F80_0000)) != 0,
            OUT_F16 => _mm256_cmpge_epu16_mask(self.w16, _mm256_set1_epi16(0x7C00)) != 0,
            _ => _mm256_cmpge_epu16_mask(self.w16, _mm256_set1_epi16(0x7F80)) != 0,
        }
    }
}

/// One contiguous run of up to 16 C elements through the epilogue: `v` the f32 sums (zero
/// where `mask` is clear), `bias` the entries for the run (null: none), each `bias_step` (0: one
/// entry broadcast, 1: consecutive). Stores under `mask` and folds the stored bits into
/// `worst` (with `CHECK`). The same operations, in the same order, as `TileEpi::apply`
/// followed by the slice conversions' rounding. With `PLAIN` (no alpha, bias or activation:
/// `gemm`'s store) only `e.add_c` is looked at.
///
/// # Safety
/// C's run writable (and readable with `e.add_c`) under `mask`; the bias readable under
/// `mask` (at its one entry if `bias_step == 0`); AVX-512F/BW/VL.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn epilogue16<const K: u8, const PLAIN: bool, const CHECK: bool>(
    mut v: __m512,
    mask: __mmask16,
    c: *mut u8,
    bias: *const f32,
    bias_step: isize,
    e: &TileEpi,
    worst: &mut Worst,
) {
    // SAFETY: the masked loads and stores touch only lanes set in `mask` (and the one bias
    // entry when broadcasting), which the contract makes accessible.
    unsafe {
        if !PLAIN && e.scale {
            v = _mm512_mul_ps(_mm512_set1_ps(e.alpha), v);
        }
        if e.add_c {
            let old = match K {
                OUT_F32 => _mm512_maskz_loadu_ps(mask, c as *const f32),
                OUT_F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, c as *const i16)),
                // A bare shift, without the conversion rule's quiet bit: this value only
                // feeds the addition, which quietens a signalling NaN itself, and with either
                // operand order gives the same bits as from the quietened NaN.
                _ => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                    _mm256_maskz_loadu_epi16(mask, c as *const i16),
                ))),
            };
            v = _mm512_add_ps(v, old);
        }
        if !PLAIN && !bias.is_null() {
            let b = if bias_step == 0 {
                _mm512_set1_ps(*bias)
            } else {
                _mm512_maskz_loadu_ps(mask, bias)
            };
            v = _mm512_add_ps(v, b);
        }
        if !PLAIN && e.relu {
            // `x < 0 ? +0 : x` exactly as the scalar path: an ordered compare, so NaN is kept,
            // and -0 < 0 is false, so -0 is kept.
            let zero = _mm512_setzero_ps();
            v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, zero), zero);
        }
        match K {
            OUT_F32 => {
                _mm512_mask_storeu_ps(c as *mut f32, mask, v);
                if CHECK {
                    let abs =
                        _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFF_FFFF));
                    worst.w32 = _mm512_mask_max_epu32(worst.w32, mask, worst.w32, abs);
                }
            }
            _ => {
                let h = if K == OUT_F16 {
                    _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v)
                } else {
                    crate::convert::narrow_bf16_avx512(_mm512_castps_si512(v))
                };
                _mm256_mask_storeu_epi16(c as *mut i16, mask, h);
                if CHECK {
                    let abs = _mm256_and_si256(h, _mm256_set1_epi16(0x7FFF));
                    worst.w16 = _mm256_mask_max_epu16(worst.w16, mask, worst.w16, abs);
                }
            }
        }
    }
}

/// `store::store_tile` for C with contiguous rows (`c_cs == 1`): each row of the tile is one
/// run, 16 lanes at a time, masked at the ragged edge; compiled once per C type, for `gemm`'s
/// plain store and for the general epilogue.
///
/// # Safety
/// As `store::store_tile`, with `c_cs == 1`; AVX-512F/BW/VL.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(in crate::gemm) unsafe fn store_rows_avx512(
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

/// The arguments of `store_rows_avx512` (and of `store_cols_avx512`, with C's column stride
/// in place of its row stride).
type RowsArgs<'a> = (*const f32, usize, usize, usize, *mut u8, isize, &'a TileEpi);

/// `store_rows_avx512` for one C type.
///
/// # Safety
/// As `store_rows_avx512`, with `K` C's type, `PLAIN` only if `e` has no alpha, bias or
/// activation, and `CHECK` unless nobody reads the result (then it is `false`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn rows_k<const K: u8, const PLAIN: bool, const CHECK: bool>(
    (src, src_rs, rows, cols, c, c_rs, e): RowsArgs<'_>,
) -> bool {
    debug_assert!(cols <= 32);
    let esz: isize = if K == OUT_F32 { 4 } else { 2 };
    // A tile row is at most two vectors: the masks are the same for every row.
    let masks = [lane_mask(cols), lane_mask(cols.saturating_sub(16))];
    let nvec = cols.div_ceil(16);
    let mut worst = Worst::new();
    // SAFETY: rows below `rows`, columns below `cols` (masked), of the tile, C and the bias
    // (with strides 0 or 1), all inside what the contract provides; no bias pointer is formed
    // without a bias.
    unsafe {
        for r in 0..rows {
            let s = src.add(r * src_rs);
            let cr = c.offset(r as isize * c_rs * esz);
            for (v, &mask) in masks.iter().enumerate().take(nvec) {
                let j = v * 16;
                let x = _mm512_maskz_loadu_ps(mask, s.add(j));
                // With a per-column bias (`bias_cs == 1`) the run's entries start at column
                // j; with a per-row one (`bias_cs == 0`) every column has row r's.
                let bj = if PLAIN || e.bias.is_null() {
                    std::ptr::null()
                } else {
                    e.bias
                        .offset(r as isize * e.bias_rs + j as isize * e.bias_cs)
                };
                let cj = cr.offset(j as isize * esz);
                epilogue16::<K, PLAIN, CHECK>(x, mask, cj, bj, e.bias_cs, e, &mut worst);
            }
        }
        CHECK && worst.any::<K>()
    }
}

/// `store::store_tile` for C with contiguous columns (`c_rs == 1`, C seen transposed): each
/// column of the tile (at most 12 rows) is gathered from the row-major tile into one vector.
///
/// # Safety
/// As `store::store_tile`, with `c_rs == 1`; AVX-512F/BW/VL.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(in crate::gemm) unsafe fn store_cols_avx512(
    out: Kind,
    src: *const f32,
    src_rs: usize,
    rows: usize,
    cols: usize,
    c: *mut u8,
    c_cs: isize,
    e: &TileEpi,
) -> bool {
    // SAFETY: the caller's contract, handed on.
    unsafe {
        let args = (src, src_rs, rows, cols, c, c_cs, e);
        match (out, e.check) {
            (Kind::F32, false) => cols_k::<OUT_F32, false>(args),
            (Kind::F32, true) => cols_k::<OUT_F32, true>(args),
            (Kind::F16, false) => cols_k::<OUT_F16, false>(args),
            (Kind::F16, true) => cols_k::<OUT_F16, true>(args),
            (Kind::Bf16, false) => cols_k::<OUT_BF16, false>(args),
            (Kind::Bf16, true) => cols_k::<OUT_BF16, true>(args),
            (Kind::E4M3 | Kind::E5M2, _) => unreachable!("C is never FP8"),
        }
    }
}

/// `store_cols_avx512` for one C type.
///
/// # Safety
/// As `store_cols_avx512`, with `K` C's type and `CHECK` unless nobody reads the result.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn cols_k<const K: u8, const CHECK: bool>(
    (src, src_rs, rows, cols, c, c_cs, e): RowsArgs<'_>,
) -> bool {
    debug_assert!(rows <= 16 && src_rs * 15 < i32::MAX as usize);
    let esz: isize = if K == OUT_F32 { 4 } else { 2 };
    let mask = lane_mask(rows);
    let idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(src_rs as i32),
    );
    let mut worst = Worst::new();
    // SAFETY: columns below `cols`, rows below `rows` (gathered and stored under `mask`), of
    // the tile, C and the bias, all inside what the contract provides.
    unsafe {
        for j in 0..cols {
            let v = _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), mask, idx, src.add(j) as _);
            let bj = if e.bias.is_null() {
                e.bias
            } else {
                e.bias.offset(j as isize * e.bias_cs)
            };
            let cj = c.offset(j as isize * c_cs * esz);
            epilogue16::<K, false, CHECK>(v, mask, cj, bj, e.bias_rs, e, &mut worst);
        }
        CHECK && worst.any::<K>()
    }
}

/// `store::tile_non_finite`: any ±inf or NaN in an f32 tile, rows `c_rs` apart.
///
/// # Safety
/// The tile readable; AVX-512F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(in crate::gemm) unsafe fn tile_non_finite_avx512(
    c: *const f32,
    c_rs: isize,
    rows: usize,
    cols: usize,
) -> bool {
    // SAFETY: rows below `rows`, columns below `cols` (masked), inside the tile.
    unsafe {
        let exp = _mm512_set1_epi32(0x7F80_0000);
        let mut bad: __mmask16 = 0;
        for r in 0..rows {
            let cr = c.offset(r as isize * c_rs);
            let mut j = 0;
            while j < cols {
                let mask = lane_mask(cols - j);
                let bits = _mm512_and_si512(_mm512_maskz_loadu_epi32(mask, cr.add(j) as _), exp);
                bad |= _mm512_mask_cmpeq_epi32_mask(mask, bits, exp);
                j += 16;
            }
        }
        bad != 0
    }
}
