//! x86-64 micro-kernels and packing, each compiled for its own instruction set with
//! `#[target_feature]` and only called after run-time detection (see `Arch::select`).

use std::arch::x86_64::*;

use super::store::{load1, TileEpi};
use super::{kernel_table, KernFn, Kind};

// AVX-512 f32: a 12 × 32 tile is 24 zmm accumulators, plus 2 for the B row and the broadcast
// A element folded into the FMA's memory operand: 26 of the 32 registers, no spills. Per k step
// it issues 24 FMAs against 14 loads, so the two FMA ports, not the load ports, set the pace.
const MR512: usize = 12;
const NR512: usize = 32;

/// # Safety
/// As [`KernFn`]; the CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn kernel_avx512<const M: usize, const NV: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    // SAFETY: the loads read `kc` steps of the packed panels and the stores write `M` rows of
    // `NV` vectors at `dst`, all inside what the contract provides.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); NV]; M];
        let (mut a, mut b) = (a, b);
        for _ in 0..kc {
            let mut bv = [_mm512_setzero_ps(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = _mm512_loadu_ps(b.add(v * 16));
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*a.add(i));
                for (x, &bx) in row.iter_mut().zip(bv.iter()) {
                    *x = _mm512_fmadd_ps(av, bx, *x);
                }
            }
            a = a.add(MR512);
            b = b.add(NR512);
        }
        for (i, row) in acc.iter().enumerate() {
            let d = dst.offset(i as isize * dst_rs);
            for (v, &x) in row.iter().enumerate() {
                let d = d.add(v * 16);
                let x = if load {
                    _mm512_add_ps(_mm512_loadu_ps(d), x)
                } else {
                    x
                };
                _mm512_storeu_ps(d, x);
            }
        }
    }
}

pub(super) static KERNELS_AVX512: [[KernFn; 2]; MR512] =
    kernel_table!(kernel_avx512; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);

// AVX2: the classic 6 × 16 tile, 12 ymm accumulators of 16.
const MR256: usize = 6;
const NR256: usize = 16;

/// # Safety
/// As [`KernFn`]; the CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_avx2<const M: usize, const NV: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    // SAFETY: the loads read `kc` steps of the packed panels and the stores write `M` rows of
    // `NV` vectors at `dst`, all inside what the contract provides.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); NV]; M];
        let (mut a, mut b) = (a, b);
        for _ in 0..kc {
            let mut bv = [_mm256_setzero_ps(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = _mm256_loadu_ps(b.add(v * 8));
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm256_set1_ps(*a.add(i));
                for (x, &bx) in row.iter_mut().zip(bv.iter()) {
                    *x = _mm256_fmadd_ps(av, bx, *x);
                }
            }
            a = a.add(MR256);
            b = b.add(NR256);
        }
        for (i, row) in acc.iter().enumerate() {
            let d = dst.offset(i as isize * dst_rs);
            for (v, &x) in row.iter().enumerate() {
                let d = d.add(v * 8);
                let x = if load {
                    _mm256_add_ps(_mm256_loadu_ps(d), x)
                } else {
                    x
                };
                _mm256_storeu_ps(d, x);
            }
        }
    }
}

pub(super) static KERNELS_AVX2: [[KernFn; 2]; MR256] = kernel_table!(kernel_avx2; 1, 2, 3, 4, 5, 6);

// AVX512-BF16: the same 12 × 32 tile, but each packed slot is a (k, k+1) bf16 pair and one
// `vdpbf16ps` does two k steps per lane. Products of two bf16 are exact in f32; the instruction
// adds them with round-to-nearest-even but flushes subnormal inputs and outputs to zero, unlike
// the f32 kernels (the tests' tolerance carries an absolute term for that).
/// # Safety
/// As [`KernFn`] (with `kc` counting k pairs); the CPU has AVX-512F and AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn kernel_avx512_bf16<const M: usize, const NV: usize>(
    kp: usize,
    a: *const f32,
    b: *const f32,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    // SAFETY: the loads read `kc` steps of the packed panels and the stores write `M` rows of
    // `NV` vectors at `dst`, all inside what the contract provides.
    // The transmutes reinterpret 512-bit integer vectors as `__m512bh`, the same size and
    // any bit pattern valid.
    unsafe {
        let (mut a, mut b) = (a as *const i32, b as *const i32);
        let mut acc = [[_mm512_setzero_ps(); NV]; M];
        for _ in 0..kp {
            let mut bv = [_mm512_setzero_si512(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = _mm512_loadu_si512(b.add(v * 16) as *const _);
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(i)));
                for (x, &bx) in row.iter_mut().zip(bv.iter()) {
                    *x = _mm512_dpbf16_ps(*x, av, std::mem::transmute::<__m512i, __m512bh>(bx));
                }
            }
            a = a.add(MR512);
            b = b.add(NR512);
        }
        for (i, row) in acc.iter().enumerate() {
            let d = dst.offset(i as isize * dst_rs);
            for (v, &x) in row.iter().enumerate() {
                let d = d.add(v * 16);
                let x = if load {
                    _mm512_add_ps(_mm512_loadu_ps(d), x)
                } else {
                    x
                };
                _mm512_storeu_ps(d, x);
            }
        }
    }
}

