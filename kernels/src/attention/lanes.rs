//! Eight f32 lanes written two ways, AVX2 intrinsics and a plain array with the same bits, and
//! the choice between them when a pass runs.

use super::head::LANES;
use crate::convert::{narrow_bf16, widen_bf16};

/// Eight f32 lanes and the operations the row loops need: written with AVX2 intrinsics
/// ([`Avx2`]) and as a plain array ([`Portable`]), so the loops are one generic body. (Written
/// over arrays alone, the compiler split some of them into two-lane vectors and spilled the
/// sums to the stack.)
pub(super) trait Lanes8: Copy {
    fn zero() -> Self;
    fn splat(x: f32) -> Self;
    /// `s[..8]`.
    fn load(s: &[f32]) -> Self;
    /// Into `s[..8]`.
    fn store(self, s: &mut [f32]);
    /// `self·a + b`, rounded once.
    fn mul_add(self, a: Self, b: Self) -> Self;
    fn add(self, o: Self) -> Self;
    /// Each lane rounded to bf16 (to nearest even; a NaN made quiet, its payload's top kept)
    /// and widened again: `widen_bf16(narrow_bf16(x))`, bit for bit.
    fn round_bf16(self) -> Self;
}

/// [`Lanes8`] for any CPU: `f32::mul_add` is the correctly rounded fused multiply-add on every
/// target, so this gives [`Avx2`]'s bits.
#[derive(Clone, Copy)]
struct Portable([f32; LANES]);

impl Lanes8 for Portable {
    #[inline(always)]
    fn zero() -> Self {
        Portable([0.0; LANES])
    }
    #[inline(always)]
    fn splat(x: f32) -> Self {
        Portable([x; LANES])
    }
    #[inline(always)]
    fn load(s: &[f32]) -> Self {
        let mut v = [0.0; LANES];
        v.copy_from_slice(&s[..LANES]);
        Portable(v)
    }
    #[inline(always)]
    fn store(self, s: &mut [f32]) {
        s[..LANES].copy_from_slice(&self.0);
    }
    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        Portable(std::array::from_fn(|l| self.0[l].mul_add(a.0[l], b.0[l])))
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        Portable(std::array::from_fn(|l| self.0[l] + o.0[l]))
    }
    #[inline(always)]
    fn round_bf16(self) -> Self {
        Portable(self.0.map(|x| widen_bf16(narrow_bf16(x))))
    }
}

/// [`Lanes8`] in one AVX register. Values of this type are only made inside [`run_rows`]' AVX2
/// body, which runs after the CPU's AVX2 and FMA were checked ([`crate::level`]): that is what
/// makes its intrinsics sound to call.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Avx2(std::arch::x86_64::__m256);

