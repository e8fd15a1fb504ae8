//! One product as the driver carries it: type-erased (`Problem`, `Epi`), transposed where
//! that costs less, then run.

use super::tile::TileEpi;
use super::types::{Activation, Epilogue, GemmElem, Kind};

pub(super) fn zero<T: GemmElem>() -> T {
    // SAFETY: +0.0 is all-zero bits in all three formats.
    unsafe { std::mem::zeroed() }
}

/// The epilogue as the driver carries it: type-erased, with the bias as a strided vector that
/// follows the problem through transposition and splitting.
#[derive(Clone, Copy)]
pub(super) struct Epi {
    pub(super) alpha: f32,
    pub(super) accumulate: bool,
    pub(super) relu: bool,
    /// Null without a bias; else element `(i, j)` of this (sub-)problem's C gets
    /// `bias[i * bias_rs + j * bias_cs]`: strides (0, 1) as given, (1, 0) once transposed.
    pub(super) bias: *const f32,
    pub(super) bias_rs: isize,
    pub(super) bias_cs: isize,
    /// [`gemm()`]'s contract: an f32 C is its own running sum (C_old enters at the first k
    /// block), and nobody reads the non-finite flag.
    pub(super) legacy: bool,
    /// Whether the stores look for ±inf and NaN ([`Epilogue::report_non_finite`]).
    pub(super) check: bool,
}

impl Epi {
    pub(super) fn legacy(accumulate: bool) -> Epi {
        Epi {
            accumulate,
            legacy: true,
            check: false,
            ..Epi::new(&Epilogue::STORE)
        }
    }

    pub(super) fn new(e: &Epilogue<'_>) -> Epi {
        Epi {
            alpha: e.alpha,
            accumulate: e.accumulate,
            relu: e.activation == Activation::Relu,
            bias: e.bias.map_or(std::ptr::null(), |b| b.as_ptr()),
            bias_rs: 0,
            bias_cs: 1,
            legacy: false,
            check: e.report_non_finite,
        }
    }

    /// Only `C (+)= A·B`: the sum itself is what gets stored.
    pub(super) fn plain(&self) -> bool {
        self.alpha == 1.0 && self.bias.is_null() && !self.relu
    }

    /// The bias entry for `(i, j)` of this problem's C (null without a bias).
    pub(super) fn bias_at(&self, i: usize, j: usize) -> *const f32 {
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
    pub(super) fn tile(&self, i: usize, j: usize) -> TileEpi {
        TileEpi {
            alpha: self.alpha,
            scale: self.alpha != 1.0,
            add_c: self.accumulate,
            relu: self.relu,
            bias: self.bias_at(i, j),
            bias_rs: self.bias_rs,
            bias_cs: self.bias_cs,
            check: self.check,
        }
    }
}

/// Type-erased problem (element sizes are known from `kind` and `out`).
#[derive(Clone, Copy)]
pub(super) struct Problem {
    pub(super) m: usize,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) a: *const u8,
    pub(super) a_rs: isize,
    pub(super) a_cs: isize,
    pub(super) b: *const u8,
    pub(super) b_rs: isize,
    pub(super) b_cs: isize,
    pub(super) c: *mut u8,
    pub(super) c_rs: isize,
    pub(super) c_cs: isize,
    /// The element type the product runs in, which picks the kernels: A's and B's own, or
    /// bf16 for FP8 operands (widened exactly while they are packed).
    pub(super) kind: Kind,
    /// A's element type as stored (what its packing reads): `kind`, or an FP8 format.
    pub(super) a_kind: Kind,
    /// B's element type as stored.
    pub(super) b_kind: Kind,
    /// C's element type.
    pub(super) out: Kind,
    pub(super) epi: Epi,
}

// SAFETY: the pointers are only used for disjoint tiles of C (see `run`), reads of A, B and
// the bias, under `gemm`'s contract, which makes that sound from any thread.
unsafe impl Send for Problem {}
// SAFETY: as for `Send`; a shared `Problem` is only read.
unsafe impl Sync for Problem {}

impl Kind {
    pub(super) fn size(self) -> isize {
        match self {
            Kind::F32 => 4,
            Kind::F16 | Kind::Bf16 => 2,
            Kind::E4M3 | Kind::E5M2 => 1,
        }
    }
}

impl Problem {
    /// `Cᵀ = Bᵀ·Aᵀ`: the same memory, seen with swapped roles and strides.
    pub(super) fn transposed(self) -> Problem {
        Problem {
            m: self.n,
            n: self.m,
            a: self.b,
            a_rs: self.b_cs,
            a_cs: self.b_rs,
            b: self.a,
            b_rs: self.a_cs,
            b_cs: self.a_rs,
            a_kind: self.b_kind,
            b_kind: self.a_kind,
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
    pub(super) unsafe fn sub(&self, i0: usize, m: usize, j0: usize, n: usize) -> Problem {
        let (sa, sb, so) = (self.a_kind.size(), self.b_kind.size(), self.out.size());
        // SAFETY: row i0 of A, column j0 of B and element (i0, j0) of C (and its bias entry)
        // exist, by the contract.
        unsafe {
            Problem {
                m,
                n,
                a: self.a.offset(i0 as isize * self.a_rs * sa),
                b: self.b.offset(j0 as isize * self.b_cs * sb),
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
