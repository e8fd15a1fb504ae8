//! Products too small for packing to pay: read A and B where they lie and keep the sums in
//! registers, one tile of C at a time, then store each tile through `store::store_tile` (the
//! same epilogue, rounding and non-finite check as every other path).
//!
//! A transformer's attention runs one product per (sample, head): `QKᵀ`, `PV` and their four
//! backward products, each about 17 × 17 × 16 for the main job's ViT (12,288 of them a step).
//! Through the blocked driver each cost 0.8–1.1 µs (8–12 GFLOP/s on an AVX2 core): packing its
//! panels, padding 17 columns to 32 and the calls around them outweighed the 4,600
//! multiply-adds.
//!
//! Every element of C sums its terms from zero in k order with fused multiply-adds, the
//! old C (with `accumulate`) added after, exactly as the micro-kernels do for a k of one block
//! (which is all this path takes): a product gives the same bits whichever path runs it.
//!
//! B's rows are read in place when contiguous (`b_cs == 1`, or A's columns, by computing
//! `Cᵀ = Bᵀ·Aᵀ`); when B's columns are (`QKᵀ`, `dO·Vᵀ`), each block of columns is first
//! transposed into a small buffer. Anything else, deeper than one k block, larger than
//! [`SMALL_MAX_MACS`] or on the bf16-pair path, goes to the blocked driver.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
#[cfg(target_arch = "x86_64")]
use std::mem::MaybeUninit;

use std::sync::atomic::{AtomicBool, Ordering};

use super::arch::Arch;
#[cfg(target_arch = "x86_64")]
use super::avx2::{load8, load_n, pack_transpose};
use super::problem::Problem;
#[cfg(target_arch = "x86_64")]
use super::types::{TAG_BF16 as BF16, TAG_F16 as F16, TAG_F32 as F32};
#[cfg(target_arch = "x86_64")]
use super::{elem::load1, store::store_tile};
#[cfg(target_arch = "x86_64")]
use super::{Kind, TILE_MR, TILE_NR};
use crate::level::Level;

/// Products of at most this many multiply-adds (`m·n·k`) run here. Measured on a 2-core Zen 3
/// (AVX2) with `kernels/examples/small_products.rs`: the attention's layouts run 1.3–1.7×
/// faster than through the driver; the two paths meet between 32 × 16 × 32 and 40 × 20 × 40
/// (from run to run 0.7–1.3× there).
const SMALL_MAX_MACS: usize = 1 << 15;

/// The deepest k this path takes: one k block of the driver's f32 products (16-bit ones take
/// 512), so that the driver would sum every element in one chain too.
const SMALL_MAX_K: usize = 256;

static SMALL_PRODUCTS: AtomicBool = AtomicBool::new(true);

/// Tests and benchmarks only: with `false`, every product goes through the blocked driver, so
/// that the two paths can be compared (they must give the same bits) and timed.
#[doc(hidden)]
pub fn set_small_products(on: bool) {
    SMALL_PRODUCTS.store(on, Ordering::Relaxed);
}

