//! Packing: copy a strided block of A or B into the contiguous micro-panel layout the kernels
//! read, widening f16/bf16 to f32 (or, for the bf16-pair path, interleaving k pairs). FP8 codes
//! are widened here too, exactly, to what their product runs in (f32 lanes, or bf16 pairs), so
//! an FP8 operand is read once, at one byte per element, and never copied to 16 bits first.

use super::elem::{load1, widen};
use super::{Arch, Kind};
#[cfg(target_arch = "x86_64")]
use crate::level::Level;

/// Longest k block any path packs in one go.
const KC_LIMIT: usize = 512;

/// Packs `lanes` lanes as consecutive micro-panels of `width` lanes each, panel `q` (lanes
/// `q·width..`) at `dst + q·width·ceil(kc / step)`, each by [`panel`]: a block of A's rows or
/// B's columns as the blocked loops lay it out.
///
/// A source whose lanes are contiguous, with rows of at least [`ROW_SWEEP_MIN_BYTES`], is
/// swept a chunk of k rows at a time across every panel ([`panels_by_row_chunks`]). (Tried
/// first on AVX2 with the small GPT, whose rows are 256–1536 bytes apart: no change. On the
/// baby GPT's weight gradients, rows 3 KiB apart, it cut their packing on an Intel AMX core.)
///
/// # Safety
/// `src` addresses a valid `lanes × kc` view of `kind` elements; `dst` is writable for
/// `ceil(lanes / width) · width · ceil(kc / step)` f32 slots.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn panels(
    arch: &Arch,
    kind: Kind,
    src: *const u8,
    lane_stride: isize,
    k_stride: isize,
    lanes: usize,
    kc: usize,
    dst: *mut f32,
    width: usize,
    fill: bool,
) {
    let kstep = if arch.pairs { 2 } else { 1 };
    let units = kc.div_ceil(kstep);
    let esz = kind.size();
    #[cfg(target_arch = "x86_64")]
    if lane_stride == 1 && lanes > width && lanes * esz as usize >= ROW_SWEEP_MIN_BYTES {
        // SAFETY: the caller's contract.
        return unsafe {
            panels_by_row_chunks(arch, kind, src, k_stride, lanes, kc, dst, width, fill)
        };
    }
    let mut l0 = 0;
    while l0 < lanes {
        // SAFETY: panel `l0 / width` covers lanes `l0..` of the view and its `width · units`
        // slots from `dst + l0 · units`, inside what the contract makes writable.
        unsafe {
            panel(
                arch,
                kind,
                src.offset(l0 as isize * lane_stride * esz),
                lane_stride,
                k_stride,
                width.min(lanes - l0),
                kc,
                dst.add(l0 * units),
                width,
                fill,
            );
        }
        l0 += width;
    }
}

/// The shortest row piece (lanes × element size) [`panels_by_row_chunks`] sweeps: four cache
/// lines. Below it the panels share one or two lines of each row and a sweep has little to
/// save for its extra calls; the ViT's weight gradients (64–128-byte pieces a thread) keep the
/// one-panel loop. (`cargo bench --bench gemm -- "vit gW"` ran 0.85× with the sweep over six
/// alternated runs, but as much again with this bound keeping those shapes off it: that bench
/// cannot tell either way.)
#[cfg(target_arch = "x86_64")]
const ROW_SWEEP_MIN_BYTES: usize = 256;

/// Asks for rows `rows` of a block (each `bytes` long from `src + row · row_bytes`) to be
/// brought into L2: the next chunk's, while this one is packed. `perf annotate` with the
/// sweep alone: still 80% of the pair packing's samples on its row loads (the baby GPT's
/// gradients come from L3 or memory, 50 MB a layer, and its rows are too short a run for
/// the hardware's prefetchers to get ahead).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_rows(src: *const u8, row_bytes: isize, bytes: usize, rows: std::ops::Range<usize>) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    for r in rows {
        let row = src.wrapping_offset(r as isize * row_bytes);
        // One line past `bytes`: a row piece that does not start on a line boundary ends in it.
        for off in (0..=bytes).step_by(64) {
            // SAFETY: a prefetch never faults and reads nothing into the program; the
            // address is formed with wrapping arithmetic, so no out-of-bounds pointer is
            // dereferenced or offset.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(row.wrapping_add(off) as *const i8) };
        }
    }
}

/// k rows per sweep of [`panels_by_row_chunks`] (even, so that pairs never straddle two).
#[cfg(target_arch = "x86_64")]
const ROW_CHUNK: usize = 64;

