//! [`Real`] on x86 vector registers: `N` AVX-512 (`Zmm`) or AVX2 (`Ymm`) registers in lockstep,
//! each operation one intrinsic per register, so the slice forms compile to whole-register code.
//!
//! Why not [`Lanes`](super::lanes::Lanes) on these levels: LLVM's SLP vectoriser cut the
//! 32-element arrays into a mixture of 128-, 256- and 512-bit pieces with scalar leftovers and
//! spills (`perf annotate` of `gelu_slice` at the AVX-512 level: `xmm` multiply-adds, `vmulss`,
//! stack reloads), and GELU ran at 1.47 ns an element on an AVX-512 core; on whole registers
//! 0.60 (`cargo bench -p typed-amp-kernels --bench math`, three runs alternated).
//!
//! The bits are the scalar forms': every operation is the IEEE one rounded once, the fused
//! multiply-add is exact, and the selections keep the scalar NaN rules (`vmaxps`/`vminps`
//! return their second operand when either is NaN, which the argument order below turns into
//! `f32::clamp`'s and `below_or`'s behaviour; an ordered `>=` compare is false for NaN).
//! `tests/math.rs` holds every level to the scalar bits.
//!
//! Values of these types exist only inside the slice forms' functions compiled for the
//! matching target features and called after the level check; the intrinsics' `unsafe`
//! blocks rely on that (the types are private to `math`).

use std::arch::x86_64::*;
use std::ops::{Add, Mul, Neg, Sub};

use super::lanes::Real;

/// The bits of f32's sign.
const SIGN: i32 = i32::MIN;

/// `N` AVX-512 registers of 16 f32 each.
#[derive(Clone, Copy)]
pub(super) struct Zmm<const N: usize>(pub(super) [__m512; N]);

/// `N` AVX2 registers of 8 f32 each.
#[derive(Clone, Copy)]
pub(super) struct Ymm<const N: usize>(pub(super) [__m256; N]);

/// The operator traits and [`Real`] for a register type, from one intrinsic per operation.
/// `$cmp_select(s, bound, a, b)` is `if s >= bound { a } else { b }` lane by lane.
macro_rules! register_real {
    (
        $name:ident, $reg:ty,
        set1 = $set1:ident, add = $add:ident, sub = $sub:ident, mul = $mul:ident,
        fmadd = $fmadd:ident, max = $max:ident, min = $min:ident,
        abs = $abs:expr, copysign = $copysign:expr, pow2 = $pow2:expr,
        select_at_least = $select:expr $(,)?
    ) => {
        impl<const N: usize> $name<N> {
            #[inline(always)]
            fn map(self, f: impl Fn($reg) -> $reg) -> Self {
                let mut r = self.0;
                for x in &mut r {
                    *x = f(*x);
                }
                $name(r)
            }

            #[inline(always)]
            fn zip(self, o: Self, f: impl Fn($reg, $reg) -> $reg) -> Self {
                let mut r = self.0;
                for (x, y) in r.iter_mut().zip(o.0) {
                    *x = f(*x, y);
                }
                $name(r)
            }
        }

        impl<const N: usize> Add for $name<N> {
            type Output = Self;
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                // SAFETY: see the module's note (the target features are enabled here).
                self.zip(o, |x, y| unsafe { $add(x, y) })
            }
        }

        impl<const N: usize> Sub for $name<N> {
            type Output = Self;
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                // SAFETY: see the module's note.
                self.zip(o, |x, y| unsafe { $sub(x, y) })
            }
        }

        impl<const N: usize> Mul for $name<N> {
            type Output = Self;
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                // SAFETY: see the module's note.
                self.zip(o, |x, y| unsafe { $mul(x, y) })
            }
        }

        impl<const N: usize> Neg for $name<N> {
            type Output = Self;
            #[inline(always)]
            fn neg(self) -> Self {
                // SAFETY: see the module's note. Flipping the sign bit is f32's negation.
                self.map(|x| unsafe { $copysign(x, x, true) })
            }
        }

        impl<const N: usize> Real for $name<N> {
            #[inline(always)]
            fn splat(c: f32) -> Self {
                // SAFETY: see the module's note.
                $name([unsafe { $set1(c) }; N])
            }
            #[inline(always)]
            fn mul_add(self, a: Self, b: Self) -> Self {
                let mut r = self.0;
                for ((x, y), z) in r.iter_mut().zip(a.0).zip(b.0) {
                    // SAFETY: see the module's note.
                    *x = unsafe { $fmadd(*x, y, z) };
                }
                $name(r)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                // SAFETY: see the module's note.
                self.map(|x| unsafe { $abs(x) })
            }
            #[inline(always)]
            fn clamp(self, lo: f32, hi: f32) -> Self {
                // `max(lo, x)` and `min(hi, ·)` return `x` when it is NaN (the second operand).
                // SAFETY: see the module's note.
                self.map(|x| unsafe { $min($set1(hi), $max($set1(lo), x)) })
            }
            #[inline(always)]
            fn below_or(self, bound: f32) -> Self {
                // `min(x, bound)` is `x < bound ? x : bound`: NaN gives `bound`.
                // SAFETY: see the module's note.
                self.map(|x| unsafe { $min(x, $set1(bound)) })
            }
            #[inline(always)]
            fn copysign(self, sign: Self) -> Self {
                // SAFETY: see the module's note.
                self.zip(sign, |x, s| unsafe { $copysign(x, s, false) })
            }
            #[inline(always)]
            fn pow2_of_shifted(self) -> Self {
                // SAFETY: see the module's note.
                self.map(|x| unsafe { $pow2(x) })
            }
            #[inline(always)]
            fn select_at_least(self, bound: f32, a: Self, b: Self) -> Self {
                let mut r = b.0;
                for ((x, s), y) in r.iter_mut().zip(self.0).zip(a.0) {
                    // SAFETY: see the module's note.
                    *x = unsafe { $select(s, $set1(bound), y, *x) };
                }
                $name(r)
            }
        }
    };
}

