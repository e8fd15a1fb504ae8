//! Products of FP8 matrices with their scales: [`gemm_fp8`].
//!
//! The codes are widened exactly to bf16 while the GEMM packs them
//! ([`gemm_fp8_epilogue`](crate::gemm_fp8_epilogue): every E4M3 and E5M2 value is a bf16
//! value, see [`crate::convert::fp8`]) and multiplied as the bf16 GEMM multiplies bf16 (with
//! `vdpbf16ps` on bf16 pairs where [`crate::Level::Avx512Bf16`] is in use, widened to f32
//! otherwise), accumulating in f32; the product reads one byte per operand element and
//! writes no widened copy.
//!
//! Every product of two FP8 values is exact in f32 (at most 8 significant bits, exponents
//! from 2^-32 to 2^32), so the result differs from the exact product of the scaled operands
//! only by the f32 accumulation and the scale multiplications: at most `γ(k + 2)·Σ|a||b|`
//! per element, `γ(n) = n·u / (1 - n·u)`, `u = 2^-24`.

use crate::convert::Fp8Format;
use crate::{gemm_fp8_epilogue, Epilogue, GemmReport, MatMut, MatRef};

/// `C[i, j] = (Σ_l A[i, l]·B[l, j]) · a_scale_inv[i] · b_scale_inv[j]` in f32, for FP8 `A`
/// (`m × k`) and `B` (`k × n`) in any strides; a scale slice of length 1 applies to every row
/// of A (or column of B), otherwise it has one entry per row of A (per column of B). With one
/// scale each, the two are multiplied once into the epilogue's `alpha`; otherwise each element
/// is multiplied by its row's, then its column's. The report says whether anything stored is
/// inf or NaN (as [`gemm_epilogue`](crate::gemm_epilogue)'s, before the per-row scaling).
///
/// # Panics
/// As [`gemm_epilogue_slices`](crate::gemm_epilogue_slices); and if a scale slice is neither
/// of length 1 nor of A's row count (B's column count).
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
    let per_tensor = a_scale_inv.len() == 1 && b_scale_inv.len() == 1;
    let epi = Epilogue {
        alpha: if per_tensor {
            a_scale_inv[0] * b_scale_inv[0]
        } else {
            1.0
        },
        report_non_finite: true,
        ..Epilogue::STORE
    };
    let (rs, cs, rows, cols) = (c.rs, c.cs, c.rows, c.cols);
    let data = c.data;
    let report = gemm_fp8_epilogue(
        a,
        b,
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
