//! Blocked matrix products in the style of BLIS / Goto: pack a block of B and a block of A into
//! contiguous micro-panels (widening 16-bit inputs to f32 on the way), then sweep an `MR × NR`
//! register-blocked micro-kernel over them. Every finished f32 tile goes through one store
//! routine (`store.rs`), which applies the [`Epilogue`] and rounds once into C.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

use half::{bf16, f16};
use rayon::prelude::*;

use crate::level::{level, Level};

#[cfg(target_arch = "x86_64")]
mod avx2;
mod pack;
mod store;
#[cfg(target_arch = "x86_64")]
mod x86;

use store::{store_tile, tile_non_finite, TileEpi};

/// Which element type a [`GemmElem`] or [`GemmOut`] is; lets the driver stay non-generic.
#[doc(hidden)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    F32,
    F16,
    Bf16,
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}

    /// Seals [`super::GemmOut`]: the pairs (input, output) the store paths implement.
    pub trait SealedOut<T> {}
    impl SealedOut<f32> for f32 {}
    impl SealedOut<half::f16> for half::f16 {}
    impl SealedOut<half::bf16> for half::bf16 {}
    impl SealedOut<half::f16> for f32 {}
    impl SealedOut<half::bf16> for f32 {}
}

/// An element type [`gemm()`] multiplies: `f32`, [`half::f16`] or [`half::bf16`]. Products of
/// the 16-bit types are accumulated in `f32` and rounded once, to nearest even, when stored.
pub trait GemmElem: Copy + Send + Sync + 'static + sealed::Sealed {
    #[doc(hidden)]
    const KIND: Kind;
}
impl GemmElem for f32 {
    const KIND: Kind = Kind::F32;
}
impl GemmElem for f16 {
    const KIND: Kind = Kind::F16;
}
impl GemmElem for bf16 {
    const KIND: Kind = Kind::Bf16;
}

/// An element type [`gemm_epilogue`] can write the product of two `T` matrices into: `T`
/// itself, or `f32` for 16-bit `T` (the f32 accumulation is then stored without any 16-bit
/// rounding, as a mixed-precision backward wants for an FP32 gradient buffer).
pub trait GemmOut<T: GemmElem>: Copy + Send + Sync + 'static + sealed::SealedOut<T> {
    #[doc(hidden)]
    const OUT: Kind;
}
impl GemmOut<f32> for f32 {
    const OUT: Kind = Kind::F32;
}
impl GemmOut<f16> for f16 {
    const OUT: Kind = Kind::F16;
}
impl GemmOut<bf16> for bf16 {
    const OUT: Kind = Kind::Bf16;
}
impl GemmOut<f16> for f32 {
    const OUT: Kind = Kind::F32;
}
impl GemmOut<bf16> for f32 {
    const OUT: Kind = Kind::F32;
}

/// The activation an [`Epilogue`] applies, in f32, before the single rounding into C.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// The value unchanged.
    #[default]
    None,
    /// `if x < 0 { +0.0 } else { x }`: negative values become +0; NaN stays NaN (so that a
    /// non-finite product is never hidden from [`GemmReport::non_finite`]) and −0 stays −0
    /// (the `vmaxps(0, x)` convention).
    Relu,
}

/// What happens to each element of `A·B` on its way into C, for [`gemm_epilogue`]:
///
/// `C[i, j] = round(act(alpha·(A·B)[i, j] + C_old[i, j] + bias[j]))`
///
/// evaluated left to right in f32, one IEEE operation at a time (no fused multiply-add), where
/// `(A·B)[i, j]` is the f32 accumulation of the products, `C_old` is C's previous value
/// widened to f32 (only with `accumulate`), `bias[j]` is added only with a bias, `alpha·` is
/// skipped when `alpha == 1` (multiplying by 1 changes no value), and `round` is the identity
/// for an f32 C and round-to-nearest-even for a 16-bit C, the only rounding to 16 bits.
#[derive(Clone, Copy, Debug)]
pub struct Epilogue<'a> {
    /// Scale of the product (`1 / loss_scale` for an unscaled weight gradient).
    pub alpha: f32,
    /// Add C's old value (widened to f32) instead of overwriting it.
    pub accumulate: bool,
    /// `bias[j]` added to every element of column `j` of C; its length must be C's column
    /// count `n`.
    pub bias: Option<&'a [f32]>,
    /// Applied last, in f32, before the rounding.
    pub activation: Activation,
}

impl Epilogue<'static> {
    /// `C = A·B`.
    pub const STORE: Epilogue<'static> = Epilogue {
        alpha: 1.0,
        accumulate: false,
        bias: None,
        activation: Activation::None,
    };
    /// `C += A·B`.
    pub const ACCUMULATE: Epilogue<'static> = Epilogue {
        accumulate: true,
        ..Epilogue::STORE
    };
}

impl Default for Epilogue<'_> {
    /// [`Epilogue::STORE`].
    fn default() -> Self {
        Epilogue::STORE
    }
}

/// What [`gemm_epilogue`] saw while storing C.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GemmReport {
    /// Some element stored into C is ±inf or NaN (after the rounding, so a 16-bit overflow
    /// counts), over all threads. A loss-scaled backward can skip its separate scan of the
    /// gradient for overflow.
    pub non_finite: bool,
}

