//! Long, thin products (k at least six times C's longer side: weight gradients), which the
//! GEMM computes as two halves of k added at the end: against an f64 reference, with the same
//! bits on any thread count, and with C's old value added once after the whole sum.
//!
//! # Tolerance
//!
//! As in `gemm.rs`: the exact `s = c₀ + Σ aᵢ·bᵢ` over `k` products of the inputs (exact in
//! f32 once widened), `S = |c₀| + Σ|aᵢ·bᵢ|`. Two halves summed apart and then added are one
//! more order of summing the same `n = k + 1` terms, each addition rounded once, so Higham's
//! bound for any order still holds: `|ŝ − s| ≤ γₙ·S`, `γₙ = n·u / (1 − n·u)`, `u = 2⁻²⁴`.
//! `vdpbf16ps` and AMX flush subnormals (`n·2⁻¹²⁶` more), and the f64 reference is off by at
//! most `2⁻⁴⁹·n·S`. C is FP32: no rounding to a narrower type.

mod common;

use common::{at_each_level, Elem, Layout, Mat};
use half::{bf16, f16};
use rand::rngs::StdRng;
use typed_amp_kernels::{gemm_epilogue_slices, Epilogue, GemmElem, GemmOut};

/// Weight-gradient shapes whose k is long enough to be split (at least 6 × max(m, n), and at
/// least 2²² flops), with odd k (a pair or tile boundary inside the second half) and a C
/// thinner than a vector.
const SHAPES: [(usize, usize, usize); 3] = [(16, 24, 6007), (40, 8, 13_001), (3, 70, 20_000)];

/// `C = A·B` (or `C += A·B`) into an FP32 C, asking for the non-finite report.
fn product<T: Elem + GemmElem>(
    a: &Mat<T>,
    b: &Mat<T>,
    c: &mut Mat<f32>,
    accumulate: bool,
    threads: usize,
) -> bool
where
    f32: GemmOut<T>,
{
    let epi = Epilogue {
        accumulate,
        report_non_finite: true,
        ..Epilogue::STORE
    };
    gemm_epilogue_slices(a.view(), b.view(), c.view_mut(), &epi, threads).non_finite
}

fn matches_the_f64_sum<T: Elem + GemmElem>(rng: &mut StdRng, ctx: &str)
where
    f32: GemmOut<T>,
{
    for (m, n, k) in SHAPES {
        for (la, lc) in [
            (Layout::ColMajor, Layout::RowMajor),
            (Layout::ColMajor, Layout::ColMajor),
            (Layout::RowMajor, Layout::Sparse),
        ] {
            for accumulate in [false, true] {
                let a = Mat::<T>::random(rng, m, k, la);
                let b = Mat::<T>::random(rng, k, n, Layout::RowMajor);
                let c0 = Mat::<f32>::random(rng, m, n, lc);
                let mut c = c0.clone();
                let what = format!(
                    "{ctx} {}→f32 {m}×{n}×{k} A {la:?} C {lc:?} acc {accumulate}",
                    T::NAME
                );
                assert!(
                    !product(&a, &b, &mut c, accumulate, 2),
                    "{what}: non-finite"
                );
                let terms = (k + 1) as f64;
                let u = 2f64.powi(-24);
                let gamma = terms * u / (1.0 - terms * u);
                for i in 0..m {
                    for j in 0..n {
                        let old = if accumulate {
                            c0.at(i, j).to_f64()
                        } else {
                            0.0
                        };
                        let (mut s, mut mag) = (old, old.abs());
                        for p in 0..k {
                            let x = a.at(i, p).to_f64() * b.at(p, j).to_f64();
                            s += x;
                            mag += x.abs();
                        }
                        let tol =
                            gamma * mag + terms * 2f64.powi(-126) + 2f64.powi(-49) * terms * mag;
                        let got = c.at(i, j).to_f64();
                        assert!(
                            (got - s).abs() <= tol,
                            "{what}: C[{i},{j}] = {got}, expected {s} ± {tol}"
                        );
                    }
                }
                // Nothing outside C's slots changed (the sentinel gaps of a sparse C).
                let mut inside = vec![false; c.data.len()];
                (0..m).for_each(|i| (0..n).for_each(|j| inside[c.idx(i, j)] = true));
                for (x, (got, was)) in c.data.iter().zip(&c0.data).enumerate() {
                    assert!(
                        inside[x] || got.to_bits() == was.to_bits(),
                        "{what}: wrote at {x}"
                    );
                }
            }
        }
    }
}

