//! `erf_f32` and `exp_f32` against f64 `erf`/`exp`, every result held to an error bound
//! derived from the coefficients, the unit roundoff u = 2⁻²⁴ and the number of roundings.
//!
//! # Bounds
//! Horner's rule for `p(x) = Σ cᵢxⁱ` of degree d, each step a multiply and an add rounded
//! separately, is off by at most `γ₂d·Σ|cᵢ||x|ⁱ` (Higham, *Accuracy and Stability of Numerical
//! Algorithms*, §5.1), `γₙ = nu/(1 − nu)`; with each step one fused multiply-add (one
//! rounding, as `math::horner` evaluates it) by at most `γd·Σ|cᵢ||x|ⁱ`, the bound held here (a
//! Horner with separate roundings can exceed it); an error `δ` in x moves it by at most
//! `|δ|·Σ i|cᵢ||x|ⁱ⁻¹`. Each approximation's own error (the fitted polynomial evaluated in f64
//! against f64 `erf`/`exp`) is measured here, not assumed, and must stay below what its
//! coefficients' documentation states.
//!
//! - `exp_f32(x)`: `n = round(x/ln2)` is exact; `r = (x − n·LN2_HI) − n·LN2_LO` has the exact
//!   first step (`n·LN2_HI` has at most 24 significant bits and is within a factor of two of x)
//!   and two roundings after, `u·|n·LN2_LO| + u·|r|`, plus `|n|·|ln2 − LN2_HI − LN2_LO|`;
//!   the polynomial adds `γ₇·Σ|r|ⁱ/i!` and the truncation; scaling by 2ⁿ is exact, and the
//!   last product is rounded once more.
//! - `erf_f32(x)` below the split: `s = x²` rounded (`u·s`), `P(s)` by Horner, the product
//!   `x·P` rounded, then `x + x·P` rounded. Above: `t − 2.5` rounded, `Q` by Horner, `t²` rounded, their difference
//!   rounded (so `g` is off by the sum), then `exp_f32(g)` (its own bound plus `e^g·|Δg|`),
//!   then `1 − e` rounded.

use typed_amp_kernels::math::{
    erf_f32, exp_f32, exp_slice, gelu, gelu_derivative, gelu_derivative_slice, gelu_slice,
    ERF_CENTRE, ERF_LARGE, ERF_SMALL, ERF_SPLIT, EXP_TAYLOR, LN2_HI, LN2_LO,
};
use typed_amp_kernels::{detected_level, force_level, Level};

const U: f64 = 1.0 / 16_777_216.0;

fn gamma(n: usize) -> f64 {
    n as f64 * U / (1.0 - n as f64 * U)
}

/// `(Σ|cᵢ||x|ⁱ, Σ i|cᵢ||x|ⁱ⁻¹, Σ cᵢxⁱ)` in f64.
fn magnitudes(c: &[f32], x: f64) -> (f64, f64, f64) {
    let (mut mag, mut dmag, mut value) = (0.0, 0.0, 0.0);
    for (i, &ci) in c.iter().enumerate() {
        let ci = ci as f64;
        mag += ci.abs() * x.abs().powi(i as i32);
        value += ci * x.powi(i as i32);
        if i > 0 {
            dmag += i as f64 * ci.abs() * x.abs().powi(i as i32 - 1);
        }
    }
    (mag, dmag, value)
}

/// The bound on `|exp_f32(x) − eˣ|` for `x` in [−87, 88], and the polynomial's own relative
/// error there (truncation, measured in f64).
fn exp_bound(x: f64) -> (f64, f64) {
    let n = (x / std::f64::consts::LN_2).round();
    let r = x - n * std::f64::consts::LN_2;
    let ln2_split_err = (std::f64::consts::LN_2 - LN2_HI as f64 - LN2_LO as f64).abs();
    let dr = U * (n * LN2_LO as f64).abs() + U * r.abs() + n.abs() * ln2_split_err;
    let (mag, dmag, value) = magnitudes(&EXP_TAYLOR, r);
    let truncation = (value - r.exp()).abs() / r.exp();
    let poly = gamma(EXP_TAYLOR.len() - 1) * mag + dmag * dr;
    let e = x.exp();
    (
        e * (truncation + poly / r.exp()) * (1.0 + U) + U * e,
        truncation,
    )
}

