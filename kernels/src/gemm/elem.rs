//! One element, or a run of elements, of any [`Kind`] to and from f32: what the stores, the
//! packing and the small products read and write C, A and B with (the rounding is
//! [`crate::convert`]'s). FP8 codes are only ever read (widened exactly); C is never FP8.

use half::{bf16, f16};

use super::types::Kind;
use crate::convert::{self, Fp8Format, E4M3, E5M2};
use crate::level::Level;

/// One element of `kind` at `s`, widened to f32.
///
/// # Safety
/// `s` readable as one `kind` element.
#[inline(always)]
pub(super) unsafe fn load1(kind: Kind, s: *const u8) -> f32 {
    // SAFETY: the caller's contract.
    unsafe {
        match kind {
            Kind::F32 => *(s as *const f32),
            Kind::F16 => convert::widen_f16(*(s as *const f16)),
            Kind::Bf16 => convert::widen_bf16(*(s as *const bf16)),
            Kind::E4M3 => E4M3(*s).to_f32(),
            Kind::E5M2 => E5M2(*s).to_f32(),
        }
    }
}

/// Stores `v` at `d` as one `kind` element, rounding to nearest even like the slice
/// conversions.
///
/// # Safety
/// `d` writable as one `kind` element.
#[inline(always)]
pub(super) unsafe fn store1(kind: Kind, d: *mut u8, v: f32) {
    // SAFETY: the caller's contract.
    unsafe {
        match kind {
            Kind::F32 => *(d as *mut f32) = v,
            Kind::F16 => *(d as *mut f16) = convert::narrow_f16(v),
            Kind::Bf16 => *(d as *mut bf16) = convert::narrow_bf16(v),
            Kind::E4M3 | Kind::E5M2 => unreachable!("C is never FP8"),
        }
    }
}

/// `n` elements of `kind` at `src` widened into `dst`.
///
/// # Safety
/// `src` readable and `dst` writable for `n` elements, not overlapping; `lvl` supported.
#[inline]
pub(super) unsafe fn widen(lvl: Level, kind: Kind, src: *const u8, dst: *mut f32, n: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        match kind {
            Kind::F32 => std::ptr::copy_nonoverlapping(src as *const f32, dst, n),
            Kind::F16 => convert::f16_to_f32_raw(lvl, src as *const f16, dst, n),
            Kind::Bf16 => convert::bf16_to_f32_raw(lvl, src as *const bf16, dst, n),
            Kind::E4M3 => convert::fp8::widen_raw::<E4M3, false>(lvl, src, dst as *mut u8, n),
            Kind::E5M2 => convert::fp8::widen_raw::<E5M2, false>(lvl, src, dst as *mut u8, n),
        }
    }
}

/// `n` f32 at `src` rounded into `kind` elements at `dst`.
///
/// # Safety
/// As [`widen`].
#[inline]
pub(super) unsafe fn narrow(lvl: Level, kind: Kind, src: *const f32, dst: *mut u8, n: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        match kind {
            Kind::F32 => std::ptr::copy_nonoverlapping(src, dst as *mut f32, n),
            Kind::F16 => convert::f32_to_f16_raw(lvl, src, dst as *mut f16, n),
            Kind::Bf16 => convert::f32_to_bf16_raw(lvl, src, dst as *mut bf16, n),
            Kind::E4M3 | Kind::E5M2 => unreachable!("C is never FP8"),
        }
    }
}
