//! `gemm_epilogue` against the unfused path: the f32 product through the existing `gemm` (on
//! exactly widened copies of A and B), then alpha, C_old, bias and ReLU in a separate loop in
//! the documented order, then one rounding with `half`. On every level this CPU supports.
//!
//! # When the results must be identical
//! The epilogue is the same IEEE operations in the same order on both sides, so a difference
//! can only come from the f32 sum itself. It is the same sum when both sides use the same
//! kernel and the same k blocks: always for f32 inputs; for 16-bit inputs widened to f32 (f16,
//! and bf16 without the `vdpbf16ps` pair path) when k fits in the f32 path's 256-deep k block,
//! or at any k below AVX-512, where every type uses 256. (Thread splits, transposition and tile
//! shapes do not change an element's sum: each is one chain of multiply-adds over k, and
//! `fma(a, b, c) = fma(b, a, c)`.) Then the bits must match.
//!
//! # Otherwise: the bound
//! With `s = Σ aₚbₚ` exact, `S = Σ|aₚbₚ|` and `n = k + 1`, either side's f32 sum is within
//! `γₙ·S` of `s` (`γₙ = n·u/(1 − n·u)`, `u = 2⁻²⁴`, recursive summation in any order; Higham
//! §3.1, §4.2), plus `k·2⁻¹²⁶` where `vdpbf16ps` flushes subnormals. The epilogue then rounds at
//! most three times in f32 (`alpha·`, `+ C_old`, `+ bias`), each by at most `u` times a value
//! bounded by `M·(1 + γₙ)(1 + u)³`, `M = |alpha|·S + |C_old| + |bias|`; ReLU is 1-Lipschitz;
//! the store rounds once more, by `u_T·|v|` (`u_T = 2⁻¹¹` f16, `2⁻⁸` bf16, 0 for f32) plus half
//! the subnormal spacing. So each result is within
//! `e = |alpha|·(γₙ·S + k·2⁻¹²⁶) + 3u·M·(1 + γₙ)(1 + u)³`, `|r − V| ≤ e + u_T·(|V| + e) + abs_T`
//! of the exact `V = act(alpha·s + C_old + bias)` (computed in f64, whose own error is covered
//! by a `2⁻⁴⁹·(n + 3)·M` term), and the two sides within twice that of each other.

mod common;

use common::{at_each_level, uses_pairs, Elem, Layout, Mat, LAYOUTS};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::Rng;
use typed_amp_kernels::{
    gemm_epilogue_slices, gemm_slices, level, Activation, Epilogue, GemmElem, GemmOut, Level,
};

#[derive(Clone, Copy, Debug)]
struct Case {
    m: usize,
    n: usize,
    k: usize,
    la: Layout,
    lb: Layout,
    lc: Layout,
    accumulate: bool,
    bias: bool,
    relu: bool,
    alpha: f32,
    threads: usize,
}

/// The documented epilogue of one element, written out independently of the crate.
fn unfused(p: f32, alpha: f32, old: Option<f32>, bias: Option<f32>, relu: bool) -> f32 {
    let mut v = if alpha != 1.0 { alpha * p } else { p };
    if let Some(o) = old {
        v += o;
    }
    if let Some(b) = bias {
        v += b;
    }
    if relu && v < 0.0 {
        v = 0.0;
    }
    v
}