#[test]
fn exp_f32_is_within_its_derived_bound() {
    let mut worst_truncation: f64 = 0.0;
    for i in 0..=1_750_000 {
        let x = (-87.0 + i as f64 * 1e-4) as f32;
        let x64 = x as f64;
        let (bound, truncation) = exp_bound(x64);
        worst_truncation = worst_truncation.max(truncation);
        let got = exp_f32(x) as f64;
        assert!(
            (got - x64.exp()).abs() <= bound,
            "exp_f32({x}) = {got}, exact {} ± {bound}",
            x64.exp()
        );
    }
    // EXP_TAYLOR's documentation: truncation below 7.4e-9 on |r| <= ln2/2.
    assert!(worst_truncation < 7.4e-9, "{worst_truncation}");
    assert!(exp_f32(f32::NAN).is_nan());
    assert_eq!(exp_f32(0.0), 1.0);
    assert!(exp_f32(-1e30) > 0.0 && exp_f32(1e30).is_finite());
}

/// The bound on `|erf_f32(x) − erf(x)|`, and the approximation's own error at x (measured in
/// f64: relative below the split, absolute on `ln erfc + t²` above).
fn erf_bound(x: f32) -> (f64, f64) {
    let x64 = x as f64;
    let exact = libm::erf(x64);
    let a = x64.abs();
    if a < ERF_SPLIT as f64 {
        let s = x64 * x64;
        let (mag, dmag, p) = magnitudes(&ERF_SMALL, s);
        let approx = x64 + x64 * p;
        let fit = (approx - exact).abs();
        let eval = a * (gamma(ERF_SMALL.len() - 1) * mag + dmag * U * s) * (1.0 + U)
            + U * (x64 * p).abs()
            + U * approx.abs();
        (
            fit + eval,
            if exact == 0.0 { 0.0 } else { fit / exact.abs() },
        )
    } else {
        let t = a.min(4.0);
        let v = t - ERF_CENTRE as f64;
        let (mag, dmag, q) = magnitudes(&ERF_LARGE, v);
        let g = q - t * t;
        let fit_g = (g - (libm::erfc(t).ln())).abs();
        let dg = gamma(ERF_LARGE.len() - 1) * mag
            + dmag * U * v.abs()
            + U * t * t
            + U * (g.abs() + mag + t * t);
        let approx = 1.0 - g.exp();
        let e_bound = exp_bound(g).0 + g.exp() * dg * (1.0 + dg);
        // Beyond 4 the form returns erf(4): `erf(x) − erf(4) ≤ erfc(4)`, in `fit`.
        let fit = (approx - exact.abs()).abs();
        (fit + e_bound * (1.0 + U) + U * approx.abs(), fit_g)
    }
}

#[test]
fn erf_f32_is_within_its_derived_bound() {
    let (mut worst_small, mut worst_large, mut worst_ulps): (f64, f64, f64) = (0.0, 0.0, 0.0);
    let mut check = |x: f32| {
        let (bound, fit) = erf_bound(x);
        if (x.abs() as f64) < ERF_SPLIT as f64 {
            worst_small = worst_small.max(fit);
        } else if x.abs() <= 4.0 {
            worst_large = worst_large.max(fit);
        }
        let got = erf_f32(x) as f64;
        let exact = libm::erf(x as f64);
        if exact != 0.0 {
            let ulp = 2f64.powi(exact.abs().log2().floor() as i32 - 23);
            worst_ulps = worst_ulps.max((got - exact).abs() / ulp);
        }
        assert!(
            (got - exact).abs() <= bound,
            "erf_f32({x}) = {got}, exact {exact} ± {bound}"
        );
    };
    for i in 0..=2_000_000 {
        check((-6.0 + i as f64 * 6e-6) as f32);
    }
    for i in 0..20_000 {
        let x = 10f64.powf(-30.0 + 30.0 * i as f64 / 20_000.0) as f32;
        check(x);
        check(-x);
    }
    for x in [0.0, -0.0, ERF_SPLIT, -ERF_SPLIT, 4.0, 1e30, f32::MAX] {
        check(x);
    }
    println!("erf_f32: largest error {worst_ulps:.2} ulp");
    // The coefficients' documentation: below 1.3e-8 relative, and 5.6e-8 absolute on
    // `ln erfc(t) + t²` (with the coefficients as rounded to f32).
    assert!(worst_small < 1.3e-8, "{worst_small}");
    assert!(worst_large < 5.6e-8, "{worst_large}");
    assert!(erf_f32(f32::NAN).is_nan());
    assert_eq!(erf_f32(f32::INFINITY), 1.0);
    assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
    assert_eq!(erf_f32(-0.0).to_bits(), (-0.0f32).to_bits());
}