/// A read-only strided matrix view over a slice, for [`gemm_slices`]: element `(i, j)` is
/// `data[i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a, T> {
    /// The elements; every `(i, j)` with `i < rows`, `j < cols` must index into it.
    pub data: &'a [T],
    /// Number of rows.
    pub rows: usize,
    /// Number of columns.
    pub cols: usize,
    /// Row stride, in elements.
    pub rs: usize,
    /// Column stride, in elements.
    pub cs: usize,
}

/// A writable strided matrix view over a slice, for [`gemm_epilogue_slices`]: element
/// `(i, j)` is `data[i * rs + j * cs]`, and distinct elements must be distinct slots.
#[derive(Debug)]
pub struct MatMut<'a, T> {
    /// The elements; every `(i, j)` with `i < rows`, `j < cols` must index into it.
    pub data: &'a mut [T],
    /// Number of rows.
    pub rows: usize,
    /// Number of columns.
    pub cols: usize,
    /// Row stride, in elements.
    pub rs: usize,
    /// Column stride, in elements.
    pub cs: usize,
}

/// A view's checked strides, as the raw entry points take them.
#[derive(Clone, Copy)]
struct Strides {
    rs: isize,
    cs: isize,
}

/// Checks that a `rows × cols` view with strides `(rs, cs)` stays inside `len` elements, and
/// returns its strides as `isize`. Panics, naming the operand, if it does not or if the last
/// offset overflows `usize` (which unchecked arithmetic would wrap into a small, "valid"
/// index). A dimension of length 0 or 1 never multiplies its stride by a non-zero index, so its
/// stride is replaced by 0: any value is accepted there, including one above `isize::MAX`.
fn checked_view(what: &str, len: usize, rows: usize, cols: usize, rs: usize, cs: usize) -> Strides {
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
fn check_distinct(rows: usize, cols: usize, rs: usize, cs: usize) {
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
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert!(
        c.rows == m && c.cols == n,
        "gemm: C is {} × {}, the product {m} × {n}",
        c.rows,
        c.cols
    );
    let sa = checked_view("A", a.data.len(), m, k, a.rs, a.cs);
    let sb = checked_view("B", b.data.len(), k, n, b.rs, b.cs);
    let sc = checked_view("C", c.data.len(), m, n, c.rs, c.cs);
    check_distinct(m, n, c.rs, c.cs);
    // SAFETY: as in `gemm_slices`; C's `&mut` borrow also keeps it apart from the bias (a
    // `&` borrow inside `epi`), whose length `gemm_epilogue` checks itself.
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
            c.data.as_mut_ptr(),
            sc.rs,
            sc.cs,
            epi,
            threads,
        )
    }
}

static BF16_PAIR_EMULATION: AtomicBool = AtomicBool::new(false);

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
    let _timing = crate::timing::scope(crate::timing::Kind::Products);
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
    if let Some(bias) = epi.bias {
        assert_eq!(
            bias.len(),
            n,
            "gemm: the bias needs one element per column of C"
        );
    }
    if m == 0 || n == 0 {
        return GemmReport::default();
    }
    let _timing = crate::timing::scope(crate::timing::Kind::Products);
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
        out: C::OUT,
        epi: Epi::new(epi),
    };
    // SAFETY: the caller's contract is `drive`'s; the bias has `n` elements (checked above).
    let non_finite = unsafe {
        if k == 0 {
            store::k_empty(&p)
        } else {
            drive(p, threads)
        }
    };
    GemmReport { non_finite }
}

fn zero<T: GemmElem>() -> T {
    // SAFETY: +0.0 is all-zero bits in all three formats.
    unsafe { std::mem::zeroed() }
}

/// The epilogue as the driver carries it: type-erased, with the bias as a strided vector that
/// follows the problem through transposition and splitting.
#[derive(Clone, Copy)]
struct Epi {
    alpha: f32,
    accumulate: bool,
    relu: bool,
    /// Null without a bias; else element `(i, j)` of this (sub-)problem's C gets
    /// `bias[i * bias_rs + j * bias_cs]`: strides (0, 1) as given, (1, 0) once transposed.
    bias: *const f32,
    bias_rs: isize,
    bias_cs: isize,
    /// [`gemm()`]'s contract: an f32 C is its own running sum (C_old enters at the first k
    /// block), and nobody reads the non-finite flag.
    legacy: bool,
}

impl Epi {
    fn legacy(accumulate: bool) -> Epi {
        Epi {
            accumulate,
            legacy: true,
            ..Epi::new(&Epilogue::STORE)
        }
    }

    fn new(e: &Epilogue<'_>) -> Epi {
        Epi {
            alpha: e.alpha,
            accumulate: e.accumulate,
            relu: e.activation == Activation::Relu,
            bias: e.bias.map_or(std::ptr::null(), |b| b.as_ptr()),
            bias_rs: 0,
            bias_cs: 1,
            legacy: false,
        }
    }

    /// Only `C (+)= A·B`: the sum itself is what gets stored.
    fn plain(&self) -> bool {
        self.alpha == 1.0 && self.bias.is_null() && !self.relu
    }

