//! dfdx's `bf16` dtype on the CPU: every op and layer typed-amp uses, forward and backward, in
//! bf16 against the same computation in f32 from the same (bf16-representable) inputs and weights.
//!
//! # Tolerances
//!
//! bf16 keeps 8 significant bits: the spacing of bf16 numbers is 2^-7 relative, and one
//! round-to-nearest-even (RNE) rounding errs by at most u = 2^-8 times the magnitude of the value
//! it rounds. Inputs and weights are bf16-representable, so they enter both computations exactly;
//! the bf16 path then differs from the f32 path only through its R bf16 roundings. Each rounding of
//! an intermediate v moves the final result by at most u·|v|·|∂y/∂v|, so every bound below is
//! R · u · M, where M bounds |v|·|∂y/∂v| over the path (usually the largest magnitude the
//! reference reaches: max |reference|, or the largest intermediate when that is bigger). Each test
//! says how it counts R and M.
//!
//! Both paths also make f32 roundings (2^-24 relative each). Where both run the same f32
//! operations on the same values in the same order (the f32 GEMM behind the bf16 matmul, the f32
//! accumulation of bf16 sums) those roundings are identical and cancel; the others (libm in f32,
//! the f32 reference's own elementwise arithmetic) number fewer than 2^8 on any path here, so
//! together they stay below 2^-16 relative; `E32` adds that once to every bound.
//!
//! For elementwise formulas with many intermediates (GeLU, sigmoid, tanh and their derivatives) the
//! sum over roundings of u·|v|·|∂y/∂v| is evaluated per element by running-error arithmetic
//! ([`Re`]): a value carried with a bound on its accumulated error, each operation propagating the
//! incoming bounds by its partial derivatives and adding u·|result| for its own rounding. That is
//! the same R·u·M sum, taken element by element instead of with one global R and M.

use typed_amp_dfdx::dtypes::{bf16, f16};
use typed_amp_dfdx::optim::{Adam, RMSprop, Sgd};
use typed_amp_dfdx::prelude::*;

/// bf16 unit roundoff: round-to-nearest-even errs by at most 2^-8 relative.
const U: f32 = 1.0 / 256.0;
/// All f32 roundings on a path (fewer than 2^8 of 2^-24 each), relative to the magnitude M.
const E32: f32 = 1.0 / 65536.0;

/// R bf16 roundings, each at most u times a magnitude of at most `m`, plus the f32 roundings.
fn bound(r: f32, m: f32) -> f32 {
    (r * U + E32) * m
}

fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0.0f32, |a, x| a.max(x.abs()))
}

/// Deterministic values in [-scale, scale), rounded to bf16 so both paths see the same numbers.
fn values(n: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let unit = ((s >> 40) as f32) / ((1u64 << 24) as f32); // [0, 1)
            bf16::from_f32((2.0 * unit - 1.0) * scale).to_f32()
        })
        .collect()
}

/// Asserts |got - want| <= tol elementwise and returns the worst error for the report.
fn check(name: &str, got: &[f32], want: &[f32], tol: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "{name}: lengths");
    assert_eq!(tol.len(), want.len(), "{name}: tolerance lengths");
    let mut worst = 0.0f32;
    let mut worst_ratio = 0.0f32;
    for ((g, w), t) in got.iter().zip(want).zip(tol) {
        assert!(
            (g - w).abs() <= *t,
            "{name}: {g} against {w} (tolerance {t})"
        );
        worst = worst.max((g - w).abs());
        if *t > 0.0 {
            worst_ratio = worst_ratio.max((g - w).abs() / t);
        }
    }
    eprintln!(
        "{name}: worst |bf16 - f32| = {worst:.3e}, bound {:.3e}, worst error/bound {worst_ratio:.3}",
        tol.iter().fold(0.0f32, |a, t| a.max(*t))
    );
    worst
}

/// Same as [check] with one tolerance for every element.
fn check_all(name: &str, got: &[f32], want: &[f32], tol: f32) -> f32 {
    check(name, got, want, &vec![tol; want.len()])
}

fn tensor<S: Shape, E: Dtype>(dev: &Cpu, v: &[f32], shape: S) -> Tensor<S, E, Cpu>
where
    Cpu: Device<E>,
{
    dev.tensor_from_vec(v.to_vec(), shape).to_dtype::<E>()
}

fn f32s<S: Shape, E: Dtype, T>(t: Tensor<S, E, Cpu, T>) -> Vec<f32>
where
    Cpu: Device<E>,
{
    t.retaped::<NoneTape>().to_dtype::<f32>().as_vec()
}

// ---------------------------------------------------------------------------------------------
// Running-error arithmetic for elementwise formulas.

/// A value computed in f64 (standing for the exact result) with `e`, a bound on how far the bf16
/// evaluation of the same formula can be from it. Every operation flagged `rounded` is one bf16
/// rounding in dfdx's kernel and adds u·|result|.
#[derive(Clone, Copy)]
struct Re {
    v: f64,
    e: f64,
}

const UF: f64 = 1.0 / 256.0;

impl Re {
    /// An exact input (bf16-representable).
    fn exact(v: f64) -> Self {
        Re { v, e: 0.0 }
    }
    /// A constant as dfdx makes it in bf16 (`E::from_f64(c)`, `F::FRAC_2_PI()`...): one rounding.
    fn constant(v: f64) -> Self {
        Re { v, e: UF * v.abs() }
    }
    fn round(v: f64, e: f64) -> Self {
        Re {
            v,
            e: e + UF * v.abs(),
        }
    }
    fn add(self, o: Re) -> Re {
        Re::round(self.v + o.v, self.e + o.e)
    }
    fn sub(self, o: Re) -> Re {
        Re::round(self.v - o.v, self.e + o.e)
    }
    fn mul(self, o: Re) -> Re {
        Re::round(
            self.v * o.v,
            self.v.abs() * o.e + o.v.abs() * self.e + self.e * o.e,
        )
    }
    fn div(self, o: Re) -> Re {
        let d = o.v.abs() - o.e;
        assert!(d > 0.0, "divisor bound crosses zero");
        Re::round(self.v / o.v, (self.e + (self.v / o.v).abs() * o.e) / d)
    }
    /// f applied once (one rounding), with `lip` bounding |f'| within `e` of `v`.
    fn apply(self, f: impl Fn(f64) -> f64, lip: f64) -> Re {
        Re::round(f(self.v), lip * self.e)
    }
    fn tanh(self) -> Re {
        // |tanh'| <= 1
        self.apply(f64::tanh, 1.0)
    }
    fn exp(self) -> Re {
        self.apply(
            f64::exp,
            (self.v.abs() + self.e).exp().max((self.v + self.e).exp()),
        )
    }
    fn erf(self) -> Re {
        // |erf'| = 2/sqrt(pi) e^{-x^2} <= 2/sqrt(pi)
        self.apply(erf64, 2.0 / std::f64::consts::PI.sqrt())
    }
    fn sqrt(self) -> Re {
        let lo = self.v - self.e;
        assert!(lo > 0.0);
        self.apply(f64::sqrt, 0.5 / lo.sqrt())
    }
    fn powi(self, n: i32) -> Re {
        let hi = self.v.abs() + self.e;
        self.apply(|x| x.powi(n), n as f64 * hi.powi(n - 1))
    }
    fn neg(self) -> Re {
        Re {
            v: -self.v,
            e: self.e,
        }
    }
}

/// erf in f64 (Abramowitz-Stegun 7.1.26 is too coarse; this is the W. J. Cody-style series/
/// continued fraction through libm's erf via `f64` is unavailable on stable, so integrate).
fn erf64(x: f64) -> f64 {
    // Composite Simpson on [0, |x|] of 2/sqrt(pi) e^{-t^2}; 2000 panels: error < 1e-13 for |x| <= 6.
    let n = 2000;
    let a = x.abs();
    let h = a / n as f64;
    let f = |t: f64| (-t * t).exp();
    let mut s = f(0.0) + f(a);
    for i in 1..n {
        let t = i as f64 * h;
        s += if i % 2 == 1 { 4.0 } else { 2.0 } * f(t);
    }
    let v = s * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt();
    v.copysign(x)
}

// ---------------------------------------------------------------------------------------------
// to_dtype

