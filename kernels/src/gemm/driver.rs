//! The blocked driver: C split into rectangles across rayon tasks, each swept block by block
//! (pack B, pack A, micro-kernels, store).

use rayon::prelude::*;
use std::cell::RefCell;

use super::arch::Arch;
use super::problem::Problem;
use super::store::store_tile;
use super::tile::{Tile, TILE_MR, TILE_NR};
use super::tile_run::{a_at, aligned, tile_in_place, tile_running_sum, Buffers};
use super::types::Kind;

/// Work below this many flops (2·m·n·k) runs on the calling thread: rayon's fork and join cost
/// more than they save (see the benchmark's `threads` rows).
pub(super) const PARALLEL_MIN_FLOPS: usize = 1 << 22;

/// Runs `p` on up to `threads` rayon tasks, each a disjoint rectangle of C; returns whether any
/// of them stored a non-finite element.
///
/// # Safety
/// As [`drive`].
pub(super) unsafe fn run(arch: &Arch, p: &Problem, threads: usize) -> bool {
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
pub(super) fn chunks(len: usize, parts: usize, unit: usize) -> Vec<(usize, usize)> {
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
pub(super) fn split(arch: &Arch, p: &Problem, threads: usize) -> (usize, usize) {
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

thread_local! {
    static BUFFERS: RefCell<Buffers> = const {
        RefCell::new(Buffers { a: Vec::new(), b: Vec::new(), s: Vec::new() })
    };
}

/// # Safety
/// As [`drive`], for this thread's (sub-)problem.
pub(super) unsafe fn serial(arch: &Arch, p: &Problem) -> bool {
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
pub(super) fn balanced(len: usize, max: usize, unit: usize) -> usize {
    let blocks = len.div_ceil(max).max(1);
    len.div_ceil(blocks).div_ceil(unit) * unit
}

/// The blocked loops for one thread: B block (`nc` columns × `kc` deep) packed once per k
/// block, A block (`mc` rows) per B block, then the micro-kernel over their micro-panels and
/// the store of each finished tile. Returns whether any stored element is non-finite.
///
/// # Safety
/// As [`drive`].
pub(super) unsafe fn serial_with(arch: &Arch, p: &Problem, bufs: &mut Buffers) -> bool {
    let (mr, nr, vw) = (arch.mr, arch.nr(), arch.vw);
    debug_assert!(mr <= TILE_MR && nr <= TILE_NR);
    let kstep = if arch.pairs { 2 } else { 1 };
    let kc_max = balanced(p.k, arch.kc, arch.k_unit());
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
    // if any, is added once anyway (a single k block, where `C_old + s` is one addition). Any
    // operand type: a 16-bit product's FP32 weight gradient (k = every token row) then packs
    // each operand once instead of B again for every block of A's rows.
    let in_place = p.out == Kind::F32 && e.plain() && (e.legacy || !e.accumulate || !multi_block);
    // The blocked loops below pack A again for every B block (when n > nc) and, with running
    // sums, B again for every A block (when m > mc): on a transformer's tall products (16384
    // token rows by a few hundred columns) that repacking was a third of all packing. Where the
    // whole of B and one A block over all of k fit, pack each once instead.
    if (p.n > nc_max || (multi_block && !in_place && p.m > mc_max))
        && super::whole_panels::fit(arch, p, kc_max, mc_max)
    {
        // SAFETY: the same contract.
        return unsafe {
            super::whole_panels::serial(arch, p, bufs, (kc_max, mc_max, nc_max), in_place)
        };
    }
    // Otherwise f32 running sums live in a buffer between k blocks, so that the epilogue (and
    // the rounding of a 16-bit C) happens once, at the last block: `serial_running_sum`.
    if multi_block && !in_place {
        // SAFETY: the same contract.
        return unsafe { serial_running_sum(arch, p, bufs, (kc_max, mc_max, nc_max)) };
    }
    let (asz, bsz, csz) = (p.a_kind.size(), p.b_kind.size(), p.out.size());
    let a_rows = arch.a_rows(p);
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
                let src =
                    p.b.offset((pc as isize * p.b_rs + jc as isize * p.b_cs) * bsz);
                super::pack::panels(arch, p.b_kind, src, p.b_cs, p.b_rs, nc, kc, bbuf, nr, true);
                let mut ic = 0;
                while ic < p.m {
                    let mc = mc_max.min(p.m - ic);
                    if a_rows.is_none() {
                        let src =
                            p.a.offset((ic as isize * p.a_rs + pc as isize * p.a_cs) * asz);
                        super::pack::panels(
                            arch, p.a_kind, src, p.a_rs, p.a_cs, mc, kc, abuf, mr, false,
                        );
                    }
                    // The A micro-panel (MR × kc) stays in L1 while the B micro-panels stream
                    // from the L2-resident B block: the broadcast operand is the small one.
                    let mut ir = 0;
                    while ir < mc {
                        let mrr = mr.min(mc - ir);
                        let ap = match a_rows {
                            Some(_) => a_at(p, ic + ir, pc),
                            None => abuf.add(ir / mr * mr * kc_units),
                        };
                        let mut jr = 0;
                        while jr < nc {
                            let nrr = nr.min(nc - jr);
                            let nv = nrr.div_ceil(vw);
                            let kern = arch.micro(a_rows, mrr, nv);
                            let bp = bbuf.add(jr / nr * nr * kc_units);
                            let (i, j) = (ic + ir, jc + jr);
                            let cp =
                                p.c.offset((i as isize * p.c_rs + j as isize * p.c_cs) * csz);
                            if in_place {
                                non_finite |= tile_in_place(
                                    arch,
                                    p,
                                    kern,
                                    (kc_units, ap, bp),
                                    cp,
                                    (mrr, nrr),
                                    (first, last),
                                    tile_p,
                                );
                            } else {
                                // A single k block (several go to `serial_running_sum`).
                                kern.run(kc_units, ap, bp, tile_p, TILE_NR as isize, false);
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
pub(super) unsafe fn serial_running_sum(
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
    let (asz, bsz, csz) = (p.a_kind.size(), p.b_kind.size(), p.out.size());
    let a_rows = arch.a_rows(p);
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
                    let src =
                        p.b.offset((pc as isize * p.b_rs + jc as isize * p.b_cs) * bsz);
                    super::pack::panels(
                        arch, p.b_kind, src, p.b_cs, p.b_rs, nc, kc, bbuf, nr, true,
                    );
                    if a_rows.is_none() {
                        let src =
                            p.a.offset((ic as isize * p.a_rs + pc as isize * p.a_cs) * asz);
                        super::pack::panels(
                            arch, p.a_kind, src, p.a_rs, p.a_cs, mc, kc, abuf, mr, false,
                        );
                    }
                    let mut ir = 0;
                    while ir < mc {
                        let mrr = mr.min(mc - ir);
                        let ap = match a_rows {
                            Some(_) => a_at(p, ic + ir, pc),
                            None => abuf.add(ir / mr * mr * kc_units),
                        };
                        let mut jr = 0;
                        while jr < nc {
                            let nrr = nr.min(nc - jr);
                            let nv = nrr.div_ceil(vw);
                            let kern = arch.micro(a_rows, mrr, nv);
                            let bp = bbuf.add(jr / nr * nr * kc_units);
                            let (i, j) = (ic + ir, jc + jr);
                            let cp =
                                p.c.offset((i as isize * p.c_rs + j as isize * p.c_cs) * csz);
                            non_finite |= tile_running_sum(
                                arch,
                                p,
                                kern,
                                (kc_units, ap, bp),
                                (sbuf.add(ir * s_rs + jr), s_rs),
                                (cp, i, j),
                                (mrr, nrr),
                                (first, last),
                            );
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
