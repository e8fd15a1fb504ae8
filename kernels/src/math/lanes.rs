//! f32 arithmetic on one value ([`f32`]) or on `W` values in lockstep ([`Lanes`]): `math`'s
//! functions are written once over [`Real`], so the slice forms, which run them on blocks of
//! lanes, do exactly the scalar functions' operations lane by lane (the same bits).
//!
//! Why blocks: each function is a few long chains of dependent multiply-adds (`erf` runs two
//! polynomials and an `exp`, about 90 cycles of latency for one vector on Zen 3). One vector
//! per loop iteration left the chains of successive iterations to the out-of-order window,
//! which holds about three of them; on a block of several vectors every step is issued for all
//! of them together, and the chains overlap by construction.

use std::ops::{Add, Mul, Neg, Sub};

/// What `math`'s functions need of a number type: IEEE f32 operations, each rounded once.
pub(super) trait Real:
    Copy + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Neg<Output = Self>
{
    /// `c` in every lane.
    fn splat(c: f32) -> Self;
    /// `self·a + b`, rounded once.
    fn mul_add(self, a: Self, b: Self) -> Self;
    fn abs(self) -> Self;
    /// `f32::clamp` (NaN stays NaN).
    fn clamp(self, lo: f32, hi: f32) -> Self;
    /// `if self < bound { self } else { bound }` (NaN gives `bound`).
    fn below_or(self, bound: f32) -> Self;
    /// `f32::copysign`.
    fn copysign(self, sign: Self) -> Self;
    /// `2ⁿ` for the integer `n` in the low mantissa bits of `self = n + 1.5·2²³` (the rounding
    /// trick of `exp`): `(n + 127) << 23` as f32 bits, wrapping.
    fn pow2_of_shifted(self) -> Self;
    /// `if self >= bound { a } else { b }` (NaN gives `b`).
    fn select_at_least(self, bound: f32, a: Self, b: Self) -> Self;
}

/// The bits of `2ⁿ` for `shifted = n + 1.5·2²³`.
#[inline(always)]
fn pow2_bits(shifted: f32) -> u32 {
    let n = (shifted.to_bits() as i32).wrapping_sub(0x4B40_0000);
    (n.wrapping_add(127) << 23) as u32
}

impl Real for f32 {
    #[inline(always)]
    fn splat(c: f32) -> Self {
        c
    }
    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        f32::mul_add(self, a, b)
    }
    #[inline(always)]
    fn abs(self) -> Self {
        f32::abs(self)
    }
    #[inline(always)]
    fn clamp(self, lo: f32, hi: f32) -> Self {
        f32::clamp(self, lo, hi)
    }
    #[inline(always)]
    fn below_or(self, bound: f32) -> Self {
        if self < bound {
            self
        } else {
            bound
        }
    }
    #[inline(always)]
    fn copysign(self, sign: Self) -> Self {
        f32::copysign(self, sign)
    }
    #[inline(always)]
    fn pow2_of_shifted(self) -> Self {
        f32::from_bits(pow2_bits(self))
    }
    #[inline(always)]
    fn select_at_least(self, bound: f32, a: Self, b: Self) -> Self {
        if self >= bound {
            a
        } else {
            b
        }
    }
}

/// `W` f32 values, each operation applied to every lane (a loop the compiler turns into `W / 8`
/// or `W / 16` vector instructions side by side).
#[derive(Clone, Copy)]
pub(super) struct Lanes<const W: usize>(pub(super) [f32; W]);

impl<const W: usize> Lanes<W> {
    #[inline(always)]
    fn map(self, f: impl Fn(f32) -> f32) -> Self {
        let mut r = self.0;
        for x in &mut r {
            *x = f(*x);
        }
        Lanes(r)
    }

    #[inline(always)]
    fn zip(self, o: Self, f: impl Fn(f32, f32) -> f32) -> Self {
        let mut r = self.0;
        for (x, y) in r.iter_mut().zip(o.0) {
            *x = f(*x, y);
        }
        Lanes(r)
    }
}

impl<const W: usize> Add for Lanes<W> {
    type Output = Self;
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        self.zip(o, |x, y| x + y)
    }
}

impl<const W: usize> Sub for Lanes<W> {
    type Output = Self;
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        self.zip(o, |x, y| x - y)
    }
}

impl<const W: usize> Mul for Lanes<W> {
    type Output = Self;
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        self.zip(o, |x, y| x * y)
    }
}

impl<const W: usize> Neg for Lanes<W> {
    type Output = Self;
    #[inline(always)]
    fn neg(self) -> Self {
        self.map(|x| -x)
    }
}

impl<const W: usize> Real for Lanes<W> {
    #[inline(always)]
    fn splat(c: f32) -> Self {
        Lanes([c; W])
    }
    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        let mut r = self.0;
        for ((x, y), z) in r.iter_mut().zip(a.0).zip(b.0) {
            *x = x.mul_add(y, z);
        }
        Lanes(r)
    }
    #[inline(always)]
    fn abs(self) -> Self {
        self.map(f32::abs)
    }
    #[inline(always)]
    fn clamp(self, lo: f32, hi: f32) -> Self {
        self.map(|x| x.clamp(lo, hi))
    }
    #[inline(always)]
    fn below_or(self, bound: f32) -> Self {
        self.map(|x| x.below_or(bound))
    }
    #[inline(always)]
    fn copysign(self, sign: Self) -> Self {
        self.zip(sign, f32::copysign)
    }
    #[inline(always)]
    fn pow2_of_shifted(self) -> Self {
        self.map(|x| f32::from_bits(pow2_bits(x)))
    }
    #[inline(always)]
    fn select_at_least(self, bound: f32, a: Self, b: Self) -> Self {
        let mut r = b.0;
        for ((x, s), y) in r.iter_mut().zip(self.0).zip(a.0) {
            if s >= bound {
                *x = y;
            }
        }
        Lanes(r)
    }
}