    /// The bias entry for `(i, j)` of this problem's C (null without a bias).
    fn bias_at(&self, i: usize, j: usize) -> *const f32 {
        if self.bias.is_null() {
            return self.bias;
        }
        // SAFETY: (i, j) is an element of C, and the bias has one entry per column of the
        // caller's C (rows once transposed), so the offset stays inside it.
        unsafe {
            self.bias
                .offset(i as isize * self.bias_rs + j as isize * self.bias_cs)
        }
    }

    /// The whole epilogue for a tile whose `(0, 0)` is `(i, j)` of this problem's C.
    fn tile(&self, i: usize, j: usize) -> TileEpi {
        TileEpi {
            alpha: self.alpha,
            scale: self.alpha != 1.0,
            add_c: self.accumulate,
            relu: self.relu,
            bias: self.bias_at(i, j),
            bias_rs: self.bias_rs,
            bias_cs: self.bias_cs,
            check: !self.legacy,
        }
    }
}

/// Type-erased problem (element sizes are known from `kind` and `out`).
#[derive(Clone, Copy)]
struct Problem {
    m: usize,
    n: usize,
    k: usize,
    a: *const u8,
    a_rs: isize,
    a_cs: isize,
    b: *const u8,
    b_rs: isize,
    b_cs: isize,
    c: *mut u8,
    c_rs: isize,
    c_cs: isize,
    /// A's and B's element type, which picks the kernels.
    kind: Kind,
    /// C's element type.
    out: Kind,
    epi: Epi,
}

// SAFETY: the pointers are only used for disjoint tiles of C (see `run`), reads of A, B and
// the bias, under `gemm`'s contract, which makes that sound from any thread.
unsafe impl Send for Problem {}
// SAFETY: as for `Send`; a shared `Problem` is only read.
unsafe impl Sync for Problem {}

impl Kind {
    fn size(self) -> isize {
        match self {
            Kind::F32 => 4,
            Kind::F16 | Kind::Bf16 => 2,
        }
    }
}

impl Problem {
    /// `Cᵀ = Bᵀ·Aᵀ`: the same memory, seen with swapped roles and strides.
    fn transposed(self) -> Problem {
        Problem {
            m: self.n,
            n: self.m,
            a: self.b,
            a_rs: self.b_cs,
            a_cs: self.b_rs,
            b: self.a,
            b_rs: self.a_cs,
            b_cs: self.a_rs,
            c_rs: self.c_cs,
            c_cs: self.c_rs,
            epi: Epi {
                bias_rs: self.epi.bias_cs,
                bias_cs: self.epi.bias_rs,
                ..self.epi
            },
            ..self
        }
    }

    /// The sub-problem for rows `i0..i0+m` and columns `j0..j0+n` of C.
    ///
    /// # Safety
    /// `i0 + m <= self.m` and `j0 + n <= self.n` (and `self` a valid problem), so that the
    /// offset pointers stay inside the caller's matrices.
    unsafe fn sub(&self, i0: usize, m: usize, j0: usize, n: usize) -> Problem {
        let (s, so) = (self.kind.size(), self.out.size());
        // SAFETY: row i0 of A, column j0 of B and element (i0, j0) of C (and its bias entry)
        // exist, by the contract.
        unsafe {
            Problem {
                m,
                n,
                a: self.a.offset(i0 as isize * self.a_rs * s),
                b: self.b.offset(j0 as isize * self.b_cs * s),
                c: self
                    .c
                    .offset((i0 as isize * self.c_rs + j0 as isize * self.c_cs) * so),
                epi: Epi {
                    bias: self.epi.bias_at(i0, j0),
                    ..self.epi
                },
                ..*self
            }
        }
    }
}

/// Picks the kernels and the orientation, then runs the problem; returns whether any stored
/// element is non-finite.
///
/// # Safety
/// `p` satisfies [`gemm()`]'s contract (with `p.epi.accumulate`), `p.k > 0`, and a bias has
/// an entry for every column of C.
unsafe fn drive(p: Problem, threads: usize) -> bool {
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
    unsafe { run(&arch, &p, threads) }
}

/// Micro-kernel: multiplies a packed `kc`-long A micro-panel (`MR` per k step, the first `M`
/// used) by a packed B micro-panel (`NR` per k step, the first `NV` vectors used) and writes
/// (`load == false`) or adds (`load == true`) the `M × NV·VW` f32 result at `dst`, rows
/// `dst_rs` apart, columns contiguous. `kc` counts k steps, or k pairs for the bf16-pair path.
///
/// # Safety
/// `a` readable for `kc · MR` f32 (the path's `mr`), `b` for `kc · NR` f32; `dst` writable (and
/// readable with `load`) for `M` rows of `NV · VW` f32, `dst_rs` apart; the CPU has the
/// features of the path the kernel belongs to.
type KernFn =
    unsafe fn(kc: usize, a: *const f32, b: *const f32, dst: *mut f32, dst_rs: isize, load: bool);

