//! Products of FP8 matrices: [`gemm_fp8`].
//!
//! Both operands are widened to bf16 (exact: every E4M3 and E5M2 value is a bf16 value, see
//! [`crate::convert::fp8`]) and multiplied by the bf16 GEMM with an f32 C, so an FP8 product
//! runs at the bf16 rate (`vdpbf16ps` on bf16 pairs where [`crate::Level::Avx512Bf16`] is in
//! use, widening to f32 otherwise) and accumulates in f32. The widening is one vectorised pass
//! over each operand before the product (`O(k·(m + n))` against the product's `O(m·n·k)`),
//! not a step of the GEMM's packing: the packed panels are the bf16 GEMM's.
//!
//! Every product of two FP8 values is exact in f32 (at most 8 significant bits, exponents
//! from 2^-32 to 2^32), so the result differs from the exact product of the scaled operands
//! only by the f32 accumulation and the scale multiplications: at most `γ(k + 2)·Σ|a||b|`
//! per element, `γ(n) = n·u / (1 - n·u)`, `u = 2^-24`.

use half::bf16;

use crate::convert::{fp8_to_bf16, Fp8Format};
use crate::{gemm_epilogue_slices, Epilogue, GemmReport, MatMut, MatRef};

/// Below this many codes a slice is widened on the calling thread.
const PARALLEL_WIDEN: usize = 1 << 16;

/// Widens `src` into `dst` (resized to fit; its old contents are overwritten).
fn widen<F: Fp8Format>(src: &[F], dst: &mut Vec<bf16>) {
    dst.resize(src.len(), bf16::ZERO);
    if src.len() < PARALLEL_WIDEN {
        fp8_to_bf16(src, dst);
    } else {
        use rayon::prelude::*;
        dst.par_chunks_mut(PARALLEL_WIDEN)
            .zip(src.par_chunks(PARALLEL_WIDEN))
            .for_each(|(d, s)| fp8_to_bf16(s, d));
    }
}

thread_local! {
    /// The calling thread's bf16 copies of the two operands, kept between products so that
    /// repeated products of one shape neither allocate nor fault pages in (the largest pair of
    /// operands a thread multiplied stays allocated, 2 bytes per code).
    static WIDENED: std::cell::RefCell<(Vec<bf16>, Vec<bf16>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// `C[i, j] = (Σ_l A[i, l]·B[l, j]) · a_scale_inv[i] · b_scale_inv[j]` in f32, for FP8 `A`
/// (`m × k`) and `B` (`k × n`) in any strides; a scale slice of length 1 applies to every row
/// of A (or column of B), otherwise it has one entry per row of A (per column of B). With one
/// scale each, the two are multiplied once into the epilogue's `alpha`; otherwise each element
/// is multiplied by its row's, then its column's. The report says whether anything stored is
/// inf or NaN (as [`gemm_epilogue`](crate::gemm_epilogue)'s, before the per-row scaling).
///
/// # Panics
/// As [`gemm_epilogue_slices`]; and if a scale slice is neither of length 1 nor of A's row
/// count (B's column count).
pub fn gemm_fp8<FA: Fp8Format, FB: Fp8Format>(
    a: MatRef<'_, FA>,
    b: MatRef<'_, FB>,
    a_scale_inv: &[f32],
    b_scale_inv: &[f32],
    c: MatMut<'_, f32>,
    threads: usize,
) -> GemmReport {
    let (m, n) = (a.rows, b.cols);
    assert!(
        a_scale_inv.len() == 1 || a_scale_inv.len() == m,
        "gemm_fp8: {} scales for A's {m} rows",
        a_scale_inv.len()
    );
    assert!(
        b_scale_inv.len() == 1 || b_scale_inv.len() == n,
        "gemm_fp8: {} scales for B's {n} columns",
        b_scale_inv.len()
    );
    // A product inside a product (a rayon task of the GEMM calling back here) finds the
    // buffers borrowed and uses fresh ones.
    WIDENED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut bufs) => {
            let (aw, bw) = &mut *bufs;
            product(a, b, aw, bw, a_scale_inv, b_scale_inv, c, threads)
        }
        Err(_) => product(
            a,
            b,
            &mut Vec::new(),
            &mut Vec::new(),
            a_scale_inv,
            b_scale_inv,
            c,
            threads,
        ),
    })
}

#[allow(clippy::too_many_arguments)]
fn product<FA: Fp8Format, FB: Fp8Format>(
    a: MatRef<'_, FA>,
    b: MatRef<'_, FB>,
    aw: &mut Vec<bf16>,
    bw: &mut Vec<bf16>,
    a_scale_inv: &[f32],
    b_scale_inv: &[f32],
    c: MatMut<'_, f32>,
    threads: usize,
) -> GemmReport {
    let (m, n) = (a.rows, b.cols);
    widen(a.data, aw);
    widen(b.data, bw);
    let av = MatRef {
        data: &aw[..],
        rows: a.rows,
        cols: a.cols,
        rs: a.rs,
        cs: a.cs,
    };
    let bv = MatRef {
        data: &bw[..],
        rows: b.rows,
        cols: b.cols,
        rs: b.rs,
        cs: b.cs,
    };
    let per_tensor = a_scale_inv.len() == 1 && b_scale_inv.len() == 1;
    let epi = Epilogue {
        alpha: if per_tensor {
            a_scale_inv[0] * b_scale_inv[0]
        } else {
            1.0
        },
        ..Epilogue::STORE
    };
    let (rs, cs, rows, cols) = (c.rs, c.cs, c.rows, c.cols);
    let data = c.data;
    let report = gemm_epilogue_slices::<bf16, f32>(
        av,
        bv,
        MatMut {
            data: &mut *data,
            rows,
            cols,
            rs,
            cs,
        },
        &epi,
        threads,
    );
    if !per_tensor {
        let sa = |i: usize| a_scale_inv[if a_scale_inv.len() == 1 { 0 } else { i }];
        let sb = |j: usize| b_scale_inv[if b_scale_inv.len() == 1 { 0 } else { j }];
        for i in 0..m {
            for j in 0..n {
                let y = &mut data[i * rs + j * cs];
                *y = *y * sa(i) * sb(j);
            }
        }
    }
    report
}