/// GELU against f64: `ĝ = fl(fl(0.5·x)·fl(1 + ê))` with `ê = erf_f32(fl(x·fl(1/√2)))`. The
/// argument is off by two roundings (`2u·|a|`, a = x/√2), which move erf by at most
/// `(2/√π)·e^(−a²)·2u·|a|`; erf_f32's own bound at the rounded argument; `1 + ê` and the product
/// one rounding each: `|ĝ − g| ≤ 0.5·|x|·(E + Δ + u·|1 + erf|)·(1 + u) + u·|g|`.
#[test]
fn gelu_is_within_its_derived_bound() {
    for i in 0..=400_000 {
        let x = (-10.0 + i as f64 * 5e-5) as f32;
        let x64 = x as f64;
        let a = x64 / std::f64::consts::SQRT_2;
        let erf = libm::erf(a);
        let exact = 0.5 * x64 * (1.0 + erf);
        let shift = std::f64::consts::FRAC_2_SQRT_PI * (-a * a).exp() * 2.0 * U * a.abs();
        let arg = x * std::f32::consts::FRAC_1_SQRT_2;
        let e = erf_bound(arg).0 + (libm::erf(arg as f64) - erf).abs().max(shift);
        let bound = 0.5 * x64.abs() * (e + U * (1.0 + erf).abs()) * (1.0 + U) + U * exact.abs();
        let got = gelu(x) as f64;
        assert!(
            (got - exact).abs() <= bound,
            "gelu({x}) = {got}, exact {exact} ± {bound}"
        );
    }
}

/// The slice forms (built for AVX-512, or AVX2 and FMA, where the CPU has them) give the scalar
/// functions' bits at every level: Rust contracts no multiply-add into an FMA, and the FMAs the
/// polynomials ask for are exact on every level, so the wider
/// builds compute the same (NaN stays NaN).
#[test]
fn gelu_slices_give_the_scalar_bits_at_every_level() {
    // The special values both inside the first block of lanes and in the tail after the last.
    let special = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-40];
    let xs: Vec<f32> = special
        .into_iter()
        .chain((0..100_003).map(|i| (-12.0 + i as f64 * 2.4e-4) as f32))
        .chain(special)
        .collect();
    let levels = [Level::Portable, Level::Avx2, Level::Avx512];
    for lvl in levels.into_iter().filter(|&l| l <= detected_level()) {
        force_level(Some(lvl));
        let mut f = xs.clone();
        gelu_slice(&mut f);
        let mut df = xs.clone();
        gelu_derivative_slice(&mut df);
        let mut e = xs.clone();
        exp_slice(&mut e);
        for (i, &x) in xs.iter().enumerate() {
            let want = exp_f32(x);
            assert!(
                e[i].to_bits() == want.to_bits() || (e[i].is_nan() && want.is_nan()),
                "{lvl:?} exp({x}): {} vs {want}",
                e[i]
            );
        }
        // The same bits, or NaN for both (a NaN's sign and payload are not specified).
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        for (i, &x) in xs.iter().enumerate() {
            assert!(
                same(f[i], gelu(x)),
                "{lvl:?} gelu({x}): {} vs {}",
                f[i],
                gelu(x)
            );
            let d = gelu_derivative(x);
            assert!(same(df[i], d), "{lvl:?} gelu'({x}): {} vs {d}", df[i]);
        }
    }
    force_level(None);
}
