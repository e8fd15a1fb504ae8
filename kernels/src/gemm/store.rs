//! Storing finished f32 tiles into C: the [`Epilogue`](super::Epilogue) arithmetic, the one
//! rounding into a 16-bit C, and the non-finite check on what was stored.
//!
//! Every path here (the AVX-512 one in `x86.rs`, the slice-conversion one, the element-wise
//! one) performs the same IEEE operations in the same order on each element, so which one runs
//! (C's layout, the level) never changes a result.

use super::elem::{load1, narrow, store1, widen};
use super::problem::Problem;
use super::tile::{TileEpi, TILE_MR, TILE_NR};
use super::types::Kind;
use crate::level::Level;

/// Whether a stored element (bits of `kind` at `d`) is ±inf or NaN: all exponent bits set.
///
/// # Safety
/// `d` readable as one `kind` element.
#[inline(always)]
unsafe fn stored_non_finite(kind: Kind, d: *const u8) -> bool {
    // SAFETY: the caller's contract.
    unsafe {
        match kind {
            Kind::F32 => *(d as *const u32) & 0x7F80_0000 == 0x7F80_0000,
            Kind::F16 => *(d as *const u16) & 0x7C00 == 0x7C00,
            Kind::Bf16 => *(d as *const u16) & 0x7F80 == 0x7F80,
            Kind::E4M3 | Kind::E5M2 => unreachable!("C is never FP8"),
        }
    }
}

/// `C[r, j] = round(e(src[r, j]))` for a `rows × cols` tile (at most `TILE_MR × TILE_NR`)
/// whose f32 sums are at `src`, rows `src_rs` apart; C's element `(r, j)` is at `c + (r·c_rs +
/// j·c_cs)·size`. Returns whether any stored element is non-finite, where `e.check` asks:
/// stores beyond the plain sum look either way (one compiled form each, and the strided
/// scalar path), and their answer is dropped here when nobody asked.
///
/// # Safety
/// `src` readable for the tile; C's elements of the tile writable (and readable with
/// `e.add_c`) and distinct; `e.bias`, if not null, readable for the tile; `lvl` supported by
/// the CPU.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn store_tile(
    lvl: Level,
    out: Kind,
    src: *const f32,
    src_rs: usize,
    rows: usize,
    cols: usize,
    c: *mut u8,
    c_rs: isize,
    c_cs: isize,
    e: &TileEpi,
) -> bool {
    debug_assert!(rows <= TILE_MR && cols <= TILE_NR);
    debug_assert!(e.bias.is_null() || matches!((e.bias_rs, e.bias_cs), (0, 1) | (1, 0)));
    let esz = out.size();
    let looked = 'store: {
        // SAFETY: every access below is to an element (r, j) of the tile, r < rows, j < cols,
        // of `src`, C and the bias, all covered by the contract.
        unsafe {
            #[cfg(target_arch = "x86_64")]
            if lvl >= Level::Avx512 && (c_cs == 1 || c_rs == 1) {
                // One call per tile, masked vectors for the ragged edge: with a short k (im2col,
                // a 10-wide layer) the store is a large share of the work.
                break 'store if c_cs == 1 {
                    super::x86::store_rows_avx512(out, src, src_rs, rows, cols, c, c_rs, e)
                } else {
                    super::x86::store_cols_avx512(out, src, src_rs, rows, cols, c, c_cs, e)
                };
            }
            #[cfg(target_arch = "x86_64")]
            if lvl >= Level::Avx2 && c_cs == 1 {
                break 'store super::avx2::store_rows_avx2(
                    out, src, src_rs, rows, cols, c, c_rs, e,
                );
            }
            let mut non_finite = false;
            if c_cs == 1 {
                // Contiguous rows: vector conversions on each row.
                for r in 0..rows {
                    let cr = c.offset(r as isize * c_rs * esz);
                    let bias = e.bias_at(r, 0);
                    non_finite |=
                        store_run(lvl, out, src.add(r * src_rs), cols, cr, bias, e.bias_cs, e);
                }
            } else if c_rs == 1 {
                // Contiguous columns (C seen transposed): one run per column.
                let mut buf = [0.0f32; TILE_MR];
                for j in 0..cols {
                    for (r, x) in buf.iter_mut().enumerate().take(rows) {
                        *x = *src.add(r * src_rs + j);
                    }
                    let cj = c.offset(j as isize * c_cs * esz);
                    let bias = e.bias_at(0, j);
                    non_finite |= store_run(lvl, out, buf.as_ptr(), rows, cj, bias, e.bias_rs, e);
                }
            } else {
                for r in 0..rows {
                    for j in 0..cols {
                        let cp = c.offset((r as isize * c_rs + j as isize * c_cs) * esz);
                        let old = if e.add_c { load1(out, cp) } else { 0.0 };
                        let bias = e.bias_at(r, j);
                        let b = if bias.is_null() { 0.0 } else { *bias };
                        store1(out, cp, e.apply(*src.add(r * src_rs + j), old, b));
                        non_finite |= stored_non_finite(out, cp);
                    }
                }
            }
            non_finite
        }
    };
    // Stores beyond the plain sum look either way; the answer counts only where asked.
    looked && e.check
}

