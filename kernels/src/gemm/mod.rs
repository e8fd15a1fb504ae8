//! Blocked matrix products in the style of BLIS / Goto: pack a block of B and a block of A into
//! contiguous micro-panels (widening 16-bit inputs to f32 on the way), then sweep an `MR × NR`
//! register-blocked micro-kernel over them.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

use half::{bf16, f16};
use rayon::prelude::*;

use crate::convert;
use crate::level::{level, Level};

mod pack;
#[cfg(target_arch = "x86_64")]
mod x86;

/// Which element type a [`GemmElem`] is; lets the driver stay non-generic where it can.
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

fn max_index(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<usize> {
    if rows == 0 || cols == 0 {
        return None;
    }
    Some((rows - 1) * rs + (cols - 1) * cs)
}

/// Safe [`gemm()`]: `C = A·B`, or `C += A·B` with `accumulate`, where `C` (`a.rows ×
/// b.cols`) is `c[i * c_rs + j * c_cs]`.
///
/// Panics if the shapes disagree, an index falls outside its slice, or two elements of `C`
/// could share a location (which would make the result depend on thread timing).
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
    for (name, len, idx) in [
        ("A", a.data.len(), max_index(m, k, a.rs, a.cs)),
        ("B", b.data.len(), max_index(k, n, b.rs, b.cs)),
        ("C", c.len(), max_index(m, n, c_rs, c_cs)),
    ] {
        if let Some(idx) = idx {
            assert!(
                idx < len,
                "gemm: {name} is indexed up to {idx} but has {len} elements"
            );
        }
    }
    // Sufficient for distinct (i, j) to map to distinct offsets: the larger stride steps over
    // the whole extent of the smaller one.
    let (mut lo, mut hi) = ((c_rs, m), (c_cs, n));
    if lo.0 > hi.0 {
        std::mem::swap(&mut lo, &mut hi);
    }
    assert!(
        m == 0 || n == 0 || ((lo.1 <= 1 || lo.0 > 0) && (hi.1 <= 1 || hi.0 >= lo.0 * lo.1)),
        "gemm: C's strides ({c_rs}, {c_cs}) make elements overlap"
    );
    // SAFETY: every index was checked above; `c` is exclusively borrowed and its elements are
    // distinct, so the writes (possibly from several threads, to disjoint tiles) cannot race.
    unsafe {
        gemm(
            m,
            n,
            k,
            a.data.as_ptr(),
            a.rs as isize,
            a.cs as isize,
            b.data.as_ptr(),
            b.rs as isize,
            b.cs as isize,
            c.as_mut_ptr(),
            c_rs as isize,
            c_cs as isize,
            accumulate,
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
/// widened and added) and rounded to nearest even once, when stored. The work is split over
/// at most `threads` rayon tasks when it is large enough to gain from it.
///
/// # Safety
/// Every element of `A` and `B` addressed by the shapes and strides must be readable, and every
/// element of `C` writable (and readable with `accumulate`); distinct `(i, j)` of `C` must be
/// distinct locations, and `C` must not overlap `A` or `B`.
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
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    *c.offset(i as isize * c_rs + j as isize * c_cs) = zero::<T>();
                }
            }
        }
        return;
    }
    let arch = Arch::select(T::KIND, level());
    let mut p = Problem {
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
        accumulate,
        kind: T::KIND,
    };
    // Rows are padded to nothing (there is a kernel for every row count up to MR) but columns
    // to whole vectors: for a thin C (n = 10 in a classifier head), computing Cᵀ = Bᵀ·Aᵀ wastes
    // far less of the kernel. Tiles are written row by row, so a C whose rows are not
    // contiguous costs a little more to store.
    let pad = |x: usize| x.div_ceil(arch.vw) * arch.vw;
    let cost = |rows: usize, cols: usize, unit: bool| rows * pad(cols) * if unit { 4 } else { 5 };
    if cost(n, m, c_rs == 1) < cost(m, n, c_cs == 1) {
        p = p.transposed();
    }
    run(&arch, &p, threads);
}

fn zero<T: GemmElem>() -> T {
    // SAFETY: +0.0 is all-zero bits in all three formats.
    unsafe { std::mem::zeroed() }
}

/// Type-erased problem (element size is known from `kind`).
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
    accumulate: bool,
    kind: Kind,
}

// SAFETY: the pointers are only used for disjoint tiles of C (see `run`) and reads of A and B;
// `gemm`'s contract makes that sound from any thread.
unsafe impl Send for Problem {}
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
            ..self
        }
    }

    /// The sub-problem for rows `i0..i0+m` and columns `j0..j0+n` of C.
    fn sub(&self, i0: usize, m: usize, j0: usize, n: usize) -> Problem {
        let s = self.kind.size();
        // SAFETY (of the offsets, used later): inside the caller's matrices.
        unsafe {
            Problem {
                m,
                n,
                a: self.a.offset(i0 as isize * self.a_rs * s),
                b: self.b.offset(j0 as isize * self.b_cs * s),
                c: self
                    .c
                    .offset((i0 as isize * self.c_rs + j0 as isize * self.c_cs) * s),
                ..*self
            }
        }
    }
}

