//! `gemm_fp8`: FP8 products at every level this CPU supports (the bf16-pair `vdpbf16ps` path
//! included where the CPU has it), against the f64 product of the scaled operands, with the
//! bound of an f32 accumulation of `k` exact products and two scale roundings:
//! `|C - Ĉ| ≤ γ(k + 2)·|sa·sb|·Σ|a·b|`, `γ(n) = n·u / (1 - n·u)`, `u = 2^-24`.
//!
//! `gemm_fp8_epilogue`, whose packing widens the codes, against the bf16 product of the codes
//! widened beforehand: the same arithmetic, so the same bits, for every layout, epilogue, C
//! type, thread count and level (the bf16-pair packing by emulation where the CPU lacks
//! AVX512-BF16).

use std::sync::Mutex;

use half::bf16;
use rand::{rngs::StdRng, Rng, SeedableRng};
use typed_amp_kernels::convert::{fp8_to_bf16, Fp8Format, E4M3, E5M2};
use typed_amp_kernels::{
    detected_level, force_level, gemm_epilogue_slices, gemm_fp8, gemm_fp8_epilogue,
    set_bf16_pair_emulation, Activation, Epilogue, GemmOut, Level, MatMut, MatRef,
};

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

/// One product through `gemm_fp8_epilogue` and through the bf16 GEMM on the widened codes,
/// compared bit for bit (C and the non-finite report).
#[allow(clippy::too_many_arguments)]
fn same_bits<FA: Fp8Format, FB: Fp8Format, C: GemmOut<bf16> + PartialEq + std::fmt::Debug>(
    rng: &mut StdRng,
    (m, k, n): (usize, usize, usize),
    a_t: bool,
    b_t: bool,
    epi: &Epilogue<'_>,
    c0: fn(f32) -> C,
    threads: usize,
    what: &str,
) {
    let a: Vec<FA> = codes(rng, m * k);
    let b: Vec<FB> = codes(rng, k * n);
    let (mut aw, mut bw) = (vec![bf16::ZERO; m * k], vec![bf16::ZERO; k * n]);
    fp8_to_bf16(&a, &mut aw);
    fp8_to_bf16(&b, &mut bw);
    let (a_rs, a_cs) = if a_t { (1, m) } else { (k, 1) };
    let (b_rs, b_cs) = if b_t { (1, k) } else { (n, 1) };
    let start: Vec<C> = (0..m * n)
        .map(|_| c0(rng.gen_range(-4.0f32..4.0)))
        .collect();
    let (mut c8, mut c16) = (start.clone(), start);
    let r8 = gemm_fp8_epilogue(
        MatRef {
            data: &a,
            rows: m,
            cols: k,
            rs: a_rs,
            cs: a_cs,
        },
        MatRef {
            data: &b,
            rows: k,
            cols: n,
            rs: b_rs,
            cs: b_cs,
        },
        MatMut {
            data: &mut c8,
            rows: m,
            cols: n,
            rs: n,
            cs: 1,
        },
        epi,
        threads,
    );
    let r16 = gemm_epilogue_slices::<bf16, C>(
        MatRef {
            data: &aw,
            rows: m,
            cols: k,
            rs: a_rs,
            cs: a_cs,
        },
        MatRef {
            data: &bw,
            rows: k,
            cols: n,
            rs: b_rs,
            cs: b_cs,
        },
        MatMut {
            data: &mut c16,
            rows: m,
            cols: n,
            rs: n,
            cs: 1,
        },
        epi,
        threads,
    );
    let ctx = || {
        format!(
            "{what}: {}×{} {m}×{k}×{n} A{} B{} {epi:?} threads {threads}",
            std::any::type_name::<FA>(),
            std::any::type_name::<FB>(),
            if a_t { "ᵀ" } else { "" },
            if b_t { "ᵀ" } else { "" },
        )
    };
    assert_eq!(r8, r16, "{}", ctx());
    // Bits, not values: -0 against +0 or two NaN payloads would compare otherwise.
    let bits = |c: &[C]| format!("{c:?}");
    assert!(c8 == c16 || bits(&c8) == bits(&c16), "{}", ctx());
}

#[test]
fn packing_fp8_gives_the_bits_of_the_bf16_product_of_the_widened_codes() {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let bias: Vec<f32> = (0..600).map(|j| (j as f32 * 0.37).sin()).collect();
    let mut ran = Vec::new();
    let mut run = |lvl: Level, name: String| {
        force_level(Some(lvl));
        let mut rng = StdRng::seed_from_u64(0xf8 ^ lvl as u64);
        // One k block; several k blocks (k > 512); several row blocks of A; B wider than a
        // B block (the whole-panel path); a thin C (transposed by the driver).
        for (i, &shape) in [
            (1, 1, 1),
            (13, 33, 40),
            (37, 1030, 45),
            (500, 24, 40),
            (20, 40, 600),
            (9, 70, 3),
        ]
        .iter()
        .enumerate()
        {
            let n = shape.2;
            let epis = [
                Epilogue {
                    alpha: 0.375,
                    ..Epilogue::STORE
                },
                Epilogue {
                    alpha: 3.0e-5,
                    accumulate: true,
                    bias: Some(&bias[..n]),
                    activation: Activation::Relu,
                    report_non_finite: true,
                },
            ];
            for (e, epi) in epis.iter().enumerate() {
                let (a_t, b_t) = ((i + e) % 2 == 1, (i / 2 + e) % 2 == 1);
                let threads = 1 + (i + e) % 2;
                same_bits::<E4M3, E4M3, bf16>(
                    &mut rng,
                    shape,
                    a_t,
                    b_t,
                    epi,
                    bf16::from_f32,
                    threads,
                    &name,
                );
                same_bits::<E5M2, E4M3, f32>(
                    &mut rng,
                    shape,
                    !a_t,
                    b_t,
                    epi,
                    |x| x,
                    threads,
                    &name,
                );
                same_bits::<E4M3, E5M2, bf16>(
                    &mut rng,
                    shape,
                    a_t,
                    !b_t,
                    epi,
                    bf16::from_f32,
                    3 - threads,
                    &name,
                );
            }
        }
        ran.push(name);
    };
    for lvl in Level::ALL {
        if lvl <= detected_level() {
            run(lvl, lvl.name().to_string());
        }
    }
    if detected_level() < Level::Avx512Bf16 {
        set_bf16_pair_emulation(true);
        for lvl in [Level::Portable, detected_level()] {
            run(lvl, format!("{}+bf16-pair-emulation", lvl.name()));
        }
        set_bf16_pair_emulation(false);
    }
    force_level(None);
    println!("ran levels {ran:?}");
}
