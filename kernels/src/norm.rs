//! Layer norm's arithmetic on one row of f32, with its sums in f64: the forward's mean and
//! variance and the normalised, scaled row; the backward's `x̂`, the parameter gradients'
//! per-column sums and the input gradient.
//!
//! Each sum runs in eight f64 lanes (element `i` into lane `i mod 8`), which are added pairwise
//! at the end, then the elements past the last full eight in order. One f64 chain per sum (the
//! first form) waited four cycles for every element: a ViT's layer norms, rows of 64, spent
//! most of their time there. The order is fixed by the row's length alone, so every CPU and
//! every [`Level`](crate::Level) gives the same bits; compiled for AVX-512 or AVX2 where the
//! CPU has them, as [`math`](crate::math)'s loops are (Rust never contracts `a·b + c` into a
//! fused multiply-add, so the vector code rounds as the scalar code does).

/// The f64 lanes of each sum.
const LANES: usize = 8;

#[inline(always)]
fn add_lanes(acc: [f64; LANES]) -> f64 {
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
}

/// `Σ xs` in f64, in [`LANES`] lanes.
#[inline(always)]
fn sum(xs: &[f32]) -> f64 {
    let mut acc = [0f64; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (a, x) in acc.iter_mut().zip(chunk) {
            *a += f64::from(*x);
        }
    }
    let mut total = add_lanes(acc);
    for x in chunks.remainder() {
        total += f64::from(*x);
    }
    total
}

/// `Σ (x − centre)²` in f64, in [`LANES`] lanes.
#[inline(always)]
fn squared_deviations(xs: &[f32], centre: f64) -> f64 {
    let mut acc = [0f64; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (a, x) in acc.iter_mut().zip(chunk) {
            let d = f64::from(*x) - centre;
            *a += d * d;
        }
    }
    let mut total = add_lanes(acc);
    for x in chunks.remainder() {
        let d = f64::from(*x) - centre;
        total += d * d;
    }
    total
}

/// `Σ a·b` (each product in f32, as the row's other products) in f64, in [`LANES`] lanes.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f64 {
    let mut acc = [0f64; LANES];
    let mut chunks = a.chunks_exact(LANES).zip(b.chunks_exact(LANES));
    for (ca, cb) in &mut chunks {
        for ((s, x), y) in acc.iter_mut().zip(ca).zip(cb) {
            *s += f64::from(x * y);
        }
    }
    let full = a.len() / LANES * LANES;
    let mut total = add_lanes(acc);
    for (x, y) in a[full..].iter().zip(&b[full..]) {
        total += f64::from(x * y);
    }
    total
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
