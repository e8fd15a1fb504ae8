//! `erf` and `exp` for f32 without branches or library calls, so that a loop over a slice
//! vectorizes: GELU's `0.5·x·(1 + erf(x/√2))` and its derivative's `exp(−x²/2)`.
//!
//! libm's `erff` (and the `expf` it calls beyond 0.84) took about a tenth of a ViT's FP32 step
//! on two cores, one element at a time. These run both branches of their piecewise
//! approximations for every element and select, which the compiler turns into vector code.
//!
//! Accuracy, measured over every 6·10⁻⁶ of [−6, 6] and 20,000 points from 10⁻³⁰ to 1 against
//! f64 `erf` (`tests/math.rs` holds each result to an error bound derived from the
//! coefficients, u = 2⁻²⁴ and the number of roundings): `erf_f32` within 1.3 ulp, libm's
//! `erff` within 1; `exp_f32` within 9.1·10⁻⁸ relative (1.5 ulp). GELU's own rounding
//! (`1 + erf` cancels for negative x) is of the same order.

/// `erf(x) = x + x·P(x²)` below [`ERF_SPLIT`]: the coefficients of `P`, lowest first (a
/// least-squares fit of `erf(√s)/√s − 1` over `s ≤ ERF_SPLIT²`; relative error below
/// 1.3·10⁻⁸ with the coefficients rounded to f32). Adding `x` apart keeps the leading
/// coefficient's rounding (`2/√π − 1` instead of `2/√π`) eight times smaller.
pub const ERF_SMALL: [f32; 7] = [
    0.128_379_17,
    -0.376_126_35,
    0.112_836_94,
    -0.026_859_34,
    0.005_200_902_5,
    -0.000_814_136_35,
    8.364_897e-5,
];

/// `erf(t) = 1 − exp(Q(t − 2.5) − t²)` from [`ERF_SPLIT`] to 4 (beyond, `erf` is 1 in f32 to
/// within a quarter ulp): the coefficients of `Q`, lowest first (a least-squares fit of
/// `ln erfc(t) + t²`, absolute error below 5.6·10⁻⁸ with the coefficients rounded to f32).
pub const ERF_LARGE: [f32; 9] = [
    -1.556_815_3,
    -0.352_680_7,
    0.056_106_36,
    -0.010_858_515,
    0.002_165_154,
    -0.000_420_145_7,
    7.739_886_5e-5,
    -1.330_915_5e-5,
    1.613_091_2e-6,
];

/// Where `erf_f32` changes from the small-argument to the large-argument form.
pub const ERF_SPLIT: f32 = 0.921_875;

/// The large-argument form's centre.
pub const ERF_CENTRE: f32 = 2.5;

/// `ln 2` split for the argument reduction: `LN2_HI` has 16 significant bits, so `n·LN2_HI` is
/// exact for `|n| < 2⁸`.
pub const LN2_HI: f32 = 0.693_145_75;
/// `ln 2 − LN2_HI`.
pub const LN2_LO: f32 = 1.428_606_8e-6;

/// `exp(r)` on `|r| ≤ ln2/2`: Taylor coefficients `1/i!`, lowest first (truncation below
/// 7.4·10⁻⁹ relative).
pub const EXP_TAYLOR: [f32; 8] = [
    1.0,
    1.0,
    0.5,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5040.0,
];

mod lanes;
#[cfg(target_arch = "x86_64")]
mod registers;

use lanes::{Lanes, Real};

/// `c[0] + x·(c[1] + x·(…))`, each step one fused multiply-add (one rounding).
///
/// `mul_add` is the correctly rounded `a·b + c` on every target, so the bits do not depend on
/// the build: the AVX2 and AVX-512 slice forms issue `vfmadd`, the scalar form on a CPU without
/// FMA calls the C library's exact `fmaf` (slower, same result). Half the instructions of a
/// separate multiply and add: the polynomials are most of GELU's cost, and GELU and its
/// derivative were 9% of the small GPT's FP32 step on AVX2.
#[inline(always)]
fn horner<R: Real, const N: usize>(c: &[f32; N], x: R) -> R {
    let mut p = R::splat(c[N - 1]);
    for &ci in c[..N - 1].iter().rev() {
        p = p.mul_add(x, R::splat(ci));
    }
    p
}