fn check<T: Elem + GemmElem, C: Elem + GemmOut<T>>(rng: &mut StdRng, cs: Case, pairs: bool) {
    let Case {
        m,
        n,
        k,
        la,
        lb,
        lc,
        accumulate,
        relu,
        alpha,
        threads,
        ..
    } = cs;
    let a = Mat::<T>::random(rng, m, k, la);
    let b = Mat::<T>::random(rng, k, n, lb);
    let mut c = Mat::<C>::random(rng, m, n, lc);
    let c0 = c.clone();
    let bias: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let epi = Epilogue {
        alpha,
        accumulate,
        bias: cs.bias.then_some(&bias[..]),
        activation: if relu {
            Activation::Relu
        } else {
            Activation::None
        },
        report_non_finite: true,
    };
    let ctx = || format!("{}→{} {:?} {cs:?}", T::NAME, C::NAME, level());
    let report = gemm_epilogue_slices(a.view(), b.view(), c.view_mut(), &epi, threads);

    // The unfused path.
    let (a32, b32) = (a.to_f32_rows(), b.to_f32_rows());
    let mut prod = vec![0.0f32; m * n];
    gemm_slices(a32.view(), b32.view(), &mut prod, n, 1, false, threads);

    // 16-bit operands run in deeper k blocks (512) than f32 (256) on the AVX2 and AVX-512
    // levels: beyond one f32 block the sums are added in another order.
    let same_sum = T::IS_F32 || (!uses_pairs::<T>(pairs) && (k <= 256 || level() < Level::Avx2));
    let u = 2f64.powi(-24);
    let nt = (k + 1) as f64;
    let gamma = nt * u / (1.0 - nt * u);
    let ftz = if uses_pairs::<T>(pairs) {
        k as f64 * 2f64.powi(-126)
    } else {
        0.0
    };
    let mut touched = vec![false; c.data.len()];
    for i in 0..m {
        for j in 0..n {
            let idx = c.idx(i, j);
            touched[idx] = true;
            let old = accumulate.then(|| c0.data[idx].to_f32());
            let bj = cs.bias.then(|| bias[j]);
            let want = C::from_f32(unfused(prod[i * n + j], alpha, old, bj, relu));
            let got = c.data[idx];

            let (mut s, mut mag_s) = (0.0f64, 0.0f64);
            for p in 0..k {
                let x = a.at(i, p).to_f64() * b.at(p, j).to_f64();
                s += x;
                mag_s += x.abs();
            }
            let al = alpha as f64;
            let mut exact = al * s + old.map_or(0.0, |o| o as f64) + bj.map_or(0.0, |b| b as f64);
            if relu && exact < 0.0 {
                exact = 0.0;
            }
            let mag = al.abs() * mag_s
                + old.map_or(0.0, |o| (o as f64).abs())
                + bj.map_or(0.0, |b| (b as f64).abs());
            let e = al.abs() * (gamma * mag_s + ftz)
                + 3.0 * u * mag * (1.0 + gamma) * (1.0 + u).powi(3);
            let bound = e + C::U * (exact.abs() + e) + C::ABS + 2f64.powi(-49) * (nt + 3.0) * mag;
            assert!(
                (got.to_f64() - exact).abs() <= bound,
                "{}: C[{i},{j}] = {:?}, exact {exact} ± {bound}",
                ctx(),
                got
            );
            if same_sum {
                assert_eq!(
                    got.bits(),
                    want.bits(),
                    "{}: C[{i},{j}] = {got:?}, unfused {want:?} (must be identical)",
                    ctx()
                );
            } else {
                assert!(
                    (got.to_f64() - want.to_f64()).abs() <= 2.0 * bound,
                    "{}: C[{i},{j}] = {got:?}, unfused {want:?} ± {}",
                    ctx(),
                    2.0 * bound
                );
            }
        }
    }
    for (idx, t) in touched.iter().enumerate() {
        if !t {
            assert_eq!(
                c.data[idx].bits(),
                c0.data[idx].bits(),
                "{}: wrote outside C at {idx}",
                ctx()
            );
        }
    }
    assert!(
        !report.non_finite,
        "{}: finite product reported non-finite",
        ctx()
    );

    // With nothing but the product (and C_old) to store, the epilogue entry point is `gemm`:
    // the same bits, except that gemm's f32 C takes C_old into its running sum first, which
    // differs once there are several (256-deep) k blocks.
    if C::NAME == T::NAME
        && alpha == 1.0
        && !cs.bias
        && !relu
        && !(T::IS_F32 && accumulate && k > 256)
    {
        let mut g = c0.clone();
        // SAFETY of the cast: C and T are the same type here (same name), so the vector is a
        // vector of T.
        let gd: &mut Vec<T> = unsafe { &mut *(&mut g.data as *mut Vec<C> as *mut Vec<T>) };
        gemm_slices(a.view(), b.view(), gd, g.rs, g.cs, accumulate, threads);
        for (idx, (x, y)) in g.data.iter().zip(&c.data).enumerate() {
            assert_eq!(x.bits(), y.bits(), "{}: gemm differs at {idx}", ctx());
        }
    }
}

