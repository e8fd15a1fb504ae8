//! The entry points: safe slice products with checked views, the raw `unsafe` ones, and the
//! bf16 pair-emulation switch.
use std::sync::atomic::Ordering;

use super::arch::{Arch, BF16_PAIR_EMULATION};
use super::driver::run;
use super::problem::{zero, Epi, Problem};
use super::small::try_run as try_run_small;
use super::types::{Epilogue, GemmElem, GemmOut, GemmReport, MatMut, MatRef};
use crate::level::level;

/// A view's checked strides, as the raw entry points take them.
#[derive(Clone, Copy)]
pub(super) struct Strides {
    pub(super) rs: isize,
    pub(super) cs: isize,
}

/// Checks that a `rows × cols` view with strides `(rs, cs)` stays inside `len` elements, and
/// returns its strides as `isize`. Panics, naming the operand, if it does not or if the last
/// offset overflows `usize` (which unchecked arithmetic would wrap into a small, "valid"
/// index). A dimension of length 0 or 1 never multiplies its stride by a non-zero index, so its
/// stride is replaced by 0: any value is accepted there, including one above `isize::MAX`.
pub(super) fn checked_view(
    what: &str,
    len: usize,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
) -> Strides {
    let rs = if rows <= 1 { 0 } else { rs };
    let cs = if cols <= 1 { 0 } else { cs };
    if rows > 0 && cols > 0 {
        let last = (rows - 1)
            .checked_mul(rs)
            .and_then(|r| (cols - 1).checked_mul(cs).and_then(|c| r.checked_add(c)));
        let Some(last) = last else {
            panic!("gemm: {what}'s strides ({rs}, {cs}) overflow usize for a {rows} × {cols} view");
        };
        assert!(
            last < len,
            "gemm: {what} is indexed up to {last} but has {len} elements"
        );
    }
    // Every stride left non-zero is at most `last < len <= isize::MAX` (a slice's length).
    Strides {
        rs: rs as isize,
        cs: cs as isize,
    }
}

/// Panics unless distinct `(i, j)` of a `rows × cols` view with strides `(rs, cs)` are
/// distinct offsets: otherwise two threads (or two k blocks) would write one element.
///
/// Sufficient condition, over the dimensions longer than 1 (the others only ever see index 0):
/// each has a non-zero stride, and with two of them, the larger stride is at least the smaller
/// stride times its length. Then `i₁·s₁ ≤ (n₁ − 1)·s₁ < s₂`, so the offset `i₁·s₁ + i₂·s₂` is
/// a mixed-radix number whose digits `(i₂, i₁)` it determines. (It rejects some injective
/// interleavings, e.g. strides (2, 3) on a 2 × 2 view, which no caller produces.)
pub(super) fn check_distinct(rows: usize, cols: usize, rs: usize, cs: usize) {
    if rows == 0 || cols == 0 {
        return;
    }
    // (stride, length) of the dimensions that take more than one index, smaller stride first.
    let mut dims = [(rs, rows), (cs, cols)];
    dims.sort_unstable();
    let ok = match dims {
        [(_, 1), (_, 1)] => true,
        [(s, _), (_, 1)] | [(_, 1), (s, _)] => s > 0,
        [(s1, n1), (s2, _)] => s1 > 0 && s1.checked_mul(n1).is_some_and(|ext| s2 >= ext),
    };
    assert!(
        ok,
        "gemm: C's strides ({rs}, {cs}) map distinct elements of its {rows} × {cols} view to \
         one location"
    );
}

/// Panics unless the epilogue's bias, if any, has one element per column of an `n`-column C.
pub(super) fn check_bias(epi: &Epilogue<'_>, n: usize) {
    if let Some(bias) = epi.bias {
        assert_eq!(
            bias.len(),
            n,
            "gemm: the bias needs one element per column of C"
        );
    }
}