/// [`exp_f32`] over [`Real`].
#[inline(always)]
fn exp_r<R: Real>(x: R) -> R {
    // `clamp` keeps NaN (`max`/`min` would replace it by a bound).
    let xc = x.clamp(-87.0, 88.0);
    // Round x/ln2 to the nearest integer n with the 1.5·2²³ trick (no rounding call): the sum's
    // low mantissa bits are n.
    const MAGIC: f32 = 12_582_912.0;
    let shifted = xc * R::splat(std::f32::consts::LOG2_E) + R::splat(MAGIC);
    let n = shifted - R::splat(MAGIC);
    let r = (xc - n * R::splat(LN2_HI)) - n * R::splat(LN2_LO);
    horner(&EXP_TAYLOR, r) * shifted.pow2_of_shifted()
}

/// [`erf_f32`] over [`Real`].
#[inline(always)]
fn erf_r<R: Real>(x: R) -> R {
    let a = x.abs();
    let small = x + x * horner(&ERF_SMALL, x * x);
    let t = a.below_or(4.0);
    let g = horner(&ERF_LARGE, t - R::splat(ERF_CENTRE)) - t * t;
    let large = (R::splat(1.0) - exp_r(g)).copysign(x);
    // NaN fails `a >= ERF_SPLIT` and takes the small form, which keeps it.
    a.select_at_least(ERF_SPLIT, large, small)
}

/// [`gelu`] over [`Real`].
#[inline(always)]
fn gelu_r<R: Real>(x: R) -> R {
    R::splat(0.5) * x * (R::splat(1.0) + erf_r(x * R::splat(FRAC_1_SQRT_2)))
}

/// [`gelu_derivative`] over [`Real`].
#[inline(always)]
fn gelu_derivative_r<R: Real>(x: R) -> R {
    let normal = R::splat(std::f32::consts::FRAC_2_SQRT_PI) * exp_r(R::splat(0.5) * -(x * x));
    let left = R::splat(0.5) * x;
    let right = R::splat(1.0) + erf_r(R::splat(FRAC_1_SQRT_2) * x);
    R::splat(0.5) * right + left * normal * R::splat(FRAC_1_SQRT_2)
}

/// `eˣ` in f32 (see the module's accuracy note). Arguments are clamped to [−87, 88], so the
/// result stays normal and finite (`e⁻⁸⁷ ≈ 1.6·10⁻³⁸`); NaN gives NaN.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    exp_r(x)
}

/// [`exp_f32`] of each lane of one AVX2 register, with its bits (for loops that hold their
/// values in registers already, as the short heads' attention does).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn exp_ymm(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    exp_r(registers::Ymm::<1>([x])).0[0]
}

/// [`exp_f32`] of each lane of one AVX-512 register, with its bits.
///
/// # Safety
/// The CPU must have AVX-512F (and the caller's code be compiled for it).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn exp_zmm(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    exp_r(registers::Zmm::<1>([x])).0[0]
}

/// `erf(x)` in f32 (see the module's accuracy note); odd, ±1 beyond ±4, NaN gives NaN.
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    erf_r(x)
}

/// `1/√2`.
const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;

/// GELU, `x·Φ(x) = 0.5·x·(1 + erf(x/√2))`, in f32: the formula, in the order, of dfdx's
/// `accurate_gelu`, with [`erf_f32`].
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    gelu_r(x)
}

/// GELU's derivative, `Φ(x) + x·φ(x) = 0.5·(1 + erf(x/√2)) + 0.5·x·(2/√π)·e^(−x²/2)/√2`: the
/// formula, in the order, of dfdx's `accurate_gelu` backward, with [`erf_f32`] and [`exp_f32`].
#[inline(always)]
pub fn gelu_derivative(x: f32) -> f32 {
    gelu_derivative_r(x)
}

