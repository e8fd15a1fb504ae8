//! Eight f32 lanes written two ways, AVX2 intrinsics and a plain array with the same bits, and
//! the choice between them when a pass runs.

use super::head::LANES;

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