/// [`panels`] for a source whose lanes are contiguous (`lane_stride == 1`: each k row of the
/// block is one run of `lanes` elements), sweeping [`ROW_CHUNK`] rows at a time across every
/// panel rather than one panel over all of k: a panel's lanes are a short piece of each row
/// (32 or 64 bytes), and one panel at a time read its rows at the block's row stride
/// (3 KiB for a GPT's 1536-wide gradient), where no prefetcher follows, while the same lines'
/// other pieces were read again for the next panel. `perf annotate` of the baby GPT's step on
/// an Intel AMX core: 80% of the pair packing's samples on its two row loads, and the weight
/// gradients' packing 70% as long as their tile products.
///
/// AMX's A panels (row by row, [`Arch::a_tile_rows`]) are first packed k pair by k pair into
/// a scratch for the whole block, then turned panel by panel, as [`panel`] does for one.
///
/// # Safety
/// As [`panels`], with `lane_stride == 1`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn panels_by_row_chunks(
    arch: &Arch,
    kind: Kind,
    src: *const u8,
    k_stride: isize,
    lanes: usize,
    kc: usize,
    dst: *mut f32,
    width: usize,
    fill: bool,
) {
    let kstep = if arch.pairs { 2 } else { 1 };
    let units = kc.div_ceil(kstep);
    let esz = kind.size();
    let tile_rows = arch.a_tile_rows && !fill;
    // Every chunk of every panel: into `out` (panel `l0 / width` at `out + l0 · units`).
    // SAFETY: panel `l0 / width` covers lanes `l0..` of the view; its chunk at k row `p0`
    // covers rows `p0..p0 + kk` and its slots `p0 / kstep · width..` up to `(p0 + kk) /
    // kstep · width` (rounded up) of the panel's `width · units`, inside `out`'s.
    let sweep = |out: *mut f32| unsafe {
        let mut p0 = 0;
        while p0 < kc {
            let kk = ROW_CHUNK.min(kc - p0);
            prefetch_rows(
                src,
                k_stride * esz,
                lanes * esz as usize,
                p0 + kk..kc.min(p0 + 2 * kk),
            );
            let mut l0 = 0;
            while l0 < lanes {
                panel_by_steps(
                    arch,
                    kind,
                    src.offset((l0 as isize + p0 as isize * k_stride) * esz),
                    1,
                    k_stride,
                    width.min(lanes - l0),
                    kk,
                    out.add(l0 * units + p0 / kstep * width),
                    width,
                    fill,
                );
                l0 += width;
            }
            p0 += kk;
        }
    };
    if !tile_rows {
        sweep(dst);
        return;
    }
    debug_assert!(arch.pairs && width == 16 && arch.level >= Level::Avx512);
    let panels = lanes.div_ceil(width);
    STEPS.with(|cell| {
        let mut steps = cell.borrow_mut();
        if steps.len() < panels * width * units {
            steps.resize(panels * width * units, 0);
        }
        let tmp = steps.as_mut_ptr();
        sweep(tmp as *mut f32);
        for panel in 0..panels {
            let at = panel * width * units;
            // SAFETY: the scratch holds every panel's `units · 16` pairs and the destination
            // as many (the caller's contract); the level says the CPU has AVX-512F.
            unsafe { super::x86::pairs_to_rows(tmp.add(at), units, (dst as *mut u32).add(at)) };
        }
    });
}