/// One contiguous run of C (`n <= TILE_NR` elements at `c`) from the f32 sums at `vals`, the
/// bias entry of element `t` at `bias + t·bias_step` (null: none). Through the slice
/// conversions, so vectorised where the level allows.
///
/// # Safety
/// `vals` readable for `n` f32; C's run writable (and readable with `e.add_c`); the bias, if
/// not null, readable at every `t < n`; `lvl` supported by the CPU.
#[allow(clippy::too_many_arguments)]
unsafe fn store_run(
    lvl: Level,
    out: Kind,
    vals: *const f32,
    n: usize,
    c: *mut u8,
    bias: *const f32,
    bias_step: isize,
    e: &TileEpi,
) -> bool {
    debug_assert!(n <= TILE_NR);
    let mut buf = [0.0f32; TILE_NR];
    let mut old = [0.0f32; TILE_NR];
    // SAFETY: the contract covers `n` elements of `vals`, C's run and the bias; `buf` and
    // `old` hold TILE_NR >= n.
    unsafe {
        if e.add_c {
            widen(lvl, out, c, old.as_mut_ptr(), n);
        }
        for t in 0..n {
            let b = if bias.is_null() {
                0.0
            } else {
                *bias.offset(t as isize * bias_step)
            };
            buf[t] = e.apply(*vals.add(t), old[t], b);
        }
        narrow(lvl, out, buf.as_ptr(), c, n);
        e.check && (0..n).any(|t| stored_non_finite(out, c.offset(t as isize * out.size())))
    }
}

/// Whether any element of an f32 `rows × cols` tile of C (rows `c_rs` apart, columns
/// contiguous) is non-finite: the check for tiles the kernels wrote into C directly.
///
/// # Safety
/// The tile readable; `lvl` supported by the CPU.
pub(super) unsafe fn tile_non_finite(
    lvl: Level,
    c: *const f32,
    c_rs: isize,
    rows: usize,
    cols: usize,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if lvl >= Level::Avx512 {
        // SAFETY: the caller's contract, and the CPU has AVX-512F/BW/VL.
        return unsafe { super::x86::tile_non_finite_avx512(c, c_rs, rows, cols) };
    }
    #[cfg(target_arch = "x86_64")]
    if lvl >= Level::Avx2 {
        // SAFETY: the caller's contract, and the CPU has AVX2.
        return unsafe { super::avx2::tile_non_finite_avx2(c, c_rs, rows, cols) };
    }
    let _ = lvl;
    (0..rows).any(|r| {
        (0..cols).any(|j| {
            // SAFETY: (r, j) is inside the tile.
            let x = unsafe { *c.offset(r as isize * c_rs + j as isize) };
            !x.is_finite()
        })
    })
}

/// C for `k == 0`, element by element: `A·B` is an empty sum, `+0`, and the epilogue still
/// applies (`alpha·0`, C_old, bias, activation). Returns whether any stored element is
/// non-finite.
///
/// # Safety
/// `p` satisfies `gemm`'s contract for C, and a bias has one entry per column.
pub(super) unsafe fn k_empty(p: &Problem) -> bool {
    let e = p.epi.tile(0, 0);
    let esz = p.out.size();
    let mut non_finite = false;
    for i in 0..p.m {
        for j in 0..p.n {
            // SAFETY: (i, j) is an element of C, and column j has a bias entry.
            unsafe {
                let cp =
                    p.c.offset((i as isize * p.c_rs + j as isize * p.c_cs) * esz);
                let old = if e.add_c { load1(p.out, cp) } else { 0.0 };
                let bias = e.bias_at(i, j);
                let b = if bias.is_null() { 0.0 } else { *bias };
                store1(p.out, cp, e.apply(0.0, old, b));
                non_finite |= e.check && stored_non_finite(p.out, cp);
            }
        }
    }
    non_finite
}
