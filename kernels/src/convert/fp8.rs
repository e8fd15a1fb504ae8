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

use super::{bf16_bits_to_f32_bits, widen_bf16, widen_f16};

mod sealed {
    pub trait Sealed {}
}

/// An FP8 format: [`E4M3`] or [`E5M2`]. The type is also the element: a one-byte code.
pub trait Fp8Format:
    sealed::Sealed
    + Copy
    + Default
    + PartialEq
    + Eq
    + std::hash::Hash
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    /// The format's name (`"E4M3"`, `"E5M2"`).
    const NAME: &'static str;
    /// Exponent bits (4 or 5).
    const EXPONENT_BITS: u32;
    /// Explicit mantissa bits (3 or 2).
    const MANTISSA_BITS: u32;
    /// Exponent bias (7 or 15).
    const BIAS: i32;
    /// The largest finite value (448 or 57,344), where narrowing saturates.
    const MAX: f32;
    /// Whether the format has infinities (E5M2 does, E4M3 does not).
    const HAS_INFINITY: bool;

    /// The value with this code.
    fn from_bits(bits: u8) -> Self;
    /// The code of this value.
    fn to_bits(self) -> u8;

    /// Narrows one f32 (the scalar reference: see the [module](self) rules).
    #[inline]
    fn from_f32(x: f32) -> Self {
        Self::from_bits(encode::<Self>(x.to_bits()))
    }

    /// Widens to f32 (exact; the scalar reference).
    #[inline]
    fn to_f32(self) -> f32 {
        f32::from_bits(decode::<Self>(self.to_bits()))
    }

    /// Narrows one bf16 (widened to f32 first, exactly, so it is rounded once).
    #[inline]
    fn from_bf16(x: bf16) -> Self {
        Self::from_f32(widen_bf16(x))
    }

    /// Narrows one f16 (widened to f32 first, exactly, so it is rounded once).
    #[inline]
    fn from_f16(x: f16) -> Self {
        Self::from_f32(widen_f16(x))
    }

    /// Widens to bf16 (exact).
    #[inline]
    fn to_bf16(self) -> bf16 {
        bf16::from_bits((decode::<Self>(self.to_bits()) >> 16) as u16)
    }

    /// Whether this code is a NaN.
    #[inline]
    fn is_nan(self) -> bool {
        self.to_f32().is_nan()
    }
}

/// OCP FP8 E4M3 ("E4M3FN"): 4 exponent bits (bias 7), 3 mantissa bits, largest finite 448,
/// no infinities, one NaN per sign (`S.1111.111`). The forward-pass format of the FP8 recipes
/// (activations and weights). The value is its one-byte code.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
#[repr(transparent)]
pub struct E4M3(pub u8);

/// OCP FP8 E5M2: 5 exponent bits (bias 15), 2 mantissa bits, largest finite 57,344, IEEE-like
/// infinities and NaNs. The backward-pass (gradient) format of the hybrid FP8 recipes. The
/// value is its one-byte code.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
#[repr(transparent)]
pub struct E5M2(pub u8);

impl sealed::Sealed for E4M3 {}
impl sealed::Sealed for E5M2 {}

impl Fp8Format for E4M3 {
    const NAME: &'static str = "E4M3";
    const EXPONENT_BITS: u32 = 4;
    const MANTISSA_BITS: u32 = 3;
    const BIAS: i32 = 7;
    const MAX: f32 = 448.0;
    const HAS_INFINITY: bool = false;

    #[inline]
    fn from_bits(bits: u8) -> Self {
        E4M3(bits)
    }
    #[inline]
    fn to_bits(self) -> u8 {
        self.0
    }
}

impl Fp8Format for E5M2 {
    const NAME: &'static str = "E5M2";
    const EXPONENT_BITS: u32 = 5;
    const MANTISSA_BITS: u32 = 2;
    const BIAS: i32 = 15;
    const MAX: f32 = 57344.0;
    const HAS_INFINITY: bool = true;

    #[inline]
    fn from_bits(bits: u8) -> Self {
        E5M2(bits)
    }
    #[inline]
    fn to_bits(self) -> u8 {
        self.0
    }
}

/// The constants the scalar and vector code share, derived from the format's.
pub(super) struct Spec<F>(std::marker::PhantomData<F>);

