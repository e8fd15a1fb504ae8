//! The two FP8 formats of the OCP 8-bit floating point specification, [`E4M3`] and [`E5M2`],
//! and their conversions: from `f32`, `bf16` and `f16` (rounded to nearest, ties to even,
//! **saturating**), and to `f32` and `bf16` (exact: every FP8 value is a bf16 value).
//!
//! | format | exponent, mantissa bits | bias | largest finite | smallest normal | smallest subnormal | infinities | NaN codes |
//! | --- | --- | --- | --- | --- | --- | --- | --- |
//! | [`E4M3`] (OCP "E4M3FN") | 4, 3 | 7 | 448 (`S.1111.110`) | 2^-6 | 2^-9 | none | `S.1111.111` (one per sign) |
//! | [`E5M2`] | 5, 2 | 15 | 57,344 (`S.11110.11`) | 2^-14 | 2^-16 | `S.11111.00` | `S.11111.{01,10,11}` |
//!
//! # Rules
//! * **Narrowing** (`f32`, `bf16`, `f16` to FP8) rounds to nearest, ties to even, keeps
//!   subnormal results (no flush to zero) and keeps the sign of zero.
//! * **Saturation**: a value whose magnitude is at or above the format's largest finite value
//!   becomes ±that value (448 for E4M3, 57,344 for E5M2), **±inf included, in both formats**.
//!   This is the saturating mode of the FP8 training recipes (Transformer Engine's and torchao's
//!   casts clamp to ±max after scaling): a scaled tensor is quantised so that its amax lands at
//!   or below the maximum, and an overflowing value, inf included, is clamped rather than turned
//!   into inf or NaN. E5M2 has an infinity code, but no narrowing here produces it; it is only
//!   ever decoded.
//! * **NaN** stays NaN, with its sign. E4M3 has one NaN per sign (`S.1111.111`): every NaN
//!   narrows to it. E5M2 follows the 16-bit rule of [`crate::convert`]: the quiet bit (the top
//!   mantissa bit) is set and the one payload bit below it is the f32's (bit 21), so
//!   `0x7E`/`0x7F` (and their negatives) come out. Widening a NaN keeps its mantissa bits, moved
//!   to the top of the f32 significand, and sets the quiet bit (E4M3's NaN widens to
//!   `±0x7FF0_0000`; E5M2 widens as the top byte of an f16 would).
//! * **Widening** is exact; to bf16 it is the f32 result's top half (exact: an FP8 value has at
//!   most 4 significant bits and an exponent within bf16's normal range).
//! * `bf16` and `f16` sources are widened to f32 first (exact), so each value is rounded once.
//!
//! Every slice function gives, at every [`Level`], the bits of the scalar reference
//! ([`Fp8Format::from_f32`], [`Fp8Format::to_f32`]) for every element: the AVX-512 and AVX2
//! loops compute the same integer and float operations on sixteen or eight lanes (the
//! subnormal rounding with an explicit round-to-nearest-even, whatever MXCSR holds); the
//! portable level runs the scalar code.

use half::{bf16, f16};

use crate::level::{level, Level};

use super::fp8_format::{decode, encode, source_bits};
pub use super::fp8_format::{Fp8Format, E4M3, E5M2};

/// Narrows `src` into `dst` (see the [module](self) rules). Panics if the lengths differ.
pub fn f32_to_fp8<F: Fp8Format>(src: &[f32], dst: &mut [F]) {
    assert_eq!(src.len(), dst.len(), "f32_to_fp8: length mismatch");
    let (lvl, n) = (level(), src.len());
    // SAFETY: both slices hold `n` elements and cannot overlap (`&mut`); `F` is a
    // `repr(transparent)` byte; `level()` is supported by the CPU.
    unsafe {
        narrow_raw::<F, 0>(
            lvl,
            src.as_ptr() as *const u8,
            dst.as_mut_ptr() as *mut u8,
            n,
        )
    }
}