/// One instruction-set path: block sizes and kernels.
struct Arch {
    level: Level,
    /// Rows of the micro-tile.
    mr: usize,
    /// f32 lanes in a vector.
    vw: usize,
    /// Vectors across the micro-tile (`NR = nvmax · vw`).
    nvmax: usize,
    /// k depth of a packed block (even for the pair path).
    kc: usize,
    /// Rows of A packed at once (a multiple of `mr`); the A block lives in L3.
    mc: usize,
    /// Columns of B packed at once (a multiple of `nr`); `kc × nc` f32 is sized to stay in L2
    /// while each A micro-panel sweeps across it.
    nc: usize,
    /// bf16 packed as (k, k+1) pairs for `vdpbf16ps`.
    pairs: bool,
    /// `kernels[M - 1][NV - 1]`.
    kernels: &'static [[KernFn; 2]],
}

impl Arch {
    fn nr(&self) -> usize {
        self.nvmax * self.vw
    }

    fn select(kind: Kind, lvl: Level) -> Arch {
        let pair_emulation = BF16_PAIR_EMULATION.load(Ordering::Relaxed);
        #[cfg(target_arch = "x86_64")]
        {
            if kind == Kind::Bf16 && lvl >= Level::Avx512Bf16 {
                return Arch {
                    level: lvl,
                    mr: 12,
                    vw: 16,
                    nvmax: 2,
                    kc: 512,
                    mc: 480,
                    nc: 256,
                    pairs: true,
                    kernels: &x86::KERNELS_AVX512_BF16,
                };
            }
            if kind == Kind::Bf16 && pair_emulation {
                return Arch::pair_emulation(lvl);
            }
            // 16-bit C needs an f32 running sum between k blocks (a round trip through
            // memory per block), so its blocks are deeper and narrower: the same B block size,
            // and the A micro-panel (12 × kc f32) still fits L1.
            // A 16-bit operand widened to f32 while packing takes twice its own size there: its
            // A block is half as tall, so that the per-thread packing buffers (kept between
            // calls) are no larger than f32's.
            let (kc, nc, mc) = if kind == Kind::F32 {
                (256, 512, 480)
            } else {
                (512, 256, 240)
            };
            if lvl >= Level::Avx512 {
                return Arch {
                    level: lvl,
                    mr: 12,
                    vw: 16,
                    nvmax: 2,
                    kc,
                    mc,
                    nc,
                    pairs: false,
                    kernels: &x86::KERNELS_AVX512,
                };
            }
            if lvl >= Level::Avx2 {
                return Arch {
                    level: lvl,
                    mr: 6,
                    vw: 8,
                    nvmax: 2,
                    kc,
                    mc,
                    nc,
                    pairs: false,
                    kernels: &x86::KERNELS_AVX2,
                };
            }
        }
        if kind == Kind::Bf16 && pair_emulation {
            return Arch::pair_emulation(lvl);
        }
        Arch {
            level: Level::Portable,
            mr: 4,
            vw: 8,
            nvmax: 1,
            kc: 256,
            mc: 480,
            nc: 512,
            pairs: false,
            kernels: &PORTABLE_KERNELS,
        }
    }

    fn pair_emulation(lvl: Level) -> Arch {
        Arch {
            level: lvl.min(Level::Avx512),
            mr: 12,
            vw: 16,
            nvmax: 2,
            kc: 512,
            mc: 480,
            nc: 256,
            pairs: true,
            kernels: &PAIR_EMULATION_KERNELS,
        }
    }
}

/// Work below this many flops (2·m·n·k) runs on the calling thread: rayon's fork and join cost
/// more than they save (see the benchmark's `threads` rows).
const PARALLEL_MIN_FLOPS: usize = 1 << 22;

/// Runs `p` on up to `threads` rayon tasks, each a disjoint rectangle of C; returns whether any
/// of them stored a non-finite element.
///
/// # Safety
/// As [`drive`].
unsafe fn run(arch: &Arch, p: &Problem, threads: usize) -> bool {
    // Saturating: with zero strides a safe caller can describe a huge k over a tiny slice.
    let flops =
        p.m.saturating_mul(p.n)
            .saturating_mul(p.k)
            .saturating_mul(2);
    let threads = threads.min(flops / PARALLEL_MIN_FLOPS).max(1);
    if threads == 1 {
        // SAFETY: the whole problem, on this thread.
        return unsafe { serial(arch, p) };
    }
    let (tm, tn) = split(arch, p, threads);
    let rows = chunks(p.m, tm, arch.mr);
    let cols = chunks(p.n, tn, arch.nr());
    let parts: Vec<(usize, usize, usize, usize)> = rows
        .iter()
        .flat_map(|&(i0, mi)| cols.iter().map(move |&(j0, nj)| (i0, mi, j0, nj)))
        .collect();
    parts
        .into_par_iter()
        .map(|(i0, mi, j0, nj)| {
            // SAFETY: the parts are disjoint rectangles inside C (`chunks` tiles 0..m and
            // 0..n), so no element is written by two tasks, and each sub-problem is valid.
            unsafe { serial(arch, &p.sub(i0, mi, j0, nj)) }
        })
        .reduce(|| false, |x, y| x | y)
}