/// Packs one micro-panel: `dst[p * dst_stride + l] = src[l * lane_stride + p * k_stride]` for
/// `l < lanes`, `p < kc`, with lanes `lanes..dst_stride` zeroed if `fill` (B panels, whose
/// padding columns the kernels compute with). For the pair path, `p` runs over k pairs and each
/// `dst` slot holds two bf16, the even k in the low half; an odd tail is padded with zero.
/// On AMX's path ([`Arch::a_tile_rows`]) an A panel (`fill` false: A's panels are never
/// padded, B's always are) is laid out row by row instead, `dst[l * ceil(kc / 2) + p]`, its
/// lanes past `lanes` holding whatever the scratch did (they only reach rows of C past the
/// tile's, never stored).
///
/// # Safety
/// `src` addresses a valid `lanes × kc` view of `kind` elements; `dst` is writable for
/// `ceil(kc / step) * dst_stride` f32 slots.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn panel(
    arch: &Arch,
    kind: Kind,
    src: *const u8,
    lane_stride: isize,
    k_stride: isize,
    lanes: usize,
    kc: usize,
    dst: *mut f32,
    dst_stride: usize,
    fill: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if arch.a_tile_rows && !fill {
        // An A micro-panel for AMX's tiles: packed k pair by k pair as for `vdpbf16ps`, then
        // turned row by row (each lane's pairs contiguous), the layout a tile load reads.
        debug_assert!(arch.pairs && dst_stride == 16 && arch.level >= Level::Avx512);
        let kp = kc.div_ceil(2);
        return STEPS.with(|cell| {
            let mut steps = cell.borrow_mut();
            if steps.len() < kp * dst_stride {
                steps.resize(kp * dst_stride, 0);
            }
            // SAFETY: the scratch holds `kp · 16` pairs and the panel as many; the caller's
            // contract for the rest; the level says the CPU has AVX-512F.
            unsafe {
                let tmp = steps.as_mut_ptr();
                panel_by_steps(
                    arch,
                    kind,
                    src,
                    lane_stride,
                    k_stride,
                    lanes,
                    kc,
                    tmp as *mut f32,
                    dst_stride,
                    fill,
                );
                super::x86::pairs_to_rows(tmp, kp, dst as *mut u32);
            }
        });
    }
    // SAFETY: the caller's contract.
    unsafe {
        panel_by_steps(
            arch,
            kind,
            src,
            lane_stride,
            k_stride,
            lanes,
            kc,
            dst,
            dst_stride,
            fill,
        )
    }
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// [`panel`]'s k-step-major copy of an A micro-panel on its way to AMX's row-major one
    /// (at most 256 pairs of 16 lanes: 16 KiB), or [`panels_by_row_chunks`]'s of a whole A
    /// block (at most 480 lanes: 480 KiB), kept between calls.
    static STEPS: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`panel`] in the k-step-major layout every kernel but AMX's reads.
///
/// # Safety
/// As [`panel`].
#[allow(clippy::too_many_arguments)]
unsafe fn panel_by_steps(
    arch: &Arch,
    kind: Kind,
    src: *const u8,
    lane_stride: isize,
    k_stride: isize,
    lanes: usize,
    kc: usize,
    dst: *mut f32,
    dst_stride: usize,
    fill: bool,
) {
    // SAFETY: each branch hands the contract on to a routine for its layout (the x86 ones only
    // when `arch.level` says the CPU has their features), or reads lanes `< lanes` and k steps
    // `< kc` of the view and writes panel slots below `kc·dst_stride` itself.
    unsafe {
        debug_assert!(kc <= KC_LIMIT && lanes <= dst_stride);
        if arch.pairs && kind.is_fp8() {
            // FP8 codes widened to bf16 on their way into the pairs (exact), so that the
            // panel is the one the bf16 codes would have given.
            #[cfg(target_arch = "x86_64")]
            if arch.level >= Level::Avx512 && !scalar_pairs_forced() {
                if lane_stride == 1 {
                    return super::x86::pack_pairs_rows_fp8_avx512(
                        kind,
                        src,
                        k_stride,
                        lanes,
                        kc,
                        dst as *mut u32,
                        dst_stride,
                        fill,
                    );
                }
                if k_stride == 1 {
                    return super::x86::pack_pairs_transpose_fp8_avx512(
                        kind,
                        src,
                        lane_stride,
                        lanes,
                        kc,
                        dst as *mut u32,
                        dst_stride,
                        fill,
                    );
                }
            }
            return pairs_fp8(
                kind,
                src,
                lane_stride,
                k_stride,
                lanes,
                kc,
                dst as *mut u32,
                dst_stride,
                fill,
            );
        }
        if arch.pairs {
            #[cfg(target_arch = "x86_64")]
            if arch.level >= Level::Avx512 && !scalar_pairs_forced() {
                // The two layouts the training step produces; anything else (both strides
                // non-unit) takes the scalar loop.
                if lane_stride == 1 {
                    return super::x86::pack_pairs_rows_avx512(
                        src as *const u16,
                        k_stride,
                        lanes,
                        kc,
                        dst as *mut u32,
                        dst_stride,
                        fill,
                    );
                }
                if k_stride == 1 {
                    return super::x86::pack_pairs_transpose_avx512(
                        src as *const u16,
                        lane_stride,
                        lanes,
                        kc,
                        dst as *mut u32,
                        dst_stride,
                        fill,
                    );
                }
            }
            return pairs(
                src as *const u16,
                lane_stride,
                k_stride,
                lanes,
                kc,
                dst as *mut u32,
                dst_stride,
                fill,
            );
        }
        if fill && lanes < dst_stride {
            for p in 0..kc {
                std::ptr::write_bytes(dst.add(p * dst_stride + lanes), 0, dst_stride - lanes);
            }
        }
        let esz = kind.size();
        if lane_stride == 1 {
            // Each k step is a contiguous run of lanes: vector widening copies.
            #[cfg(target_arch = "x86_64")]
            if arch.level >= Level::Avx512 {
                return super::x86::pack_rows_avx512(
                    kind, src, k_stride, lanes, kc, dst, dst_stride,
                );
            }
            #[cfg(target_arch = "x86_64")]
            if arch.level >= Level::Avx2 {
                return super::avx2::pack_rows(kind, src, k_stride, lanes, kc, dst, dst_stride);
            }
            for p in 0..kc {
                widen(
                    arch.level,
                    kind,
                    src.offset(p as isize * k_stride * esz),
                    dst.add(p * dst_stride),
                    lanes,
                );
            }
        } else if k_stride == 1 {
            // Each lane is a contiguous run along k: a transpose.
            #[cfg(target_arch = "x86_64")]
            if arch.level >= Level::Avx512 {
                return super::x86::pack_transpose_avx512(
                    kind,
                    src,
                    lane_stride,
                    lanes,
                    kc,
                    dst,
                    dst_stride,
                );
            }
            #[cfg(target_arch = "x86_64")]
            if arch.level >= Level::Avx2 {
                return super::avx2::pack_transpose(
                    kind,
                    src,
                    lane_stride,
                    lanes,
                    kc,
                    dst,
                    dst_stride,
                );
            }
            let mut tmp = [0.0f32; KC_LIMIT];
            for l in 0..lanes {
                widen(
                    arch.level,
                    kind,
                    src.offset(l as isize * lane_stride * esz),
                    tmp.as_mut_ptr(),
                    kc,
                );
                for (p, &x) in tmp[..kc].iter().enumerate() {
                    *dst.add(p * dst_stride + l) = x;
                }
            }
        } else {
            for l in 0..lanes {
                for p in 0..kc {
                    let s = src.offset((l as isize * lane_stride + p as isize * k_stride) * esz);
                    *dst.add(p * dst_stride + l) = load1(kind, s);
                }
            }
        }
    }
}