/// Safe [`gemm()`]: `C = A·B`, or `C += A·B` with `accumulate`, where `C` (`a.rows ×
/// b.cols`) is `c[i * c_rs + j * c_cs]`.
///
/// # Panics
/// If the inner dimensions differ; if an index of A, B or C falls outside its slice, or the
/// largest index overflows `usize` (a huge stride); or if two elements of C could share a
/// location (a zero stride on a dimension longer than 1, or strides that interleave), which
/// would make the result depend on thread timing. C cannot overlap A or B: it is a `&mut`
/// borrow, which the borrow checker keeps apart from every `&` borrow the views hold.
#[allow(clippy::too_many_arguments)]
pub fn gemm_slices<T: GemmElem>(
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    c: &mut [T],
    c_rs: usize,
    c_cs: usize,
    accumulate: bool,
    threads: usize,
) {
    assert_eq!(a.cols, b.rows, "gemm: inner dimensions differ");
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let sa = checked_view("A", a.data.len(), m, k, a.rs, a.cs);
    let sb = checked_view("B", b.data.len(), k, n, b.rs, b.cs);
    let sc = checked_view("C", c.len(), m, n, c_rs, c_cs);
    check_distinct(m, n, c_rs, c_cs);
    // SAFETY: every element of the three views lies inside its slice (checked above, without
    // overflow, and the strides fit isize); distinct (i, j) of C are distinct slots, so the
    // writes (possibly from several threads, to disjoint tiles) cannot race; `c` is borrowed
    // mutably, so it overlaps neither `a.data` nor `b.data`.
    unsafe {
        gemm(
            m,
            n,
            k,
            a.data.as_ptr(),
            sa.rs,
            sa.cs,
            b.data.as_ptr(),
            sb.rs,
            sb.cs,
            c.as_mut_ptr(),
            sc.rs,
            sc.cs,
            accumulate,
            threads,
        )
    }
}

/// Safe [`gemm_epilogue`]: `C = act(alpha·A·B (+ C_old) (+ bias))`, rounded once, for an
/// `a.rows × b.cols` C; see [`Epilogue`] for the arithmetic.
///
/// # Panics
/// As [`gemm_slices`] (C is a `&mut` borrow, so it can overlap neither A, B nor the bias), and
/// if C's shape is not `a.rows × b.cols` or the bias's length is not `b.cols`.
pub fn gemm_epilogue_slices<T: GemmElem, C: GemmOut<T>>(
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    c: MatMut<'_, C>,
    epi: &Epilogue<'_>,
    threads: usize,
) -> GemmReport {
    assert_eq!(a.cols, b.rows, "gemm: inner dimensions differ");
    assert!(
        c.rows == a.rows && c.cols == b.cols,
        "gemm: C is {} × {}, the product {} × {}",
        c.rows,
        c.cols,
        a.rows,
        b.cols
    );
    // SAFETY: `c.data` is a `&mut` borrow, writable and readable for its length and apart
    // from A, B and the bias (`&` borrows).
    unsafe {
        epilogue_on_checked_views(
            a,
            b,
            (c.data.as_mut_ptr(), c.data.len(), c.rs, c.cs),
            epi,
            threads,
        )
    }
}

/// The safe epilogue entry points' common part, after they have checked that A's columns are
/// B's rows: the three views checked (every index inside its buffer, C's elements distinct),
/// then [`gemm_epilogue`].
///
/// # Safety
/// `c` writable for `c_len` elements (readable too with `epi.accumulate`), overlapping
/// neither A, B nor the bias.
unsafe fn epilogue_on_checked_views<T: GemmElem, C: GemmOut<T>>(
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    (c, c_len, c_rs, c_cs): (*mut C, usize, usize, usize),
    epi: &Epilogue<'_>,
    threads: usize,
) -> GemmReport {
    debug_assert_eq!(a.cols, b.rows);
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let sa = checked_view("A", a.data.len(), m, k, a.rs, a.cs);
    let sb = checked_view("B", b.data.len(), k, n, b.rs, b.cs);
    let sc = checked_view("C", c_len, m, n, c_rs, c_cs);
    check_distinct(m, n, c_rs, c_cs);
    // SAFETY: as in `gemm_slices`: every element of the three views lies inside its buffer
    // (checked above, without overflow), distinct (i, j) of C are distinct slots, and the
    // caller keeps C apart from A, B and the bias (whose length `gemm_epilogue` checks).
    unsafe {
        gemm_epilogue(
            m,
            n,
            k,
            a.data.as_ptr(),
            sa.rs,
            sa.cs,
            b.data.as_ptr(),
            sb.rs,
            sb.cs,
            c,
            sc.rs,
            sc.cs,
            epi,
            threads,
        )
    }
}