/// Splits `len` into at most `parts` runs whose starts are multiples of `unit`.
fn chunks(len: usize, parts: usize, unit: usize) -> Vec<(usize, usize)> {
    let units = len.div_ceil(unit);
    let parts = parts.min(units).max(1);
    (0..parts)
        .map(|t| {
            let u0 = units * t / parts;
            let u1 = units * (t + 1) / parts;
            let start = u0 * unit;
            (start, (u1 * unit).min(len) - start)
        })
        .filter(|&(_, l)| l > 0)
        .collect()
}

/// A `tm × tn = threads` grid over C that keeps each thread's work (padded tiles) and packing
/// (its rows of A plus its columns of B, both read whole) small.
fn split(arch: &Arch, p: &Problem, threads: usize) -> (usize, usize) {
    let (mr, nr) = (arch.mr, arch.nr());
    (1..=threads)
        .filter(|&tm| threads.is_multiple_of(tm))
        .map(|tm| (tm, threads / tm))
        .min_by_key(|&(tm, tn)| {
            let mp = p.m.div_ceil(tm).div_ceil(mr) * mr;
            let np = p.n.div_ceil(tn).div_ceil(nr) * nr;
            // Packing an element costs about as much as a few multiply-adds per output row.
            mp * np + 8 * (mp + np)
        })
        .unwrap_or((threads, 1))
}

/// Per-thread packing buffers, reused across calls: a fresh multi-megabyte allocation per
/// product would be an mmap and page faults each time.
struct Buffers {
    a: Vec<f32>,
    b: Vec<f32>,
    s: Vec<f32>,
}

thread_local! {
    static BUFFERS: RefCell<Buffers> = const {
        RefCell::new(Buffers { a: Vec::new(), b: Vec::new(), s: Vec::new() })
    };
}

/// A 64-byte-aligned pointer to at least `len` f32 in `v`.
fn aligned(v: &mut Vec<f32>, len: usize) -> *mut f32 {
    if v.len() < len + 16 {
        *v = vec![0.0; len + 16];
    }
    let p = v.as_mut_ptr();
    let off = p.align_offset(64);
    // SAFETY: `off < 16` and the vector has 16 spare elements.
    unsafe { p.add(off) }
}

/// # Safety
/// As [`drive`], for this thread's (sub-)problem.
unsafe fn serial(arch: &Arch, p: &Problem) -> bool {
    BUFFERS.with(|cell| match cell.try_borrow_mut() {
        // SAFETY: the caller's contract.
        Ok(mut bufs) => unsafe { serial_with(arch, p, &mut bufs) },
        // Only reachable if a kernel were re-entered on this thread; stay correct regardless.
        // SAFETY: the caller's contract.
        Err(_) => unsafe {
            serial_with(
                arch,
                p,
                &mut Buffers {
                    a: Vec::new(),
                    b: Vec::new(),
                    s: Vec::new(),
                },
            )
        },
    })
}

/// The block size for `len` in blocks of at most `max`: as many blocks as `max` needs, made
/// equal (rounded up to `unit`), so that k = 784 runs as 4 × 196 rather than 3 × 256 plus a
/// 16-deep block that would cost a full pass over C for little work.
fn balanced(len: usize, max: usize, unit: usize) -> usize {
    let blocks = len.div_ceil(max).max(1);
    len.div_ceil(blocks).div_ceil(unit) * unit
}

#[repr(C, align(64))]
struct Tile([f32; TILE_MR * TILE_NR]);
const TILE_MR: usize = 12;
const TILE_NR: usize = 32;

