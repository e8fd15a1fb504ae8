//! Packing: copy a strided block of A or B into the contiguous micro-panel layout the kernels
//! read, widening f16/bf16 to f32 (or, for the bf16-pair path, interleaving k pairs).

use super::{load1, widen, Arch, Kind};
#[cfg(target_arch = "x86_64")]
use crate::level::Level;

/// Longest k block any path packs in one go.
const KC_LIMIT: usize = 512;

/// Packs one micro-panel: `dst[p * dst_stride + l] = src[l * lane_stride + p * k_stride]` for
/// `l < lanes`, `p < kc`, with lanes `lanes..dst_stride` zeroed if `fill` (B panels, whose
/// padding columns the kernels compute with). For the pair path, `p` runs over k pairs and each
/// `dst` slot holds two bf16, the even k in the low half; an odd tail is padded with zero.
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
    debug_assert!(kc <= KC_LIMIT && lanes <= dst_stride);
    if arch.pairs {
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
            return super::x86::pack_rows_avx512(kind, src, k_stride, lanes, kc, dst, dst_stride);
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

#[allow(clippy::too_many_arguments)]
unsafe fn pairs(
    src: *const u16,
    lane_stride: isize,
    k_stride: isize,
    lanes: usize,
    kc: usize,
    dst: *mut u32,
    dst_stride: usize,
    fill: bool,
) {
    let kp = kc.div_ceil(2);
    let at = |l: usize, p: usize| -> u32 {
        if p < kc {
            *src.offset(l as isize * lane_stride + p as isize * k_stride) as u32
        } else {
            0
        }
    };
    for q in 0..kp {
        let d = dst.add(q * dst_stride);
        for l in 0..lanes {
            *d.add(l) = at(l, 2 * q) | (at(l, 2 * q + 1) << 16);
        }
        if fill {
            for l in lanes..dst_stride {
                *d.add(l) = 0;
            }
        }
    }
}