/// Micro-kernel: multiplies a packed `kc`-long A micro-panel (`MR` per k step, the first `M`
/// used) by a packed B micro-panel (`NR` per k step, the first `NV` vectors used) and writes
/// (`load == false`) or adds (`load == true`) the `M × NV·VW` f32 result at `dst`, rows
/// `dst_rs` apart, columns contiguous. `kc` counts k steps, or k pairs for the bf16-pair path.
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
            let (kc, nc) = if kind == Kind::F32 {
                (256, 512)
            } else {
                (512, 256)
            };
            if lvl >= Level::Avx512 {
                return Arch {
                    level: lvl,
                    mr: 12,
                    vw: 16,
                    nvmax: 2,
                    kc,
                    mc: 480,
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
                    kc: 256,
                    mc: 480,
                    nc: 512,
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

unsafe fn run(arch: &Arch, p: &Problem, threads: usize) {
    let flops = 2 * p.m * p.n * p.k;
    let threads = threads.min(flops / PARALLEL_MIN_FLOPS).max(1);
    if threads == 1 {
        return serial(arch, p);
    }
    let (tm, tn) = split(arch, p, threads);
    let rows = chunks(p.m, tm, arch.mr);
    let cols = chunks(p.n, tn, arch.nr());
    let parts: Vec<(usize, usize, usize, usize)> = rows
        .iter()
        .flat_map(|&(i0, mi)| cols.iter().map(move |&(j0, nj)| (i0, mi, j0, nj)))
        .collect();
    parts.into_par_iter().for_each(|(i0, mi, j0, nj)| {
        // SAFETY: the parts are disjoint rectangles of C.
        unsafe { serial(arch, &p.sub(i0, mi, j0, nj)) }
    });
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

unsafe fn serial(arch: &Arch, p: &Problem) {
    BUFFERS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut bufs) => serial_with(arch, p, &mut bufs),
        // Only reachable if a kernel were re-entered on this thread; stay correct regardless.
        Err(_) => serial_with(
            arch,
            p,
            &mut Buffers {
                a: Vec::new(),
                b: Vec::new(),
                s: Vec::new(),
            },
        ),
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

unsafe fn serial_with(arch: &Arch, p: &Problem, bufs: &mut Buffers) {
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
    let half = p.kind != Kind::F32;
    let multi_block = p.k > kc_max;
    // f32 running sums between k blocks for 16-bit C, which must be rounded only once.
    let s_rs = p.n.div_ceil(vw) * vw;
    let sbuf = if half && multi_block {
        aligned(&mut bufs.s, p.m * s_rs)
    } else {
        std::ptr::null_mut()
    };
    let esz = p.kind.size();
    let mut tile = Tile([0.0; TILE_MR * TILE_NR]);
    let tile_p = tile.0.as_mut_ptr();

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
                // The A micro-panel (MR × kc) stays in L1 while the B micro-panels stream from
                // the L2-resident B block: the broadcast operand is the small one.
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
                            p.c.offset((i as isize * p.c_rs + j as isize * p.c_cs) * esz);
                        if !half {
                            let beta = p.accumulate || !first;
                            if p.c_cs == 1 && nrr == nv * vw {
                                kern(kc_units, ap, bp, cp as *mut f32, p.c_rs, beta);
                            } else {
                                kern(kc_units, ap, bp, tile_p, TILE_NR as isize, false);
                                store_tile(
                                    arch.level, p.kind, tile_p, TILE_NR, mrr, nrr, cp, p.c_rs,
                                    p.c_cs, beta,
                                );
                            }
                        } else if !multi_block {
                            kern(kc_units, ap, bp, tile_p, TILE_NR as isize, false);
                            store_tile(
                                arch.level,
                                p.kind,
                                tile_p,
                                TILE_NR,
                                mrr,
                                nrr,
                                cp,
                                p.c_rs,
                                p.c_cs,
                                p.accumulate,
                            );
                        } else {
                            let sp = sbuf.add(i * s_rs + j);
                            kern(kc_units, ap, bp, sp, s_rs as isize, !first);
                            if last {
                                store_tile(
                                    arch.level,
                                    p.kind,
                                    sp,
                                    s_rs,
                                    mrr,
                                    nrr,
                                    cp,
                                    p.c_rs,
                                    p.c_cs,
                                    p.accumulate,
                                );
                            }
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

/// `C[r, j] = round(src[r, j] + (add_c ? C[r, j] : 0))` for an `rows × cols` tile, where the
/// rounding is the identity for f32 C and round-to-nearest-even for 16-bit C.
#[allow(clippy::too_many_arguments)]
unsafe fn store_tile(
    lvl: Level,
    kind: Kind,
    src: *const f32,
    src_rs: usize,
    rows: usize,
    cols: usize,
    c: *mut u8,
    c_rs: isize,
    c_cs: isize,
    add_c: bool,
) {
    debug_assert!(rows <= TILE_MR && cols <= TILE_NR);
    #[cfg(target_arch = "x86_64")]
    if c_cs == 1 && lvl >= Level::Avx512 {
        // One call per tile, masked vectors for the ragged edge: with a short k (im2col, a
        // 10-wide layer) the store is a large share of the work.
        return x86::store_rows_avx512(kind, src, src_rs, rows, cols, c, c_rs, add_c);
    }
    let esz = kind.size();
    let mut buf = [0.0f32; TILE_NR];
    let mut old = [0.0f32; TILE_NR];
    if c_cs == 1 || c_rs != 1 {
        // Contiguous rows: vector conversions. (Or neither direction contiguous: scalar.)
        for r in 0..rows {
            let s = src.add(r * src_rs);
            let cr = c.offset(r as isize * c_rs * esz);
            if c_cs == 1 {
                std::ptr::copy_nonoverlapping(s, buf.as_mut_ptr(), cols);
                if add_c {
                    widen(lvl, kind, cr, old.as_mut_ptr(), cols);
                    for (x, o) in buf.iter_mut().zip(&old).take(cols) {
                        *x += o;
                    }
                }
                narrow(lvl, kind, buf.as_ptr(), cr, cols);
            } else {
                for j in 0..cols {
                    let cj = cr.offset(j as isize * c_cs * esz);
                    let v = *s.add(j);
                    store1(kind, cj, if add_c { v + load1(kind, cj) } else { v });
                }
            }
        }
    } else {
        // Contiguous columns (C seen transposed): one run per column.
        for j in 0..cols {
            for (r, x) in buf.iter_mut().enumerate().take(rows) {
                *x = *src.add(r * src_rs + j);
            }
            let cj = c.offset(j as isize * c_cs * esz);
            if add_c {
                widen(lvl, kind, cj, old.as_mut_ptr(), rows);
                for (x, o) in buf.iter_mut().zip(&old).take(rows) {
                    *x += o;
                }
            }
            narrow(lvl, kind, buf.as_ptr(), cj, rows);
        }
    }
}

#[inline(always)]
unsafe fn load1(kind: Kind, s: *const u8) -> f32 {
    match kind {
        Kind::F32 => *(s as *const f32),
        Kind::F16 => (*(s as *const f16)).to_f32(),
        Kind::Bf16 => (*(s as *const bf16)).to_f32(),
    }
}

/// Round-to-nearest-even, like the slice conversions.
#[inline(always)]
unsafe fn store1(kind: Kind, d: *mut u8, v: f32) {
    match kind {
        Kind::F32 => *(d as *mut f32) = v,
        Kind::F16 => *(d as *mut f16) = f16::from_f32(v),
        Kind::Bf16 => *(d as *mut bf16) = bf16::from_f32(v),
    }
}

#[inline]
unsafe fn widen(lvl: Level, kind: Kind, src: *const u8, dst: *mut f32, n: usize) {
    match kind {
        Kind::F32 => std::ptr::copy_nonoverlapping(src as *const f32, dst, n),
        Kind::F16 => convert::f16_to_f32_raw(lvl, src as *const f16, dst, n),
        Kind::Bf16 => convert::bf16_to_f32_raw(lvl, src as *const bf16, dst, n),
    }
}

#[inline]
unsafe fn narrow(lvl: Level, kind: Kind, src: *const f32, dst: *mut u8, n: usize) {
    match kind {
        Kind::F32 => std::ptr::copy_nonoverlapping(src, dst as *mut f32, n),
        Kind::F16 => convert::f32_to_f16_raw(lvl, src, dst as *mut f16, n),
        Kind::Bf16 => convert::f32_to_bf16_raw(lvl, src, dst as *mut bf16, n),
    }
}

// ---------------------------------------------------------------------------------------------
// Portable kernels: plain loops over fixed-size arrays, which the compiler keeps in vector
// registers for whatever the build target offers (SSE2 on x86-64, NEON on aarch64).

const PORTABLE_MR: usize = 4;
const PORTABLE_NR: usize = 8;

unsafe fn portable_kernel<const M: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
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

#[inline(always)]
unsafe fn store_acc<const M: usize, const W: usize>(
    acc: &[[f32; W]; M],
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    for (i, row) in acc.iter().enumerate() {
        let d = dst.offset(i as isize * dst_rs);
        for (j, &x) in row.iter().enumerate() {
            *d.add(j) = if load { *d.add(j) + x } else { x };
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

unsafe fn portable_kernel_nv<const M: usize, const NV: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    portable_kernel::<M>(kc, a, b, dst, dst_rs, load)
}

static PORTABLE_KERNELS: [[KernFn; 2]; PORTABLE_MR] = kernel_table!(portable_kernel_nv; 1, 2, 3, 4);

/// Scalar stand-in for the `vdpbf16ps` kernel, on the same pair-packed panels (12 × 32).
unsafe fn pair_emulation_kernel<const M: usize, const NV: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
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