#[cfg(target_arch = "x86_64")]
impl Lanes8 for Avx2 {
    #[inline(always)]
    fn zero() -> Self {
        // SAFETY: AVX is present (see the type's documentation).
        Avx2(unsafe { std::arch::x86_64::_mm256_setzero_ps() })
    }
    #[inline(always)]
    fn splat(x: f32) -> Self {
        // SAFETY: as in `zero`.
        Avx2(unsafe { std::arch::x86_64::_mm256_set1_ps(x) })
    }
    #[inline(always)]
    fn load(s: &[f32]) -> Self {
        let s = &s[..LANES];
        // SAFETY: as in `zero`; `s` holds the eight elements read (unaligned load).
        Avx2(unsafe { std::arch::x86_64::_mm256_loadu_ps(s.as_ptr()) })
    }
    #[inline(always)]
    fn store(self, s: &mut [f32]) {
        let s = &mut s[..LANES];
        // SAFETY: as in `load`, for the eight elements written.
        unsafe { std::arch::x86_64::_mm256_storeu_ps(s.as_mut_ptr(), self.0) }
    }
    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        // SAFETY: FMA is present (see the type's documentation).
        Avx2(unsafe { std::arch::x86_64::_mm256_fmadd_ps(self.0, a.0, b.0) })
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        // SAFETY: as in `zero`.
        Avx2(unsafe { std::arch::x86_64::_mm256_add_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn round_bf16(self) -> Self {
        use std::arch::x86_64::{_mm256_castps_si256, _mm256_castsi256_ps, _mm256_slli_epi32};
        // `convert`'s eight-lane narrowing leaves each bf16 in its lane's low half; shifted up,
        // that is its widening (a NaN's quiet bit is already set).
        // SAFETY: AVX2 is present (see the type's documentation), all the narrowing needs.
        unsafe {
            let narrow = crate::convert::narrow_bf16_avx2(_mm256_castps_si256(self.0));
            Avx2(_mm256_castsi256_ps(_mm256_slli_epi32::<16>(narrow)))
        }
    }
}

/// One of the passes over a head's rows, generic over the lanes it computes in.
pub(super) trait RowPass {
    fn run<V: Lanes8>(self);
}

/// Runs `pass` on AVX2 and FMA where the CPU has them (AVX-512 CPUs included), else on
/// [`Portable`] lanes; the same bits either way.
pub(super) fn run_rows<P: RowPass>(pass: P) {
    #[cfg(target_arch = "x86_64")]
    if crate::level::level() >= crate::level::Level::Avx2 {
        #[target_feature(enable = "avx2,fma")]
        fn wide<P: RowPass>(pass: P) {
            pass.run::<Avx2>()
        }
        // SAFETY: the level is at least AVX2, which is only detected (or forced) on a CPU with
        // AVX2 and FMA.
        return unsafe { wide(pass) };
    }
    pass.run::<Portable>()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit patterns where rounding to bf16 is delicate: ties to even both ways and either side
    /// of a tie, the largest finite values (one rounds up to infinity), infinities, NaNs (quiet,
    /// signalling, with payloads in either half), subnormals and zeros of both signs.
    fn cases() -> Vec<u32> {
        let mut bits = vec![
            0x3F80_8000, // tie, kept part even: down
            0x3F81_8000, // tie, kept part odd: up
            0x3F80_7FFF, // below a tie
            0x3F80_8001, // above a tie
            0x7F7F_FFFF, // largest finite: up to infinity
            0x7F7F_7FFF, // largest finite that stays
            0x7F80_0000, // infinity
            0xFF80_0000,
            0x7FC0_0000, // quiet NaN
            0x7F80_0001, // signalling NaN, payload in the discarded half
            0xFFA5_0000, // signalling NaN, payload in the kept half
            0x0000_8000, // subnormals
            0x8000_8001,
            0x007F_FFFF,
            0x0000_0000,
            0x8000_0000,
        ];
        // And a spread of ordinary values of both signs.
        bits.extend((0..48u32).map(|i| i.wrapping_mul(0x9E37_79B9) ^ 0x0001_8000));
        bits
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_rounds_to_bf16_as_the_scalar_conversion_does() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return;
        }
        #[target_feature(enable = "avx2,fma")]
        fn avx2(x: [f32; LANES]) -> [f32; LANES] {
            let mut out = [0.0; LANES];
            Avx2::load(&x).round_bf16().store(&mut out);
            out
        }
        for chunk in cases().chunks(LANES) {
            let x: [f32; LANES] = std::array::from_fn(|l| f32::from_bits(chunk[l % chunk.len()]));
            // SAFETY: AVX2 and FMA were detected above.
            let got = unsafe { avx2(x) };
            let want = Portable(x).round_bf16().0;
            for l in 0..LANES {
                assert_eq!(
                    got[l].to_bits(),
                    want[l].to_bits(),
                    "{:#010x}",
                    x[l].to_bits()
                );
                // The scalar conversion against `half`'s (independent) rounding.
                let h = half::bf16::from_f32(x[l]).to_f32();
                assert!(
                    h.to_bits() == want[l].to_bits() || (h.is_nan() && want[l].is_nan()),
                    "{:#010x}: half gives {:#010x}, the conversion {:#010x}",
                    x[l].to_bits(),
                    h.to_bits(),
                    want[l].to_bits()
                );
            }
        }
    }
}