impl<F: Fp8Format> Spec<F> {
    /// Bits dropped from an f32 significand.
    pub(super) const SHIFT: u32 = 23 - F::MANTISSA_BITS;
    /// Subtracted from an f32's `(bits >> SHIFT)` to rebias the exponent.
    pub(super) const REBIAS: u32 = ((127 - F::BIAS) as u32) << F::MANTISSA_BITS;
    /// The f32 bits of the largest finite value (the saturation bound).
    pub(super) const MAX_BITS: u32 = F::MAX.to_bits();
    /// The f32 bits of the smallest normal value: below it, the result is subnormal.
    pub(super) const MIN_NORMAL_BITS: u32 = ((128 - F::BIAS) as u32) << 23;
    /// 2^(BIAS - 1 + MANTISSA_BITS): a subnormal magnitude times this is its code.
    pub(super) const SUB_SCALE: f32 = pow2(F::BIAS - 1 + F::MANTISSA_BITS as i32);
    /// 2^(1 - BIAS - MANTISSA_BITS): the value of code 1 (the smallest subnormal).
    pub(super) const SUB_UNIT: f32 = pow2(1 - F::BIAS - F::MANTISSA_BITS as i32);
    /// The magnitude codes at or above which a code is inf or NaN (`0x7F` for E4M3, whose only
    /// special is NaN; `0x7C` for E5M2).
    pub(super) const SPECIAL: u32 = if F::HAS_INFINITY {
        0x7F & !((1 << F::MANTISSA_BITS) - 1)
    } else {
        0x7F
    };
    /// The quiet bit of the format's mantissa.
    pub(super) const QUIET: u32 = 1 << (F::MANTISSA_BITS - 1);
}

/// 2^e for an exponent in f32's normal range.
const fn pow2(e: i32) -> f32 {
    f32::from_bits(((127 + e) as u32) << 23)
}

/// The FP8 code of an f32 (bits), by the [module](self) rules.
#[inline(always)]
pub(super) fn encode<F: Fp8Format>(x: u32) -> u8 {
    let sign = (x >> 24) & 0x80;
    let abs = x & 0x7FFF_FFFF;
    let mag = if abs > 0x7F80_0000 {
        nan_code::<F>(x)
    } else {
        let a = abs.min(Spec::<F>::MAX_BITS);
        if a < Spec::<F>::MIN_NORMAL_BITS {
            // Exact scaling by a power of two, then the integer nearest, ties to even: the
            // subnormal code (2^M, the smallest normal's code, when it rounds up).
            (f32::from_bits(a) * Spec::<F>::SUB_SCALE).round_ties_even() as u32
        } else {
            // Adding half an ulp less one, plus the kept LSB, carries exactly when the dropped
            // bits are above the tie or at it with an odd kept part (as in `f32_bits_to_bf16_bits`);
            // a carry into the exponent is the next binade, and `a <= MAX` keeps it finite.
            let s = Spec::<F>::SHIFT;
            let r = a + ((1 << (s - 1)) - 1) + ((a >> s) & 1);
            (r >> s) - Spec::<F>::REBIAS
        }
    };
    (sign | mag) as u8
}

/// The magnitude code of an f32 NaN (bits): E4M3's one NaN, or E5M2's quiet NaN with the f32's
/// payload bit below its quiet bit.
#[inline(always)]
fn nan_code<F: Fp8Format>(x: u32) -> u32 {
    if F::HAS_INFINITY {
        Spec::<F>::SPECIAL | Spec::<F>::QUIET | ((x >> Spec::<F>::SHIFT) & (Spec::<F>::QUIET - 1))
    } else {
        0x7F
    }
}

/// The f32 bits of an FP8 code (exact), by the [module](self) rules.
#[inline(always)]
pub(super) fn decode<F: Fp8Format>(c: u8) -> u32 {
    let sign = ((c & 0x80) as u32) << 24;
    let mag = (c & 0x7F) as u32;
    let m = mag & ((1 << F::MANTISSA_BITS) - 1);
    let bits = if mag >= Spec::<F>::SPECIAL {
        if F::HAS_INFINITY && m == 0 {
            0x7F80_0000
        } else {
            0x7FC0_0000 | (m << Spec::<F>::SHIFT)
        }
    } else if mag < 1 << F::MANTISSA_BITS {
        // Subnormal (or zero): the code times the smallest subnormal, exact in f32.
        (mag as f32 * Spec::<F>::SUB_UNIT).to_bits()
    } else {
        (mag << Spec::<F>::SHIFT) + (Spec::<F>::REBIAS << Spec::<F>::SHIFT)
    };
    sign | bits
}

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

/// The f32 bits of source element `i`: `SRC` 0 is f32, 1 bf16, 2 f16.
///
/// # Safety
/// `src` readable for element `i` of that type.
#[inline(always)]
pub(super) unsafe fn source_bits<const SRC: u8>(src: *const u8, i: usize) -> u32 {
    // SAFETY: the contract.
    unsafe {
        match SRC {
            0 => (src as *const u32).add(i).read_unaligned(),
            1 => bf16_bits_to_f32_bits((src as *const u16).add(i).read_unaligned()),
            _ => widen_f16(f16::from_bits((src as *const u16).add(i).read_unaligned())).to_bits(),
        }
    }
}

/// # Safety
/// `src` readable for `n` elements of the `SRC` type (see [`source_bits`]), `dst` writable
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
unsafe fn widen_raw<F: Fp8Format, const BF16: bool>(
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
