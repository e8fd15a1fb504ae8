//! Layer norm's arithmetic on one row of f32, with its sums in f64: the forward's mean and
//! variance and the normalised, scaled row; the backward's `x̂`, the parameter gradients'
//! per-column sums and the input gradient.
//!
//! Each sum runs in 32 f64 lanes (element `i` into lane `i mod 32`), which are added pairwise
//! at the end, then the elements past the last full 32 in order. One f64 chain per sum (the
//! first form) waited four cycles for every element: a ViT's layer norms, rows of 64, spent
//! most of their time there; eight lanes, compiled by LLVM into 128-bit pieces and shuffles,
//! still made the sums half of the baby GPT's layer-norm backward (`perf annotate`), so the
//! lanes are now four AVX-512 (eight AVX2) registers of intrinsics: consecutive additions go
//! to different registers, none waiting for the one before. The order is fixed by the row's length alone, so every CPU and
//! every [`Level`](crate::Level) gives the same bits; compiled for AVX-512 or AVX2 where the
//! CPU has them, as [`math`](crate::math)'s loops are (Rust never contracts `a·b + c` into a
//! fused multiply-add, so the vector code rounds as the scalar code does).

/// The f64 lanes of each sum: four AVX-512 registers, eight AVX2 ones, so that the additions
/// into one lane are four registers apart instead of one after another.
const LANES: usize = 32;

/// The lanes added pairwise, neighbours first: the same tree at every level.
#[inline(always)]
fn add_lanes(mut acc: [f64; LANES]) -> f64 {
    let mut n = LANES;
    while n > 1 {
        n /= 2;
        for i in 0..n {
            acc[i] = acc[2 * i] + acc[2 * i + 1];
        }
    }
    acc[0]
}

/// What one element adds to its lane: `x`, `(x − centre)²` or `x·y` (the product in f32).
#[derive(Clone, Copy)]
enum Term {
    Value,
    SquaredDeviation(f64),
    Product,
}

/// `Σ term(xs[i], ys[i])` in f64: element `i` into lane `i mod LANES`, the lanes added by
/// [`add_lanes`], then the elements past the last whole `LANES` in order. `ys` is read only
/// for [`Term::Product`] (and must then be as long as `xs`).
#[inline(always)]
fn lane_sum(xs: &[f32], ys: &[f32], term: Term) -> f64 {
    let full = xs.len() / LANES * LANES;
    let acc = lanes(
        &xs[..full],
        if matches!(term, Term::Product) {
            &ys[..full]
        } else {
            &[]
        },
        term,
    );
    let mut total = add_lanes(acc);
    for (i, x) in xs[full..].iter().enumerate() {
        total += one(*x, ys.get(full + i).copied().unwrap_or(0.0), term);
    }
    total
}

#[inline(always)]
fn one(x: f32, y: f32, term: Term) -> f64 {
    match term {
        Term::Value => f64::from(x),
        Term::SquaredDeviation(centre) => {
            let d = f64::from(x) - centre;
            d * d
        }
        Term::Product => f64::from(x * y),
    }
}