/// `x` with the sign of `s` (or `x` negated when `flip`), as bits.
#[inline(always)]
unsafe fn zmm_copysign(x: __m512, s: __m512, flip: bool) -> __m512 {
    // SAFETY: the caller's (AVX-512F).
    unsafe {
        let sign = _mm512_set1_epi32(SIGN);
        let (x, s) = (_mm512_castps_si512(x), _mm512_castps_si512(s));
        if flip {
            _mm512_castsi512_ps(_mm512_xor_si512(x, sign))
        } else {
            // Bitwise `sign ? s : x` (truth table 0xCA: bit 4a + 2b + c of it is `a ? b : c`).
            _mm512_castsi512_ps(_mm512_ternarylogic_epi32::<0xCA>(sign, s, x))
        }
    }
}

/// `|x|`, as bits.
#[inline(always)]
unsafe fn zmm_abs(x: __m512) -> __m512 {
    // SAFETY: the caller's (AVX-512F).
    unsafe {
        _mm512_castsi512_ps(_mm512_andnot_si512(
            _mm512_set1_epi32(SIGN),
            _mm512_castps_si512(x),
        ))
    }
}

/// `if s >= bound { a } else { b }`, lane by lane (NaN gives `b`).
#[inline(always)]
unsafe fn zmm_select_at_least(s: __m512, bound: __m512, a: __m512, b: __m512) -> __m512 {
    // SAFETY: the caller's (AVX-512F).
    unsafe {
        let take_a = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(s, bound);
        _mm512_mask_blend_ps(take_a, b, a)
    }
}

/// `(n + 127) << 23` for the `n` in the low mantissa bits of `shifted = n + 1.5·2²³`.
#[inline(always)]
unsafe fn zmm_pow2(shifted: __m512) -> __m512 {
    // SAFETY: the caller's (AVX-512F).
    unsafe {
        let n = _mm512_sub_epi32(_mm512_castps_si512(shifted), _mm512_set1_epi32(0x4B40_0000));
        let biased = _mm512_add_epi32(n, _mm512_set1_epi32(127));
        _mm512_castsi512_ps(_mm512_slli_epi32::<23>(biased))
    }
}

register_real!(
    Zmm,
    __m512,
    set1 = _mm512_set1_ps,
    add = _mm512_add_ps,
    sub = _mm512_sub_ps,
    mul = _mm512_mul_ps,
    fmadd = _mm512_fmadd_ps,
    max = _mm512_max_ps,
    min = _mm512_min_ps,
    abs = zmm_abs,
    copysign = zmm_copysign,
    pow2 = zmm_pow2,
    select_at_least = zmm_select_at_least,
);