#[cfg(test)]
thread_local! {
    /// Unit tests only: pack bf16 pairs with the scalar loop on this thread, to compare whole
    /// products against the vector packing.
    pub(super) static SCALAR_PAIRS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn scalar_pairs_forced() -> bool {
    #[cfg(test)]
    return SCALAR_PAIRS.with(|c| c.get());
    #[cfg(not(test))]
    false
}

/// The bf16-pair panel, element by element: the general case (both strides non-unit), and the
/// reference the vector versions are tested against.
///
/// # Safety
/// As [`panel`] for bf16 (`src` a valid `lanes × kc` view of 16-bit elements, `dst` writable
/// for `ceil(kc / 2) · dst_stride` u32).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn pairs(
    src: *const u16,
    lane_stride: isize,
    k_stride: isize,
    lanes: usize,
    kc: usize,
    dst: *mut u32,
    dst_stride: usize,
    fill: bool,
) {
    // SAFETY: lanes `< lanes` and k `< kc` of the view (the high half of an odd tail is not
    // read), panel slots below `ceil(kc / 2)·dst_stride`.
    unsafe {
        let at = |l: usize, p: usize| -> u32 {
            *src.offset(l as isize * lane_stride + p as isize * k_stride) as u32
        };
        for q in 0..kc.div_ceil(2) {
            let d = dst.add(q * dst_stride);
            // An odd kc leaves the last pair's high half (k = kc, outside the block) zero.
            let has_hi = 2 * q + 1 < kc;
            for l in 0..lanes {
                let hi = if has_hi { at(l, 2 * q + 1) } else { 0 };
                *d.add(l) = at(l, 2 * q) | (hi << 16);
            }
            if fill {
                for l in lanes..dst_stride {
                    *d.add(l) = 0;
                }
            }
        }
    }
}

