//! Eight f32 lanes written two ways, AVX2 intrinsics and a plain array with the same bits, and
//! the choice between them when a pass runs.

use super::head::LANES;
use crate::math::exp_f32;

/// `MASK[LANES - first..][..LANES]`: lanes `first..` all ones, the lanes before zero.
const MASK: [u32; 2 * LANES] = {
    let mut m = [0; 2 * LANES];
    let mut l = LANES;
    while l < 2 * LANES {
        m[l] = u32::MAX;
        l += 1;
    }
    m
};

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
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    /// `f32::max(acc, self)` in each lane: a NaN in `self` leaves `acc` (the accumulator
    /// second, as `_mm256_max_ps` returns its second operand where either is NaN).
    fn max_into(self, acc: Self) -> Self;
    /// [`exp_f32`] of each lane.
    fn exp(self) -> Self;
    /// Lanes `..first` replaced by `fill`'s, the rest kept (`first ≤ LANES`).
    fn fill_below(self, first: usize, fill: Self) -> Self;
    /// Each lane kept where `m`'s is above −∞, else zero (NaNs in `self` included).
    fn zero_where_neg_inf(self, m: Self) -> Self;
    /// The lanes as an array.
    fn to_array(self) -> [f32; LANES];
    /// Eight vectors as the rows of a matrix, transposed: lane `l` of vector `r` of the result
    /// is lane `r` of vector `l`.
    fn transpose8(rows: [Self; LANES]) -> [Self; LANES];
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
    fn sub(self, o: Self) -> Self {
        Portable(std::array::from_fn(|l| self.0[l] - o.0[l]))
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        Portable(std::array::from_fn(|l| self.0[l] * o.0[l]))
    }
    #[inline(always)]
    fn max_into(self, acc: Self) -> Self {
        Portable(std::array::from_fn(|l| acc.0[l].max(self.0[l])))
    }
    #[inline(always)]
    fn exp(self) -> Self {
        let mut x = self.0;
        for x in &mut x {
            *x = exp_f32(*x);
        }
        Portable(x)
    }
    #[inline(always)]
    fn fill_below(self, first: usize, fill: Self) -> Self {
        Portable(std::array::from_fn(|l| {
            if l < first {
                fill.0[l]
            } else {
                self.0[l]
            }
        }))
    }
    #[inline(always)]
    fn zero_where_neg_inf(self, m: Self) -> Self {
        Portable(std::array::from_fn(|l| {
            if m.0[l] > f32::NEG_INFINITY {
                self.0[l]
            } else {
                0.0
            }
        }))
    }
    #[inline(always)]
    fn to_array(self) -> [f32; LANES] {
        self.0
    }
    #[inline(always)]
    fn transpose8(rows: [Self; LANES]) -> [Self; LANES] {
        std::array::from_fn(|r| Portable(std::array::from_fn(|l| rows[l].0[r])))
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
    fn sub(self, o: Self) -> Self {
        // SAFETY: as in `zero`.
        Avx2(unsafe { std::arch::x86_64::_mm256_sub_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        // SAFETY: as in `zero`.
        Avx2(unsafe { std::arch::x86_64::_mm256_mul_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn max_into(self, acc: Self) -> Self {
        // SAFETY: as in `zero`. `maxps` returns its second operand where either is NaN: `acc`
        // where `self` is NaN, as `f32::max(acc, self)` does (and `acc` where it is NaN itself,
        // as `f32::max` does not: the passes start it at −∞ and never make it NaN).
        Avx2(unsafe { std::arch::x86_64::_mm256_max_ps(self.0, acc.0) })
    }
    #[inline(always)]
    fn exp(self) -> Self {
        // SAFETY: AVX2 and FMA are present (see the type's documentation). `math`'s register
        // form of `exp_f32`, with its bits.
        Avx2(unsafe { crate::math::exp_ymm(self.0) })
    }
    #[inline(always)]
    fn fill_below(self, first: usize, fill: Self) -> Self {
        use std::arch::x86_64::{_mm256_blendv_ps, _mm256_castsi256_ps, _mm256_loadu_si256};
        let mask = &MASK[LANES - first.min(LANES)..][..LANES];
        // SAFETY: as in `zero`; `mask` holds the eight lanes read. Where a mask lane is all
        // ones (`first..`), `blendv` takes `self`'s lane.
        Avx2(unsafe {
            let keep = _mm256_castsi256_ps(_mm256_loadu_si256(mask.as_ptr().cast()));
            _mm256_blendv_ps(fill.0, self.0, keep)
        })
    }
    #[inline(always)]
    fn zero_where_neg_inf(self, m: Self) -> Self {
        use std::arch::x86_64::{_mm256_and_ps, _mm256_cmp_ps, _mm256_set1_ps, _CMP_GT_OQ};
        // SAFETY: as in `zero`. `m > −∞` is false for −∞ (and NaN), whose lanes the mask zeroes.
        Avx2(unsafe {
            let live = _mm256_cmp_ps::<_CMP_GT_OQ>(m.0, _mm256_set1_ps(f32::NEG_INFINITY));
            _mm256_and_ps(self.0, live)
        })
    }
    #[inline(always)]
    fn to_array(self) -> [f32; LANES] {
        let mut a = [0.0; LANES];
        self.store(&mut a);
        a
    }
    #[inline(always)]
    fn transpose8(rows: [Self; LANES]) -> [Self; LANES] {
        use std::arch::x86_64::{
            _mm256_permute2f128_ps, _mm256_shuffle_ps, _mm256_unpackhi_ps, _mm256_unpacklo_ps,
        };
        let r = rows.map(|v| v.0);
        // SAFETY: as in `zero`. The usual three steps: interleave pairs of rows (lanes 0 1 of
        // each 128-bit half), pairs of pairs (0 1 2 3 of a half), then the halves.
        unsafe {
            let lo = |a, b| _mm256_unpacklo_ps(a, b);
            let hi = |a, b| _mm256_unpackhi_ps(a, b);
            let t = [
                lo(r[0], r[1]),
                hi(r[0], r[1]),
                lo(r[2], r[3]),
                hi(r[2], r[3]),
                lo(r[4], r[5]),
                hi(r[4], r[5]),
                lo(r[6], r[7]),
                hi(r[6], r[7]),
            ];
            let u = [
                _mm256_shuffle_ps::<0x44>(t[0], t[2]),
                _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
                _mm256_shuffle_ps::<0x44>(t[1], t[3]),
                _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
                _mm256_shuffle_ps::<0x44>(t[4], t[6]),
                _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
                _mm256_shuffle_ps::<0x44>(t[5], t[7]),
                _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
            ];
            [
                Avx2(_mm256_permute2f128_ps::<0x20>(u[0], u[4])),
                Avx2(_mm256_permute2f128_ps::<0x20>(u[1], u[5])),
                Avx2(_mm256_permute2f128_ps::<0x20>(u[2], u[6])),
                Avx2(_mm256_permute2f128_ps::<0x20>(u[3], u[7])),
                Avx2(_mm256_permute2f128_ps::<0x31>(u[0], u[4])),
                Avx2(_mm256_permute2f128_ps::<0x31>(u[1], u[5])),
                Avx2(_mm256_permute2f128_ps::<0x31>(u[2], u[6])),
                Avx2(_mm256_permute2f128_ps::<0x31>(u[3], u[7])),
            ]
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

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_transposes_as_the_portable_lanes_do() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return;
        }
        #[target_feature(enable = "avx2,fma")]
        fn avx2(m: &[[f32; LANES]; LANES]) -> [[f32; LANES]; LANES] {
            Avx2::transpose8(m.map(|r| Avx2::load(&r))).map(Avx2::to_array)
        }
        let m: [[f32; LANES]; LANES] =
            std::array::from_fn(|r| std::array::from_fn(|l| (r * LANES + l) as f32));
        let want: [[f32; LANES]; LANES] = std::array::from_fn(|r| std::array::from_fn(|l| m[l][r]));
        assert_eq!(Portable::transpose8(m.map(Portable)).map(|v| v.0), want);
        // SAFETY: AVX2 and FMA were detected above.
        assert_eq!(unsafe { avx2(&m) }, want);
    }
}
