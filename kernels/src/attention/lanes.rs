//! f32 vectors written three ways with the same bits: eight lanes as a plain array
//! ([`Portable`]) and in an AVX register ([`Avx2`]), sixteen in an AVX-512 register
//! ([`Avx512`]); and the choice between them when a pass runs.

use crate::math::exp_f32;

/// The most lanes a vector type has.
pub(super) const MAX_LANES: usize = 16;

/// `MASK[MAX_LANES - first..][..N]`: lanes `first..` all ones, the lanes before zero.
#[cfg(target_arch = "x86_64")]
const MASK: [u32; 2 * MAX_LANES] = {
    let mut m = [0; 2 * MAX_LANES];
    let mut l = MAX_LANES;
    while l < 2 * MAX_LANES {
        m[l] = u32::MAX;
        l += 1;
    }
    m
};

/// `N` f32 lanes and the operations the passes need, so that the passes are one generic body.
/// (Written over arrays alone, the compiler split some loops into two-lane vectors and spilled
/// the sums to the stack.) Every operation gives the same bits in every implementation, lane by
/// lane, and no result depends on `N`: a pass's bits are the same on every vector type.
pub(super) trait Lanes: Copy {
    /// Lanes a vector holds (8 or 16).
    const N: usize;
    /// Vector registers of the instruction set: how many sums a loop keeps in registers.
    const REGISTERS: usize;
    /// The eight-lane type the transposes and the rows' dot products run on (the type itself
    /// where it has eight lanes).
    type Eight: Lanes8;
    fn zero() -> Self;
    fn splat(x: f32) -> Self;
    /// `s[..N]`.
    fn load(s: &[f32]) -> Self;
    /// Into `s[..N]`.
    fn store(self, s: &mut [f32]);
    /// `self·a + b`, rounded once.
    fn mul_add(self, a: Self, b: Self) -> Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    /// `f32::max(acc, self)` in each lane: a NaN in `self` leaves `acc` (the accumulator
    /// second, as `maxps` returns its second operand where either is NaN).
    fn max_into(self, acc: Self) -> Self;
    /// [`exp_f32`] of each lane.
    fn exp(self) -> Self;
    /// Lanes `..first` replaced by `fill`'s, the rest kept.
    fn fill_below(self, first: usize, fill: Self) -> Self;
    /// Each lane kept where `m`'s is above −∞, else zero (NaNs in `self` included).
    fn zero_where_neg_inf(self, m: Self) -> Self;
    /// The lanes, in the first `N` elements.
    fn to_array(self) -> [f32; MAX_LANES];
}

/// Eight-lane vectors, which also transpose eight of themselves.
pub(super) trait Lanes8: Lanes {
    /// Eight vectors as the rows of a matrix, transposed: lane `l` of vector `r` of the result
    /// is lane `r` of vector `l`.
    fn transpose8(rows: [Self; 8]) -> [Self; 8];
}

/// Eight lanes for any CPU: `f32::mul_add` is the correctly rounded fused multiply-add on every
/// target, so this gives the vector types' bits.
#[derive(Clone, Copy)]
struct Portable([f32; 8]);