/// RNE of an f32 to bf16 bits, written from the definition (independent of `half`).
fn rne_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) as u16) | 0x0040;
    }
    let hi = b >> 16;
    let lo = b & 0xFFFF;
    let up = lo > 0x8000 || (lo == 0x8000 && (hi & 1) == 1);
    (hi + up as u32) as u16
}

#[test]
fn to_dtype_bf16_f32_round_trip_is_exact() {
    let dev = Cpu::default();
    let all: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
    let n = all.len();
    let x = dev.tensor_from_vec(all.clone(), (n,));
    let wide = x.clone().to_dtype::<f32>();
    let back = wide.clone().to_dtype::<bf16>().as_vec();
    for ((b, w), r) in all.iter().zip(wide.as_vec()).zip(back) {
        // widening is a 16-bit shift, exactly
        if b.is_nan() {
            assert!(w.is_nan() && r.is_nan(), "{b:?}: NaN must stay NaN");
        } else {
            assert_eq!(w.to_bits(), (b.to_bits() as u32) << 16, "{b:?} widened");
            assert_eq!(r.to_bits(), b.to_bits(), "{b:?} round trip");
        }
    }
}

#[test]
fn to_dtype_f32_to_bf16_rounds_to_nearest_even() {
    let dev = Cpu::default();
    let one = 1.0f32;
    let ulp = 2f32.powi(-7); // bf16 spacing at 1
    let cases: Vec<(f32, f32)> = vec![
        // exactly halfway between 1 and 1 + ulp: tie to the even neighbour, 1
        (one + ulp / 2.0, one),
        // halfway between 1 + ulp (odd) and 1 + 2 ulp (even): up
        (one + 1.5 * ulp, one + 2.0 * ulp),
        // just above the tie: up
        (one + ulp / 2.0 + 2f32.powi(-20), one + ulp),
        // just below the tie: down
        (one + ulp / 2.0 - 2f32.powi(-20), one),
        (-(one + 1.5 * ulp), -(one + 2.0 * ulp)),
        (0.0, 0.0),
        (-0.0, -0.0),
        (f32::INFINITY, f32::INFINITY),
        (f32::NEG_INFINITY, f32::NEG_INFINITY),
        // bf16::MAX stays; half an ulp above it is a tie with an odd mantissa: rounds to inf
        (bf16::MAX.to_f32(), bf16::MAX.to_f32()),
        (f32::from_bits(0x7F7F_8000), f32::INFINITY),
        (f32::from_bits(0x7F7F_7FFF), bf16::MAX.to_f32()),
        (f32::MAX, f32::INFINITY),
        (-f32::MAX, f32::NEG_INFINITY),
        // subnormals round like any other value
        (f32::from_bits(0x0000_8001), f32::from_bits(0x0001_0000)),
        (f32::from_bits(0x0000_8000), 0.0),
    ];
    let (inp, want): (Vec<f32>, Vec<f32>) = cases.iter().cloned().unzip();
    let n = inp.len();
    let got = dev
        .tensor_from_vec(inp.clone(), (n,))
        .to_dtype::<bf16>()
        .as_vec();
    for ((x, w), g) in inp.iter().zip(&want).zip(&got) {
        assert_eq!(
            g.to_f32().to_bits(),
            w.to_bits(),
            "{x:e} ({:#x})",
            x.to_bits()
        );
    }

    // NaN stays NaN (quiet), with either sign
    let nans = vec![f32::NAN, -f32::NAN, f32::from_bits(0x7F80_0001)];
    let got = dev.tensor_from_vec(nans, (3,)).to_dtype::<bf16>().as_vec();
    assert!(got.iter().all(|x| x.is_nan()));

    // a sweep of f32s with every low-half pattern class against RNE from its definition
    let mut xs = Vec::new();
    for hi in [0x3F80u32, 0x3F81, 0xC2F3, 0x0001, 0x7F7F, 0x4B00] {
        for lo in [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1234, 0xC000] {
            xs.push(f32::from_bits((hi << 16) | lo));
        }
    }
    let n = xs.len();
    let got = dev
        .tensor_from_vec(xs.clone(), (n,))
        .to_dtype::<bf16>()
        .as_vec();
    for (x, g) in xs.iter().zip(got) {
        assert_eq!(g.to_bits(), rne_bits(*x), "{x:e}");
    }
}

#[test]
fn to_dtype_between_f16_bf16_and_f32() {
    let dev = Cpu::default();
    // f16 -> bf16 for every f16: f16 -> f32 is exact, so the result is RNE of the f16's value
    let all_h: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    let n = all_h.len();
    let h = dev.tensor_from_vec(all_h.clone(), (n,));
    let hb = h.clone().to_dtype::<bf16>().as_vec();
    for (x, y) in all_h.iter().zip(&hb) {
        if x.is_nan() {
            assert!(y.is_nan());
        } else {
            assert_eq!(y.to_bits(), rne_bits(x.to_f32()), "f16 {x:?} -> bf16");
        }
    }
    // f16 -> f32 -> f16 is exact
    let hf = h.clone().to_dtype::<f32>().to_dtype::<f16>().as_vec();
    for (x, y) in all_h.iter().zip(&hf) {
        assert!(x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()));
    }

    // bf16 -> f16 for every bf16: one rounding of the bf16's exact value to f16 (overflow to inf
    // above f16::MAX, f16 subnormals for tiny values)
    let all_b: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
    let b = dev.tensor_from_vec(all_b.clone(), (n,));
    let bh = b.clone().to_dtype::<f16>().as_vec();
    for (x, y) in all_b.iter().zip(&bh) {
        if x.is_nan() {
            assert!(y.is_nan());
        } else {
            assert_eq!(
                y.to_bits(),
                f16::from_f32(x.to_f32()).to_bits(),
                "bf16 {x:?}"
            );
        }
    }
    // bf16 values inside f16's normal range have at most 8 significant bits: exact in f16,
    // so bf16 -> f16 -> bf16 returns them unchanged
    for (x, y) in all_b.iter().zip(&bh) {
        let v = x.to_f32().abs();
        if v.is_finite() && (f16::MIN_POSITIVE.to_f32()..=f16::MAX.to_f32()).contains(&v) {
            assert_eq!(bf16::from_f32(y.to_f32()).to_bits(), x.to_bits());
        }
    }
    let sample = [1.0f32, 65504.0, 1e5, -3.0e-6];
    let hb_f16 = dev
        .tensor_from_vec(sample.to_vec(), (4,))
        .to_dtype::<bf16>()
        .to_dtype::<f16>()
        .to_dtype::<f32>()
        .as_vec();
    assert_eq!(hb_f16[0], 1.0);
    // f16::MAX = 65504 needs 11 significant bits: bf16 rounds it to 2^16, above f16::MAX: inf
    assert!(hb_f16[1].is_infinite());
    assert!(hb_f16[2].is_infinite());
    assert_eq!(
        hb_f16[3],
        f16::from_f32(bf16::from_f32(-3.0e-6).to_f32()).to_f32()
    );
}

// ---------------------------------------------------------------------------------------------
// Elementwise activations

/// A 1-d tensor on the CPU recording onto dfdx's own tape.
type Taped<E> = Tensor<(usize,), E, Cpu, OwnedTape<E, Cpu>>;

fn unary_case<E: Dtype>(x: &[f32], c: &[f32], op: fn(Taped<E>) -> Taped<E>) -> (Vec<f32>, Vec<f32>)
where
    Cpu: Device<E>,
{
    let dev = Cpu::default();
    let n = x.len();
    let xt: Tensor<_, E, _> = tensor(&dev, x, (n,));
    let ct: Tensor<_, E, _> = tensor(&dev, c, (n,));
    let y = op(xt.leaky_trace());
    let yv = f32s(y.retaped::<NoneTape>());
    // loss = sum(y * c): its gradient wrt y is c exactly (mul backward: c · 1, added to zero)
    let g = (y * ct).sum().backward();
    (yv, f32s(g.get(&xt)))
}