/// The lanes of whole chunks of `LANES`, in vector registers where the CPU has them.
#[inline(always)]
fn lanes(xs: &[f32], ys: &[f32], term: Term) -> [f64; LANES] {
    #[cfg(target_arch = "x86_64")]
    {
        let lvl = crate::level::level();
        if lvl >= crate::level::Level::Avx512 {
            // SAFETY: the level is only AVX-512 on a CPU with AVX-512F.
            return unsafe { x86::lanes_avx512(xs, ys, term) };
        }
        if lvl >= crate::level::Level::Avx2 {
            // SAFETY: the level is only AVX2 on a CPU with AVX2.
            return unsafe { x86::lanes_avx2(xs, ys, term) };
        }
    }
    let mut acc = [0f64; LANES];
    for (c, chunk) in xs.chunks_exact(LANES).enumerate() {
        for (l, (a, x)) in acc.iter_mut().zip(chunk).enumerate() {
            let y = if matches!(term, Term::Product) {
                ys[c * LANES + l]
            } else {
                0.0
            };
            *a += one(*x, y, term);
        }
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Term, LANES};

    /// [`super::lanes`] in four AVX-512 registers (lanes `8q..8q + 8` in register `q`), with
    /// the scalar code's operations (conversion, subtraction, multiplication, addition: no
    /// fused multiply-add), so the same bits.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `xs.len()` is a multiple of `LANES`, and `ys` as long for
    /// [`Term::Product`].
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn lanes_avx512(xs: &[f32], ys: &[f32], term: Term) -> [f64; LANES] {
        let mut acc = [_mm512_setzero_pd(); 4];
        let centre = match term {
            Term::SquaredDeviation(c) => c,
            _ => 0.0,
        };
        let centre = _mm512_set1_pd(centre);
        for c in 0..xs.len() / LANES {
            for (q, acc) in acc.iter_mut().enumerate() {
                let at = c * LANES + 8 * q;
                // SAFETY: `at + 8 <= xs.len()` (whole chunks), and `ys` as long for products.
                let x = unsafe { _mm256_loadu_ps(xs.as_ptr().add(at)) };
                let v = match term {
                    Term::Value => _mm512_cvtps_pd(x),
                    Term::SquaredDeviation(_) => {
                        let d = _mm512_sub_pd(_mm512_cvtps_pd(x), centre);
                        _mm512_mul_pd(d, d)
                    }
                    Term::Product => {
                        // SAFETY: as above.
                        let y = unsafe { _mm256_loadu_ps(ys.as_ptr().add(at)) };
                        _mm512_cvtps_pd(_mm256_mul_ps(x, y))
                    }
                };
                *acc = _mm512_add_pd(*acc, v);
            }
        }
        let mut out = [0f64; LANES];
        for (q, acc) in acc.iter().enumerate() {
            // SAFETY: `out` has room for eight f64 at `8q` (q < 4).
            unsafe { _mm512_storeu_pd(out.as_mut_ptr().add(8 * q), *acc) };
        }
        out
    }

    /// [`super::lanes`] in eight AVX2 registers (lanes `4r..4r + 4` in register `r`).
    ///
    /// # Safety
    /// The CPU has AVX2; lengths as for [`lanes_avx512`].
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn lanes_avx2(xs: &[f32], ys: &[f32], term: Term) -> [f64; LANES] {
        let mut acc = [_mm256_setzero_pd(); 8];
        let centre = match term {
            Term::SquaredDeviation(c) => c,
            _ => 0.0,
        };
        let centre = _mm256_set1_pd(centre);
        for c in 0..xs.len() / LANES {
            for (r, acc) in acc.iter_mut().enumerate() {
                let at = c * LANES + 4 * r;
                // SAFETY: `at + 4 <= xs.len()` (whole chunks), and `ys` as long for products.
                let x = unsafe { _mm_loadu_ps(xs.as_ptr().add(at)) };
                let v = match term {
                    Term::Value => _mm256_cvtps_pd(x),
                    Term::SquaredDeviation(_) => {
                        let d = _mm256_sub_pd(_mm256_cvtps_pd(x), centre);
                        _mm256_mul_pd(d, d)
                    }
                    Term::Product => {
                        // SAFETY: as above.
                        let y = unsafe { _mm_loadu_ps(ys.as_ptr().add(at)) };
                        _mm256_cvtps_pd(_mm_mul_ps(x, y))
                    }
                };
                *acc = _mm256_add_pd(*acc, v);
            }
        }
        let mut out = [0f64; LANES];
        for (r, acc) in acc.iter().enumerate() {
            // SAFETY: `out` has room for four f64 at `4r` (r < 8).
            unsafe { _mm256_storeu_pd(out.as_mut_ptr().add(4 * r), *acc) };
        }
        out
    }
}

/// `Σ xs` in f64, in [`LANES`] lanes.
#[inline(always)]
fn sum(xs: &[f32]) -> f64 {
    lane_sum(xs, &[], Term::Value)
}

/// `Σ (x − centre)²` in f64, in [`LANES`] lanes.
#[inline(always)]
fn squared_deviations(xs: &[f32], centre: f64) -> f64 {
    lane_sum(xs, &[], Term::SquaredDeviation(centre))
}

/// `Σ a·b` (each product in f32, as the row's other products) in f64, in [`LANES`] lanes.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len().min(b.len());
    lane_sum(&a[..n], &b[..n], Term::Product)
}