/// [`pairs`] for FP8 codes of `kind`: each code widened to bf16 (exact, `convert`'s decoding)
/// and packed where the bf16 would have been; the reference of the vector versions.
///
/// # Safety
/// As [`panel`] for FP8 (`src` a valid `lanes × kc` view of one-byte codes, `dst` writable
/// for `ceil(kc / 2) · dst_stride` u32).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn pairs_fp8(
    kind: Kind,
    src: *const u8,
    lane_stride: isize,
    k_stride: isize,
    lanes: usize,
    kc: usize,
    dst: *mut u32,
    dst_stride: usize,
    fill: bool,
) {
    // SAFETY: as in `pairs`, one byte per element.
    unsafe {
        let at = |l: usize, p: usize| -> u32 {
            let s = src.offset(l as isize * lane_stride + p as isize * k_stride);
            // Every FP8 value is a bf16 value: the f32's low half is zero.
            load1(kind, s).to_bits() >> 16
        };
        for q in 0..kc.div_ceil(2) {
            let d = dst.add(q * dst_stride);
            let has_hi = 2 * q + 1 < kc;
            for l in 0..lanes {
                let hi = if has_hi { at(l, 2 * q + 1) } else { 0 };
                *d.add(l) = at(l, 2 * q) | (hi << 16);
            }
            if fill {
                for l in lanes..dst_stride {
                    *d.add(l) = 0;
                }
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::{pairs, pairs_fp8};
    use crate::gemm::x86::{
        pack_pairs_rows_avx512, pack_pairs_rows_fp8_avx512, pack_pairs_transpose_avx512,
        pack_pairs_transpose_fp8_avx512,
    };
    use crate::gemm::Kind;
    use crate::level::{detected_level, Level};

    /// A `lanes × kc` view at `base` inside `buf` whose every other slot holds a NaN pattern
    /// that must never reach a panel, with element `(l, p)` at `base + l·ls + p·ks`.
    struct View {
        buf: Vec<u16>,
        base: usize,
        ls: isize,
        ks: isize,
    }

    fn view(lanes: usize, kc: usize, ls: isize, ks: isize, seed: u32) -> View {
        // The lowest and highest offsets the view reaches, for negative strides too.
        let ext = |n: usize, s: isize| (n as isize - 1) * s;
        let lo = ext(lanes, ls).min(0) + ext(kc, ks).min(0);
        let hi = ext(lanes, ls).max(0) + ext(kc, ks).max(0);
        let len = (hi - lo + 1) as usize;
        // Every slot gets a NaN sentinel; the view's elements get a value that encodes their
        // position, so a swapped or shifted element cannot match by accident.
        let mut buf = vec![0xFFFFu16; len + 64];
        let base = (-lo) as usize + 32;
        for l in 0..lanes {
            for p in 0..kc {
                let off = base as isize + l as isize * ls + p as isize * ks;
                let v = (l as u32 * 1031 + p as u32 * 7 + seed).wrapping_mul(2_654_435_761) >> 16;
                buf[off as usize] = (v as u16) & 0x7F7F;
            }
        }
        View { buf, base, ls, ks }
    }

    #[test]
    fn vector_pair_packing_matches_scalar() {
        if detected_level() < Level::Avx512 {
            println!("vector_pair_packing_matches_scalar: no AVX-512, skipped");
            return;
        }
        // Every lane count a panel can have, every k depth up to one past the longest block.
        let mut cases = 0usize;
        for lanes in 1..=32usize {
            for kc in 1..=513usize {
                for dst_stride in [12usize, 32] {
                    if lanes > dst_stride {
                        continue;
                    }
                    for fill in [false, true] {
                        let kp = kc.div_ceil(2);
                        let run = |f: &dyn Fn(&View, *mut u32), v: &View| {
                            // The panel starts full of garbage: whatever the packing leaves
                            // alone must be left alone by both versions.
                            let mut out = vec![0xDEAD_BEEFu32; kp * dst_stride];
                            f(v, out.as_mut_ptr());
                            out
                        };
                        // SAFETY: `view` built a `lanes × kc` view at `base` with these strides
                        // inside `buf`, and `run` passes a panel of `ceil(kc / 2)·dst_stride`
                        // u32 (and for the vector versions below, the CPU has AVX-512F/BW/VL,
                        // checked above).
                        let scalar = |v: &View, d: *mut u32| unsafe {
                            let s = v.buf.as_ptr().add(v.base);
                            pairs(s, v.ls, v.ks, lanes, kc, d, dst_stride, fill)
                        };
                        // Each k step contiguous (lane stride 1), k stride padded or negative.
                        for ks in [lanes as isize, lanes as isize + 3, -(lanes as isize) - 1] {
                            let v = view(lanes, kc, 1, ks, cases as u32);
                            // SAFETY: as for `scalar`.
                            let vec = |v: &View, d: *mut u32| unsafe {
                                let s = v.buf.as_ptr().add(v.base);
                                pack_pairs_rows_avx512(s, v.ks, lanes, kc, d, dst_stride, fill)
                            };
                            assert_eq!(
                                run(&scalar, &v),
                                run(&vec, &v),
                                "rows: lanes {lanes} kc {kc} ks {ks} stride {dst_stride} fill {fill}"
                            );
                            cases += 1;
                        }
                        // Each lane contiguous along k; an odd lane stride makes every pair
                        // an unaligned 32-bit word.
                        for ls in [kc as isize, kc as isize + 1, -(kc as isize) - 5] {
                            let v = view(lanes, kc, ls, 1, cases as u32);
                            // SAFETY: as for `scalar`.
                            let vec = |v: &View, d: *mut u32| unsafe {
                                let s = v.buf.as_ptr().add(v.base);
                                pack_pairs_transpose_avx512(s, v.ls, lanes, kc, d, dst_stride, fill)
                            };
                            assert_eq!(
                                run(&scalar, &v),
                                run(&vec, &v),
                                "transpose: lanes {lanes} kc {kc} ls {ls} stride {dst_stride} fill {fill}"
                            );
                            cases += 1;
                        }
                    }
                }
            }
        }
        println!("vector_pair_packing_matches_scalar: {cases} panels");
    }

    /// The FP8 pair packing in registers against the scalar one, for both formats: every
    /// code in every position (the codes run through all 256 patterns), every lane count, k
    /// depths around the 32-code loads, both layouts, odd strides.
    #[test]
    fn vector_fp8_pair_packing_matches_scalar() {
        if detected_level() < Level::Avx512 {
            println!("vector_fp8_pair_packing_matches_scalar: no AVX-512, skipped");
            return;
        }
        let buf: Vec<u8> = (0..40_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut cases = 0usize;
        for kind in [Kind::E4M3, Kind::E5M2] {
            for lanes in 1..=32usize {
                for kc in (1..=70usize).chain([511, 512]) {
                    for fill in [false, true] {
                        let dst_stride = 32;
                        let kp = kc.div_ceil(2);
                        let base = 100;
                        let run = |f: &dyn Fn(*mut u32)| {
                            let mut out = vec![0xDEAD_BEEFu32; kp * dst_stride];
                            f(out.as_mut_ptr());
                            out
                        };
                        // Each k step contiguous (lane stride 1), an odd k stride.
                        let ks = lanes as isize + 3;
                        // SAFETY: the view's last element is at base + (kc − 1)·ks + lanes − 1
                        // < 40,000 (kc ≤ 512, ks ≤ 35); the panels hold kp·dst_stride u32;
                        // AVX-512F/BW/VL checked above.
                        let (a, b) = unsafe {
                            let s = buf.as_ptr().add(base);
                            (
                                run(&|d| pairs_fp8(kind, s, 1, ks, lanes, kc, d, dst_stride, fill)),
                                run(&|d| {
                                    pack_pairs_rows_fp8_avx512(
                                        kind, s, ks, lanes, kc, d, dst_stride, fill,
                                    )
                                }),
                            )
                        };
                        assert_eq!(a, b, "{kind:?} rows: lanes {lanes} kc {kc} fill {fill}");
                        // Each lane contiguous along k, an odd lane stride.
                        let ls = kc as isize + 1;
                        // SAFETY: the last element is at base + (lanes − 1)·ls + kc − 1 <
                        // 40,000 (lanes ≤ 32, ls ≤ 513); as above otherwise.
                        let (a, b) = unsafe {
                            let s = buf.as_ptr().add(base);
                            (
                                run(&|d| pairs_fp8(kind, s, ls, 1, lanes, kc, d, dst_stride, fill)),
                                run(&|d| {
                                    pack_pairs_transpose_fp8_avx512(
                                        kind, s, ls, lanes, kc, d, dst_stride, fill,
                                    )
                                }),
                            )
                        };
                        assert_eq!(
                            a, b,
                            "{kind:?} transpose: lanes {lanes} kc {kc} fill {fill}"
                        );
                        cases += 2;
                    }
                }
            }
        }
        println!("vector_fp8_pair_packing_matches_scalar: {cases} panels");
    }
}