/// Runs `p` here if it is small and laid out for it (returns whether any stored element is
/// non-finite); `None` leaves it to the blocked driver.
///
/// # Safety
/// As the driver's `run` (`p` a valid problem under `gemm()`'s contract, `p.k > 0`).
pub(super) unsafe fn try_run(arch: &Arch, p: &Problem) -> Option<bool> {
    let macs = p.m.saturating_mul(p.n).saturating_mul(p.k);
    if arch.level < Level::Avx2
        || arch.pairs
        || p.a_kind != p.kind
        || p.b_kind != p.kind
        || macs > SMALL_MAX_MACS
        || p.k > SMALL_MAX_K
        || !SMALL_PRODUCTS.load(Ordering::Relaxed)
    {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract; the level is at least AVX2, which is only detected (or
    // forced) on a CPU with AVX2, FMA and F16C.
    unsafe {
        if p.b_cs == 1 {
            return Some(tiles(arch.level, p, false));
        }
        if p.a_rs == 1 {
            // `Cᵀ = Bᵀ·Aᵀ` addresses the same elements, with Aᵀ's rows (B's role) contiguous.
            return Some(tiles(arch.level, &p.transposed(), false));
        }
        if p.b_rs == 1 {
            return Some(tiles(arch.level, p, true));
        }
    }
    None
}

/// Rows of C per kernel call.
#[cfg(target_arch = "x86_64")]
const ROWS: usize = 4;
/// Vectors of eight columns per kernel call (at most), and the columns of a block.
#[cfg(target_arch = "x86_64")]
const VECTORS: usize = 3;
#[cfg(target_arch = "x86_64")]
const WIDTH: usize = VECTORS * 8;

/// B's side of a kernel call: the address of `B[0, j]` for the block's first column `j`, the
/// row stride in elements (columns are contiguous) and the element type.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct BRows {
    at: *const u8,
    rs: isize,
    kind: Kind,
}

/// All of C in blocks of [`WIDTH`] columns and [`TILE_MR`] rows: the kernel fills a tile
/// [`ROWS`] rows at a time, then one store writes it to C. With `transpose`, B's columns are
/// contiguous instead of its rows, and each block of columns is first copied (widened to f32)
/// into a buffer with contiguous rows.
///
/// # Safety
/// As [`try_run`], with `p.b_cs == 1` (or `p.b_rs == 1` with `transpose`) and
/// `p.k <= SMALL_MAX_K`; the CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiles(level: Level, p: &Problem, transpose: bool) -> bool {
    let mut tile = [0.0f32; TILE_MR * TILE_NR];
    let mut bbuf = [MaybeUninit::<f32>::uninit(); SMALL_MAX_K * WIDTH];
    let (esz, csz) = (p.kind.size(), p.out.size());
    let mut non_finite = false;
    // SAFETY: blocks cover rows < m and columns < n of C. The transposition reads B's
    // `cols` columns (each contiguous along k < p.k) and writes rows k < p.k <= SMALL_MAX_K,
    // lanes < cols <= WIDTH of the buffer, which is all the kernel reads of it. The kernel
    // writes ROWS rows of the tile from row r0 <= TILE_MR - ROWS, VECTORS·8 <= TILE_NR
    // columns; the store reads the tile's first `rows × cols`.
    unsafe {
        let mut j = 0;
        while j < p.n {
            let cols = WIDTH.min(p.n - j);
            let b = if transpose {
                let dst = bbuf.as_mut_ptr() as *mut f32;
                let src = p.b.offset(j as isize * p.b_cs * esz);
                pack_transpose(p.kind, src, p.b_cs, cols, p.k, dst, WIDTH);
                BRows {
                    at: dst as *const u8,
                    rs: WIDTH as isize,
                    kind: Kind::F32,
                }
            } else {
                BRows {
                    at: p.b.offset(j as isize * esz),
                    rs: p.b_rs,
                    kind: p.kind,
                }
            };
            let mut i = 0;
            while i < p.m {
                let rows = TILE_MR.min(p.m - i);
                let mut r0 = 0;
                while r0 < rows {
                    let t = tile.as_mut_ptr().add(r0 * TILE_NR);
                    kernel(p, i + r0, ROWS.min(rows - r0), b, cols, t);
                    r0 += ROWS;
                }
                let cp =
                    p.c.offset((i as isize * p.c_rs + j as isize * p.c_cs) * csz);
                non_finite |= store_tile(
                    level,
                    p.out,
                    tile.as_ptr(),
                    TILE_NR,
                    rows,
                    cols,
                    cp,
                    p.c_rs,
                    p.c_cs,
                    &p.epi.tile(i, j),
                );
                i += TILE_MR;
            }
            j += WIDTH;
        }
    }
    non_finite
}

