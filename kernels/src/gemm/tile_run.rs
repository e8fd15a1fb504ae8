//! One micro-tile run and stored, in place in C or through a running sum of f32 between k
//! blocks, and the per-thread packing buffers: what the blocked driver (`driver.rs`) and the
//! whole-panel path (`whole_panels.rs`) share.

use super::arch::Arch;
use super::problem::Problem;
use super::store::{store_tile, tile_non_finite};
use super::tile::{Micro, TileEpi, TILE_NR};

/// Per-thread packing buffers, reused across calls: a fresh multi-megabyte allocation per
/// product would be an mmap and page faults each time.
pub(super) struct Buffers {
    pub(super) a: Vec<f32>,
    pub(super) b: Vec<f32>,
    pub(super) s: Vec<f32>,
}

/// A 64-byte-aligned pointer to at least `len` f32 in `v`.
pub(super) fn aligned(v: &mut Vec<f32>, len: usize) -> *mut f32 {
    if v.len() < len + 16 {
        *v = vec![0.0; len + 16];
    }
    let p = v.as_mut_ptr();
    let off = p.align_offset(64);
    // SAFETY: `off < 16` and the vector has 16 spare elements.
    unsafe { p.add(off) }
}

/// One micro-tile of a product whose f32 C is its own running sum (`in_place`): the kernel adds
/// into C directly where the tile is full-width and contiguous, else into `tile` stored as a
/// plain sum. Returns whether the finished tile (at the last k block) holds a non-finite value.
///
/// # Safety
/// As the loops that call it: `ap`, `bp` packed for `kc_units` steps, `cp` this tile's corner
/// of C, `tile` a [`Tile`]'s elements.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile_in_place(
    arch: &Arch,
    p: &Problem,
    kern: Micro,
    (kc_units, ap, bp): (usize, *const f32, *const f32),
    cp: *mut u8,
    (mrr, nrr): (usize, usize),
    (first, last): (bool, bool),
    tile: *mut f32,
) -> bool {
    let e = &p.epi;
    let nv = nrr.div_ceil(arch.vw);
    let beta = e.accumulate || !first;
    // SAFETY: the caller's contract.
    unsafe {
        if p.c_cs == 1 && nrr == nv * arch.vw {
            kern.run(kc_units, ap, bp, cp as *mut f32, p.c_rs, beta);
            last && e.check && tile_non_finite(arch.level, cp as *const f32, p.c_rs, mrr, nrr)
        } else {
            kern.run(kc_units, ap, bp, tile, TILE_NR as isize, false);
            let te = TileEpi::sum(beta, e.check);
            let nf = store_tile(
                arch.level, p.out, tile, TILE_NR, mrr, nrr, cp, p.c_rs, p.c_cs, &te,
            );
            last && nf
        }
    }
}

/// One micro-tile of a product whose f32 sums live in a buffer between k blocks (`sums`, rows
/// `s_rs` apart): the kernel adds into them, and at the last k block they go through the
/// epilogue into C at `(i, j)`. Returns whether a stored element is non-finite.
///
/// # Safety
/// As [`tile_in_place`], with `sums` writable for the tile's rows of `s_rs`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile_running_sum(
    arch: &Arch,
    p: &Problem,
    kern: Micro,
    (kc_units, ap, bp): (usize, *const f32, *const f32),
    (sums, s_rs): (*mut f32, usize),
    (cp, i, j): (*mut u8, usize, usize),
    (mrr, nrr): (usize, usize),
    (first, last): (bool, bool),
) -> bool {
    // SAFETY: the caller's contract.
    unsafe {
        kern.run(kc_units, ap, bp, sums, s_rs as isize, !first);
        last && store_tile(
            arch.level,
            p.out,
            sums,
            s_rs,
            mrr,
            nrr,
            cp,
            p.c_rs,
            p.c_cs,
            &p.epi.tile(i, j),
        )
    }
}

/// Where a micro-kernel reading A's rows in place ([`Arch::a_rows`]) starts: row `i`, k `pc`
/// of the problem's A (k stride 1).
///
/// # Safety
/// `i < m` and `pc < k` of `p`, whose A the driver's contract makes addressable.
pub(super) unsafe fn a_at(p: &Problem, i: usize, pc: usize) -> *const f32 {
    // SAFETY: the caller's contract.
    unsafe {
        p.a.offset((i as isize * p.a_rs + pc as isize) * p.a_kind.size()) as *const f32
    }
}