#[test]
fn split_products_match_the_f64_sum() {
    at_each_level("split_products_match_the_f64_sum", |rng, _| {
        matches_the_f64_sum::<f32>(rng, "");
        matches_the_f64_sum::<bf16>(rng, "");
        matches_the_f64_sum::<f16>(rng, "");
    });
}

fn same_bits_on_any_thread_count<T: Elem + GemmElem>(rng: &mut StdRng, ctx: &str)
where
    f32: GemmOut<T>,
{
    for (m, n, k) in SHAPES {
        for accumulate in [false, true] {
            let a = Mat::<T>::random(rng, m, k, Layout::ColMajor);
            let b = Mat::<T>::random(rng, k, n, Layout::RowMajor);
            let c0 = Mat::<f32>::random(rng, m, n, Layout::RowMajor);
            let bits = |threads: usize| {
                let mut c = c0.clone();
                product(&a, &b, &mut c, accumulate, threads);
                c.data.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            };
            let one = bits(1);
            for threads in [2, 3, 4] {
                assert!(
                    bits(threads) == one,
                    "{ctx} {}→f32 {m}×{n}×{k} acc {accumulate}: {threads} threads differ from 1",
                    T::NAME
                );
            }
        }
    }
}

#[test]
fn split_products_have_the_same_bits_on_any_thread_count() {
    at_each_level(
        "split_products_have_the_same_bits_on_any_thread_count",
        |rng, _| {
            same_bits_on_any_thread_count::<f32>(rng, "");
            same_bits_on_any_thread_count::<bf16>(rng, "");
        },
    );
}

/// A NaN or infinity in either half of k reaches C and the report, with or without C's old
/// value; a finite product reports nothing.
#[test]
fn a_non_finite_value_in_either_half_is_reported() {
    at_each_level("a_non_finite_value_in_either_half_is_reported", |rng, _| {
        let (m, n, k) = SHAPES[0];
        for bad_at in [3, k - 2] {
            for (bad, accumulate) in [(f32::NAN, false), (f32::INFINITY, true)] {
                let mut a = Mat::<f32>::random(rng, m, k, Layout::ColMajor);
                let b = Mat::<f32>::random(rng, k, n, Layout::RowMajor);
                let mut c = Mat::<f32>::random(rng, m, n, Layout::RowMajor);
                a.set(5, bad_at, bad);
                let what = format!("{bad} at k {bad_at}, acc {accumulate}");
                assert!(
                    product(&a, &b, &mut c, accumulate, 2),
                    "{what}: not reported"
                );
                assert!((0..n).any(|j| !c.at(5, j).is_finite()), "{what}: not in C");
                assert!(
                    (0..m)
                        .filter(|&i| i != 5)
                        .all(|i| (0..n).all(|j| c.at(i, j).is_finite())),
                    "{what}: reached other rows"
                );
            }
        }
    });
}

/// C's old value enters once, after the whole sum of the products (the `Epilogue` contract),
/// not after the first half's: with `C_old = 1` and one product of 2⁻²⁴ in each half of k,
/// `(2⁻²⁴ + 2⁻²⁴) + 1 = 1 + 2⁻²³` exactly, while `(1 + 2⁻²⁴) + 2⁻²⁴` rounds back to 1 twice.
#[test]
fn the_old_value_is_added_after_the_whole_sum() {
    at_each_level("the_old_value_is_added_after_the_whole_sum", |rng, _| {
        let (m, n, k) = (8, 8, 1 << 16);
        let tiny = 2f32.powi(-24);
        let filled = |rng: &mut StdRng, rows, cols, layout, value: f32| {
            let mut x = Mat::<f32>::random(rng, rows, cols, layout);
            x.data.fill(value);
            x
        };
        let mut a = filled(rng, m, k, Layout::ColMajor, 0.0);
        let mut b = filled(rng, k, n, Layout::RowMajor, 0.0);
        // One product per half (k/2 is a whole number of every path's k unit).
        for p in [0, k / 2] {
            (0..m).for_each(|i| a.set(i, p, 1.0));
            (0..n).for_each(|j| b.set(p, j, tiny));
        }
        for threads in [1, 2] {
            let mut c = filled(rng, m, n, Layout::RowMajor, 1.0);
            product(&a, &b, &mut c, true, threads);
            for x in &c.data {
                assert_eq!(
                    x.to_bits(),
                    (1.0 + 2.0 * tiny).to_bits(),
                    "{threads} threads"
                );
            }
        }
    });
}