fn compare_unary(
    name: &str,
    op32: fn(Taped<f32>) -> Taped<f32>,
    op16: fn(Taped<bf16>) -> Taped<bf16>,
    fwd_bound: impl Fn(f64) -> Re,
    bwd_bound: impl Fn(f64, Re) -> Re,
) {
    let x = values(41, 3.0, 11);
    let c = values(41, 1.0, 12);
    let (y32, g32) = unary_case::<f32>(&x, &c, op32);
    let (y16, g16) = unary_case::<bf16>(&x, &c, op16);
    let mut ty = Vec::new();
    let mut tg = Vec::new();
    for (xi, ci) in x.iter().zip(&c) {
        let f = fwd_bound(*xi as f64);
        ty.push(f.e as f32 + E32 * f.v.abs() as f32);
        // dfdx's backward: grad_x += df(x) * grad_y, with grad_y = c exact; the product rounds
        let df = bwd_bound(*xi as f64, f);
        let g = df.mul(Re::exact(*ci as f64));
        tg.push(g.e as f32 + E32 * (df.v.abs() as f32 + 1.0));
    }
    check(&format!("{name} forward"), &y16, &y32, &ty);
    check(&format!("{name} backward"), &g16, &g32, &tg);
}

#[test]
fn relu_is_exact() {
    // max(x, 0) and its 0/1 derivative times c round nothing: R = 0.
    let x = values(41, 3.0, 1);
    let c = values(41, 1.0, 2);
    let (y32, g32) = unary_case::<f32>(&x, &c, |t| t.relu());
    let (y16, g16) = unary_case::<bf16>(&x, &c, |t| t.relu());
    check_all("relu forward", &y16, &y32, 0.0);
    check_all("relu backward", &g16, &g32, 0.0);
}

#[test]
fn tanh_sigmoid_gelu_forward_backward() {
    // The bounds below replay dfdx's CPU formulas (src/tensor_ops/<op>/cpu_kernel.rs) in
    // running-error arithmetic: each bf16 operation adds u·|its result|, propagated onward by the
    // partial derivatives of the rest of the formula. half evaluates each bf16 operation in f32
    // and rounds once, so every operation is one rounding.
    compare_unary(
        "tanh",
        |t| t.tanh(),
        |t| t.tanh(),
        // f(x) = tanh(x): one rounding
        |x| Re::exact(x).tanh(),
        // df uses f(x): 1 - f(x)^2, with f(x) carrying its forward error
        |_, fx| Re::exact(1.0).sub(fx.powi(2)),
    );
    compare_unary(
        "sigmoid",
        |t| t.sigmoid(),
        |t| t.sigmoid(),
        // f(x) = 1 / (1 + exp(-x))
        |x| Re::exact(1.0).div(Re::exact(1.0).add(Re::exact(x).neg().exp())),
        // df uses f(x): f(x) (1 - f(x))
        |_, fx| fx.mul(Re::exact(1.0).sub(fx)),
    );
    compare_unary(
        "fast_gelu",
        |t| t.fast_gelu(),
        |t| t.fast_gelu(),
        |x| {
            // alpha = x + 0.044715 x^3; f = 0.5 x (1 + tanh(sqrt(2/pi) alpha))
            let xr = Re::exact(x);
            let alpha = xr.add(Re::constant(0.044715).mul(xr.powi(3)));
            // sqrt(2/pi): FRAC_2_PI rounded, then its sqrt rounded
            let c = Re::constant(2.0 / std::f64::consts::PI).sqrt();
            let half = Re::exact(0.5);
            half.mul(xr).mul(Re::exact(1.0).add(c.mul(alpha).tanh()))
        },
        |x, _| {
            let xr = Re::exact(x);
            let half = Re::exact(0.5);
            let three = Re::exact(3.0);
            // beta = SQRT_2 * FRAC_2_SQRT_PI * 0.5, each constant rounded
            let beta = Re::constant(std::f64::consts::SQRT_2)
                .mul(Re::constant(2.0 / std::f64::consts::PI.sqrt()))
                .mul(half);
            let kappa = Re::constant(0.044715);
            let x_sq = xr.mul(xr);
            let x_cube = x_sq.mul(xr);
            let tanh_inner = beta.mul(xr.add(kappa.mul(x_cube))).tanh();
            let left = half.mul(xr);
            let right = Re::exact(1.0).add(tanh_inner);
            let left_derivative = half.mul(right);
            let tanh_derivative = Re::exact(1.0).sub(tanh_inner.mul(tanh_inner));
            let inner_derivative = beta.mul(Re::exact(1.0).add(three.mul(kappa).mul(x_sq)));
            let right_derivative = left.mul(tanh_derivative).mul(inner_derivative);
            left_derivative.add(right_derivative)
        },
    );
    compare_unary(
        "accurate_gelu",
        |t| t.accurate_gelu(),
        |t| t.accurate_gelu(),
        |x| {
            // 0.5 x (1 + erf(x / sqrt 2)), erf evaluated in f32 and rounded once
            let xr = Re::exact(x);
            let alpha = Re::constant(std::f64::consts::FRAC_1_SQRT_2);
            Re::exact(0.5)
                .mul(xr)
                .mul(Re::exact(1.0).add(xr.mul(alpha).erf()))
        },
        |x, _| {
            let xr = Re::exact(x);
            let half = Re::exact(0.5);
            let alpha = Re::constant(std::f64::consts::FRAC_1_SQRT_2);
            let x_sq = xr.mul(xr);
            let normal_dist =
                Re::constant(2.0 / std::f64::consts::PI.sqrt()).mul(half.mul(x_sq.neg()).exp());
            let left = half.mul(xr);
            let right = Re::exact(1.0).add(alpha.mul(xr).erf());
            let left_derivative = half.mul(right);
            let right_derivative = left.mul(normal_dist);
            left_derivative.add(right_derivative)
        },
    );
}

#[test]
fn dropout_train_forward_backward() {
    // Same seed on both devices: the same Bernoulli mask. Kept elements are x · f32(1 / (1 − p))
    // computed in f32 and rounded once to bf16 (R = 1 on M = max|y|); the backward multiplies
    // the incoming c the same way and adds it to a zero gradient: R = 2 on M = max|c| / 0.75.
    macro_rules! run {
        ($E:ty, $x:expr, $c:expr) => {{
            type E = $E;
            let (x, c): (&[f32], &[f32]) = ($x, $c);
            let dev = Cpu::seed_from_u64(5);
            let n = x.len();
            let xt: Tensor<_, E, _> = tensor(&dev, x, (n,));
            let ct: Tensor<_, E, _> = tensor(&dev, c, (n,));
            let mut drop = Dropout { p: 0.25 };
            let y = drop.forward_mut(xt.leaky_trace());
            let yv = f32s(y.retaped::<NoneTape>());
            let g = (y * ct).sum().backward();
            (yv, f32s(g.get(&xt)))
        }};
    }
    let x = values(257, 2.0, 21);
    let c = values(257, 1.0, 22);
    let (y32, g32) = run!(f32, &x, &c);
    let (y16, g16) = run!(bf16, &x, &c);
    // the masks agree
    for (a, b) in y32.iter().zip(&y16) {
        assert_eq!(*a == 0.0, *b == 0.0);
    }
    check_all("dropout forward", &y16, &y32, bound(1.0, max_abs(&y32)));
    check_all(
        "dropout backward",
        &g16,
        &g32,
        bound(2.0, max_abs(&c) / 0.75),
    );
}

// ---------------------------------------------------------------------------------------------
// Matmul and Linear

