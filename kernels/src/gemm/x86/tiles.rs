//! AMX micro-kernels: bf16 products on Intel's tile unit. One `tdpbf16ps` adds to a 16 × 16
//! f32 tile of C the product of a 16 × 32 bf16 tile of A and a 16-row tile of B's (k, k+1)
//! pairs, 8,192 multiply-adds an instruction: on a Sapphire Rapids-class core about 3 TFLOP/s
//! from registers (a throwaway probe, not in the repository), against about 140 GFLOP/s a core
//! for the AVX-512 kernel that widens bf16 to f32 (the gemm bench's f32 column, 2 threads).
//!
//! The micro-tile is 16 rows × 32 columns: one A tile (`tmm0`), two B tiles (`tmm1`, `tmm2`)
//! and two C tiles (`tmm4`, `tmm5`). B's packed panels are the bf16-pair path's (`NR = 32`
//! slots of one pair each per k pair, so a B tile is 16 pair rows 128 bytes apart); A's tiles
//! want each row's pairs contiguous, so A is read where it lies (row-major bf16) or packed row
//! by row (`pack::panel` with `Arch::a_tile_rows`). A k depth that is not a multiple of 32,
//! and A's rows of a tile shorter than 16 read in place, go through small zero-padded copies,
//! so that no tile load reads past what the contract provides.
//!
//! Rounding: each `tdpbf16ps` adds its 32 products per element to C in an order of its own,
//! with round-to-nearest-even and subnormal inputs and outputs flushed to zero, as
//! `vdpbf16ps` does, and a running sum already in C (`load`) is added after the products, as
//! every kernel adds it. The bits therefore differ from the other paths' (within the tests'
//! bounds) but are the same whether A is packed or read in place, for every tile height, and
//! whichever operand plays A (`kernels/tests/packed_b.rs` holds the driver, which computes a
//! column-major C as `Cᵀ = Bᵀ·Aᵀ`, to `gemm_packed_b`'s bits).

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::Cell;
use std::mem::MaybeUninit;

use crate::gemm::{kernel_table, rows_kernel_table, KernFn, RowsKernFn};

/// Rows of A and of C in a tile, and k pairs in a row of A's tile (rows of B's).
const TILE_ROWS: usize = 16;
/// Bytes of a tile's row: 16 pairs of bf16, or 16 f32.
const ROW_BYTES: usize = 64;
/// Bytes between consecutive k pairs of a packed B panel: 32 columns of one pair each.
const B_PAIR_BYTES: usize = 128;

/// The tile configuration (`ldtilecfg`'s 64-byte operand): palette 1, and every one of the
/// eight tiles 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        // colsb (bytes per row) at 16 + 2t, little-endian; rows at 48 + t.
        c[16 + 2 * t] = ROW_BYTES as u8;
        c[48 + t] = TILE_ROWS as u8;
        t += 1;
    }
    TileConfig(c)
};

thread_local! {
    /// Whether this thread has loaded [`CONFIG`]. `ldtilecfg` costs about as much as ten
    /// `tdpbf16ps` (a throwaway probe on a Sapphire Rapids-class Xeon, not in the repository:
    /// about 55 ns against 5.4), so it runs once per thread; the
    /// configuration stays with the thread (saved and restored with its other registers),
    /// and nothing in this crate releases or changes it.
    static CONFIGURED: Cell<bool> = const { Cell::new(false) };
}

/// Loads [`CONFIG`] into this thread's tile unit if it is not there yet.
///
/// # Safety
/// The CPU has AMX-TILE and the system has granted this process the tile data
/// (`Level::AmxBf16` detected).
#[inline]
unsafe fn configure() {
    if !CONFIGURED.get() {
        // SAFETY: the configuration is 64 readable, aligned bytes with a valid palette; the
        // caller's contract provides AMX.
        unsafe { asm!("ldtilecfg [{0}]", in(reg) CONFIG.0.as_ptr(), options(nostack)) };
        CONFIGURED.set(true);
    }
}

/// Bytes between rows of C's scratch: two tiles side by side.
const C_STAGE_RS: isize = 2 * ROW_BYTES as isize;

/// 64-byte-aligned scratch for tiles.
#[repr(C, align(64))]
struct Stage<const N: usize>([u8; N]);

/// One step of 32 k: `C0 += A·B0` (and `C1 += A·B1` for a second vector of columns), A's tile
/// at `a` with rows `a_rs` bytes apart, B0's and B1's at `b0` and `b1` with pair rows `b_rs`
/// apart.
///
/// # Safety
/// 16 rows of 64 bytes readable at `a` (stride `a_rs`), at `b0` and, for `NV == 2`, at `b1`
/// (stride `b_rs`); the tiles configured ([`configure`]).
#[inline(always)]
unsafe fn step<const NV: usize>(
    a: *const u8,
    a_rs: isize,
    (b0, b1, b_rs): (*const u8, *const u8, isize),
) {
    // SAFETY: the caller's contract; the tile registers are not the compiler's.
    unsafe {
        asm!(
            "tileloadd tmm0, [{a} + {a_rs}*1]",
            "tileloadd tmm1, [{b} + {b_rs}*1]",
            "tdpbf16ps tmm4, tmm0, tmm1",
            a = in(reg) a,
            a_rs = in(reg) a_rs,
            b = in(reg) b0,
            b_rs = in(reg) b_rs,
            options(nostack),
        );
        if NV == 2 {
            asm!(
                "tileloadd tmm2, [{b} + {b_rs}*1]",
                "tdpbf16ps tmm5, tmm0, tmm2",
                b = in(reg) b1,
                b_rs = in(reg) b_rs,
                options(nostack),
            );
        }
    }
}