/// The blocked loops for one thread: B block (`nc` columns × `kc` deep) packed once per k
/// block, A block (`mc` rows) per B block, then the micro-kernel over their micro-panels and
/// the store of each finished tile. Returns whether any stored element is non-finite.
///
/// # Safety
/// As [`drive`].
unsafe fn serial_with(arch: &Arch, p: &Problem, bufs: &mut Buffers) -> bool {
    let (mr, nr, vw) = (arch.mr, arch.nr(), arch.vw);
    debug_assert!(mr <= TILE_MR && nr <= TILE_NR);
    let kstep = if arch.pairs { 2 } else { 1 };
    let kc_max = balanced(p.k, arch.kc, kstep);
    // Packed panels hold k *steps* (pairs count once, two bf16 in one f32-sized slot).
    let kc_units_max = kc_max / kstep;
    let mc_max = balanced(p.m, arch.mc, mr);
    let nc_max = balanced(p.n, arch.nc, nr);
    let abuf = aligned(&mut bufs.a, mc_max * kc_units_max);
    let bbuf = aligned(&mut bufs.b, nc_max * kc_units_max);
    let multi_block = p.k > kc_max;
    let e = &p.epi;
    // An f32 C can hold its own running sum between k blocks when only the sum goes into it:
    // always for `gemm` (whose C_old enters the sum first), and for an epilogue whose C_old,
    // if any, is added once anyway (a single k block, where `C_old + s` is one addition).
    let in_place = p.out == Kind::F32
        && p.kind == Kind::F32
        && e.plain()
        && (e.legacy || !e.accumulate || !multi_block);
    // Otherwise f32 running sums live in a buffer between k blocks, so that the epilogue (and
    // the rounding of a 16-bit C) happens once, at the last block: `serial_running_sum`.
    if multi_block && !in_place {
        // SAFETY: the same contract.
        return unsafe { serial_running_sum(arch, p, bufs, (kc_max, mc_max, nc_max)) };
    }
    let (esz, csz) = (p.kind.size(), p.out.size());
    let mut tile = Tile([0.0; TILE_MR * TILE_NR]);
    let tile_p = tile.0.as_mut_ptr();
    let mut non_finite = false;

    // SAFETY: every pointer formed below is an offset of rows < m, columns < n and k < k of
    // the problem's matrices, which the contract makes addressable, or of the packing buffers
    // within the sizes allocated above (`mc_max × kc_units_max`, `nc_max × kc_units_max`); the
    // kernels write `mrr × nv·vw` f32 to a tile or (in place, full-width tiles only) C.
    unsafe {
        let mut jc = 0;
        while jc < p.n {
            let nc = nc_max.min(p.n - jc);
            let mut pc = 0;
            while pc < p.k {
                let kc = kc_max.min(p.k - pc);
                let kc_units = kc.div_ceil(kstep);
                let (first, last) = (pc == 0, pc + kc == p.k);
                let mut jr = 0;
                while jr < nc {
                    let nrr = nr.min(nc - jr);
                    let src =
                        p.b.offset((pc as isize * p.b_rs + (jc + jr) as isize * p.b_cs) * esz);
                    let dst = bbuf.add(jr / nr * nr * kc_units);
                    pack::panel(arch, p.kind, src, p.b_cs, p.b_rs, nrr, kc, dst, nr, true);
                    jr += nr;
                }
                let mut ic = 0;
                while ic < p.m {
                    let mc = mc_max.min(p.m - ic);
                    let mut ir = 0;
                    while ir < mc {
                        let mrr = mr.min(mc - ir);
                        let src =
                            p.a.offset(((ic + ir) as isize * p.a_rs + pc as isize * p.a_cs) * esz);
                        let dst = abuf.add(ir / mr * mr * kc_units);
                        pack::panel(arch, p.kind, src, p.a_rs, p.a_cs, mrr, kc, dst, mr, false);
                        ir += mr;
                    }
                    // The A micro-panel (MR × kc) stays in L1 while the B micro-panels stream
                    // from the L2-resident B block: the broadcast operand is the small one.
                    let mut ir = 0;
                    while ir < mc {
                        let mrr = mr.min(mc - ir);
                        let ap = abuf.add(ir / mr * mr * kc_units);
                        let mut jr = 0;
                        while jr < nc {
                            let nrr = nr.min(nc - jr);
                            let nv = nrr.div_ceil(vw);
                            let kern = arch.kernels[mrr - 1][nv - 1];
                            let bp = bbuf.add(jr / nr * nr * kc_units);
                            let (i, j) = (ic + ir, jc + jr);
                            let cp =
                                p.c.offset((i as isize * p.c_rs + j as isize * p.c_cs) * csz);
                            if in_place {
                                let beta = e.accumulate || !first;
                                if p.c_cs == 1 && nrr == nv * vw {
                                    kern(kc_units, ap, bp, cp as *mut f32, p.c_rs, beta);
                                    if last && !e.legacy {
                                        non_finite |= tile_non_finite(
                                            arch.level,
                                            cp as *const f32,
                                            p.c_rs,
                                            mrr,
                                            nrr,
                                        );
                                    }
                                } else {
                                    kern(kc_units, ap, bp, tile_p, TILE_NR as isize, false);
                                    let te = TileEpi::sum(beta, !e.legacy);
                                    let nf = store_tile(
                                        arch.level, p.out, tile_p, TILE_NR, mrr, nrr, cp, p.c_rs,
                                        p.c_cs, &te,
                                    );
                                    non_finite |= last && nf;
                                }
                            } else {
                                // A single k block (several go to `serial_running_sum`).
                                kern(kc_units, ap, bp, tile_p, TILE_NR as isize, false);
                                non_finite |= store_tile(
                                    arch.level,
                                    p.out,
                                    tile_p,
                                    TILE_NR,
                                    mrr,
                                    nrr,
                                    cp,
                                    p.c_rs,
                                    p.c_cs,
                                    &e.tile(i, j),
                                );
                            }
                            jr += nr;
                        }
                        ir += mr;
                    }
                    ic += mc;
                }
                pc += kc;
            }
            jc += nc;
        }
    }
    non_finite
}

