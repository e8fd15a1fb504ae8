//! A right-hand operand packed once into the micro-kernels' B panels ([`PackedB`]) and products
//! that read any block of it ([`gemm_packed_b`]), on the calling thread.
//!
//! Attention multiplies each head's keys and values many times: the baby GPT's causal forward
//! uses a 64-key block of `Kᵀ` and of `V` for 2.5 query blocks on average, its backward five
//! such operands per block pair. Through the general entry every one of those products packed
//! its B again, went through the driver's blocking and stored its scores through a tile: 40%
//! of the attention's time, against 36% in the micro-kernels (`perf`, `cargo bench --bench
//! attention`, Zen 3). Packed once per head, each product is only the micro-kernels over the
//! panels it needs, written straight into C where C is FP32 and the epilogue is a plain sum.
//!
//! A product gives the bits [`gemm_epilogue`](super::gemm_epilogue) gives for the same
//! operands: the same kernels, the same k blocks, each element summed in the same order.

use std::cell::RefCell;

use super::arch::Arch;
use super::driver::balanced;
use super::entry::{check_bias, check_distinct, checked_view};
use super::problem::{Epi, Problem};
use super::store::k_empty;
use super::tile::{Tile, TILE_MR, TILE_NR};
use super::tile_run::{a_at, aligned, tile_in_place, tile_running_sum};
use super::types::{Epilogue, GemmElem, GemmOut, GemmReport, Kind, MatMut, MatRef};
use crate::level::{level, Level};

/// A `k × n` matrix packed into B micro-panels for the path its element type runs on (at the
/// kernel level of the moment it was packed), for [`gemm_packed_b`]. The buffer is kept
/// between [`PackedB::pack`] calls, so one `PackedB` can serve head after head without
/// allocating.
pub struct PackedB {
    buf: Vec<f32>,
    /// Where the 64-byte-aligned panels start in `buf`.
    start: usize,
    kind: Kind,
    level: Level,
    pairs: bool,
    nr: usize,
    rows: usize,
    cols: usize,
    /// Packed k steps per panel (k pairs count once on the bf16-pair path).
    units: usize,
}

impl Default for PackedB {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for PackedB {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedB")
            .field("kind", &self.kind)
            .field("level", &self.level)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish()
    }
}

impl PackedB {
    /// An empty (0 × 0) f32 matrix, packed for the level of the moment.
    pub fn new() -> Self {
        let arch = Arch::select(Kind::F32, level());
        PackedB {
            buf: Vec::new(),
            start: 0,
            kind: Kind::F32,
            level: arch.level,
            pairs: arch.pairs,
            nr: arch.nr(),
            rows: 0,
            cols: 0,
            units: 0,
        }
    }

    /// Rows (the products' k) of the packed matrix.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns of the packed matrix.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The columns of B a product may start at are multiples of this (the panels' width: 16,
    /// 32 or 64 by path, always a power of two that divides 64).
    pub fn column_align(&self) -> usize {
        self.nr
    }

    /// Packs `b` (widening 16-bit elements where the path multiplies in f32), replacing what
    /// this held.
    ///
    /// # Panics
    /// If an index of the view falls outside its slice (as [`gemm_slices`](super::gemm_slices)),
    /// or if the packed panels' size overflows (a view with zero strides can describe any size).
    pub fn pack<T: GemmElem>(&mut self, b: MatRef<'_, T>) {
        let s = checked_view("B", b.data.len(), b.rows, b.cols, b.rs, b.cs);
        let arch = Arch::select(T::KIND, level());
        let (nr, kstep) = (arch.nr(), if arch.pairs { 2 } else { 1 });
        let units = b.rows.div_ceil(kstep);
        let n_pad = b.cols.div_ceil(nr) * nr;
        *self = PackedB {
            buf: std::mem::take(&mut self.buf),
            start: 0,
            kind: T::KIND,
            level: arch.level,
            pairs: arch.pairs,
            nr,
            rows: b.rows,
            cols: b.cols,
            units,
        };
        // Zero strides let a one-element slice describe any size: the panels' size is checked.
        let len = n_pad
            .checked_mul(units)
            .filter(|&l| l.checked_mul(4).is_some_and(|b| b <= isize::MAX as usize))
            .unwrap_or_else(|| {
                panic!(
                    "gemm: a packed {} × {} B does not fit in memory",
                    b.rows, b.cols
                )
            });
        let dst = aligned(&mut self.buf, len);
        // SAFETY: `aligned` returned a pointer into `buf`.
        self.start = unsafe { dst.offset_from(self.buf.as_ptr()) } as usize;
        let bsz = T::KIND.size();
        let src = b.data.as_ptr() as *const u8;
        // SAFETY: every (k, j) packed lies in the checked view; each panel's k blocks (even
        // lengths but the last, on the pair path) land at their k step within the panel's
        // `units · nr` slots, inside the `n_pad · units` that `aligned` provides.
        unsafe {
            for jr in (0..b.cols).step_by(nr) {
                let lanes = nr.min(b.cols - jr);
                let panel = dst.add(jr * units);
                let mut pc = 0;
                while pc < b.rows {
                    let kc = arch.kc.min(b.rows - pc);
                    let at = (pc as isize * s.rs + jr as isize * s.cs) * bsz;
                    super::pack::panel(
                        &arch,
                        T::KIND,
                        src.offset(at),
                        s.cs,
                        s.rs,
                        lanes,
                        kc,
                        panel.add(pc / kstep * nr),
                        nr,
                        true,
                    );
                    pc += kc;
                }
            }
        }
    }
}