/// Copies the first `bytes` (at most 64) of `rows` rows from `src` (rows `src_rs` bytes apart)
/// to `dst` (rows `dst_rs` apart); the rest of each row at `dst`, and the rows after, keep
/// what they held.
///
/// # Safety
/// `src` readable and `dst` writable for the rows' first `bytes`; `bytes <= 64`; the CPU has
/// AVX-512BW.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn copy_rows(
    (src, src_rs): (*const u8, isize),
    rows: usize,
    bytes: usize,
    (dst, dst_rs): (*mut u8, isize),
) {
    let mask: __mmask64 = if bytes >= 64 { !0 } else { (1u64 << bytes) - 1 };
    // SAFETY: masked loads and stores touch only each row's first `bytes`.
    unsafe {
        for r in 0..rows as isize {
            let v = _mm512_maskz_loadu_epi8(mask, src.offset(r * src_rs) as *const i8);
            _mm512_mask_storeu_epi8(dst.offset(r * dst_rs) as *mut i8, mask, v);
        }
    }
}

/// The kernel: `M` rows (1 to 16) of C by `NV` vectors of 16 columns, `kp` k pairs, A's row
/// `i` at byte `a + i·a_rs`. With `whole_a`, all 16 rows of A's tile may be read (a packed
/// micro-panel, whose rows past `M` hold what the packing left there and only reach C's rows
/// past `M`, which are never stored); without it only `M` rows are, and shorter tiles are
/// copied first.
///
/// # Safety
/// As [`KernFn`] with `kc = kp` pairs: `a + i·a_rs` readable for `kp` pairs for `i < M` (for
/// `i < 16` with `whole_a`), `b` for `kp` rows of 128 bytes; `dst` as there; the CPU has
/// AVX-512BW and AMX-BF16, granted (`Level::AmxBf16`).
#[target_feature(enable = "avx512f,avx512bw")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_kernel<const M: usize, const NV: usize>(
    kp: usize,
    a: *const u8,
    a_rs: isize,
    whole_a: bool,
    b: *const u8,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    let direct_a = whole_a || M == TILE_ROWS;
    // A full-height C that is only written is stored in place; otherwise the sums go through
    // a scratch tile and are added to C's old values (if any) there, after all the products,
    // as every other kernel adds them: a product's bits do not depend on which kernel
    // variant or store path it took.
    let direct_c = M == TILE_ROWS && !load;
    // The scratch tiles are zeroed only where used: a full tile's call (the common one) would
    // otherwise clear 3 KiB for nothing. C's is written whole by `tilestored` before any read.
    let mut c_stage = MaybeUninit::<Stage<{ TILE_ROWS * C_STAGE_RS as usize }>>::uninit();
    let mut a_stage = MaybeUninit::<Stage<{ TILE_ROWS * ROW_BYTES }>>::uninit();
    let a_stage_p = if direct_a {
        std::ptr::null_mut()
    } else {
        a_stage
            .write(Stage([0u8; TILE_ROWS * ROW_BYTES]))
            .0
            .as_mut_ptr()
    };
    // SAFETY: every load and store below stays inside what the contract provides (A's rows
    // for whole 32-k steps, or `M` of them through the scratch; B's rows below `kp`; C's `M`
    // rows of `NV` vectors) or inside the scratch tiles.
    unsafe {
        configure();
        asm!("tilezero tmm4", "tilezero tmm5", options(nostack, nomem));
        let steps = kp / TILE_ROWS;
        for s in 0..steps {
            let a_s = a.add(s * ROW_BYTES);
            let b_s = b.add(s * TILE_ROWS * B_PAIR_BYTES);
            let b_s = (b_s, b_s.add(ROW_BYTES), B_PAIR_BYTES as isize);
            if direct_a {
                step::<NV>(a_s, a_rs, b_s);
            } else {
                copy_rows((a_s, a_rs), M, ROW_BYTES, (a_stage_p, ROW_BYTES as isize));
                step::<NV>(a_stage_p, ROW_BYTES as isize, b_s);
            }
        }
        let tail = kp % TILE_ROWS;
        if tail > 0 {
            // The last pairs, zero-padded to a whole step in both operands (a zero A column
            // meets a zero B row: no NaN from what lies past the operands).
            let a_t = Stage([0u8; TILE_ROWS * ROW_BYTES]);
            let a_tp = a_t.0.as_ptr() as *mut u8;
            let rows = if direct_a { TILE_ROWS } else { M };
            let a_s = a.add(steps * ROW_BYTES);
            copy_rows((a_s, a_rs), rows, tail * 4, (a_tp, ROW_BYTES as isize));
            let b_t = Stage([0u8; TILE_ROWS * B_PAIR_BYTES]);
            let b_tp = b_t.0.as_ptr() as *mut u8;
            let b_s = b.add(steps * TILE_ROWS * B_PAIR_BYTES);
            for v in 0..NV {
                let src = (b_s.add(v * ROW_BYTES), B_PAIR_BYTES as isize);
                let dst = (b_tp.add(v * TILE_ROWS * ROW_BYTES), ROW_BYTES as isize);
                copy_rows(src, tail, ROW_BYTES, dst);
            }
            let b1 = b_tp.add(TILE_ROWS * ROW_BYTES);
            step::<NV>(a_tp, ROW_BYTES as isize, (b_tp, b1, ROW_BYTES as isize));
        }
        let (c, c_rs) = if direct_c {
            (dst as *mut u8, dst_rs * 4)
        } else {
            (c_stage.as_mut_ptr() as *mut u8, C_STAGE_RS)
        };
        asm!("tilestored [{c} + {rs}*1], tmm4", c = in(reg) c, rs = in(reg) c_rs, options(nostack));
        if NV == 2 {
            let c1 = c.add(ROW_BYTES);
            asm!("tilestored [{c} + {rs}*1], tmm5", c = in(reg) c1, rs = in(reg) c_rs, options(nostack));
        }
        if !direct_c {
            for r in 0..M {
                let d = dst.offset(r as isize * dst_rs);
                for v in 0..NV {
                    let x = c.offset(r as isize * C_STAGE_RS).add(v * ROW_BYTES);
                    let x = _mm512_load_ps(x as *const f32);
                    let x = if load {
                        _mm512_add_ps(_mm512_loadu_ps(d.add(v * 16)), x)
                    } else {
                        x
                    };
                    _mm512_storeu_ps(d.add(v * 16), x);
                }
            }
        }
    }
}