/// [`serial_with`] for a product whose f32 running sums cannot live in C between k blocks (a
/// 16-bit C, or an epilogue beyond the plain sum): the k loop runs inside each `mc × nc` block
/// of C, so the sums need one block of f32 (`mc × nc`, under a megabyte), not the whole of C
/// (for a 4096 × 512 C, 8 MiB held by every thread). The B block is packed again for each row
/// block of A, about `m / mc` times in all: little beside the `m·n·k` multiply-adds.
///
/// # Safety
/// As [`serial_with`].
unsafe fn serial_running_sum(
    arch: &Arch,
    p: &Problem,
    bufs: &mut Buffers,
    (kc_max, mc_max, nc_max): (usize, usize, usize),
) -> bool {
    let (mr, nr, vw) = (arch.mr, arch.nr(), arch.vw);
    let kstep = if arch.pairs { 2 } else { 1 };
    let kc_units_max = kc_max / kstep;
    let abuf = aligned(&mut bufs.a, mc_max * kc_units_max);
    let bbuf = aligned(&mut bufs.b, nc_max * kc_units_max);
    let s_rs = nc_max.div_ceil(vw) * vw;
    let sbuf = aligned(&mut bufs.s, mc_max * s_rs);
    let (esz, csz) = (p.kind.size(), p.out.size());
    let e = &p.epi;
    let mut non_finite = false;
    // SAFETY: every pointer formed below is an offset of rows < m, columns < n and k < k of the
    // problem's matrices, which the contract makes addressable, or of the buffers within the
    // sizes allocated above; the kernels write `mrr × nv·vw` f32 into sbuf's block.
    unsafe {
        let mut jc = 0;
        while jc < p.n {
            let nc = nc_max.min(p.n - jc);
            let mut ic = 0;
            while ic < p.m {
                let mc = mc_max.min(p.m - ic);
                let mut pc = 0;
                while pc < p.k {
                    let kc = kc_max.min(p.k - pc);
                    let kc_units = kc.div_ceil(kstep);
                    let (first, last) = (pc == 0, pc + kc == p.k);
                    let mut jr = 0;
                    while jr < nc {
                        let nrr = nr.min(nc - jr);
                        let src =
                            p.b.offset((pc as isize * p.b_rs + (jc + jr) as isize * p.b_cs) * esz);
                        let dst = bbuf.add(jr / nr * nr * kc_units);
                        pack::panel(arch, p.kind, src, p.b_cs, p.b_rs, nrr, kc, dst, nr, true);
                        jr += nr;
                    }
                    let mut ir = 0;
                    while ir < mc {
                        let mrr = mr.min(mc - ir);
                        let src =
                            p.a.offset(((ic + ir) as isize * p.a_rs + pc as isize * p.a_cs) * esz);
                        let dst = abuf.add(ir / mr * mr * kc_units);
                        pack::panel(arch, p.kind, src, p.a_rs, p.a_cs, mrr, kc, dst, mr, false);
                        ir += mr;
                    }
                    let mut ir = 0;
                    while ir < mc {
                        let mrr = mr.min(mc - ir);
                        let ap = abuf.add(ir / mr * mr * kc_units);
                        let mut jr = 0;
                        while jr < nc {
                            let nrr = nr.min(nc - jr);
                            let nv = nrr.div_ceil(vw);
                            let kern = arch.kernels[mrr - 1][nv - 1];
                            let bp = bbuf.add(jr / nr * nr * kc_units);
                            let sp = sbuf.add(ir * s_rs + jr);
                            kern(kc_units, ap, bp, sp, s_rs as isize, !first);
                            if last {
                                let (i, j) = (ic + ir, jc + jr);
                                let cp =
                                    p.c.offset((i as isize * p.c_rs + j as isize * p.c_cs) * csz);
                                non_finite |= store_tile(
                                    arch.level,
                                    p.out,
                                    sp,
                                    s_rs,
                                    mrr,
                                    nrr,
                                    cp,
                                    p.c_rs,
                                    p.c_cs,
                                    &e.tile(i, j),
                                );
                            }
                            jr += nr;
                        }
                        ir += mr;
                    }
                    pc += kc;
                }
                ic += mc;
            }
            jc += nc;
        }
    }
    non_finite
}
// ---------------------------------------------------------------------------------------------
// Portable kernels: plain loops over fixed-size arrays, which the compiler keeps in vector
// registers for whatever the build target offers (SSE2 on x86-64, NEON on aarch64).

const PORTABLE_MR: usize = 4;
const PORTABLE_NR: usize = 8;

/// # Safety
/// As [`KernFn`], with `MR = 4`, `NR = 8`.
unsafe fn portable_kernel<const M: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    // SAFETY: the loads read `kc` steps of the packed panels and the stores write `M` rows at
    // `dst`, all inside what the contract provides.
    unsafe {
        let mut acc = [[0.0f32; PORTABLE_NR]; M];
        for p in 0..kc {
            let bv: [f32; PORTABLE_NR] = *(b.add(p * PORTABLE_NR) as *const [f32; PORTABLE_NR]);
            for (i, row) in acc.iter_mut().enumerate() {
                let av = *a.add(p * PORTABLE_MR + i);
                for (x, &bj) in row.iter_mut().zip(bv.iter()) {
                    // mul_add would be a libm call where the target has no FMA.
                    *x += av * bj;
                }
            }
        }
        store_acc(&acc, dst, dst_rs, load);
    }
}

/// # Safety
/// `dst` writable (and readable with `load`) for `M` rows of `W` f32, `dst_rs` apart.
#[inline(always)]
unsafe fn store_acc<const M: usize, const W: usize>(
    acc: &[[f32; W]; M],
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    // SAFETY: the contract.
    unsafe {
        for (i, row) in acc.iter().enumerate() {
            let d = dst.offset(i as isize * dst_rs);
            for (j, &x) in row.iter().enumerate() {
                *d.add(j) = if load { *d.add(j) + x } else { x };
            }
        }
    }
}

