//! Layer norm's row kernels (`typed_amp_kernels::norm`) against f64 references, and the same
//! bits at every instruction-set level.

use typed_amp_kernels::norm::{layer_norm_backward_row, layer_norm_forward_row};
use typed_amp_kernels::{force_level, Level};

/// f32's unit roundoff.
const U32: f64 = 1.0 / 16_777_216.0;
/// f64's unit roundoff.
const U64: f64 = f64::EPSILON / 2.0;

fn row(width: usize, seed: u32, offset: f32) -> Vec<f32> {
    (0..width)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / 4e9 - 0.5 + offset)
        .collect()
}

/// The statistics against f64 sums in index order. The lanes change only the order of the f64
/// additions (each sum off by at most `n·u₆₄·Σ|terms|`), then the statistic is rounded once to
/// f32 (`u₃₂` relative); the inverse square root adds two f64 roundings.
#[test]
fn forward_statistics_and_rows_match_an_f64_reference() {
    for width in [1, 7, 8, 9, 64, 65, 384, 1000] {
        let x = row(width, 7, 3.0);
        let gamma = row(width, 5, 1.0);
        let beta = row(width, 9, 0.0);
        let n = width as f64;
        let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let abs_sum = x.iter().map(|&v| f64::from(v).abs()).sum::<f64>();
        let var = x
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        let rstd = 1.0 / (var + 1e-5).sqrt();
        let mut y = x.clone();
        let (m, s) = layer_norm_forward_row(&mut y, &gamma, &beta, 1e-5);
        let mean_err = 2.0 * n * U64 * abs_sum / n;
        assert!(
            (f64::from(m) - mean).abs() <= U32 * mean.abs() + mean_err,
            "width {width}: mean {m} vs {mean}"
        );
        // var's own sum error plus what the mean's error moves it by (2·|x − mean|·δ).
        let dev_sum = x.iter().map(|&v| (f64::from(v) - mean).abs()).sum::<f64>() / n;
        let var_err = 2.0 * n * U64 * var + 2.0 * dev_sum * mean_err + mean_err * mean_err;
        let rstd_err = 0.5 * rstd * var_err / (var + 1e-5) + 3.0 * U64 * rstd;
        assert!(
            (f64::from(s) - rstd).abs() <= U32 * rstd + rstd_err,
            "width {width}: rstd {s} vs {rstd}"
        );
        // The row: (x − m)·s·γ + β, four f32 roundings from the rounded statistics.
        for (i, (&got, &xi)) in y.iter().zip(&x).enumerate() {
            let (g, b) = (f64::from(gamma[i]), f64::from(beta[i]));
            let exact = (f64::from(xi) - f64::from(m)) * f64::from(s) * g + b;
            let mag = (f64::from(xi) - f64::from(m)).abs() * f64::from(s) * g.abs() + b.abs();
            assert!(
                (f64::from(got) - exact).abs() <= 4.0 * U32 * mag * (1.0 + 4.0 * U32),
                "width {width}, [{i}]: {got} vs {exact}"
            );
        }
    }
}

/// The backward against the formula in f64 from the same (rounded) statistics.
#[test]
fn backward_matches_an_f64_reference() {
    for width in [1, 9, 64, 383] {
        let x = row(width, 3, 2.0);
        let dy = row(width, 11, 0.0);
        let gamma = row(width, 5, 1.0);
        let (m, s) = (2.0f32, 3.5f32);
        let (mut xh, mut g) = (x.clone(), dy.clone());
        let (mut dg, mut db) = (vec![0.5f64; width], vec![0.25f64; width]);
        layer_norm_backward_row(&mut xh, &mut g, &gamma, (m, s), &mut dg, &mut db, true);
        let n = width as f64;
        let xh_ref: Vec<f64> = x
            .iter()
            .map(|&v| (f64::from(v) - f64::from(m)) * f64::from(s))
            .collect();
        let gh: Vec<f64> = dy
            .iter()
            .zip(&gamma)
            .map(|(&d, &g)| f64::from(d) * f64::from(g))
            .collect();
        let mg = gh.iter().sum::<f64>() / n;
        let mgx = gh.iter().zip(&xh_ref).map(|(a, b)| a * b).sum::<f64>() / n;
        let mag_g = gh.iter().map(|v| v.abs()).sum::<f64>() / n;
        let mag_gx = gh
            .iter()
            .zip(&xh_ref)
            .map(|(a, b)| (a * b).abs())
            .sum::<f64>()
            / n;
        for i in 0..width {
            // x̂: two roundings; dγ, dβ: the f32 product (two roundings with x̂'s) then f64.
            let xr = xh_ref[i];
            assert!((f64::from(xh[i]) - xr).abs() <= 2.0 * U32 * xr.abs() * 1.01 + 1e-30);
            let dgr = 0.5 + f64::from(dy[i]) * xr;
            assert!((dg[i] - dgr).abs() <= 4.0 * U32 * (f64::from(dy[i]) * xr).abs() + 4.0 * U64);
            assert_eq!(db[i], 0.25 + f64::from(dy[i]));
            // dx = s·(ĝ − mg − x̂·mgx): ĝ and x̂ rounded (2 u each), the means off by the f32
            // products' roundings (3 u of their magnitudes) and rounded to f32, three more
            // roundings in the combination.
            let exact = f64::from(s) * (gh[i] - mg - xr * mgx);
            let mag = f64::from(s) * (gh[i].abs() + mag_g + xr.abs() * (mag_gx + mgx.abs()))
                + f64::from(s) * (3.0 * mag_g + 3.0 * xr.abs() * mag_gx);
            assert!(
                (f64::from(g[i]) - exact).abs() <= 8.0 * U32 * mag,
                "width {width}, dx[{i}]: {} vs {exact}",
                g[i]
            );
        }
    }
}

/// Every level gives the same bits (the sums' order depends on the row's length alone).
#[test]
fn every_level_gives_the_same_bits() {
    for width in [5, 64, 77] {
        let x = row(width, 3, 1.0);
        let dy = row(width, 11, 0.0);
        let gamma = row(width, 5, 1.0);
        let beta = row(width, 9, 0.0);
        let run = |level| {
            force_level(Some(level));
            let mut y = x.clone();
            let stats = layer_norm_forward_row(&mut y, &gamma, &beta, 1e-5);
            let (mut xh, mut g) = (x.clone(), dy.clone());
            let (mut dg, mut db) = (vec![0f64; width], vec![0f64; width]);
            layer_norm_backward_row(&mut xh, &mut g, &gamma, stats, &mut dg, &mut db, true);
            force_level(None);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let bits64 = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            (
                bits(&y),
                (stats.0.to_bits(), stats.1.to_bits()),
                bits(&xh),
                bits(&g),
                bits64(&dg),
                bits64(&db),
            )
        };
        let portable = run(Level::Portable);
        for level in [Level::Avx2, Level::Avx512] {
            assert!(run(level) == portable, "width {width}: {level:?} differs");
        }
    }
}
