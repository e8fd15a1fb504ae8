//! The FP8 formats, [`E4M3`] and [`E5M2`], and their scalar codes: what the slice functions of
//! [`super::fp8`] (whose documentation holds the rules) and their AVX-512 and AVX2 loops
//! (`fp8_x86.rs`) share, below both.

use half::{bf16, f16};

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

    /// Narrows one f32 (the scalar reference: see the [rules](super::fp8)).
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

/// The FP8 code of an f32 (bits), by the [rules](super::fp8).
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

/// The f32 bits of an FP8 code (exact), by the [rules](super::fp8).
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

/// Elements `from..n` one at a time (the portable level, and the vector loops' tails), the
/// largest `|x|` bits starting from `m`.
///
/// # Safety
/// `src` readable as `SRC` values and (with `CAST`) `dst` writable for `n` elements.
#[inline(always)]
pub(super) unsafe fn tail<F: Fp8Format, const SRC: u8, const CAST: bool>(
    src: *const u8,
    scale: f32,
    dst: *mut u8,
    from: usize,
    n: usize,
    mut m: u32,
) -> u32 {
    // SAFETY: indices below `n`, inside the contract's buffers.
    unsafe {
        for i in from..n {
            let x = source_bits::<SRC>(src, i);
            m = m.max(x & 0x7FFF_FFFF);
            if CAST {
                *dst.add(i) = encode::<F>((f32::from_bits(x) * scale).to_bits());
            }
        }
    }
    m
}