/// Every (input, output) pair the API offers.
fn check_all(rng: &mut StdRng, cs: Case, pairs: bool) {
    check::<f32, f32>(rng, cs, pairs);
    check::<f16, f16>(rng, cs, pairs);
    check::<bf16, bf16>(rng, cs, pairs);
    check::<f16, f32>(rng, cs, pairs);
    check::<bf16, f32>(rng, cs, pairs);
}

fn case(i: usize, m: usize, n: usize, k: usize, threads: usize) -> Case {
    const ALPHAS: [f32; 4] = [1.0, 0.5, 1.0 / 1024.0, -3.7];
    Case {
        m,
        n,
        k,
        // Every layout combination of A, B and C comes round as i runs.
        la: LAYOUTS[i % 4],
        lb: LAYOUTS[(i / 4) % 4],
        lc: LAYOUTS[(i / 16) % 4],
        accumulate: i.is_multiple_of(2),
        bias: !i.is_multiple_of(3),
        relu: i % 5 < 3,
        alpha: ALPHAS[(i / 3) % 4],
        threads,
    }
}

#[test]
fn odd_sizes_against_unfused() {
    const EDGES: [usize; 8] = [1, 2, 15, 16, 17, 33, 47, 70];
    at_each_level("odd_sizes_against_unfused", |rng, pairs| {
        let mut i = 0;
        for &m in &EDGES {
            for &n in &EDGES {
                let k = [1, 7, 70][i % 3];
                check_all(rng, case(i, m, n, k, 1 + i % 2), pairs);
                i += 1;
            }
        }
        // And random shapes in 1..=70 each way.
        for _ in 0..64 {
            let (m, n, k) = (
                rng.gen_range(1..=70),
                rng.gen_range(1..=70),
                rng.gen_range(1..=70),
            );
            check_all(rng, case(i, m, n, k, 2), pairs);
            i += 1;
        }
    });
}

#[test]
fn k_blocks_threads_and_transposition() {
    at_each_level("k_blocks_threads_and_transposition", |rng, pairs| {
        // k > 256 and > 512 cross the f32 and the 16-bit k blocks (several blocks, the running
        // sum); 2·m·n·k ≥ 2²³ splits over two threads; a thin C (n = 7) is computed transposed,
        // which turns the bias into a per-row one.
        let shapes = [
            (37, 45, 600, 1),
            (130, 140, 300, 2),
            (300, 7, 513, 2),
            (7, 300, 513, 2),
            (64, 96, 1025, 2),
            (150, 200, 260, 2),
        ];
        for (s, &(m, n, k, t)) in shapes.iter().enumerate() {
            for v in 0..4 {
                check_all(rng, case(s * 4 + v * 17, m, n, k, t), pairs);
            }
        }
    });
}

#[test]
fn every_layout_and_option() {
    at_each_level("every_layout_and_option", |rng, pairs| {
        for i in 0..4 * 4 * 4 * 2 {
            let mut cs = case(i, 19, 37, 29, 1);
            (cs.la, cs.lb, cs.lc) = (LAYOUTS[i % 4], LAYOUTS[(i / 4) % 4], LAYOUTS[(i / 16) % 4]);
            cs.accumulate = i >= 64;
            for (bias, relu) in [(false, false), (true, false), (false, true), (true, true)] {
                check_all(rng, Case { bias, relu, ..cs }, pairs);
            }
        }
    });
}

