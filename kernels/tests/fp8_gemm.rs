//! `gemm_fp8`: FP8 products at every level this CPU supports (the bf16-pair `vdpbf16ps` path
//! included where the CPU has it), against the f64 product of the scaled operands, with the
//! bound of an f32 accumulation of `k` exact products and two scale roundings:
//! `|C - Ĉ| ≤ γ(k + 2)·|sa·sb|·Σ|a·b|`, `γ(n) = n·u / (1 - n·u)`, `u = 2^-24`.

use std::sync::Mutex;

use rand::{rngs::StdRng, Rng, SeedableRng};
use typed_amp_kernels::convert::{Fp8Format, E4M3, E5M2};
use typed_amp_kernels::{detected_level, force_level, gemm_fp8, Level, MatMut, MatRef};

static LOCK: Mutex<()> = Mutex::new(());

/// Random finite codes of every magnitude (subnormals and the maximum included).
fn codes<F: Fp8Format>(rng: &mut StdRng, n: usize) -> Vec<F> {
    (0..n)
        .map(|_| {
            let c = F::from_bits(rng.gen());
            if c.to_f32().is_finite() {
                c
            } else {
                F::from_bits(0)
            }
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn check<FA: Fp8Format, FB: Fp8Format>(
    m: usize,
    k: usize,
    n: usize,
    b_transposed: bool,
    per_row: bool,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let a: Vec<FA> = codes(&mut rng, m * k);
    let b: Vec<FB> = codes(&mut rng, k * n);
    let sa: Vec<f32> = (0..if per_row { m } else { 1 })
        .map(|_| rng.gen_range(0.5f32..2.0) * 2f32.powi(rng.gen_range(-12..4)))
        .collect();
    let sb: Vec<f32> = (0..if per_row { n } else { 1 })
        .map(|_| rng.gen_range(0.5f32..2.0) * 2f32.powi(rng.gen_range(-12..4)))
        .collect();
    // B is k × n: row-major (element (l, j) at l·n + j), or the transpose of a row-major n × k
    // (at j·k + l), as a linear layer's weights are.
    let (b_rs, b_cs) = if b_transposed { (1, k) } else { (n, 1) };
    let mut c = vec![f32::NAN; m * n];
    let report = gemm_fp8(
        MatRef {
            data: &a,
            rows: m,
            cols: k,
            rs: k,
            cs: 1,
        },
        MatRef {
            data: &b,
            rows: k,
            cols: n,
            rs: b_rs,
            cs: b_cs,
        },
        &sa,
        &sb,
        MatMut {
            data: &mut c,
            rows: m,
            cols: n,
            rs: n,
            cs: 1,
        },
        2,
    );
    assert!(!report.non_finite);
    let u = 2f64.powi(-24);
    let gamma = |t: f64| t * u / (1.0 - t * u);
    for i in 0..m {
        for j in 0..n {
            let (mut exact, mut abs) = (0.0f64, 0.0f64);
            for l in 0..k {
                let p = a[i * k + l].to_f32() as f64 * b[l * b_rs + j * b_cs].to_f32() as f64;
                exact += p;
                abs += p.abs();
            }
            let s = sa[if per_row { i } else { 0 }] as f64 * sb[if per_row { j } else { 0 }] as f64;
            let bound = gamma((k + 2) as f64) * abs * s;
            let err = (c[i * n + j] as f64 - exact * s).abs();
            assert!(
                err <= bound,
                "{}×{} {m}×{k}×{n} ({i}, {j}): {} against {:e}, bound {bound:e}",
                std::any::type_name::<FA>(),
                std::any::type_name::<FB>(),
                c[i * n + j],
                exact * s
            );
        }
    }
}

#[test]
fn fp8_products_are_within_the_accumulation_bound_at_every_level() {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut ran = Vec::new();
    for lvl in Level::ALL {
        if lvl > detected_level() {
            continue;
        }
        force_level(Some(lvl));
        for (i, &(m, k, n)) in [
            (1, 1, 1),
            (5, 7, 3),
            (33, 65, 17),
            (64, 512, 48),
            (7, 1500, 9),
        ]
        .iter()
        .enumerate()
        {
            for bt in [false, true] {
                for per_row in [false, true] {
                    let seed = (i * 4 + bt as usize * 2 + per_row as usize) as u64;
                    check::<E4M3, E4M3>(m, k, n, bt, per_row, seed);
                    check::<E5M2, E4M3>(m, k, n, bt, per_row, seed + 100);
                    check::<E5M2, E5M2>(m, k, n, bt, per_row, seed + 200);
                }
            }
        }
        ran.push(lvl.name());
    }
    force_level(None);
    println!("ran levels {ran:?}");
}