#[inline(always)]
fn forward_row_body(row: &mut [f32], gamma: &[f32], beta: &[f32], epsilon: f64) -> (f32, f32) {
    let width = row.len() as f64;
    // Two passes: the mean, then the squared deviations from it.
    let mean = sum(row) / width;
    let var = squared_deviations(row, mean) / width;
    let (m, s) = (mean as f32, (1.0 / (var + epsilon).sqrt()) as f32);
    for ((v, g), b) in row.iter_mut().zip(gamma).zip(beta) {
        *v = (*v - m) * s * g + b;
    }
    (m, s)
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn backward_row_body(
    x: &mut [f32],
    dy: &mut [f32],
    gamma: &[f32],
    (mean, rstd): (f32, f32),
    dgamma: &mut [f64],
    dbeta: &mut [f64],
    input_gradient: bool,
) {
    // x̂ = (x − mean)·rstd and ĝ = dy·γ; then dx = rstd·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂)).
    for ((((x, g), gm), dg), db) in x
        .iter_mut()
        .zip(dy.iter_mut())
        .zip(gamma)
        .zip(dgamma.iter_mut())
        .zip(dbeta.iter_mut())
    {
        *x = (*x - mean) * rstd;
        *dg += f64::from(*g * *x);
        *db += f64::from(*g);
        *g *= gm;
    }
    if !input_gradient {
        return;
    }
    let width = x.len() as f64;
    let (mg, mgx) = ((sum(dy) / width) as f32, (dot(dy, x) / width) as f32);
    for (g, x) in dy.iter_mut().zip(x.iter()) {
        *g = rstd * (*g - mg - x * mgx);
    }
}

/// `pub fn $name(…) -> $ret`: `$body(…)` in code compiled for AVX-512 or AVX2 and FMA where the
/// CPU has them (the body is inlined into each), else for the build target.
macro_rules! dispatched {
    ($(#[$doc:meta])* pub fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty => $body:ident) => {
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            if crate::level::level() >= crate::level::Level::Avx512 {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
                fn widest($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }
                // SAFETY: the level is at least AVX-512, which is only detected (or forced) on
                // a CPU with AVX-512F, BW and VL (and AVX2 and FMA).
                return unsafe { widest($($arg),*) };
            }
            #[cfg(target_arch = "x86_64")]
            if crate::level::level() >= crate::level::Level::Avx2 {
                #[target_feature(enable = "avx2,fma")]
                fn wide($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }
                // SAFETY: the level is at least AVX2, which is only detected (or forced) on a
                // CPU with AVX2 and FMA.
                return unsafe { wide($($arg),*) };
            }
            $body($($arg),*)
        }
    };
}

dispatched!(
    /// Normalises `row` in place, `(x − mean)·rstd·γ + β` (in f32, the statistics rounded to f32
    /// first), and returns `(mean, rstd)`, `rstd = 1/√(var + ε)`: the mean and the (biased)
    /// variance summed in f64, in two passes.
    ///
    /// The row's length is `row.len()`; `gamma` and `beta` must be as long (elements past the
    /// shortest of the three are left as they are).
    pub fn layer_norm_forward_row(
        row: &mut [f32],
        gamma: &[f32],
        beta: &[f32],
        epsilon: f64
    ) -> (f32, f32) => forward_row_body
);

dispatched!(
    /// One row of layer norm's backward from the forward's `(mean, rstd)`: `x` (the row's
    /// input) becomes `x̂ = (x − mean)·rstd`; `dy·x̂` and `dy` are added (in f64) to `dgamma` and
    /// `dbeta` column by column; and, with `input_gradient`, `dy` becomes the input's gradient
    /// `rstd·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂))`, `ĝ = dy·γ` (else `dy` holds `ĝ`).
    ///
    /// Every slice must have the row's length (`x.len()`); the loops stop at the shortest.
    pub fn layer_norm_backward_row(
        x: &mut [f32],
        dy: &mut [f32],
        gamma: &[f32],
        stats: (f32, f32),
        dgamma: &mut [f64],
        dbeta: &mut [f64],
        input_gradient: bool
    ) -> () => backward_row_body
);