/// max over (i, j) of sum_k |a_ik| |b_kj|: bounds |A·B| and every partial sum of it.
fn abs_product_max(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> f32 {
    let mut best = 0.0f32;
    for i in 0..m {
        for j in 0..n {
            let s: f32 = (0..k).map(|p| (a[i * k + p] * b[p * n + j]).abs()).sum();
            best = best.max(s);
        }
    }
    best
}

fn transpose(v: &[f32], r: usize, c: usize) -> Vec<f32> {
    let mut t = vec![0.0; v.len()];
    for i in 0..r {
        for j in 0..c {
            t[j * r + i] = v[i * c + j];
        }
    }
    t
}

#[test]
fn matmul_odd_sizes_strides_and_batches() {
    const M: usize = 7;
    const K: usize = 13;
    const N: usize = 5;
    let a = values(M * K, 2.0, 31);
    let b = values(K * N, 2.0, 32);
    let c = values(M * N, 1.0, 33);

    fn run<E: Dtype>(a: &[f32], b: &[f32], c: &[f32], transposed: bool) -> [Vec<f32>; 3]
    where
        Cpu: Device<E>,
    {
        let dev = Cpu::default();
        let at: Tensor<Rank2<M, K>, E, _> = tensor(&dev, a, (Const, Const));
        let bt: Tensor<Rank2<K, N>, E, _> = tensor(&dev, b, (Const, Const));
        let ct: Tensor<Rank2<M, N>, E, _> = tensor(&dev, c, (Const, Const));
        let y = if transposed {
            // the same product through column-major (permuted) operands
            let a_tr: Tensor<Rank2<K, M>, E, _> = tensor(&dev, &transpose(a, M, K), (Const, Const));
            let b_tr: Tensor<Rank2<N, K>, E, _> = tensor(&dev, &transpose(b, K, N), (Const, Const));
            a_tr.permute::<Rank2<M, K>, _>().matmul(b_tr.permute())
        } else {
            at.clone().matmul(bt.clone())
        };
        let yv = f32s(y);
        let g = (at.leaky_trace().matmul(bt.clone()) * ct).sum().backward();
        [yv, f32s(g.get(&at)), f32s(g.get(&bt))]
    }
    // Forward: the f32 GEMM of exact (widened) operands, rounded to bf16 once: R = 1 on
    // M = max_ij sum_k |a_ik b_kj| (which bounds the result and the f32 partial sums).
    let m_fwd = abs_product_max(&a, &b, M, K, N);
    // Backward: grad_a = c·bᵀ and grad_b = aᵀ·c, each one f32 GEMM rounded once (accumulated into
    // a zero gradient, so C + A·B rounds once): R = 1 on the same kind of magnitude.
    let m_ga = abs_product_max(&c, &transpose(&b, K, N), M, N, K);
    let m_gb = abs_product_max(&transpose(&a, M, K), &c, K, M, N);
    for transposed in [false, true] {
        let [y32, ga32, gb32] = run::<f32>(&a, &b, &c, transposed);
        let [y16, ga16, gb16] = run::<bf16>(&a, &b, &c, transposed);
        let tag = if transposed {
            " (permuted operands)"
        } else {
            ""
        };
        check_all(
            &format!("matmul forward{tag}"),
            &y16,
            &y32,
            bound(1.0, m_fwd),
        );
        check_all(
            &format!("matmul grad lhs{tag}"),
            &ga16,
            &ga32,
            bound(1.0, m_ga),
        );
        check_all(
            &format!("matmul grad rhs{tag}"),
            &gb16,
            &gb32,
            bound(1.0, m_gb),
        );
    }

    // Batched: (3, M, K) x (K, N), backward through the broadcast rhs. grad_b accumulates the
    // three batch products into one bf16 buffer (C += A·B, each rounding once): R = 3 on
    // M = the sum over batches of max |aᵀ·c| partial products.
    const B: usize = 3;
    let ab = values(B * M * K, 2.0, 34);
    let cb = values(B * M * N, 1.0, 35);
    fn run_batched<E: Dtype>(a: &[f32], b: &[f32], c: &[f32]) -> [Vec<f32>; 3]
    where
        Cpu: Device<E>,
    {
        let dev = Cpu::default();
        let at: Tensor<Rank3<B, M, K>, E, _> = tensor(&dev, a, (Const, Const, Const));
        let bt: Tensor<Rank2<K, N>, E, _> = tensor(&dev, b, (Const, Const));
        let ct: Tensor<Rank3<B, M, N>, E, _> = tensor(&dev, c, (Const, Const, Const));
        let y = at.leaky_trace().matmul(bt.clone());
        let yv = f32s(y.retaped::<NoneTape>());
        let g = (y * ct).sum().backward();
        [yv, f32s(g.get(&at)), f32s(g.get(&bt))]
    }
    let [y32, ga32, gb32] = run_batched::<f32>(&ab, &b, &cb);
    let [y16, ga16, gb16] = run_batched::<bf16>(&ab, &b, &cb);
    let mut m_fwd = 0.0f32;
    let mut m_ga = 0.0f32;
    let mut m_gb_sum = 0.0f32;
    for i in 0..B {
        let ai = &ab[i * M * K..(i + 1) * M * K];
        let ci = &cb[i * M * N..(i + 1) * M * N];
        m_fwd = m_fwd.max(abs_product_max(ai, &b, M, K, N));
        m_ga = m_ga.max(abs_product_max(ci, &transpose(&b, K, N), M, N, K));
        m_gb_sum += abs_product_max(&transpose(ai, M, K), ci, K, M, N);
    }
    check_all("batched matmul forward", &y16, &y32, bound(1.0, m_fwd));
    check_all("batched matmul grad lhs", &ga16, &ga32, bound(1.0, m_ga));
    check_all(
        "batched matmul grad rhs",
        &gb16,
        &gb32,
        bound(B as f32, m_gb_sum),
    );
}

#[test]
fn linear_forward_backward() {
    const I: usize = 13;
    const O: usize = 5;
    const B: usize = 7;
    let w = values(O * I, 0.5, 41);
    let bias = values(O, 0.5, 42);
    let x = values(B * I, 2.0, 43);
    let c = values(B * O, 1.0, 44);
    macro_rules! run {
        ($E:ty, $w:expr, $bias:expr, $x:expr, $c:expr) => {{
            type E = $E;
            let (w, bias, x, c): (&[f32], &[f32], &[f32], &[f32]) = ($w, $bias, $x, $c);
            let dev = Cpu::default();
            let mut lin = dev.build_module::<Linear<I, O>, E>();
            lin.weight = tensor(&dev, w, (Const, Const));
            lin.bias = tensor(&dev, bias, (Const,));
            let xt: Tensor<Rank2<B, I>, E, _> = tensor(&dev, x, (Const, Const));
            let ct: Tensor<Rank2<B, O>, E, _> = tensor(&dev, c, (Const, Const));
            let y = lin.forward(xt.leaky_trace());
            let yv = f32s(y.retaped::<NoneTape>());
            let g = (y * ct).sum().backward();
            [
                yv,
                f32s(g.get(&xt)),
                f32s(g.get(&lin.weight)),
                f32s(g.get(&lin.bias)),
            ]
        }};
    }
    let [y32, gx32, gw32, gb32] = run!(f32, &w, &bias, &x, &c);
    let [y16, gx16, gw16, gb16] = run!(bf16, &w, &bias, &x, &c);
    // Forward y = x·wᵀ + b: the GEMM rounds once (u·|x·wᵀ|), the bias add once (u·|y|):
    // R = 2 on M = max sum_k |x_ik w_jk| + max |b|.
    let m = abs_product_max(&x, &transpose(&w, O, I), B, I, O) + max_abs(&bias);
    check_all("linear forward", &y16, &y32, bound(2.0, m));
    // grad_x = c·w (one rounded GEMM): R = 1 on max sum |c||w|.
    check_all(
        "linear grad x",
        &gx16,
        &gx32,
        bound(1.0, abs_product_max(&c, &w, B, O, I)),
    );
    // grad_w = cᵀ·x (one rounded GEMM): R = 1 on max sum |c||x|.
    check_all(
        "linear grad w",
        &gw16,
        &gw32,
        bound(1.0, abs_product_max(&transpose(&c, B, O), &x, O, B, I)),
    );
    // grad_b: the broadcast add's backward sums c_ij (times the exact derivative 1) over the
    // batch in f32 and rounds grad_b[j] once: R = 1 on M = max_j sum_i |c_ij|.
    let m_b = (0..O)
        .map(|j| (0..B).map(|i| c[i * O + j].abs()).sum::<f32>())
        .fold(0.0f32, f32::max);
    check_all("linear grad bias", &gb16, &gb32, bound(1.0, m_b));
}

// ---------------------------------------------------------------------------------------------
// Convolution and pooling (run-time image sizes, as typed-amp's layers call them)

#[test]
fn conv2d_forward_backward() {
    const C: usize = 3;
    const O: usize = 4;
    const K: usize = 3;
    const B: usize = 2;
    let (h, w) = (9usize, 7usize);
    let x = values(B * C * h * w, 2.0, 51);
    let f = values(O * C * K * K, 0.5, 52);
    // stride 2, padding 1: out 5 x 4
    let (ho, wo) = ((h + 2 - K) / 2 + 1, (w + 2 - K) / 2 + 1);
    let c = values(B * O * ho * wo, 1.0, 53);
    fn run<E: Dtype>(x: &[f32], f: &[f32], c: &[f32], h: usize, w: usize) -> [Vec<f32>; 3]
    where
        Cpu: Device<E> + ConvDevice<E>,
    {
        let dev = Cpu::default();
        let xt: Tensor<(Const<B>, Const<C>, usize, usize), E, _> =
            tensor(&dev, x, (Const, Const, h, w));
        let ft: Tensor<Rank4<O, C, K, K>, E, _> = tensor(&dev, f, (Const, Const, Const, Const));
        let y =
            (xt.leaky_trace(), ft.clone()).conv2d(Const::<2>, Const::<1>, Const::<1>, Const::<1>);
        let shape = *y.shape();
        let ct = tensor::<_, E>(&dev, c, shape);
        let yv = f32s(y.retaped::<NoneTape>());
        let g = (y * ct).sum().backward();
        [yv, f32s(g.get(&xt)), f32s(g.get(&ft))]
    }
    let [y32, gx32, gf32] = run::<f32>(&x, &f, &c, h, w);
    let [y16, gx16, gf16] = run::<bf16>(&x, &f, &c, h, w);
    // Forward: unfold (exact copies) and one GEMM per image rounded once: R = 1 on
    // M = (C K K) max|x| max|f|, which bounds every sum_k |x||f| of a patch.
    let mx = max_abs(&x);
    let mf = max_abs(&f);
    let mc = max_abs(&c);
    check_all(
        "conv2d forward",
        &y16,
        &y32,
        bound(1.0, (C * K * K) as f32 * mx * mf),
    );
    // grad_x: per image one GEMM (fᵀ · unfolded grad) accumulated into a zero buffer, rounded
    // once: R = 1 on M = (O K K) max|f| max|c|.
    check_all(
        "conv2d grad x",
        &gx16,
        &gx32,
        bound(1.0, (O * K * K) as f32 * mf * mc),
    );
    // grad_f: one GEMM per image accumulated into the same bf16 buffer (C += A·B, rounded each
    // time): R = B roundings, each of a partial sum bounded by B (ho wo) max|x| max|c|.
    check_all(
        "conv2d grad filters",
        &gf16,
        &gf32,
        bound(B as f32, (B * ho * wo) as f32 * mx * mc),
    );
}

#[test]
fn pool2d_max_and_avg_forward_backward() {
    const B: usize = 2;
    const C: usize = 3;
    let (h, w) = (7usize, 9usize);
    let x = values(B * C * h * w, 2.0, 61);
    fn run<E: Dtype>(x: &[f32], h: usize, w: usize, kind: Pool2DKind) -> [Vec<f32>; 2]
    where
        Cpu: Device<E> + ConvDevice<E>,
    {
        let dev = Cpu::default();
        let xt: Tensor<(Const<B>, Const<C>, usize, usize), E, _> =
            tensor(&dev, x, (Const, Const, h, w));
        let y = xt
            .leaky_trace()
            .pool2d(kind, Const::<3>, Const::<2>, Const::<0>, Const::<1>);
        let n = y.shape().num_elements();
        let c = values(n, 1.0, 62);
        let ct = tensor::<_, E>(&dev, &c, *y.shape());
        let yv = f32s(y.retaped::<NoneTape>());
        let g = (y * ct).sum().backward();
        [yv, f32s(g.get(&xt))]
    }
    let [y32, g32] = run::<f32>(&x, h, w, Pool2DKind::Max);
    let [y16, g16] = run::<bf16>(&x, h, w, Pool2DKind::Max);
    // Max: a comparison, exact; its gradient routes c to the argmax, and overlapping windows
    // (kernel 3, stride 2) add at most 4 values of c into one input in bf16: 3 roundings of
    // partial sums bounded by 4 max|c| (c is drawn in [-1, 1): max|c| <= 1).
    check_all("max pool forward", &y16, &y32, 0.0);
    check_all("max pool backward", &g16, &g32, bound(3.0, 4.0 * 1.0));
    let [y32, g32] = run::<f32>(&x, h, w, Pool2DKind::Avg);
    let [y16, g16] = run::<bf16>(&x, h, w, Pool2DKind::Avg);
    // Avg: the 9 window elements are summed in bf16 (8 roundings of partial sums <= 9 max|x|),
    // then multiplied by bf16(1/9) (the constant rounds, the product rounds; both relative to the
    // average <= max|x|). The sum's errors shrink by the factor 1/9: 8·9/9 + 1 + 1 = 10.
    // R = 10 on M = max|x|.
    check_all("avg pool forward", &y16, &y32, bound(10.0, max_abs(&x)));
    // Backward: each window's share c · bf16(1/9) rounds twice (constant, product; <= max|c|/9)
    // and lands on up to 4 overlapping inputs, added in bf16 (3 roundings of partial sums
    // <= 4 max|c|/9): 4·2 + 3·4 = 20 roundings of max|c|/9, i.e. R = 5 on M = 4 max|c| / 9, with
    // max|c| <= 1.
    check_all("avg pool backward", &g16, &g32, bound(5.0, 4.0 / 9.0 * 1.0));
}

// ---------------------------------------------------------------------------------------------
// Normalization layers

#[test]
fn batchnorm_and_layernorm_train_forward_backward() {
    // BatchNorm1D over a (batch 11, 5 channels) input and LayerNorm1D over 13 features.
    // Forward path per element (dfdx's batchnorm2d::train_fwd, normalize()):
    //   mean: sum (f32 accumulation, 1 rounding) * bf16(1/n) (1 + 1): 3 roundings of ~|mean|
    //   centered = x - mean: 1 rounding of <= 2 max|x|
    //   var: square (1), sum (1), * bf16(1/n) (2): relative error 4u on var
    //   std = sqrt(var + bf16(eps)): add (1), eps constant (negligible), sqrt (1): 2u + 4u/2
    //   scale / std (1), centered * that (1), + bias (1)
    // The normalized value z = centered/std has |z| <= sqrt(n); each relative error on std or on
    // the scale moves z by that relative amount, each absolute error on centered moves it by
    // 1/std. Counting relative errors on |z·scale| (<= Z): std 4u, division 1u, product 1u,
    // the add 1u on |y|, centered 1u·(2 max|x|)/std, mean's 3u·|mean|/std. We bound everything
    // by R = 12 on M = max(max|y|, Z, (2 max|x| + |mean|)/std_min) — the largest magnitude on
    // the path measured in output units.
    macro_rules! run_bn {
        ($E:ty, $x:expr, $c:expr, $scale:expr, $bias:expr) => {{
            type E = $E;
            let (x, c, scale, bias): (&[f32], &[f32], &[f32], &[f32]) = ($x, $c, $scale, $bias);
            let dev = Cpu::default();
            let mut bn = dev.build_module::<BatchNorm1D<5>, E>();
            bn.scale = tensor(&dev, scale, (Const,));
            bn.bias = tensor(&dev, bias, (Const,));
            let xt: Tensor<Rank2<11, 5>, E, _> = tensor(&dev, x, (Const, Const));
            let ct: Tensor<Rank2<11, 5>, E, _> = tensor(&dev, c, (Const, Const));
            let y = bn.forward_mut(xt.leaky_trace());
            let yv = f32s(y.retaped::<NoneTape>());
            let g = (y * ct).sum().backward();
            [
                yv,
                f32s(g.get(&xt)),
                f32s(g.get(&bn.scale)),
                f32s(g.get(&bn.bias)),
            ]
        }};
    }
    let x = values(55, 2.0, 71);
    let c = values(55, 1.0, 72);
    let scale = values(5, 1.5, 73);
    let bias = values(5, 0.5, 74);
    let [y32, gx32, gs32, gb32] = run_bn!(f32, &x, &c, &scale, &bias);
    let [y16, gx16, gs16, gb16] = run_bn!(bf16, &x, &c, &scale, &bias);
    let stats = channel_stats(&x, 11, 5);
    let std_min = stats.iter().map(|s| s.1).fold(f32::INFINITY, f32::min);
    let mean_max = stats.iter().map(|s| s.0.abs()).fold(0.0f32, f32::max);
    let mscale = max_abs(&scale);
    let z = (11f32).sqrt() * mscale;
    let m_fwd = max_abs(&y32)
        .max(z)
        .max(mscale * (2.0 * max_abs(&x) + mean_max) / std_min);
    check_all("batchnorm1d forward", &y16, &y32, bound(12.0, m_fwd));
    // grad_bias = sum over the batch of c, accumulated in f32 by the broadcast backward and
    // rounded once: R = 1 on M = max_j sum_i |c_ij|.
    let csum = (0..5)
        .map(|j| (0..11).map(|i| c[i * 5 + j].abs()).sum::<f32>())
        .fold(0.0f32, f32::max);
    check_all("batchnorm1d grad bias", &gb16, &gb32, bound(1.0, csum));
    // grad_scale = (sum_i c_i centered_i) / std: the products c·centered are exact in f32 and
    // summed there (1 rounding), centered carries 1u (its rounding) + 3u (the mean's, relative
    // to |x| terms), the division's backward takes bf16 1/std (1 rounding, std carries 4u) and
    // its product rounds (1), the broadcast backward rounds once more (1): R = 1 + 4 + 1 + 4 + 1
    // + 1 = 12 on M = sum_i |c_i| · Z / max|scale| (|centered_i / std| <= Z / max|scale|).
    check_all(
        "batchnorm1d grad scale",
        &gs16,
        &gs32,
        bound(12.0, csum * z / mscale),
    );
    // grad_x: three terms (direct, through the mean, through the variance), each a product of
    // c, scale/std and z or 1/n-sums of them; every term carries the forward's R = 12, its sums
    // (f32, 1 rounding) and 3 bf16 products: R = 12 + 1 + 3 = 16 per term, and the terms meet in
    // bf16 gradient buffers with 2 more roundings: R = 3·16 + 2 = 50 on M = 2 max|c| mscale/std_min
    // (each term is at most max|c| scale/std, the variance term with |z|^2/n <= 1 at most twice).
    check_all(
        "batchnorm1d grad x",
        &gx16,
        &gx32,
        bound(50.0, max_abs(&c) * mscale / std_min * 2.0),
    );

    // LayerNorm1D<13> on a (7, 13) input: the same normalize() path over the feature axis, then
    // * gamma + beta: the counts above with n = 13 (R = 12 forward).
    macro_rules! run_ln {
        ($E:ty, $x:expr, $c:expr, $gamma:expr, $beta:expr) => {{
            type E = $E;
            let (x, c, gamma, beta): (&[f32], &[f32], &[f32], &[f32]) = ($x, $c, $gamma, $beta);
            let dev = Cpu::default();
            let mut ln = dev.build_module::<LayerNorm1D<13>, E>();
            ln.gamma = tensor(&dev, gamma, (Const,));
            ln.beta = tensor(&dev, beta, (Const,));
            let xt: Tensor<Rank2<7, 13>, E, _> = tensor(&dev, x, (Const, Const));
            let ct: Tensor<Rank2<7, 13>, E, _> = tensor(&dev, c, (Const, Const));
            let y = ln.forward_mut(xt.leaky_trace());
            let yv = f32s(y.retaped::<NoneTape>());
            let g = (y * ct).sum().backward();
            [yv, f32s(g.get(&xt))]
        }};
    }
    let x = values(91, 2.0, 75);
    let c = values(91, 1.0, 76);
    let gamma = values(13, 1.5, 77);
    let beta = values(13, 0.5, 78);
    let [y32, gx32] = run_ln!(f32, &x, &c, &gamma, &beta);
    let [y16, gx16] = run_ln!(bf16, &x, &c, &gamma, &beta);
    let rows = row_stats(&x, 7, 13);
    let std_min = rows.iter().map(|s| s.1).fold(f32::INFINITY, f32::min);
    let mean_max = rows.iter().map(|s| s.0.abs()).fold(0.0f32, f32::max);
    let mg = max_abs(&gamma);
    let m_fwd = max_abs(&y32)
        .max((13f32).sqrt() * mg)
        .max(mg * (2.0 * max_abs(&x) + mean_max) / std_min);
    check_all("layernorm1d forward", &y16, &y32, bound(12.0, m_fwd));
    // grad_x: as for batch norm (sums over 13 features, in f32): R = 3·(12 + 1 + 3) + 2 = 50.
    check_all(
        "layernorm1d grad x",
        &gx16,
        &gx32,
        bound(50.0, max_abs(&c) * mg / std_min * 2.0),
    );

    // BatchNorm2D<3> on (4, 3, 5, 7): statistics over 140 elements per channel; the f32
    // accumulation of sums matters here (a bf16 running sum of 140 terms would carry 139
    // roundings). Forward counts as for BatchNorm1D: R = 12.
    macro_rules! run_bn2 {
        ($E:ty, $x:expr) => {{
            type E = $E;
            let x: &[f32] = $x;
            let dev = Cpu::default();
            let mut bn = dev.build_module::<BatchNorm2D<3>, E>();
            let xt: Tensor<Rank4<4, 3, 5, 7>, E, _> = tensor(&dev, x, (Const, Const, Const, Const));
            let y = bn.forward_mut(xt.leaky_trace());
            f32s(y)
        }};
    }
    let x = values(4 * 3 * 35, 2.0, 79);
    let y32 = run_bn2!(f32, &x);
    let y16 = run_bn2!(bf16, &x);
    let mut per_chan = vec![Vec::new(); 3];
    for b in 0..4 {
        for ch in 0..3 {
            per_chan[ch].extend_from_slice(&x[(b * 3 + ch) * 35..(b * 3 + ch + 1) * 35]);
        }
    }
    let std_min = per_chan
        .iter()
        .map(|v| row_stats(v, 1, v.len())[0].1)
        .fold(f32::INFINITY, f32::min);
    let m_fwd = max_abs(&y32)
        .max((140f32).sqrt())
        .max((2.0 * max_abs(&x) + 0.5) / std_min);
    check_all("batchnorm2d forward", &y16, &y32, bound(12.0, m_fwd));
}

/// (mean, std) of each column of a row-major (rows, cols) matrix.
fn channel_stats(x: &[f32], rows: usize, cols: usize) -> Vec<(f32, f32)> {
    row_stats(&transpose(x, rows, cols), cols, rows)
}

/// (mean, std) of each row of a row-major (rows, cols) matrix.
fn row_stats(x: &[f32], rows: usize, cols: usize) -> Vec<(f32, f32)> {
    (0..rows)
        .map(|r| {
            let v = &x[r * cols..(r + 1) * cols];
            let mean = v.iter().sum::<f32>() / cols as f32;
            let var = v.iter().map(|a| (a - mean).powi(2)).sum::<f32>() / cols as f32;
            (mean, (var + 1e-5).sqrt())
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Softmax, reductions, shapes

#[test]
fn softmax_and_log_softmax() {
    fn run<E: Dtype>(x: &[f32], c: &[f32], log: bool) -> [Vec<f32>; 2]
    where
        Cpu: Device<E>,
    {
        let dev = Cpu::default();
        let xt: Tensor<Rank2<6, 11>, E, _> = tensor(&dev, x, (Const, Const));
        let ct: Tensor<Rank2<6, 11>, E, _> = tensor(&dev, c, (Const, Const));
        let y = if log {
            xt.leaky_trace().log_softmax_16bit::<Axis<1>>()
        } else {
            xt.leaky_trace().softmax_16bit::<Axis<1>>()
        };
        let yv = f32s(y.retaped::<NoneTape>());
        let g = (y * ct).sum().backward();
        [yv, f32s(g.get(&xt))]
    }
    let x = values(66, 3.0, 81);
    let c = values(66, 1.0, 82);
    // softmax (dfdx's softmax.rs): t = x - max (1 rounding of |t| <= 6), e = exp(t) (1 rounding,
    // and t's error u|t| <= 6u becomes 6u relative: 7u), s = sum e (positive terms: their 7u, plus
    // the f32 sum's rounding: 8u), y = e / s (1): relative error 7 + 8 + 1 = 16u on y <= 1.
    // R = 16 on M = max|y|.
    let [y32, g32] = run::<f32>(&x, &c, false);
    let [y16, g16] = run::<bf16>(&x, &c, false);
    check_all("softmax forward", &y16, &y32, bound(16.0, max_abs(&y32)));
    // backward, grad_x_i = e_i (c_i / s - sum_j c_j e_j / s^2) through div, sum and exp:
    //   c_i / s: bf16 1/s (s's 8u + 1), the product's rounding (1): 10u on |c_i|/s;
    //   sum_j c_j (-e_j / s^2): -e/s.powi(2) is 2 roundings on e (7u) and s^2 (17u): 26u per term,
    //     f32 sum, rounded (1): 27u... bounded by 26u sum_j |c_j| e_j/s^2 + 1u on the sum;
    //   sum backward adds the two (1 rounding of <= 2 max|c|/s);
    //   exp backward multiplies by e_i (7u on the product) and rounds (1).
    // With e_i/s = y_i <= 1 and sum_j |c_j| e_j / s <= max|c|:
    //   (10 + 27 + 2·1 + 2·8) u max|c| <= 55 u max|c|. R = 55 on M = max|c|.
    check_all("softmax backward", &g16, &g32, bound(55.0, max_abs(&c)));
    // log_softmax (dfdx's log_softmax.rs): t = x - max (1 rounding: absolute u|t| <= 6u),
    // s = sum exp t (8u relative, as for softmax), l = ln s (s's 8u relative becomes 8u absolute,
    // plus 1 rounding of |l| <= ln 11), y = t - l (1 rounding of |y|):
    // |error| <= (6 + 8 + ln 11 + max|y|) u. R = 1 on M = 14 + ln 11 + max|y|.
    let [y32, g32] = run::<f32>(&x, &c, true);
    let [y16, g16] = run::<bf16>(&x, &c, true);
    let m = 14.0 + 11f32.ln() + max_abs(&y32);
    check_all("log_softmax forward", &y16, &y32, bound(1.0, m));
    // backward, grad_x_i = c_i - e_i (sum_j c_j) / s: the broadcast backward of the subtraction
    // sums c in f32 (1 rounding of <= 11 max|c|); ln's backward multiplies by bf16 1/s (s's 8u, 1)
    // and rounds (1): 11u relative; exp's backward multiplies by e_i (7u) and rounds (1): 19u on
    // |y_i sum c| <= 11 max|c|; the direct c_i and that product meet in bf16 (1 rounding of
    // <= 12 max|c|). 19·11 + 12 <= 20·12: R = 20 on M = 12 max|c|.
    check_all(
        "log_softmax backward",
        &g16,
        &g32,
        bound(20.0, 12.0 * max_abs(&c)),
    );
}

#[test]
fn reductions_sum_mean_max_min_var() {
    fn run<E: Dtype>(x: &[f32], c: &[f32]) -> Vec<[Vec<f32>; 2]>
    where
        Cpu: Device<E>,
    {
        let dev = Cpu::default();
        let xt: Tensor<Rank2<9, 17>, E, _> = tensor(&dev, x, (Const, Const));
        let ct: Tensor<Rank1<9>, E, _> = tensor(&dev, c, (Const,));
        let mut out = Vec::new();
        for which in 0..5 {
            let t = xt.leaky_trace();
            let y: Tensor<Rank1<9>, E, _, _> = match which {
                0 => t.sum::<Rank1<9>, _>(),
                1 => t.mean::<Rank1<9>, _>(),
                2 => t.max::<Rank1<9>, _>(),
                3 => t.min::<Rank1<9>, _>(),
                _ => t.var::<Rank1<9>, _>(),
            };
            let yv = f32s(y.retaped::<NoneTape>());
            let g = (y * ct.clone()).sum().backward();
            out.push([yv, f32s(g.get(&xt))]);
        }
        out
    }
    let x = values(9 * 17, 2.0, 91);
    let c = values(9, 1.0, 92);
    let r32 = run::<f32>(&x, &c);
    let r16 = run::<bf16>(&x, &c);
    let mx = max_abs(&x);
    let mc = max_abs(&c);
    // sum: f32 accumulation of exact values, rounded once: R = 1 on M = 17 max|x|.
    // Its gradient is c broadcast: exact.
    check_all("sum forward", &r16[0][0], &r32[0][0], bound(1.0, 17.0 * mx));
    check_all("sum backward", &r16[0][1], &r32[0][1], 0.0);
    // mean = sum · bf16(1/17): sum (1), constant (1), product (1): R = 3 on M = max|mean| <= mx.
    // Backward: c · bf16(1/17): constant (1) and product (1): R = 2 on M = mc / 17.
    check_all("mean forward", &r16[1][0], &r32[1][0], bound(3.0, mx));
    check_all(
        "mean backward",
        &r16[1][1],
        &r32[1][1],
        bound(2.0, mc / 17.0),
    );
    // max/min: exact; the gradient goes to the arg max/min, exact.
    check_all("max forward", &r16[2][0], &r32[2][0], 0.0);
    check_all("max backward", &r16[2][1], &r32[2][1], 0.0);
    check_all("min forward", &r16[3][0], &r32[3][0], 0.0);
    check_all("min backward", &r16[3][1], &r32[3][1], 0.0);
    // var = mean((mean - x)^2) (dfdx's var_to.rs): the inner mean errs by 3u|mean| <= 3u mx,
    // d = mean - x rounds (u|d| <= 2u mx): |δd| <= 5u mx; d^2 errs by 2|d||δd| + u d^2
    // <= 20u mx^2 + 4u mx^2; the outer mean averages those and adds its own 3u relative on
    // var <= 4 mx^2: 24 + 12 = 36u mx^2. R = 9 on M = 4 mx^2.
    check_all(
        "var forward",
        &r16[4][0],
        &r32[4][0],
        bound(9.0, 4.0 * mx * mx),
    );
    // var backward: with G = 4 mx mc / 17 bounding |g_j| = |2 d_j c / 17|:
    //   g_j = c · bf16(1/17) (2 roundings) · 2 d_j (exact doubling, d's 5u mx, product 1):
    //     |δg_j| <= 2·5u mx mc/17 + 2u G = 4.5u G;
    //   the subtraction's broadcast backward sums the 17 g_j in f32 (their 17·4.5u G, 1 rounding
    //     of <= 17 G), the inner mean's backward multiplies by bf16(1/17) (2): <= 7.5u G;
    //   the sum's backward adds that to the direct -g_j in bf16 (1 rounding of <= 2G).
    // 4.5 + 7.5 + 2 = 14: R = 14 on M = G.
    check_all(
        "var backward",
        &r16[4][1],
        &r32[4][1],
        bound(14.0, 4.0 * mx * mc / 17.0),
    );

    // A long sum: 4099 elements of 1 ± small. A bf16 running sum would stop at 256 (256 + 1
    // rounds back to 256 under ties-to-even); the f32 accumulator adds the same values in the same
    // order as the f32 reference and rounds once: R = 1 on the sum.
    let dev = Cpu::default();
    let ones = values(4099, 0.25, 93)
        .into_iter()
        .map(|v| bf16::from_f32(1.0 + v).to_f32())
        .collect::<Vec<_>>();
    let want: f32 = ones.iter().sum();
    let t32 = dev.tensor_from_vec(ones.clone(), (4099usize,));
    let t16 = t32.clone().to_dtype::<bf16>();
    let s16 = t16.sum::<Rank0, _>().array().to_f32();
    let s32 = t32.sum::<Rank0, _>().array();
    check_all("sum of 4099", &[s16], &[s32], bound(1.0, want.abs()));
}

#[test]
fn reshape_flatten_broadcast() {
    // reshape/flatten/broadcast move values without arithmetic (R = 0); the broadcast add rounds
    // once (R = 1 on M = max|x| + max|b|); the broadcast backward sums the 6 rows of c in f32 and
    // rounds once: R = 1 on M = 6 max|c|.
    fn run<E: Dtype>(x: &[f32], b: &[f32], c: &[f32]) -> [Vec<f32>; 4]
    where
        Cpu: Device<E>,
    {
        let dev = Cpu::default();
        let xt: Tensor<Rank2<6, 10>, E, _> = tensor(&dev, x, (Const, Const));
        let bt: Tensor<Rank1<10>, E, _> = tensor(&dev, b, (Const,));
        let ct: Tensor<Rank2<6, 10>, E, _> = tensor(&dev, c, (Const, Const));
        let flat = xt.clone().reshape::<Rank1<60>>();
        let r = xt.clone().reshape::<Rank2<3, 20>>();
        let img: Tensor<Rank4<2, 3, 2, 5>, E, _> = xt.clone().reshape();
        let flattened = img.reshape::<Rank2<2, 30>>();
        let _ = r;
        let y = bt.leaky_trace().broadcast::<Rank2<6, 10>, _>() + xt.clone();
        let yv = f32s(y.retaped::<NoneTape>());
        let g = (y * ct).sum().backward();
        [f32s(flat), f32s(flattened), yv, f32s(g.get(&bt))]
    }
    let x = values(60, 2.0, 101);
    let b = values(10, 1.0, 102);
    let c = values(60, 1.0, 103);
    let r32 = run::<f32>(&x, &b, &c);
    let r16 = run::<bf16>(&x, &b, &c);
    check_all("reshape", &r16[0], &r32[0], 0.0);
    check_all("flatten", &r16[1], &r32[1], 0.0);
    check_all(
        "broadcast add forward",
        &r16[2],
        &r32[2],
        bound(1.0, max_abs(&x) + max_abs(&b)),
    );
    check_all(
        "broadcast backward",
        &r16[3],
        &r32[3],
        bound(1.0, 6.0 * max_abs(&c)),
    );
}

// ---------------------------------------------------------------------------------------------
// Optimizers

#[test]
fn optimizer_steps_on_bf16_weights() {
    const I: usize = 13;
    const O: usize = 5;
    let w = values(O * I, 0.5, 111);
    let bias = values(O, 0.5, 112);
    let x = values(7 * I, 1.0, 113);
    let c = values(7 * O, 1.0, 114);
    // The same gradient (computed in f32, rounded to bf16) feeds both optimizers, so the test
    // measures the update alone.
    macro_rules! step {
        ($E:ty, $w:expr, $bias:expr, $gw:expr, $gb:expr, $which:expr) => {{
            type E = $E;
            let (w, bias, gw, gb, which): (&[f32], &[f32], &[f32], &[f32], usize) =
                ($w, $bias, $gw, $gb, $which);
            let dev = Cpu::default();
            let mut lin = dev.build_module::<Linear<I, O>, E>();
            lin.weight = tensor(&dev, w, (Const, Const));
            lin.bias = tensor(&dev, bias, (Const,));
            let gwt: Tensor<Rank2<O, I>, E, _> = tensor(&dev, gw, (Const, Const));
            let gbt: Tensor<Rank1<O>, E, _> = tensor(&dev, gb, (Const,));
            let mut grads = Gradients::leaky();
            grads
                .get_or_alloc_mut(&lin.weight)
                .unwrap()
                .copy_from_slice(&gwt.as_vec());
            grads
                .get_or_alloc_mut(&lin.bias)
                .unwrap()
                .copy_from_slice(&gbt.as_vec());
            match which {
                0 => {
                    let mut opt = Adam::new(
                        &lin,
                        AdamConfig {
                            lr: 0.05,
                            ..Default::default()
                        },
                    );
                    opt.update(&mut lin, &grads).unwrap();
                    opt.update(&mut lin, &grads).unwrap();
                }
                1 => {
                    let mut opt = Sgd::new(
                        &lin,
                        SgdConfig {
                            lr: 0.1,
                            momentum: Some(Momentum::Nesterov(0.9)),
                            weight_decay: None,
                        },
                    );
                    opt.update(&mut lin, &grads).unwrap();
                    opt.update(&mut lin, &grads).unwrap();
                }
                _ => {
                    let mut opt = RMSprop::new(
                        &lin,
                        RMSpropConfig {
                            lr: 1e-2,
                            ..Default::default()
                        },
                    );
                    opt.update(&mut lin, &grads).unwrap();
                    opt.update(&mut lin, &grads).unwrap();
                }
            }
            let mut out = f32s(lin.weight.clone());
            out.extend(f32s(lin.bias.clone()));
            out
        }};
    }
    // gradient of sum(c ⊙ (x wᵀ + b)) in f32, rounded to bf16 (both paths use these exact values)
    let dev = Cpu::default();
    let mut lin = dev.build_module::<Linear<I, O>, f32>();
    lin.weight = dev.tensor_from_vec(w.clone(), (Const, Const));
    lin.bias = dev.tensor_from_vec(bias.clone(), (Const,));
    let xt: Tensor<Rank2<7, I>, f32, _> = dev.tensor_from_vec(x, (Const, Const));
    let ct: Tensor<Rank2<7, O>, f32, _> = dev.tensor_from_vec(c, (Const, Const));
    let g = (lin.forward(xt.leaky_trace()) * ct).sum().backward();
    let rb = |v: Vec<f32>| {
        v.into_iter()
            .map(|a| bf16::from_f32(a).to_f32())
            .collect::<Vec<_>>()
    };
    let gw = rb(g.get(&lin.weight).as_vec());
    let gb = rb(g.get(&lin.bias).as_vec());
    let mut p0 = w.clone();
    p0.extend(&bias);
    let names = [
        "adam lr 0.05 (2 steps)",
        "sgd nesterov (2 steps)",
        "rmsprop (2 steps)",
    ];
    for (which, name) in names.iter().enumerate() {
        let p32 = step!(f32, &w, &bias, &gw, &gb, which);
        let p16 = step!(bf16, &w, &bias, &gw, &gb, which);
        // The bf16 kernel computes each update in f32 from bf16 state and rounds p (and each
        // state) once per step. Step 1: p1 = RNE(p0 - d1) errs by u|p1|; the moments rounded to
        // bf16 carry u relative into step 2, whose update d2 is then off by at most
        // (for Adam: m̂/sqrt(v̂) with m and v each u-relative: 1.5u; SGD: v carries u; RMSprop:
        // the square average carries u, its root u/2, plus momentum u) 2u relative, and p2 rounds
        // again: R = 1 (p1) + 1 (p2) + 2 (the update, relative to |d2| <= max|p0 - p2| + max|p0 - p1|)
        // on M = max(|p|) + max step: R = 4 on M = max|p| + 2 max|p - p0|.
        let step_max = p32
            .iter()
            .zip(&p0)
            .fold(0.0f32, |a, (p, q)| a.max((p - q).abs()));
        let m = max_abs(&p32) + 2.0 * step_max;
        check_all(name, &p16, &p32, bound(4.0, m));
    }
}

#[test]
fn long_broadcast_backwards_accumulate_in_f32() {
    // The gradient of a tensor broadcast over 600 rows sums 600 terms. A bf16 running sum of ones
    // stops at 256 (256 + 1 is a tie and rounds to the even 256). dfdx's bf16 backwards (binary
    // ops on a broadcast operand, and sum over a broadcast axis) accumulate in f32 and round once:
    // R = 1 on M = 600, and 600 is a bf16 number, so the result is exactly 600.
    let dev = Cpu::default();
    let b: Tensor<Rank1<3>, bf16, _> = dev.ones();
    let x: Tensor<Rank2<600, 3>, bf16, _> = dev.zeros();
    let g = (b.leaky_trace().broadcast::<Rank2<600, 3>, _>() + x)
        .sum()
        .backward();
    let got: Vec<f32> = g.get(&b).as_vec().iter().map(|v| v.to_f32()).collect();
    check_all(
        "bias-like broadcast backward (600 rows)",
        &got,
        &[600.0; 3],
        bound(1.0, 600.0),
    );
    assert_eq!(got, vec![600.0; 3]);

    let g = b
        .leaky_trace()
        .broadcast::<Rank2<600, 3>, _>()
        .sum::<Rank1<3>, _>()
        .sum()
        .backward();
    let got: Vec<f32> = g.get(&b).as_vec().iter().map(|v| v.to_f32()).collect();
    check_all(
        "sum over a broadcast axis, backward (600 rows)",
        &got,
        &[600.0; 3],
        bound(1.0, 600.0),
    );
    assert_eq!(got, vec![600.0; 3]);
}