/// `f` of every element of `xs`, in place: blocks of `W` lanes ([`Lanes`]), then the rest one
/// by one, all with the same operations.
#[inline(always)]
fn blocks<const W: usize>(
    xs: &mut [f32],
    f: impl Fn(Lanes<W>) -> Lanes<W>,
    g: impl Fn(f32) -> f32,
) {
    let (whole, rest) = xs.as_chunks_mut::<W>();
    for b in whole {
        *b = f(Lanes(*b)).0;
    }
    for x in rest {
        *x = g(*x);
    }
}

/// AVX-512 registers per block of the slice forms (64 lanes: GELU 0.60–0.61 ns an element
/// against 0.66–0.70 with two registers, `cargo bench --bench math`, two runs alternated).
#[cfg(target_arch = "x86_64")]
const ZMM_BLOCK: usize = 4;
/// AVX2 registers per block of the slice forms (32 lanes: with eight, the temporaries no longer
/// fit the 16 registers and spill).
#[cfg(target_arch = "x86_64")]
const YMM_BLOCK: usize = 4;

/// `pub fn $name(xs: &mut [f32])`: `$f` of every element, in place, in code compiled for AVX-512
/// or AVX2 and FMA where the CPU has them (on whole registers, [`registers`]: blocks of
/// [`ZMM_BLOCK`] or [`YMM_BLOCK`]), else SSE2's (on [`Lanes`], blocks of 16): several chains of
/// multiply-adds in flight at once.
/// `cargo bench -p typed-amp-kernels --bench math`, Zen 3, medians of three runs alternated
/// with one vector at a time: the derivative 2.48 → 2.31 ns per element, `exp` 0.41 → 0.38,
/// GELU 1.81 → 1.83 (within the runs' spread). Rust never contracts `a·b + c` into a fused
/// multiply-add, and the fused ones it is asked for (`mul_add`) are exact everywhere, so every
/// build gives the same bits. (`$f` is called by name: through a closure not marked for
/// inlining, the call was not inlined into the AVX2 loop and ran unvectorised.)
macro_rules! slice_form {
    ($(#[$doc:meta])* $name:ident, $f:ident) => {
        $(#[$doc])*
        pub fn $name(xs: &mut [f32]) {
            #[cfg(target_arch = "x86_64")]
            if crate::level::level() >= crate::level::Level::Avx512 {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
                fn widest(xs: &mut [f32]) {
                    // SAFETY: compiled for AVX-512F, called only on a CPU that has it.
                    unsafe {
                        registers::zmm_blocks::<ZMM_BLOCK>(
                            xs,
                            #[inline(always)] |b| $f(b),
                            #[inline(always)] |x| $f(x),
                        )
                    }
                }
                // SAFETY: the level is at least AVX-512, which is only detected (or forced) on
                // a CPU with AVX-512F, BW and VL (and AVX2 and FMA).
                return unsafe { widest(xs) };
            }
            #[cfg(target_arch = "x86_64")]
            if crate::level::level() >= crate::level::Level::Avx2 {
                #[target_feature(enable = "avx2,fma")]
                fn wide(xs: &mut [f32]) {
                    // SAFETY: compiled for AVX2 and FMA, called only on a CPU that has them.
                    unsafe {
                        registers::ymm_blocks::<YMM_BLOCK>(
                            xs,
                            #[inline(always)] |b| $f(b),
                            #[inline(always)] |x| $f(x),
                        )
                    }
                }
                // SAFETY: the level is at least AVX2, which is only detected (or forced) on a
                // CPU with AVX2 and FMA.
                return unsafe { wide(xs) };
            }
            blocks::<16>(xs, |b| $f(b), |x| $f(x));
        }
    };
}

slice_form!(
    /// [`gelu`] of every element, in place.
    gelu_slice,
    gelu_r
);
slice_form!(
    /// [`gelu_derivative`] of every element, in place.
    gelu_derivative_slice,
    gelu_derivative_r
);
slice_form!(
    /// [`exp_f32`] of every element, in place (attention's probabilities).
    exp_slice,
    exp_r
);
