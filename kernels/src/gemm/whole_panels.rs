//! Packing every panel of a product once: all of B, then each block of A's rows over all of
//! k, where both fit (`driver::serial_with` chooses this path; its blocked loops pack A again
//! for every B block and, with running sums, B again for every A block).

use super::arch::Arch;
use super::problem::Problem;
use super::tile::{Tile, TILE_MR, TILE_NR};
use super::tile_run::{a_at, aligned, tile_in_place, tile_running_sum, Buffers};

/// Bytes of packed panels [`serial`] may hold for each of A and B per thread
/// (kept between calls, as the blocked buffers are): the GPT's and ViT's weights (up to
/// 1536 × 384) fit with room to spare; a weight gradient's operands (k = all token rows) do not,
/// and keep the blocked loops.
const WHOLE_PANEL_BYTES: usize = 4 << 20;

#[cfg(test)]
thread_local! {
    /// Tests turn [`serial`] off to compare its bits with the blocked loops'.
    pub(super) static WHOLE_PANELS_OFF: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Packed k steps over all of k: full blocks of `kc_max` (even for pairs) and the rest.
fn k_units(arch: &Arch, k: usize, kc_max: usize) -> usize {
    let kstep = if arch.pairs { 2 } else { 1 };
    k / kc_max * (kc_max / kstep) + (k % kc_max).div_ceil(kstep)
}

/// Whether [`serial`]' buffers (all of B, and `mc` rows of A over all of k) stay
/// within [`WHOLE_PANEL_BYTES`] each.
pub(super) fn fit(arch: &Arch, p: &Problem, kc_max: usize, mc_max: usize) -> bool {
    #[cfg(test)]
    if WHOLE_PANELS_OFF.with(|c| c.get()) {
        return false;
    }
    let units = k_units(arch, p.k, kc_max);
    let n_pad = p.n.div_ceil(arch.nr()) * arch.nr();
    let bytes = |lanes: usize| lanes.saturating_mul(units).saturating_mul(4);
    bytes(n_pad) <= WHOLE_PANEL_BYTES && bytes(mc_max) <= WHOLE_PANEL_BYTES
}

/// [`serial_with`](super::driver::serial_with) with every element of A and B packed once: all of B first (every k block,
/// every column), then for each `mc`-row block of A its panels over all of k, swept against
/// each B block in turn. The k blocks of each element of C run in the same order as in the
/// blocked loops, so the bits are theirs; only what is packed, and how often, differs.
///
/// # Safety
/// As [`serial_with`]; [`fit`] held for `p`.
pub(super) unsafe fn serial(
    arch: &Arch,
    p: &Problem,
    bufs: &mut Buffers,
    (kc_max, mc_max, nc_max): (usize, usize, usize),
    in_place: bool,
) -> bool {
    let (mr, nr, vw) = (arch.mr, arch.nr(), arch.vw);
    let kstep = if arch.pairs { 2 } else { 1 };
    let units = k_units(arch, p.k, kc_max);
    let n_pad = p.n.div_ceil(nr) * nr;
    let abuf = aligned(&mut bufs.a, mc_max * units);
    let bbuf = aligned(&mut bufs.b, n_pad * units);
    let s_rs = nc_max.div_ceil(vw) * vw;
    let sbuf = aligned(&mut bufs.s, mc_max * s_rs);
    // Where the k block starting at `pc` begins in the packed panels, in k steps: every block
    // before it is a full `kc_max` one.
    let block = |pc: usize| pc / kc_max * (kc_max / kstep);
    let (asz, bsz, csz) = (p.a_kind.size(), p.b_kind.size(), p.out.size());
    let a_rows = arch.a_rows(p);
    let mut tile = Tile([0.0; TILE_MR * TILE_NR]);
    let tile_p = tile.0.as_mut_ptr();
    let mut non_finite = false;
    // SAFETY: every pointer formed below is an offset of rows < m, columns < n and k < k of
    // the problem's matrices, which the contract makes addressable, or of the buffers within
    // the sizes allocated above: B's block at `pc` holds `n_pad` lanes of its k steps from
    // `block(pc) · n_pad`, A's `mc_max` lanes from `block(pc) · mc_max`, and `units` counts
    // every block's steps. The kernels write `mrr × nv·vw` f32 to sbuf's block, a tile, or
    // (in place, full-width tiles only) C.
    unsafe {
        let mut pc = 0;
        while pc < p.k {
            let kc = kc_max.min(p.k - pc);
            let src = p.b.offset(pc as isize * p.b_rs * bsz);
            let dst = bbuf.add(block(pc) * n_pad);
            super::pack::panels(arch, p.b_kind, src, p.b_cs, p.b_rs, p.n, kc, dst, nr, true);
            pc += kc;
        }
        let mut ic = 0;
        while ic < p.m {
            let mc = mc_max.min(p.m - ic);
            let mut pc = 0;
            while a_rows.is_none() && pc < p.k {
                let kc = kc_max.min(p.k - pc);
                let src =
                    p.a.offset((ic as isize * p.a_rs + pc as isize * p.a_cs) * asz);
                let dst = abuf.add(block(pc) * mc_max);
                super::pack::panels(arch, p.a_kind, src, p.a_rs, p.a_cs, mc, kc, dst, mr, false);
                pc += kc;
            }
            let mut jc = 0;
            while jc < p.n {
                let nc = nc_max.min(p.n - jc);
                let mut pc = 0;
                while pc < p.k {
                    let kc = kc_max.min(p.k - pc);
                    let kc_units = kc.div_ceil(kstep);
                    let (first, last) = (pc == 0, pc + kc == p.k);
                    let mut ir = 0;
                    while ir < mc {
                        let mrr = mr.min(mc - ir);
                        let ap = match a_rows {
                            Some(_) => a_at(p, ic + ir, pc),
                            None => abuf.add(block(pc) * mc_max + ir * kc_units),
                        };
                        let mut jr = 0;
                        while jr < nc {
                            let nrr = nr.min(nc - jr);
                            let nv = nrr.div_ceil(vw);
                            let kern = arch.micro(a_rows, mrr, nv);
                            let (i, j) = (ic + ir, jc + jr);
                            let bp = bbuf.add(block(pc) * n_pad + j * kc_units);
                            let cp =
                                p.c.offset((i as isize * p.c_rs + j as isize * p.c_cs) * csz);
                            non_finite |= if in_place {
                                tile_in_place(
                                    arch,
                                    p,
                                    kern,
                                    (kc_units, ap, bp),
                                    cp,
                                    (mrr, nrr),
                                    (first, last),
                                    tile_p,
                                )
                            } else {
                                tile_running_sum(
                                    arch,
                                    p,
                                    kern,
                                    (kc_units, ap, bp),
                                    (sbuf.add(ir * s_rs + jr), s_rs),
                                    (cp, i, j),
                                    (mrr, nrr),
                                    (first, last),
                                )
                            };
                            jr += nr;
                        }
                        ir += mr;
                    }
                    pc += kc;
                }
                jc += nc;
            }
            ic += mc;
        }
    }
    non_finite
}