/// [`gemm_epilogue_slices`] into memory nobody has written yet: `C = act(alpha·A·B + bias)`
/// for an `a.rows × b.cols` C stored row-major and contiguous in `c[..a.rows * b.cols]`, which
/// may be uninitialised (a new buffer's spare capacity). On return every one of those elements
/// is initialised, so a caller may `set_len` over them: an output buffer needs no zero fill
/// first (a pass over memory as long as the product's store, which for the large products of
/// a training step cost as much as a tenth of it). The product only ever reads back elements
/// of C it has already written (an FP32 C's running sum across k blocks, the non-finite
/// check), never C's old value: `epi.accumulate` is refused.
///
/// # Panics
/// As [`gemm_epilogue_slices`]; if `epi.accumulate` is set; if `c` is shorter than
/// `a.rows * b.cols`.
pub fn gemm_epilogue_uninit<T: GemmElem, C: GemmOut<T>>(
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    c: &mut [std::mem::MaybeUninit<C>],
    epi: &Epilogue<'_>,
    threads: usize,
) -> GemmReport {
    assert!(
        !epi.accumulate,
        "gemm: a C nobody has written has no old value to accumulate into"
    );
    assert_eq!(a.cols, b.rows, "gemm: inner dimensions differ");
    let len = a
        .rows
        .checked_mul(b.cols)
        .expect("gemm: C's size overflows usize");
    assert!(
        c.len() >= len,
        "gemm: C needs {len} elements, the buffer has {}",
        c.len()
    );
    // SAFETY: C (row-major, `len` elements) lies inside `c`, a `&mut` borrow apart from A, B
    // and the bias. Without `accumulate`, `gemm()`'s contract asks C to be writable only: the
    // product writes every element (each tile once, or an FP32 C's first k block before the
    // later ones add to it) before it reads any back.
    unsafe {
        epilogue_on_checked_views(
            a,
            b,
            (c.as_mut_ptr().cast::<C>(), len, b.cols, 1),
            epi,
            threads,
        )
    }
}

/// Tests only: on a CPU without AVX512-BF16, run bf16 products through the bf16-pair packing
/// that the `vdpbf16ps` kernel uses, with a scalar stand-in for the instruction, so that the
/// packing is checked where the instruction cannot run.
#[doc(hidden)]
pub fn set_bf16_pair_emulation(on: bool) {
    BF16_PAIR_EMULATION.store(on, Ordering::Relaxed);
}

/// `C = A·B`, or `C += A·B` with `accumulate`, for an `m × k` matrix `A` and a `k × n` matrix
/// `B`; element `(i, j)` of `A` is `*a.offset(i * a_rs + j * a_cs)`, and likewise for `B`, `C`.
/// Strides are in elements and may be anything (transposed views are just swapped strides).
///
/// `f16` and `bf16` products are accumulated in `f32` (with `accumulate`, `C`'s old value is
/// widened and added to the finished sum) and rounded to nearest even once, when stored. An
/// `f32` C is its own running sum: with `accumulate` its old value enters the sum first. The
/// work is split over at most `threads` rayon tasks when it is large enough to gain from it.
///
/// # Safety
/// Every element of `A` and `B` addressed by the shapes and strides (`i < m`, `p < k`,
/// `j < n`) must be readable, and every element of `C` writable (and readable with
/// `accumulate`), for the whole call; distinct `(i, j)` of `C` must be distinct locations,
/// and `C` must not overlap `A` or `B`. Offsets in bytes must fit `isize` (as for
/// `pointer::offset`). Nothing else may access `C` during the call.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm<T: GemmElem>(
    m: usize,
    n: usize,
    k: usize,
    a: *const T,
    a_rs: isize,
    a_cs: isize,
    b: *const T,
    b_rs: isize,
    b_cs: isize,
    c: *mut T,
    c_rs: isize,
    c_cs: isize,
    accumulate: bool,
    threads: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    let _timing = crate::timing::product_scope(|| crate::timing::ProductShape {
        m,
        n,
        k,
        a: (a_rs, a_cs),
        b: (b_rs, b_cs),
        c: (c_rs, c_cs),
        accumulate,
    });
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    // SAFETY: (i, j) is an element of C, writable by the caller's contract.
                    unsafe { *c.offset(i as isize * c_rs + j as isize * c_cs) = zero::<T>() };
                }
            }
        }
        return;
    }
    let p = Problem {
        m,
        n,
        k,
        a: a as *const u8,
        a_rs,
        a_cs,
        b: b as *const u8,
        b_rs,
        b_cs,
        c: c as *mut u8,
        c_rs,
        c_cs,
        kind: T::KIND,
        a_kind: T::KIND,
        b_kind: T::KIND,
        out: T::KIND,
        epi: Epi::legacy(accumulate),
    };
    // SAFETY: the caller's contract is `drive`'s.
    unsafe { drive(p, threads) };
}