#[test]
fn empty_k_still_applies_the_epilogue() {
    at_each_level("empty_k_still_applies_the_epilogue", |rng, pairs| {
        for i in 0..12 {
            check_all(rng, case(i, 5, 9, 0, 1), pairs);
        }
        // m = 0 or n = 0: nothing stored, nothing reported.
        for (m, n) in [(0, 5), (5, 0), (0, 0)] {
            check_all(rng, case(1, m, n, 3, 1), pairs);
        }
    });
}

/// Runs one epilogue product over f32-valued inputs with the non-finite check asked for,
/// returning the report; the same product without it must store the same C and report `false`.
fn run_one<T: Elem + GemmElem, C: Elem + GemmOut<T>>(
    a: &Mat<T>,
    b: &Mat<T>,
    c: &mut Mat<C>,
    epi: &Epilogue<'_>,
    threads: usize,
) -> bool {
    let mut unchecked = c.clone();
    let quiet = Epilogue {
        report_non_finite: false,
        ..*epi
    };
    let report = gemm_epilogue_slices(a.view(), b.view(), unchecked.view_mut(), &quiet, threads);
    assert!(!report.non_finite, "a product that was not asked reported");
    let checked = Epilogue {
        report_non_finite: true,
        ..*epi
    };
    let non_finite =
        gemm_epilogue_slices(a.view(), b.view(), c.view_mut(), &checked, threads).non_finite;
    let bits = |m: &Mat<C>| {
        m.data
            .iter()
            .map(|x| x.to_f64().to_bits())
            .collect::<Vec<_>>()
    };
    assert!(
        bits(c) == bits(&unchecked),
        "the check changed what was stored"
    );
    non_finite
}

fn non_finite_cases<T: Elem + GemmElem, C: Elem + GemmOut<T>>(rng: &mut StdRng, ctx: &str) {
    // 2·m·n·k ≥ 2²³ (two threads' worth, see PARALLEL_MIN_FLOPS): two threads each store
    // half of C's rows, and only the second sees a bad last row; the report must combine them.
    let (m, n, k) = (128, 96, 400);
    let big = 2.0f32 * 65504.0 * 65504.0; // finite in f32, beyond f16
    for lc in [Layout::RowMajor, Layout::ColMajor, Layout::Sparse] {
        for threads in [1, 2] {
            let ctx = format!("{ctx} {}→{} C {lc:?} threads {threads}", T::NAME, C::NAME);
            let a = Mat::<T>::random(rng, m, k, Layout::RowMajor);
            let b = Mat::<T>::random(rng, k, n, Layout::RowMajor);
            let c = Mat::<C>::random(rng, m, n, lc);
            let bias = vec![0.25f32; n];
            let plain = Epilogue::STORE;
            let with_bias = Epilogue {
                bias: Some(&bias),
                activation: Activation::Relu,
                ..Epilogue::ACCUMULATE
            };

            for epi in [&plain, &with_bias] {
                assert!(
                    !run_one(&a, &b, &mut c.clone(), epi, threads),
                    "{ctx}: finite"
                );
            }
            // NaN in A's last row: C's last row is NaN, also through ReLU.
            let mut an = a.clone();
            an.set(m - 1, k / 2, T::from_f32(f32::NAN));
            for epi in [&plain, &with_bias] {
                let mut cc = c.clone();
                assert!(run_one(&an, &b, &mut cc, epi, threads), "{ctx}: NaN in A");
                assert!(cc.at(m - 1, 0).to_f32().is_nan(), "{ctx}: NaN propagates");
                assert!(cc.at(0, 0).to_f32().is_finite(), "{ctx}: only that row");
            }
            // +inf in B's last column.
            let mut bi = b.clone();
            bi.set(0, n - 1, T::from_f32(f32::INFINITY));
            assert!(
                run_one(&a, &bi, &mut c.clone(), &plain, threads),
                "{ctx}: inf in B"
            );
            // A NaN in C_old counts only when it is read.
            let mut cn = c.clone();
            cn.set(m / 2, n / 2, C::from_f32(f32::NAN));
            assert!(
                run_one(&a, &b, &mut cn.clone(), &Epilogue::ACCUMULATE, threads),
                "{ctx}: NaN C_old"
            );
            assert!(
                !run_one(&a, &b, &mut cn, &plain, threads),
                "{ctx}: overwritten NaN C_old"
            );
            // An infinite bias entry: +inf is stored; -inf goes through ReLU to 0, and what is
            // checked is what is stored.
            let mut binf = vec![0.0f32; n];
            binf[n - 1] = f32::INFINITY;
            let e = Epilogue {
                bias: Some(&binf),
                ..Epilogue::STORE
            };
            assert!(
                run_one(&a, &b, &mut c.clone(), &e, threads),
                "{ctx}: +inf bias"
            );
            binf[n - 1] = f32::NEG_INFINITY;
            let e = Epilogue {
                bias: Some(&binf),
                activation: Activation::Relu,
                ..Epilogue::STORE
            };
            let mut cc = c.clone();
            assert!(
                !run_one(&a, &b, &mut cc, &e, threads),
                "{ctx}: ReLU(-inf) = 0"
            );
            assert_eq!(cc.at(0, n - 1).to_f32(), 0.0);
            // Overflow in the store: finite in f32, beyond the 16-bit type (or f32) range.
            let alpha = if C::IS_F32 {
                f32::MAX
            } else if C::NAME == "f16" {
                big
            } else {
                f32::MAX
            };
            let e = Epilogue {
                alpha,
                ..Epilogue::STORE
            };
            assert!(
                run_one(&a, &b, &mut c.clone(), &e, threads),
                "{ctx}: overflow"
            );
        }
    }
}