/// [`axpy`] for the element types of A and B, and the vectors `cols` needs.
///
/// # Safety
/// As [`axpy`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel(p: &Problem, i: usize, rows: usize, b: BRows, cols: usize, tile: *mut f32) {
    macro_rules! by_vectors {
        ($ka:expr, $kb:expr) => {
            match cols.div_ceil(8) {
                1 => axpy::<{ $ka }, { $kb }, 1>(p, i, rows, b, cols, tile),
                2 => axpy::<{ $ka }, { $kb }, 2>(p, i, rows, b, cols, tile),
                _ => axpy::<{ $ka }, { $kb }, 3>(p, i, rows, b, cols, tile),
            }
        };
    }
    // SAFETY: the caller's contract, handed on with the matching element types.
    unsafe {
        match (p.kind, b.kind) {
            (Kind::F32, _) => by_vectors!(F32, F32),
            (Kind::F16, Kind::F32) => by_vectors!(F16, F32),
            (Kind::F16, _) => by_vectors!(F16, F16),
            (Kind::Bf16, Kind::F32) => by_vectors!(BF16, F32),
            (Kind::Bf16, _) => by_vectors!(BF16, BF16),
            // `try_run` leaves FP8 operands to the blocked driver.
            (Kind::E4M3 | Kind::E5M2, _) => unreachable!("an FP8 operand in a small product"),
        }
    }
}

/// `tile[r][c] = Σ_k A[i+r, k]·B[k, j+c]` for `r < rows`, `c < cols` (`j` the block's first
/// column, where `b.at` points), from zero in k order, with `NV = ceil(cols / 8)` vectors per
/// row. Rows past `rows` repeat row `i` (their sums land in the tile, never in C); lanes past
/// `cols` are not read.
///
/// # Safety
/// `1 <= rows <= ROWS`, `i + rows <= p.m`, `1 <= cols <= WIDTH` with `cols.div_ceil(8) ==
/// NV`; A's element type is `KA`, and `b` addresses `p.k` rows of `cols` contiguous `KB`
/// elements; `p` valid; `tile` writable for `ROWS` rows of `TILE_NR`; AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy<const KA: u8, const KB: u8, const NV: usize>(
    p: &Problem,
    i: usize,
    rows: usize,
    b: BRows,
    cols: usize,
    tile: *mut f32,
) {
    let (ka, kb) = (Kind::of_tag(KA), Kind::of_tag(KB));
    let (asz, bsz) = (ka.size(), kb.size());
    let tail = cols - (NV - 1) * 8;
    let mut acc = [[_mm256_setzero_ps(); NV]; ROWS];
    // SAFETY: rows `i..i + rows` (the others repeat row i) and k < p.k of A; rows k < p.k of
    // B's block, `cols` lanes each (the last vector reads only `tail`); the tile's first ROWS
    // rows.
    unsafe {
        let a_row: [*const u8; ROWS] = std::array::from_fn(|r| {
            let r = if r < rows { i + r } else { i };
            p.a.offset(r as isize * p.a_rs * asz)
        });
        for k in 0..p.k {
            let b_row = b.at.offset(k as isize * b.rs * bsz);
            let mut bv = [_mm256_setzero_ps(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                let at = b_row.offset(v as isize * 8 * bsz);
                *x = if v + 1 < NV {
                    load8(kb, at)
                } else {
                    load_n(kb, at, tail)
                };
            }
            for (acc_r, a_r) in acc.iter_mut().zip(&a_row) {
                let a = _mm256_set1_ps(load1(ka, a_r.offset(k as isize * p.a_cs * asz)));
                for (x, &bx) in acc_r.iter_mut().zip(&bv) {
                    *x = _mm256_fmadd_ps(a, bx, *x);
                }
            }
        }
        for (r, acc_r) in acc.iter().enumerate() {
            for (v, &x) in acc_r.iter().enumerate() {
                _mm256_storeu_ps(tile.add(r * TILE_NR + v * 8), x);
            }
        }
    }
}