macro_rules! kernel_table {
    ($f:ident; $($m:literal),*) => {
        [$([$f::<$m, 1> as KernFn, $f::<$m, 2> as KernFn]),*]
    };
}
#[cfg(target_arch = "x86_64")]
pub(crate) use kernel_table;

/// # Safety
/// As [`KernFn`], with `MR = 4`, `NR = 8`.
unsafe fn portable_kernel_nv<const M: usize, const NV: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    // SAFETY: the same contract as `portable_kernel`'s.
    unsafe { portable_kernel::<M>(kc, a, b, dst, dst_rs, load) }
}

static PORTABLE_KERNELS: [[KernFn; 2]; PORTABLE_MR] = kernel_table!(portable_kernel_nv; 1, 2, 3, 4);

/// Scalar stand-in for the `vdpbf16ps` kernel, on the same pair-packed panels (12 × 32).
///
/// # Safety
/// As [`KernFn`] (`kc` counting k pairs), with `MR = 12`, `NR = 32`.
unsafe fn pair_emulation_kernel<const M: usize, const NV: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    // SAFETY: the loads read `kc` steps of the packed panels and the stores write `M` rows at
    // `dst`, all inside what the contract provides.
    unsafe {
        let (a, b) = (a as *const u32, b as *const u32);
        let mut acc = [[0.0f32; 32]; M];
        let lo = |x: u32| f32::from_bits(x << 16);
        let hi = |x: u32| f32::from_bits(x & 0xFFFF_0000);
        for p in 0..kc {
            for (i, row) in acc.iter_mut().enumerate() {
                let av = *a.add(p * 12 + i);
                for (j, x) in row.iter_mut().enumerate().take(NV * 16) {
                    let bv = *b.add(p * 32 + j);
                    // The order Intel documents for vdpbf16ps: odd element first.
                    *x += hi(av) * hi(bv);
                    *x += lo(av) * lo(bv);
                }
            }
        }
        for (i, row) in acc.iter().enumerate() {
            let d = dst.offset(i as isize * dst_rs);
            for (j, &x) in row.iter().enumerate().take(NV * 16) {
                *d.add(j) = if load { *d.add(j) + x } else { x };
            }
        }
    }
}

static PAIR_EMULATION_KERNELS: [[KernFn; 2]; 12] =
    kernel_table!(pair_emulation_kernel; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::level::detected_level;

    /// The vector pair packing changes where bits are copied, never the arithmetic: whole bf16
    /// products must come out bit for bit as with the scalar packing, for every layout.
    #[test]
    fn pair_packing_vector_and_scalar_products_identical() {
        let emulate = detected_level() < Level::Avx512Bf16;
        if emulate {
            set_bf16_pair_emulation(true);
        }
        let shapes = [
            (256, 512, 784),
            (256, 10, 512),
            (784, 512, 256),
            (37, 45, 300),
            (13, 33, 1025),
            (1, 17, 5),
            (19, 1, 4),
            (5, 7, 1),
        ];
        let mut seed = 1u32;
        let mut next = move || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            bf16::from_f32((seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5)
        };
        for (m, n, k) in shapes {
            let a: Vec<bf16> = (0..m * k).map(|_| next()).collect();
            let b: Vec<bf16> = (0..k * n).map(|_| next()).collect();
            let c0: Vec<bf16> = (0..m * n).map(|_| next()).collect();
            for (a_rs, a_cs) in [(k, 1), (1, m)] {
                for (b_rs, b_cs) in [(n, 1), (1, k)] {
                    for (c_rs, c_cs) in [(n, 1), (1, m)] {
                        for accumulate in [false, true] {
                            let product = |scalar: bool| {
                                pack::SCALAR_PAIRS.with(|f| f.set(scalar));
                                let mut c = c0.clone();
                                // SAFETY: the strides address m × k, k × n and m × n views of
                                // vectors of exactly that size; C is a distinct vector. One
                                // thread, so the flag above (thread-local) applies throughout.
                                unsafe {
                                    gemm(
                                        m,
                                        n,
                                        k,
                                        a.as_ptr(),
                                        a_rs as isize,
                                        a_cs as isize,
                                        b.as_ptr(),
                                        b_rs as isize,
                                        b_cs as isize,
                                        c.as_mut_ptr(),
                                        c_rs as isize,
                                        c_cs as isize,
                                        accumulate,
                                        1,
                                    )
                                };
                                pack::SCALAR_PAIRS.with(|f| f.set(false));
                                c.iter().map(|x| x.to_bits()).collect::<Vec<u16>>()
                            };
                            assert_eq!(
                                product(true),
                                product(false),
                                "m {m} n {n} k {k} A ({a_rs},{a_cs}) B ({b_rs},{b_cs}) \
                                 C ({c_rs},{c_cs}) acc {accumulate}"
                            );
                        }
                    }
                }
            }
        }
        if emulate {
            set_bf16_pair_emulation(false);
        }
    }
}