#[test]
fn non_finite_is_reported() {
    at_each_level("non_finite_is_reported", |rng, _| {
        let lvl = format!("{:?}", level());
        non_finite_cases::<f32, f32>(rng, &lvl);
        non_finite_cases::<f16, f16>(rng, &lvl);
        non_finite_cases::<bf16, bf16>(rng, &lvl);
        non_finite_cases::<f16, f32>(rng, &lvl);
        non_finite_cases::<bf16, f32>(rng, &lvl);
        // f32 with nothing but the product: the kernels write full tiles straight into a
        // row-major C, across several k blocks; the check then reads C back.
        let (m, n, k) = (24, 64, 600);
        let mut a = Mat::<f32>::random(rng, m, k, Layout::RowMajor);
        let b = Mat::<f32>::random(rng, k, n, Layout::RowMajor);
        let mut c = Mat::<f32>::random(rng, m, n, Layout::RowMajor);
        assert!(!run_one(&a, &b, &mut c, &Epilogue::STORE, 1));
        a.set(m - 1, 3, f32::INFINITY);
        assert!(run_one(&a, &b, &mut c, &Epilogue::STORE, 1));
    });
}

#[test]
#[should_panic(expected = "bias")]
fn bias_of_the_wrong_length_panics() {
    let a = [1.0f32; 6];
    let mut c = [0.0f32; 4];
    let bias = [0.0f32; 3];
    let v = |d| typed_amp_kernels::MatRef {
        data: d,
        rows: 2,
        cols: 3,
        rs: 3,
        cs: 1,
    };
    let b = typed_amp_kernels::MatRef {
        data: &a,
        rows: 3,
        cols: 2,
        rs: 2,
        cs: 1,
    };
    let c = typed_amp_kernels::MatMut {
        data: &mut c,
        rows: 2,
        cols: 2,
        rs: 2,
        cs: 1,
    };
    let e = Epilogue {
        bias: Some(&bias),
        ..Epilogue::STORE
    };
    gemm_epilogue_slices(v(&a), b, c, &e, 1);
}