pub(super) static KERNELS_AVX512_BF16: [[KernFn; 2]; MR512] =
    kernel_table!(kernel_avx512_bf16; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);

/// 16 consecutive elements widened to f32.
///
/// # Safety
/// `s` readable for 16 `kind` elements; the CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load16(kind: Kind, s: *const u8) -> __m512 {
    // SAFETY: the contract: 16 readable elements at `s`.
    unsafe {
        match kind {
            Kind::F32 => _mm512_loadu_ps(s as *const f32),
            Kind::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(s as *const __m256i)),
            Kind::Bf16 => widen_bf16_512(_mm256_loadu_si256(s as *const __m256i)),
        }
    }
}

/// Sixteen bf16 to f32 by the crate's one rule (`convert`'s module docs): a shift, and the
/// quiet bit for NaN. What follows is always arithmetic, which would quieten a signalling NaN
/// anyway, but then no widening in the crate differs from the others, even in bits nobody sees.
#[target_feature(enable = "avx512f")]
#[inline]
fn widen_bf16_512(h: __m256i) -> __m512 {
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

/// In-register 16 × 16 transpose: unpack pairs, then 4 × 4 blocks within 128-bit lanes, then
/// two rounds of 128-bit lane shuffles. 64 shuffles for 256 elements.
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose16(r: &mut [__m512; 16]) {
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
pub(super) unsafe fn pack_transpose_avx512(
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
pub(super) unsafe fn pack_rows_avx512(
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

#[inline(always)]
fn lane_mask(w: usize) -> __mmask16 {
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
unsafe fn load16_masked(kind: Kind, s: *const u8, mask: __mmask16) -> __m512 {
    // SAFETY: the masked load reads only lanes set in `mask`, which the contract makes readable.
    unsafe {
        match kind {
            Kind::F32 => _mm512_maskz_loadu_ps(mask, s as *const f32),
            Kind::F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, s as *const i16)),
            Kind::Bf16 => widen_bf16_512(_mm256_maskz_loadu_epi16(mask, s as *const i16)),
        }
    }
}

/// C's element type as a const parameter, so that each store loop is compiled for one type.
const OUT_F32: u8 = 0;
const OUT_F16: u8 = 1;
const OUT_BF16: u8 = 2;

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
pub(super) unsafe fn store_rows_avx512(
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
pub(super) unsafe fn store_cols_avx512(
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
pub(super) unsafe fn tile_non_finite_avx512(
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
pub(super) unsafe fn pack_pairs_rows_avx512(
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
pub(super) unsafe fn pack_pairs_transpose_avx512(
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

#[cfg(test)]
mod tests {
    use super::{load16, load16_masked, Kind};
    use crate::level::{detected_level, Level};
    use std::arch::x86_64::*;

    /// The widening the packing and the C_old loads do in registers gives the bits of the
    /// crate's conversions for all 65,536 patterns of both formats.
    #[test]
    fn in_register_widening_follows_the_conversion_rule() {
        if detected_level() < Level::Avx512 {
            println!("in_register_widening_follows_the_conversion_rule: no AVX-512, skipped");
            return;
        }
        let all: Vec<u16> = (0..=u16::MAX).collect();
        for kind in [Kind::F16, Kind::Bf16] {
            for chunk in all.chunks(16) {
                let want: Vec<u32> = chunk
                    .iter()
                    .map(|&h| match kind {
                        Kind::F16 => crate::convert::widen_f16(half::f16::from_bits(h)),
                        _ => crate::convert::widen_bf16(half::bf16::from_bits(h)),
                    })
                    .map(f32::to_bits)
                    .collect();
                let mut got = [0u32; 16];
                let mut got_masked = [0u32; 16];
                // SAFETY: 16 readable u16 at the chunk (65,536 is a multiple of 16), 16
                // writable u32 in each array; the CPU has AVX-512F/BW/VL (checked above).
                unsafe {
                    let p = chunk.as_ptr() as *const u8;
                    _mm512_storeu_ps(got.as_mut_ptr() as *mut f32, load16(kind, p));
                    let v = load16_masked(kind, p, 0x7FFF);
                    _mm512_storeu_ps(got_masked.as_mut_ptr() as *mut f32, v);
                }
                assert_eq!(&got[..], &want[..], "{kind:?} at {:#06x}", chunk[0]);
                assert_eq!(&got_masked[..15], &want[..15], "{kind:?} masked");
                assert_eq!(got_masked[15], 0, "masked-off lane is zero");
            }
        }
    }
}