/// Narrows `src` into `dst` (each value widened to f32 exactly, then rounded once). Panics if
/// the lengths differ.
pub fn bf16_to_fp8<F: Fp8Format>(src: &[bf16], dst: &mut [F]) {
    assert_eq!(src.len(), dst.len(), "bf16_to_fp8: length mismatch");
    let (lvl, n) = (level(), src.len());
    // SAFETY: as in `f32_to_fp8`.
    unsafe {
        narrow_raw::<F, 1>(
            lvl,
            src.as_ptr() as *const u8,
            dst.as_mut_ptr() as *mut u8,
            n,
        )
    }
}

/// Narrows `src` into `dst` (each value widened to f32 exactly, then rounded once). Panics if
/// the lengths differ.
pub fn f16_to_fp8<F: Fp8Format>(src: &[f16], dst: &mut [F]) {
    assert_eq!(src.len(), dst.len(), "f16_to_fp8: length mismatch");
    let (lvl, n) = (level(), src.len());
    // SAFETY: as in `f32_to_fp8`.
    unsafe {
        narrow_raw::<F, 2>(
            lvl,
            src.as_ptr() as *const u8,
            dst.as_mut_ptr() as *mut u8,
            n,
        )
    }
}

/// Widens `src` into `dst` (exact). Panics if the lengths differ.
pub fn fp8_to_f32<F: Fp8Format>(src: &[F], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "fp8_to_f32: length mismatch");
    let (lvl, n) = (level(), src.len());
    // SAFETY: as in `f32_to_fp8`.
    unsafe {
        widen_raw::<F, false>(
            lvl,
            src.as_ptr() as *const u8,
            dst.as_mut_ptr() as *mut u8,
            n,
        )
    }
}

/// Widens `src` into `dst` (exact). Panics if the lengths differ.
pub fn fp8_to_bf16<F: Fp8Format>(src: &[F], dst: &mut [bf16]) {
    assert_eq!(src.len(), dst.len(), "fp8_to_bf16: length mismatch");
    let (lvl, n) = (level(), src.len());
    // SAFETY: as in `f32_to_fp8`.
    unsafe {
        widen_raw::<F, true>(
            lvl,
            src.as_ptr() as *const u8,
            dst.as_mut_ptr() as *mut u8,
            n,
        )
    }
}

/// # Safety
/// `src` readable for `n` elements of the `SRC` type (see `source_bits`), `dst` writable
/// for `n` bytes, not overlapping; `lvl` supported by the CPU.
unsafe fn narrow_raw<F: Fp8Format, const SRC: u8>(
    lvl: Level,
    src: *const u8,
    dst: *mut u8,
    n: usize,
) {
    // SAFETY: `lvl` is supported by the CPU (the contract), so the AVX-512 routine's features
    // are present; the buffers cover `n` elements (the contract).
    unsafe {
        #[cfg(target_arch = "x86_64")]
        if lvl >= Level::Avx512 {
            return super::fp8_x86::narrow_avx512::<F, SRC>(src, dst, n);
        }
        #[cfg(target_arch = "x86_64")]
        if lvl >= Level::Avx2 {
            return super::fp8_x86::narrow_avx2::<F, SRC>(src, dst, n);
        }
        let _ = lvl;
        for i in 0..n {
            *dst.add(i) = encode::<F>(source_bits::<SRC>(src, i));
        }
    }
}

/// # Safety
/// `src` readable for `n` bytes, `dst` writable for `n` elements (f32, or bf16 when `BF16`),
/// not overlapping; `lvl` supported by the CPU.
pub(crate) unsafe fn widen_raw<F: Fp8Format, const BF16: bool>(
    lvl: Level,
    src: *const u8,
    dst: *mut u8,
    n: usize,
) {
    // SAFETY: as in `narrow_raw`.
    unsafe {
        #[cfg(target_arch = "x86_64")]
        if lvl >= Level::Avx512 {
            return super::fp8_x86::widen_avx512::<F, BF16>(src, dst, n);
        }
        #[cfg(target_arch = "x86_64")]
        if lvl >= Level::Avx2 {
            return super::fp8_x86::widen_avx2::<F, BF16>(src, dst, n);
        }
        let _ = lvl;
        for i in 0..n {
            let bits = decode::<F>(*src.add(i));
            if BF16 {
                (dst as *mut u16)
                    .add(i)
                    .write_unaligned((bits >> 16) as u16);
            } else {
                (dst as *mut u32).add(i).write_unaligned(bits);
            }
        }
    }
}
