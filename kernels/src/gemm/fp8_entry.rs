//! The FP8 product's entry point: [`gemm_fp8_epilogue`], FP8 operands of either format whose
//! codes the packing widens, exactly, to the bf16 the product then runs in.

use half::bf16;

use super::entry::{check_bias, check_distinct, checked_view, drive};
use super::problem::{Epi, Problem};
use super::types::{Epilogue, GemmOut, GemmReport, Kind, MatMut, MatRef};
use crate::convert::Fp8Format;

/// The [`Kind`] of an FP8 format (the sealed trait has two: E5M2's exponent has 5 bits).
fn kind_of<F: Fp8Format>() -> Kind {
    if F::EXPONENT_BITS == 5 {
        Kind::E5M2
    } else {
        Kind::E4M3
    }
}

/// `C = round(act(alpha·(A·B) + C_old + bias))` for FP8 codes `A` (`m × k`, format `FA`) and
/// `B` (`k × n`, format `FB`), in any strides, with the [`Epilogue`] arithmetic of
/// [`gemm_epilogue_slices`](crate::gemm_epilogue_slices) and a bf16 or f32 C.
///
/// The codes are read where they lie and widened while A and B are packed, to the bf16 a bf16
/// product would pack (exact: every FP8 value is a bf16 value; bf16 pairs for `vdpbf16ps`
/// where [`crate::Level::Avx512Bf16`] is in use, f32 lanes otherwise), so each product of two
/// codes is exact in f32 and the result has, bit for bit, the value of
/// `gemm_epilogue_slices::<bf16, C>` on the widened codes. The operands' dequantising scales
/// (`1 / scale` each, per tensor) go into `epi.alpha` as their product: one multiplication per
/// element of C, in the store, before the one rounding.
///
/// # Panics
/// As [`gemm_epilogue_slices`](crate::gemm_epilogue_slices).
pub fn gemm_fp8_epilogue<FA: Fp8Format, FB: Fp8Format, C: GemmOut<bf16>>(
    a: MatRef<'_, FA>,
    b: MatRef<'_, FB>,
    c: MatMut<'_, C>,
    epi: &Epilogue<'_>,
    threads: usize,
) -> GemmReport {
    assert_eq!(a.cols, b.rows, "gemm: inner dimensions differ");
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert!(
        c.rows == m && c.cols == n,
        "gemm: C is {} × {}, the product {m} × {n}",
        c.rows,
        c.cols
    );
    check_bias(epi, n);
    let sa = checked_view("A", a.data.len(), m, k, a.rs, a.cs);
    let sb = checked_view("B", b.data.len(), k, n, b.rs, b.cs);
    let sc = checked_view("C", c.data.len(), m, n, c.rs, c.cs);
    check_distinct(m, n, c.rs, c.cs);
    if m == 0 || n == 0 {
        return GemmReport::default();
    }
    let _timing = crate::timing::scope(crate::timing::Kind::Products);
    let p = Problem {
        m,
        n,
        k,
        a: a.data.as_ptr() as *const u8,
        a_rs: sa.rs,
        a_cs: sa.cs,
        b: b.data.as_ptr() as *const u8,
        b_rs: sb.rs,
        b_cs: sb.cs,
        c: c.data.as_mut_ptr() as *mut u8,
        c_rs: sc.rs,
        c_cs: sc.cs,
        kind: Kind::Bf16,
        a_kind: kind_of::<FA>(),
        b_kind: kind_of::<FB>(),
        out: C::OUT,
        epi: Epi::new(epi),
    };
    // SAFETY: every element of the three views lies inside its slice (checked above, without
    // overflow), FP8 codes are one byte each as their kinds say; distinct (i, j) of C are
    // distinct slots; C is a `&mut` borrow, so it overlaps neither A, B nor the bias, whose
    // length was checked.
    let non_finite = unsafe {
        if k == 0 {
            super::store::k_empty(&p)
        } else {
            drive(p, threads)
        }
    };
    GemmReport { non_finite }
}