impl Lanes for Portable {
    const N: usize = 8;
    // As AVX2's, whose loops these stand in for: the tiles (and so the bits) are the same.
    const REGISTERS: usize = 16;
    type Eight = Self;
    #[inline(always)]
    fn zero() -> Self {
        Portable([0.0; 8])
    }
    #[inline(always)]
    fn splat(x: f32) -> Self {
        Portable([x; 8])
    }
    #[inline(always)]
    fn load(s: &[f32]) -> Self {
        let mut v = [0.0; 8];
        v.copy_from_slice(&s[..8]);
        Portable(v)
    }
    #[inline(always)]
    fn store(self, s: &mut [f32]) {
        s[..8].copy_from_slice(&self.0);
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
    fn to_array(self) -> [f32; MAX_LANES] {
        let mut a = [0.0; MAX_LANES];
        a[..8].copy_from_slice(&self.0);
        a
    }
}

impl Lanes8 for Portable {
    #[inline(always)]
    fn transpose8(rows: [Self; 8]) -> [Self; 8] {
        std::array::from_fn(|r| Portable(std::array::from_fn(|l| rows[l].0[r])))
    }
}

/// Eight lanes in one AVX register. Values of this type are only made inside [`run_rows`]'
/// AVX2 and AVX-512 bodies, which run after the CPU's AVX2 and FMA were checked
/// ([`crate::level`]): that is what makes its intrinsics sound to call.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Avx2(std::arch::x86_64::__m256);

#[cfg(target_arch = "x86_64")]
impl Lanes for Avx2 {
    const N: usize = 8;
    const REGISTERS: usize = 16;
    type Eight = Self;
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
        let s = &s[..8];
        // SAFETY: as in `zero`; `s` holds the eight elements read (unaligned load).
        Avx2(unsafe { std::arch::x86_64::_mm256_loadu_ps(s.as_ptr()) })
    }
    #[inline(always)]
    fn store(self, s: &mut [f32]) {
        let s = &mut s[..8];
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
        let mask = &MASK[MAX_LANES - first.min(8)..][..8];
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
    fn to_array(self) -> [f32; MAX_LANES] {
        let mut a = [0.0; MAX_LANES];
        self.store(&mut a);
        a
    }
}

#[cfg(target_arch = "x86_64")]
impl Lanes8 for Avx2 {
    #[inline(always)]
    fn transpose8(rows: [Self; 8]) -> [Self; 8] {
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

/// Sixteen lanes in one AVX-512 register. Values of this type are only made inside
/// [`run_rows`]' AVX-512 body, which runs after the CPU's AVX-512F, BW and VL were checked
/// ([`crate::level`]): that is what makes its intrinsics sound to call.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Avx512(std::arch::x86_64::__m512);

#[cfg(target_arch = "x86_64")]
impl Lanes for Avx512 {
    const N: usize = 16;
    const REGISTERS: usize = 32;
    type Eight = Avx2;
    #[inline(always)]
    fn zero() -> Self {
        // SAFETY: AVX-512F is present (see the type's documentation).
        Avx512(unsafe { std::arch::x86_64::_mm512_setzero_ps() })
    }
    #[inline(always)]
    fn splat(x: f32) -> Self {
        // SAFETY: as in `zero`.
        Avx512(unsafe { std::arch::x86_64::_mm512_set1_ps(x) })
    }
    #[inline(always)]
    fn load(s: &[f32]) -> Self {
        let s = &s[..16];
        // SAFETY: as in `zero`; `s` holds the sixteen elements read (unaligned load).
        Avx512(unsafe { std::arch::x86_64::_mm512_loadu_ps(s.as_ptr()) })
    }
    #[inline(always)]
    fn store(self, s: &mut [f32]) {
        let s = &mut s[..16];
        // SAFETY: as in `load`, for the sixteen elements written.
        unsafe { std::arch::x86_64::_mm512_storeu_ps(s.as_mut_ptr(), self.0) }
    }
    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        // SAFETY: as in `zero`.
        Avx512(unsafe { std::arch::x86_64::_mm512_fmadd_ps(self.0, a.0, b.0) })
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        // SAFETY: as in `zero`.
        Avx512(unsafe { std::arch::x86_64::_mm512_add_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        // SAFETY: as in `zero`.
        Avx512(unsafe { std::arch::x86_64::_mm512_sub_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        // SAFETY: as in `zero`.
        Avx512(unsafe { std::arch::x86_64::_mm512_mul_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn max_into(self, acc: Self) -> Self {
        // SAFETY: as in `zero`; the NaN rule of `Avx2::max_into` (`vmaxps` returns its second
        // operand where either is NaN).
        Avx512(unsafe { std::arch::x86_64::_mm512_max_ps(self.0, acc.0) })
    }
    #[inline(always)]
    fn exp(self) -> Self {
        // SAFETY: as in `zero`. `math`'s register form of `exp_f32`, with its bits.
        Avx512(unsafe { crate::math::exp_zmm(self.0) })
    }
    #[inline(always)]
    fn fill_below(self, first: usize, fill: Self) -> Self {
        // Lanes `first..` from `self`: their mask bits set.
        let keep: u16 = if first >= 16 { 0 } else { u16::MAX << first };
        // SAFETY: as in `zero`.
        Avx512(unsafe { std::arch::x86_64::_mm512_mask_blend_ps(keep, fill.0, self.0) })
    }
    #[inline(always)]
    fn zero_where_neg_inf(self, m: Self) -> Self {
        use std::arch::x86_64::_CMP_GT_OQ;
        use std::arch::x86_64::{_mm512_cmp_ps_mask, _mm512_maskz_mov_ps, _mm512_set1_ps};
        // SAFETY: as in `zero`. `m > −∞` is false for −∞ (and NaN), whose lanes are zeroed.
        Avx512(unsafe {
            let live = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(m.0, _mm512_set1_ps(f32::NEG_INFINITY));
            _mm512_maskz_mov_ps(live, self.0)
        })
    }
    #[inline(always)]
    fn to_array(self) -> [f32; MAX_LANES] {
        let mut a = [0.0; MAX_LANES];
        self.store(&mut a);
        a
    }
}

/// One of the passes over a head, generic over the vectors it computes in.
pub(super) trait RowPass {
    fn run<V: Lanes>(self);
}

/// Runs `pass` on AVX-512's sixteen lanes where the CPU has them and `sixteen` says the pass
/// fits them ([`ShortHead::sixteen_lanes_fit`](super::head::ShortHead::sixteen_lanes_fit)),
/// else on AVX2 and FMA where the CPU has them (AVX-512 CPUs included), else on [`Portable`]
/// lanes; the same bits on each.
pub(super) fn run_rows<P: RowPass>(sixteen: bool, pass: P) {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::level::{level, Level};
        if sixteen && level() >= Level::Avx512 {
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
            fn widest<P: RowPass>(pass: P) {
                pass.run::<Avx512>()
            }
            // SAFETY: the level is at least AVX-512, which is only detected (or forced) on a
            // CPU with AVX-512F, BW and VL, AVX2 and FMA.
            return unsafe { widest(pass) };
        }
        if level() >= Level::Avx2 {
            #[target_feature(enable = "avx2,fma")]
            fn wide<P: RowPass>(pass: P) {
                pass.run::<Avx2>()
            }
            // SAFETY: the level is at least AVX2, which is only detected (or forced) on a CPU
            // with AVX2 and FMA.
            return unsafe { wide(pass) };
        }
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
        fn avx2(m: &[[f32; 8]; 8]) -> [[f32; 8]; 8] {
            Avx2::transpose8(m.map(|r| Avx2::load(&r))).map(|v| {
                let a = v.to_array();
                std::array::from_fn(|l| a[l])
            })
        }
        let m: [[f32; 8]; 8] = std::array::from_fn(|r| std::array::from_fn(|l| (r * 8 + l) as f32));
        let want: [[f32; 8]; 8] = std::array::from_fn(|r| std::array::from_fn(|l| m[l][r]));
        assert_eq!(Portable::transpose8(m.map(Portable)).map(|v| v.0), want);
        // SAFETY: AVX2 and FMA were detected above.
        assert_eq!(unsafe { avx2(&m) }, want);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_masks_as_the_portable_lanes_do() {
        if !(is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl"))
        {
            return;
        }
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
        fn avx512(x: &[f32; 16], m: &[f32; 16], first: usize) -> [[f32; 16]; 2] {
            let (x, m) = (Avx512::load(x), Avx512::load(m));
            [
                x.fill_below(first, Avx512::splat(-1.0)).to_array(),
                x.zero_where_neg_inf(m).to_array(),
            ]
        }
        let x: [f32; 16] = std::array::from_fn(|l| l as f32 + 0.5);
        let m: [f32; 16] = std::array::from_fn(|l| match l % 3 {
            0 => f32::NEG_INFINITY,
            1 => f32::NAN,
            _ => l as f32,
        });
        for first in 0..=17 {
            // SAFETY: AVX-512F, BW and VL were detected above.
            let [filled, zeroed] = unsafe { avx512(&x, &m, first) };
            for l in 0..16 {
                assert_eq!(
                    filled[l],
                    if l < first { -1.0 } else { x[l] },
                    "{first} {l}"
                );
                assert_eq!(zeroed[l], if l % 3 == 2 { x[l] } else { 0.0 }, "{l}");
            }
        }
    }
}