thread_local! {
    /// Per-thread buffer for A's micro-panel where A cannot be read in place.
    static A_PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `C = epilogue(A · B[k0..k0 + k, j0..j0 + n])` for an `m × k` A and the `m × n` C, with B's
/// block taken from `b` (packed by [`PackedB::pack`] from elements of A's type), on the
/// calling thread. The arithmetic is [`gemm_epilogue_slices`](super::gemm_epilogue_slices)'s,
/// bit for bit.
///
/// # Panics
/// As [`gemm_epilogue_slices`](super::gemm_epilogue_slices) for A, C and the bias; and if `b`
/// was packed from another element type or for another kernel path (the level was forced in
/// between), if the block reaches past `b`, if `j0` is not a multiple of
/// [`PackedB::column_align`], or, on the bf16-pair path, if `k0` is odd or the block ends at an
/// odd row before `b`'s last.
pub fn gemm_packed_b<T: GemmElem, C: GemmOut<T>>(
    a: MatRef<'_, T>,
    b: &PackedB,
    (k0, j0): (usize, usize),
    c: MatMut<'_, C>,
    epilogue: &Epilogue<'_>,
) -> GemmReport {
    let (m, k, n) = (a.rows, a.cols, c.cols);
    assert_eq!(c.rows, m, "gemm: C has {} rows, A {m}", c.rows);
    assert!(
        b.kind == T::KIND,
        "gemm: B was packed as {:?}, A is {:?}",
        b.kind,
        T::KIND
    );
    let arch = Arch::select(T::KIND, b.level);
    assert!(
        arch.pairs == b.pairs && arch.nr() == b.nr,
        "gemm: B was packed for another kernel path (the level or the pair emulation changed)"
    );
    assert!(
        k0.checked_add(k).is_some_and(|e| e <= b.rows)
            && j0.checked_add(n).is_some_and(|e| e <= b.cols),
        "gemm: the block at ({k0}, {j0}) of {k} × {n} reaches past the packed {} × {}",
        b.rows,
        b.cols
    );
    assert!(
        j0.is_multiple_of(b.nr),
        "gemm: the block's first column {j0} is not a multiple of {}",
        b.nr
    );
    assert!(
        !b.pairs || (k0.is_multiple_of(2) && (k.is_multiple_of(2) || k0 + k == b.rows)),
        "gemm: on the bf16-pair path the block's rows must start and end on a k pair"
    );
    check_bias(epilogue, n);
    let sa = checked_view("A", a.data.len(), m, k, a.rs, a.cs);
    let sc = checked_view("C", c.data.len(), m, n, c.rs, c.cs);
    check_distinct(m, n, c.rs, c.cs);
    if m == 0 || n == 0 {
        return GemmReport::default();
    }
    let _timing = crate::timing::product_scope(|| crate::timing::ProductShape {
        m,
        n,
        k,
        a: (sa.rs, sa.cs),
        b: (0, 0),
        c: (sc.rs, sc.cs),
        accumulate: epilogue.accumulate,
    });
    let p = Problem {
        m,
        n,
        k,
        a: a.data.as_ptr() as *const u8,
        a_rs: sa.rs,
        a_cs: sa.cs,
        b: std::ptr::null(),
        b_rs: 0,
        b_cs: 0,
        c: c.data.as_mut_ptr() as *mut u8,
        c_rs: sc.rs,
        c_cs: sc.cs,
        kind: T::KIND,
        a_kind: T::KIND,
        b_kind: T::KIND,
        out: C::OUT,
        epi: Epi::new(epilogue),
    };
    // SAFETY: A's and C's views are checked, C is a `&mut` borrow apart from A, B's panels and
    // the bias; the block lies inside B's panels (checked above), whose layout is this arch's.
    let non_finite = unsafe {
        if k == 0 {
            k_empty(&p)
        } else {
            A_PANEL.with(|cell| match cell.try_borrow_mut() {
                Ok(mut buf) => run(&arch, &p, b, (k0, j0), &mut buf),
                Err(_) => run(&arch, &p, b, (k0, j0), &mut Vec::new()),
            })
        }
    };
    GemmReport { non_finite }
}

/// The tiles of `p` (B unset: its block at `(k0, j0)` of `b`), row panel by row panel.
///
/// # Safety
/// `p` valid under `gemm()`'s contract for A and C, `p.k > 0`; the block of `b` as
/// [`gemm_packed_b`] checks; `arch` the path `b` was packed for.
unsafe fn run(
    arch: &Arch,
    p: &Problem,
    b: &PackedB,
    (k0, j0): (usize, usize),
    abuf: &mut Vec<f32>,
) -> bool {
    let (mr, nr, vw) = (arch.mr, arch.nr(), arch.vw);
    debug_assert!(mr <= TILE_MR && nr <= TILE_NR);
    let kstep = if arch.pairs { 2 } else { 1 };
    // The k blocks the driver would use for this k, so that each element's sum is grouped
    // (and so rounded) as there.
    let kc_max = balanced(p.k, arch.kc, arch.k_unit());
    let multi_block = p.k > kc_max;
    let e = &p.epi;
    let in_place = p.out == Kind::F32 && e.plain() && (!e.accumulate || !multi_block);
    let a_rows = arch.a_rows(p);
    let abuf = aligned(abuf, mr * p.k.div_ceil(kstep));
    let asz = p.a_kind.size();
    let csz = p.out.size();
    let mut tile = Tile([0.0; TILE_MR * TILE_NR]);
    let tile_p = tile.0.as_mut_ptr();
    let mut non_finite = false;
    // SAFETY: rows < m, columns < n and k < k of the problem address A and C inside their
    // views; B's panel for column `j0 + jr` starts `(j0 + jr) · units` slots into the buffer
    // and its k step `k0 / kstep + u` a further `u · nr`, with `u` below the block's steps,
    // inside the panel (checked by the caller); the A panel holds `mr` lanes for every k step.
    unsafe {
        let panels = b.buf.as_ptr().add(b.start);
        let mut ir = 0;
        while ir < p.m {
            let mrr = mr.min(p.m - ir);
            if a_rows.is_none() {
                let mut pc = 0;
                while pc < p.k {
                    let kc = kc_max.min(p.k - pc);
                    let src =
                        p.a.offset((ir as isize * p.a_rs + pc as isize * p.a_cs) * asz);
                    let dst = abuf.add(pc / kstep * mr);
                    super::pack::panel(
                        arch, p.a_kind, src, p.a_rs, p.a_cs, mrr, kc, dst, mr, false,
                    );
                    pc += kc;
                }
            }
            let mut jr = 0;
            while jr < p.n {
                let nrr = nr.min(p.n - jr);
                let kern = arch.micro(a_rows, mrr, nrr.div_ceil(vw));
                let bp = panels.add((j0 + jr) * b.units + k0 / kstep * nr);
                let cp =
                    p.c.offset((ir as isize * p.c_rs + jr as isize * p.c_cs) * csz);
                let mut pc = 0;
                while pc < p.k {
                    let kc = kc_max.min(p.k - pc);
                    let kc_units = kc.div_ceil(kstep);
                    let (first, last) = (pc == 0, pc + kc == p.k);
                    let ap = match a_rows {
                        Some(_) => a_at(p, ir, pc),
                        None => abuf.add(pc / kstep * mr),
                    };
                    let bpk = bp.add(pc / kstep * nr);
                    if in_place {
                        non_finite |= tile_in_place(
                            arch,
                            p,
                            kern,
                            (kc_units, ap, bpk),
                            cp,
                            (mrr, nrr),
                            (first, last),
                            tile_p,
                        );
                    } else {
                        // The running sum stays in the tile between k blocks.
                        non_finite |= tile_running_sum(
                            arch,
                            p,
                            kern,
                            (kc_units, ap, bpk),
                            (tile_p, TILE_NR),
                            (cp, ir, jr),
                            (mrr, nrr),
                            (first, last),
                        );
                    }
                    pc += kc;
                }
                jr += nr;
            }
            ir += mr;
        }
    }
    non_finite
}