/// [`tile_kernel`] on a packed A micro-panel: 16 rows of `kp` pairs each, row after row.
///
/// # Safety
/// As [`KernFn`] (with `kc` counting k pairs, A packed row by row); `Level::AmxBf16`.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn amx_kernel<const M: usize, const NV: usize>(
    kp: usize,
    a: *const f32,
    b: *const f32,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    // SAFETY: the packed micro-panel holds 16 rows of `kp` pairs, 4·kp bytes apart.
    unsafe {
        let a_rs = 4 * kp as isize;
        tile_kernel::<M, NV>(kp, a as _, a_rs, true, b as _, dst, dst_rs, load)
    }
}

/// [`tile_kernel`] reading A's rows where they lie, `a_rs` bytes apart.
///
/// # Safety
/// As [`RowsKernFn`] (with `kc` counting k pairs); `Level::AmxBf16`.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn amx_rows_kernel<const M: usize, const NV: usize>(
    kp: usize,
    a: *const f32,
    a_rs: isize,
    b: *const f32,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    // SAFETY: the contract provides `M` rows of `kp` pairs at `a`, `a_rs` apart.
    unsafe { tile_kernel::<M, NV>(kp, a as _, a_rs, false, b as _, dst, dst_rs, load) }
}

pub(in crate::gemm) static KERNELS_AMX: [[KernFn; 2]; TILE_ROWS] =
    kernel_table!(amx_kernel; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);

pub(in crate::gemm) static ROWS_KERNELS_AMX: [[RowsKernFn; 2]; TILE_ROWS] =
    rows_kernel_table!(amx_rows_kernel; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);

/// Rewrites a packed A micro-panel from k-pair-major (`src[q·16 + l]`, as `pack::panel` writes
/// it for the pair path) to row-major (`dst[l·kp + q]`), 16 × 16 pairs at a time.
///
/// # Safety
/// `src` readable for `kp · 16` u32, `dst` writable for `16 · kp` u32, not overlapping; the CPU
/// has AVX-512F.
#[target_feature(enable = "avx512f")]
pub(in crate::gemm) unsafe fn pairs_to_rows(src: *const u32, kp: usize, dst: *mut u32) {
    // SAFETY: rows `q < kp` of the source, and pairs `q < kp` of each destination row.
    unsafe {
        let mut q0 = 0;
        while q0 < kp {
            let qb = (kp - q0).min(16);
            let mut r = [_mm512_setzero_ps(); 16];
            for (q, x) in r.iter_mut().enumerate().take(qb) {
                *x = _mm512_loadu_ps(src.add((q0 + q) * 16) as *const f32);
            }
            super::pack::transpose16(&mut r);
            let mask = super::lanes::lane_mask(qb);
            for (l, &x) in r.iter().enumerate() {
                _mm512_mask_storeu_ps(dst.add(l * kp + q0) as *mut f32, mask, x);
            }
            q0 += 16;
        }
    }
}