/// The product with an [`Epilogue`]: `C[i, j] = round(act(alpha·(A·B)[i, j] + C_old[i, j] +
/// bias[j]))`, rounded once (see [`Epilogue`] for the exact arithmetic), with C of element
/// type `C`: `T`, or `f32` for 16-bit `T`. Shapes and strides are as for [`gemm()`].
///
/// The f32 accumulation runs across k blocks and threads as in [`gemm()`]; the epilogue is
/// applied once per element, after the last k block, and C's old value is read once. Which
/// threads computed which elements does not change any result.
///
/// Returns whether any element stored into C is ±inf or NaN. With a NaN `alpha`, or NaN in
/// both an operand of an addition, which NaN's payload survives is unspecified (as in IEEE
/// 754); NaN stays NaN.
///
/// # Panics
/// If `epi.bias` is given and its length is not `n`.
///
/// # Safety
/// As [`gemm()`], with `epi.accumulate` in place of `accumulate`; in addition, C must not
/// overlap `epi.bias` (a shared borrow that C's writes would otherwise mutate).
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_epilogue<T: GemmElem, C: GemmOut<T>>(
    m: usize,
    n: usize,
    k: usize,
    a: *const T,
    a_rs: isize,
    a_cs: isize,
    b: *const T,
    b_rs: isize,
    b_cs: isize,
    c: *mut C,
    c_rs: isize,
    c_cs: isize,
    epi: &Epilogue<'_>,
    threads: usize,
) -> GemmReport {
    check_bias(epi, n);
    if m == 0 || n == 0 {
        return GemmReport::default();
    }
    let _timing = crate::timing::product_scope(|| crate::timing::ProductShape {
        m,
        n,
        k,
        a: (a_rs, a_cs),
        b: (b_rs, b_cs),
        c: (c_rs, c_cs),
        accumulate: epi.accumulate,
    });
    let p = Problem {
        m,
        n,
        k,
        a: a as *const u8,
        a_rs,
        a_cs,
        b: b as *const u8,
        b_rs,
        b_cs,
        c: c as *mut u8,
        c_rs,
        c_cs,
        kind: T::KIND,
        a_kind: T::KIND,
        b_kind: T::KIND,
        out: C::OUT,
        epi: Epi::new(epi),
    };
    // SAFETY: the caller's contract is `drive`'s; the bias has `n` elements (checked above).
    let non_finite = unsafe {
        if k == 0 {
            super::store::k_empty(&p)
        } else {
            drive(p, threads)
        }
    };
    GemmReport { non_finite }
}

/// Picks the kernels and the orientation, then runs the problem; returns whether any stored
/// element is non-finite.
///
/// # Safety
/// `p` satisfies [`gemm()`]'s contract (with `p.epi.accumulate`), `p.k > 0`, and a bias has
/// an entry for every column of C.
pub(super) unsafe fn drive(p: Problem, threads: usize) -> bool {
    let arch = Arch::select(p.kind, level());
    // Rows are padded to nothing (there is a kernel for every row count up to MR) but columns
    // to whole vectors: for a thin C (n = 10 in a classifier head), computing Cᵀ = Bᵀ·Aᵀ wastes
    // far less of the kernel. Tiles are written row by row, so a C whose rows are not
    // contiguous costs a little more to store.
    let pad = |x: usize| x.div_ceil(arch.vw) * arch.vw;
    let cost = |rows: usize, cols: usize, unit: bool| rows * pad(cols) * if unit { 4 } else { 5 };
    let p = if cost(p.n, p.m, p.c_rs == 1) < cost(p.m, p.n, p.c_cs == 1) {
        p.transposed()
    } else {
        p
    };
    // SAFETY: the transposed problem addresses the same elements.
    unsafe {
        if let Some(non_finite) = try_run_small(&arch, &p) {
            return non_finite;
        }
        if let Some(first) = super::k_pieces::split_at(&arch, &p) {
            return super::k_pieces::run_halves(&arch, &p, threads, first);
        }
        run(&arch, &p, threads)
    }
}
