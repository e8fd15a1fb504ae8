//! The scalar conversions between f32 and the 16-bit formats, and the bit-level bf16 rules the
//! vector code spells the same way (the rules are [`crate::convert`]'s). Below the slice
//! functions and the FP8 conversions, which use them.

use half::{bf16, f16};

/// One f16 widened to f32 (exact).
#[inline]
pub fn widen_f16(x: f16) -> f32 {
    x.to_f32()
}

/// One f32 narrowed to f16, rounding to nearest even.
#[inline]
pub fn narrow_f16(x: f32) -> f16 {
    f16::from_f32(x)
}

/// One bf16 widened to f32 (exact).
#[inline]
pub fn widen_bf16(x: bf16) -> f32 {
    f32::from_bits(bf16_bits_to_f32_bits(x.to_bits()))
}

/// One f32 narrowed to bf16, rounding to nearest even.
#[inline]
pub fn narrow_bf16(x: f32) -> bf16 {
    bf16::from_bits(f32_bits_to_bf16_bits(x.to_bits()))
}

/// `half`'s bf16 narrowing, spelt with integer operations that vectorise.
#[inline(always)]
pub(crate) fn f32_bits_to_bf16_bits(x: u32) -> u16 {
    if x & 0x7FFF_FFFF > 0x7F80_0000 {
        ((x >> 16) | 0x0040) as u16
    } else {
        // Adding 0x7FFF plus the kept LSB carries into bit 16 exactly when the discarded half
        // is above the tie, or at the tie with an odd kept part: round to nearest even. A carry
        // out of the largest finite value gives the infinity bit pattern, as it should.
        ((x + 0x7FFF + ((x >> 16) & 1)) >> 16) as u16
    }
}

#[inline(always)]
pub(crate) fn bf16_bits_to_f32_bits(h: u16) -> u32 {
    let x = (h as u32) << 16;
    if x & 0x7FFF_FFFF > 0x7F80_0000 {
        x | 0x0040_0000
    } else {
        x
    }
}