/// `x` with the sign of `s` (or `x` negated when `flip`), as bits.
#[inline(always)]
unsafe fn ymm_copysign(x: __m256, s: __m256, flip: bool) -> __m256 {
    // SAFETY: the caller's (AVX2).
    unsafe {
        let sign = _mm256_castsi256_ps(_mm256_set1_epi32(SIGN));
        if flip {
            _mm256_xor_ps(x, sign)
        } else {
            _mm256_or_ps(_mm256_andnot_ps(sign, x), _mm256_and_ps(sign, s))
        }
    }
}

/// `|x|`, as bits.
#[inline(always)]
unsafe fn ymm_abs(x: __m256) -> __m256 {
    // SAFETY: the caller's (AVX2).
    unsafe { _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_set1_epi32(SIGN)), x) }
}

/// `if s >= bound { a } else { b }`, lane by lane (NaN gives `b`).
#[inline(always)]
unsafe fn ymm_select_at_least(s: __m256, bound: __m256, a: __m256, b: __m256) -> __m256 {
    // SAFETY: the caller's (AVX2).
    unsafe {
        let take_a = _mm256_cmp_ps::<_CMP_GE_OQ>(s, bound);
        _mm256_blendv_ps(b, a, take_a)
    }
}

/// `(n + 127) << 23` for the `n` in the low mantissa bits of `shifted = n + 1.5·2²³`.
#[inline(always)]
unsafe fn ymm_pow2(shifted: __m256) -> __m256 {
    // SAFETY: the caller's (AVX2).
    unsafe {
        let n = _mm256_sub_epi32(_mm256_castps_si256(shifted), _mm256_set1_epi32(0x4B40_0000));
        let biased = _mm256_add_epi32(n, _mm256_set1_epi32(127));
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(biased))
    }
}

register_real!(
    Ymm,
    __m256,
    set1 = _mm256_set1_ps,
    add = _mm256_add_ps,
    sub = _mm256_sub_ps,
    mul = _mm256_mul_ps,
    fmadd = _mm256_fmadd_ps,
    max = _mm256_max_ps,
    min = _mm256_min_ps,
    abs = ymm_abs,
    copysign = ymm_copysign,
    pow2 = ymm_pow2,
    select_at_least = ymm_select_at_least,
);

/// `f` of every element of `xs`, in place, `N` AVX-512 registers at a time, the rest with `g`.
///
/// # Safety
/// The CPU has AVX-512F (and the caller is compiled for it, for the code to be vector code).
#[inline(always)]
pub(super) unsafe fn zmm_blocks<const N: usize>(
    xs: &mut [f32],
    f: impl Fn(Zmm<N>) -> Zmm<N>,
    g: impl Fn(f32) -> f32,
) {
    let mut chunks = xs.chunks_exact_mut(16 * N);
    for block in &mut chunks {
        let p = block.as_mut_ptr();
        // SAFETY: the caller's.
        let mut r = [unsafe { _mm512_setzero_ps() }; N];
        for (i, v) in r.iter_mut().enumerate() {
            // SAFETY: `block` holds 16·N f32, so every register's 16 are in bounds.
            *v = unsafe { _mm512_loadu_ps(p.add(16 * i)) };
        }
        let Zmm(out) = f(Zmm(r));
        for (i, v) in out.into_iter().enumerate() {
            // SAFETY: as for the loads.
            unsafe { _mm512_storeu_ps(p.add(16 * i), v) };
        }
    }
    for x in chunks.into_remainder() {
        *x = g(*x);
    }
}

/// `f` of every element of `xs`, in place, `N` AVX2 registers at a time, the rest with `g`.
///
/// # Safety
/// The CPU has AVX2 and FMA (and the caller is compiled for them).
#[inline(always)]
pub(super) unsafe fn ymm_blocks<const N: usize>(
    xs: &mut [f32],
    f: impl Fn(Ymm<N>) -> Ymm<N>,
    g: impl Fn(f32) -> f32,
) {
    let mut chunks = xs.chunks_exact_mut(8 * N);
    for block in &mut chunks {
        let p = block.as_mut_ptr();
        // SAFETY: the caller's.
        let mut r = [unsafe { _mm256_setzero_ps() }; N];
        for (i, v) in r.iter_mut().enumerate() {
            // SAFETY: `block` holds 8·N f32, so every register's 8 are in bounds.
            *v = unsafe { _mm256_loadu_ps(p.add(8 * i)) };
        }
        let Ymm(out) = f(Ymm(r));
        for (i, v) in out.into_iter().enumerate() {
            // SAFETY: as for the loads.
            unsafe { _mm256_storeu_ps(p.add(8 * i), v) };
        }
    }
    for x in chunks.into_remainder() {
        *x = g(*x);
    }
}
