//! GEMM against an f64 reference, on every instruction-set level this CPU supports.
//!
//! # Tolerance
//!
//! Let the exact result be `s = c₀ + Σᵢ aᵢ·bᵢ` over `k` products of the (widened, hence exact
//! in f32) inputs, with `c₀` C's old value when accumulating (else 0), and `S = |c₀| + Σ|aᵢ·bᵢ|`.
//! The kernels add these `n = k + 1` terms in f32 in some order, each multiply-add rounded once
//! (FMA) or a product that is exact (bf16·bf16 in `vdpbf16ps`) then added. For any order of
//! recursive summation of `n` terms with unit roundoff `u = 2⁻²⁴`, the classic bound (Higham,
//! *Accuracy and Stability of Numerical Algorithms*, §3.1 and §4.2) is
//! `|ŝ − s| ≤ γₙ·S`, `γₙ = n·u / (1 − n·u)`.
//! Storing into an f16 or bf16 C rounds once more, to nearest: `|ĉ − ŝ| ≤ u_T·|ŝ|` with
//! `u_T = 2⁻¹¹` (f16, 11-bit significand) or `2⁻⁸` (bf16, 8-bit), plus, below the normal range,
//! half the subnormal spacing (`2⁻²⁵` for f16; bf16 shares f32's range, so `2⁻¹³⁴`). As
//! `|ŝ| ≤ |s| + γₙ·S`:
//! `|ĉ − s| ≤ γₙ·S + u_T·(|s| + γₙ·S) + abs_T`.
//! `vdpbf16ps` flushes subnormals to zero, which can move each of its `n` additions by up to
//! `2⁻¹²⁶`: `n·2⁻¹²⁶` more, added always (it is far below anything else here). The f64
//! reference itself is off by at most `γₙ^(f64)·S`, covered by a `2⁻⁴⁹·n·S` term.

use std::sync::Mutex;

use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use typed_amp_kernels::{
    detected_level, force_level, gemm, gemm_epilogue_slices, gemm_slices, set_a_rows_in_place,
    set_bf16_pair_emulation, set_small_products, Activation, Epilogue, GemmElem, GemmOut, Level,
    MatMut, MatRef,
};

/// The level is process-wide: tests that force it take turns.
static LOCK: Mutex<()> = Mutex::new(());

trait Elem: GemmElem + Default + std::fmt::Debug {
    const NAME: &'static str;
    /// Unit roundoff of the final store, and the absolute error allowed below normal range.
    const U: f64;
    const ABS: f64;
    fn from_f32(x: f32) -> Self;
    fn to_f64(self) -> f64;
}
impl Elem for f32 {
    const NAME: &'static str = "f32";
    const U: f64 = 0.0;
    const ABS: f64 = 0.0;
    fn from_f32(x: f32) -> Self {
        x
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}
impl Elem for f16 {
    const NAME: &'static str = "f16";
    const U: f64 = 1.0 / 2048.0;
    const ABS: f64 = 2.980_232_238_769_531_2e-8; // 2^-25
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
}
impl Elem for bf16 {
    const NAME: &'static str = "bf16";
    const U: f64 = 1.0 / 256.0;
    const ABS: f64 = 0.0; // 2^-134 is below anything the f64 checks can see
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
}

/// How a matrix sits in memory.
#[derive(Clone, Copy, Debug)]
enum Layout {
    RowMajor,
    ColMajor,
    /// Row-major with padded rows.
    PaddedRows,
    /// Both strides larger than the extents they step over would need.
    Sparse,
}
const LAYOUTS: [Layout; 4] = [
    Layout::RowMajor,
    Layout::ColMajor,
    Layout::PaddedRows,
    Layout::Sparse,
];

impl Layout {
    fn strides(self, rows: usize, cols: usize) -> (usize, usize) {
        match self {
            Layout::RowMajor => (cols, 1),
            Layout::ColMajor => (1, rows),
            Layout::PaddedRows => (cols + 5, 1),
            Layout::Sparse => (2, 2 * rows + 3),
        }
    }
}

struct Mat<T> {
    data: Vec<T>,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<T: Elem> Mat<T> {
    fn random(rng: &mut StdRng, rows: usize, cols: usize, layout: Layout) -> Self {
        let (rs, cs) = layout.strides(rows, cols);
        let len = if rows == 0 || cols == 0 {
            0
        } else {
            (rows - 1) * rs + (cols - 1) * cs + 1
        };
        // Gaps between elements get a sentinel the kernels must never read into C or write.
        let data = (0..len)
            .map(|i| {
                if i % 11 == 0 {
                    T::from_f32(0.0)
                } else {
                    T::from_f32(rng.gen_range(-1.0f32..1.0))
                }
            })
            .collect();
        Mat {
            data,
            rows,
            cols,
            rs,
            cs,
        }
    }
    fn at(&self, i: usize, j: usize) -> T {
        self.data[i * self.rs + j * self.cs]
    }
    fn view(&self) -> MatRef<'_, T> {
        MatRef {
            data: &self.data,
            rows: self.rows,
            cols: self.cols,
            rs: self.rs,
            cs: self.cs,
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn check<T: Elem>(
    rng: &mut StdRng,
    m: usize,
    n: usize,
    k: usize,
    la: Layout,
    lb: Layout,
    lc: Layout,
    accumulate: bool,
    threads: usize,
) {
    let a = Mat::<T>::random(rng, m, k, la);
    let b = Mat::<T>::random(rng, k, n, lb);
    let mut c = Mat::<T>::random(rng, m, n, lc);
    let c0 = c.data.clone();
    let ctx = || {
        format!(
            "{} {:?} m={m} n={n} k={k} A {la:?} B {lb:?} C {lc:?} acc={accumulate} threads={threads}",
            T::NAME,
            typed_amp_kernels::level()
        )
    };
    gemm_slices(
        a.view(),
        b.view(),
        &mut c.data,
        c.rs,
        c.cs,
        accumulate,
        threads,
    );

    let nterms = (k + 1) as f64;
    let u = 2f64.powi(-24);
    let gamma = nterms * u / (1.0 - nterms * u);
    let mut touched = vec![false; c.data.len()];
    for i in 0..m {
        for j in 0..n {
            let idx = i * c.rs + j * c.cs;
            touched[idx] = true;
            let old = if accumulate { c0[idx].to_f64() } else { 0.0 };
            let (mut s, mut mag) = (old, old.abs());
            for p in 0..k {
                let x = a.at(i, p).to_f64() * b.at(p, j).to_f64();
                s += x;
                mag += x.abs();
            }
            let tol = gamma * mag
                + T::U * (s.abs() + gamma * mag)
                + T::ABS
                + nterms * 2f64.powi(-126)
                + 2f64.powi(-49) * nterms * mag;
            let got = c.data[idx].to_f64();
            assert!(
                (got - s).abs() <= tol,
                "{}: C[{i},{j}] = {got}, expected {s} ± {tol}",
                ctx()
            );
        }
    }
    for (idx, t) in touched.iter().enumerate() {
        if !t {
            assert_eq!(
                c.data[idx].to_f64().to_bits(),
                c0[idx].to_f64().to_bits(),
                "{}: wrote outside C at {idx}",
                ctx()
            );
        }
    }
}

/// Runs `f` once at every level this CPU supports (plus the bf16-pair emulation where
/// AVX512-BF16 is absent), and prints which ran.
fn at_each_level(name: &str, mut f: impl FnMut(&mut StdRng)) {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut ran = Vec::new();
    for lvl in Level::ALL {
        if lvl > detected_level() {
            continue;
        }
        assert_eq!(force_level(Some(lvl)), lvl);
        let mut rng = StdRng::seed_from_u64(0x5eed ^ lvl as u64);
        f(&mut rng);
        ran.push(lvl.name().to_string());
    }
    if detected_level() < Level::Avx512Bf16 {
        set_bf16_pair_emulation(true);
        for lvl in [Level::Portable, detected_level()] {
            force_level(Some(lvl));
            let mut rng = StdRng::seed_from_u64(0xbf16);
            f(&mut rng);
            ran.push(format!("{}+bf16-pair-emulation", lvl.name()));
        }
        set_bf16_pair_emulation(false);
    }
    force_level(None);
    println!(
        "{name}: ran levels [{}] (detected {})",
        ran.join(", "),
        detected_level().name()
    );
}

#[test]
fn odd_sizes_every_combination() {
    const SIZES: [usize; 4] = [1, 7, 33, 513];
    at_each_level("odd_sizes_every_combination", |rng| {
        let mut case = 0usize;
        for &m in &SIZES {
            for &n in &SIZES {
                for &k in &SIZES {
                    // The f64 reference at 513³ takes seconds in a test build; every other
                    // combination runs.
                    if m * n * k > 513 * 513 * 33 {
                        continue;
                    }
                    case += 1;
                    let la = LAYOUTS[case % 4];
                    let lb = LAYOUTS[(case / 4) % 4];
                    let lc = LAYOUTS[(case / 2) % 4];
                    let acc = case.is_multiple_of(2);
                    let threads = 1 + case % 3;
                    check::<f32>(rng, m, n, k, la, lb, lc, acc, threads);
                    check::<f16>(rng, m, n, k, la, lb, lc, !acc, threads);
                    check::<bf16>(rng, m, n, k, la, lb, lc, acc, threads);
                }
            }
        }
    });
}

#[test]
fn every_layout_combination() {
    at_each_level("every_layout_combination", |rng| {
        for la in LAYOUTS {
            for lb in LAYOUTS {
                for lc in [Layout::RowMajor, Layout::ColMajor, Layout::Sparse] {
                    for acc in [false, true] {
                        // k > 256 spans two packed k blocks (the f32 running-sum path for
                        // 16-bit C); 37 × 45 leaves partial tiles both ways.
                        check::<f32>(rng, 37, 45, 300, la, lb, lc, acc, 2);
                        check::<f16>(rng, 37, 45, 300, la, lb, lc, acc, 2);
                        check::<bf16>(rng, 37, 45, 300, la, lb, lc, acc, 2);
                        check::<bf16>(rng, 19, 50, 17, la, lb, lc, acc, 1);
                    }
                }
            }
        }
    });
}

#[test]
fn training_step_shapes() {
    use Layout::*;
    at_each_level("training_step_shapes", |rng| {
        // MLP at batch 256 (dfdx: y = x·Wᵀ with W stored [out, in]); backward grad_W = Gᵀ·X
        // and grad_X = G·W; CNN im2col products.
        let shapes: &[(usize, usize, usize, Layout, Layout)] = &[
            (256, 512, 784, RowMajor, ColMajor),
            (256, 10, 512, RowMajor, ColMajor),
            (512, 10, 256, ColMajor, RowMajor),
            (256, 512, 10, RowMajor, RowMajor),
            (16, 784, 9, RowMajor, RowMajor),
            (32, 196, 144, RowMajor, RowMajor),
            (3, 1100, 5, RowMajor, RowMajor),
            // Wider than one B block of every path (the bf16-pair path's is 768 columns) and
            // deeper than one k block: three column blocks, the last ragged, A packed for each.
            (29, 1601, 1030, RowMajor, ColMajor),
            // A ViT's attention per (sample, head), 17 tokens of 16 (rows of 64, so padded):
            // QKᵀ, PV, and the backward's dP·K and Pᵀ·dO.
            (17, 17, 16, PaddedRows, ColMajor),
            (17, 16, 17, RowMajor, PaddedRows),
            (17, 16, 17, ColMajor, PaddedRows),
        ];
        for &(m, n, k, la, lb) in shapes {
            check::<f32>(rng, m, n, k, la, lb, RowMajor, true, 2);
            check::<f16>(rng, m, n, k, la, lb, RowMajor, false, 2);
            check::<bf16>(rng, m, n, k, la, lb, RowMajor, true, 2);
        }
    });
}

#[test]
fn empty_dimensions() {
    at_each_level("empty_dimensions", |_| {
        // k = 0: C = 0, or unchanged when accumulating.
        let a: [f32; 0] = [];
        let mut c = [1.5f32; 6];
        let view = |d: &'static [f32], r, cl| MatRef {
            data: d,
            rows: r,
            cols: cl,
            rs: cl,
            cs: 1,
        };
        gemm_slices(view(&[], 2, 0), view(&[], 0, 3), &mut c, 3, 1, true, 2);
        assert_eq!(c, [1.5; 6]);
        gemm_slices(view(&[], 2, 0), view(&[], 0, 3), &mut c, 3, 1, false, 2);
        assert_eq!(c, [0.0; 6]);
        let mut h = [f16::ONE; 4];
        gemm_slices(
            MatRef {
                data: &[],
                rows: 2,
                cols: 0,
                rs: 0,
                cs: 1,
            },
            MatRef {
                data: &[],
                rows: 0,
                cols: 2,
                rs: 2,
                cs: 1,
            },
            &mut h,
            2,
            1,
            false,
            1,
        );
        assert_eq!(h, [f16::ZERO; 4]);
        // m = 0 or n = 0: nothing to touch (and null pointers are fine).
        unsafe {
            gemm::<f32>(
                0,
                3,
                4,
                a.as_ptr(),
                4,
                1,
                std::ptr::null(),
                3,
                1,
                std::ptr::null_mut(),
                3,
                1,
                false,
                2,
            );
            gemm::<bf16>(
                3,
                0,
                4,
                std::ptr::null(),
                4,
                1,
                std::ptr::null(),
                3,
                1,
                std::ptr::null_mut(),
                3,
                1,
                true,
                2,
            );
        }
    });
}

#[test]
fn non_finite_values_propagate() {
    at_each_level("non_finite_values_propagate", |_| {
        let a = [f16::INFINITY, f16::ONE, f16::ONE, f16::ONE];
        let b = [f16::ONE, f16::ONE, f16::NAN, f16::ONE];
        let mut c = [f16::ZERO; 4];
        let v = |d| MatRef {
            data: d,
            rows: 2,
            cols: 2,
            rs: 2,
            cs: 1,
        };
        gemm_slices(v(&a), v(&b), &mut c, 2, 1, false, 1);
        assert!(
            c[0].is_nan() && c[1] == f16::INFINITY && c[2].is_nan() && c[3] == f16::from_f32(2.0)
        );
        // Overflow of the f32 sum's rounding to f16 gives ±inf, as a hardware conversion does.
        let big = [f16::MAX; 4];
        gemm_slices(v(&big), v(&big), &mut c, 2, 1, false, 1);
        assert!(c.iter().all(|x| *x == f16::INFINITY));
    });
}

#[test]
fn forced_level_never_exceeds_detected() {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for lvl in Level::ALL {
        assert!(force_level(Some(lvl)) <= detected_level());
    }
    force_level(None);
}

/// One product through the small-product path and through the blocked driver: the same bits.
#[allow(clippy::too_many_arguments)]
fn same_bits_both_paths<T: Elem>(
    rng: &mut StdRng,
    (m, n, k): (usize, usize, usize),
    la: Layout,
    lb: Layout,
    lc: Layout,
    accumulate: bool,
) {
    let a = Mat::<T>::random(rng, m, k, la);
    let b = Mat::<T>::random(rng, k, n, lb);
    let c = Mat::<T>::random(rng, m, n, lc);
    let run = |small: bool| {
        let mut out = c.data.clone();
        set_small_products(small);
        gemm_slices(a.view(), b.view(), &mut out, c.rs, c.cs, accumulate, 1);
        set_small_products(true);
        out
    };
    let (small, blocked) = (run(true), run(false));
    for (idx, (x, y)) in small.iter().zip(&blocked).enumerate() {
        assert_eq!(
            x.to_f64().to_bits(),
            y.to_f64().to_bits(),
            "{} {:?} m={m} n={n} k={k} A {la:?} B {lb:?} C {lc:?} acc={accumulate}: element \
             {idx} is {x:?} without packing, {y:?} through the driver",
            T::NAME,
            typed_amp_kernels::level()
        );
    }
}

/// The small-product path (no packing: attention's per-head products) sums every element from
/// zero in k order, the old C added after, as the micro-kernels do within one k block, so it
/// must give the driver's bits: for the attention's shapes, odd ones, the size and depth
/// limits, every layout of A and B, each element type, with and without accumulation.
#[test]
fn small_products_match_the_driver_bit_for_bit() {
    use Layout::*;
    at_each_level("small_products_match_the_driver_bit_for_bit", |rng| {
        let shapes = [
            (17, 17, 16),
            (17, 16, 17),
            (1, 1, 1),
            (5, 29, 7),
            (33, 7, 64),
            (32, 32, 32),
            (5, 24, 256),
            (3, 50, 200),
        ];
        for shape in shapes {
            for la in LAYOUTS {
                for lb in LAYOUTS {
                    for lc in [RowMajor, ColMajor] {
                        for acc in [false, true] {
                            same_bits_both_paths::<f32>(rng, shape, la, lb, lc, acc);
                            same_bits_both_paths::<f16>(rng, shape, la, lb, lc, acc);
                            same_bits_both_paths::<bf16>(rng, shape, la, lb, lc, acc);
                        }
                    }
                }
            }
        }
    });
}

/// One product with A's rows read in place (by the bf16-pair kernels, or the AVX-512 and AVX2
/// f32 ones) and with A packed: the same values go through the same instructions, so the bits
/// must be equal, into a C of the operands' type (a bf16 C keeps its f32 running sums in a
/// buffer) and an f32 C (its own running sum), with and without the old C and an epilogue, on
/// one thread and two.
fn same_bits_a_in_place_or_packed<T: Elem + GemmOut<T>>(
    rng: &mut StdRng,
    (m, n, k): (usize, usize, usize),
    la: Layout,
    threads: usize,
) where
    f32: GemmOut<T>,
{
    let a = Mat::<T>::random(rng, m, k, la);
    let b = Mat::<T>::random(rng, k, n, Layout::RowMajor);
    let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.25 - 1.0).collect();
    let c16 = Mat::<T>::random(rng, m, n, Layout::RowMajor);
    let c32 = Mat::<f32>::random(rng, m, n, Layout::RowMajor);
    for accumulate in [false, true] {
        for fused in [false, true] {
            let epi = Epilogue {
                alpha: if fused { 0.5 } else { 1.0 },
                accumulate,
                bias: fused.then_some(&bias[..]),
                activation: if fused {
                    Activation::Relu
                } else {
                    Activation::None
                },
                report_non_finite: true,
            };
            let run = |in_place: bool| {
                let (mut out16, mut out32) = (c16.data.clone(), c32.data.clone());
                set_a_rows_in_place(in_place);
                let c16 = MatMut {
                    data: &mut out16[..],
                    rows: m,
                    cols: n,
                    rs: n,
                    cs: 1,
                };
                let r16 = gemm_epilogue_slices(a.view(), b.view(), c16, &epi, threads);
                let c32 = MatMut {
                    data: &mut out32[..],
                    rows: m,
                    cols: n,
                    rs: n,
                    cs: 1,
                };
                let r32 = gemm_epilogue_slices(a.view(), b.view(), c32, &epi, threads);
                set_a_rows_in_place(true);
                // Exact and one-to-one on the finite values both C hold.
                let bits16: Vec<u64> = out16.iter().map(|x| x.to_f64().to_bits()).collect();
                let bits32: Vec<u32> = out32.iter().map(|x| x.to_bits()).collect();
                (bits16, bits32, r16.non_finite, r32.non_finite)
            };
            assert!(
                run(true) == run(false),
                "{:?} {} m={m} n={n} k={k} A {la:?} threads {threads} acc={accumulate} \
                 epilogue={fused}: A read in place and A packed differ",
                typed_amp_kernels::level(),
                T::NAME
            );
        }
    }
}

/// The pair path (k even) and the AVX-512 and AVX2 f32 paths read a row-major A where it lies
/// instead of packing it: the same bits as packed A for one pair, one block of k, several blocks (1,100 =
/// 3 × 368 and a rest), C wider than one B block (whole-panel packing), rows not a multiple of
/// the tile's, padded rows (an odd row stride, so pairs start at odd addresses), and the
/// layouts and odd k that still pack. (`in_place` off disables the f32 rows kernels too, so
/// breaking any of them fails here.)
#[test]
fn a_rows_in_place_match_packed_a_bit_for_bit() {
    use Layout::*;
    at_each_level("a_rows_in_place_match_packed_a_bit_for_bit", |rng| {
        let shapes = [
            (1, 1, 2),
            (13, 33, 64),
            (37, 70, 128),
            (96, 800, 64),
            (29, 40, 1100),
            (500, 64, 1024),
            (17, 17, 16),
            (7, 9, 31),
        ];
        for shape in shapes {
            for la in [RowMajor, PaddedRows, ColMajor] {
                for threads in [1, 2] {
                    same_bits_a_in_place_or_packed::<bf16>(rng, shape, la, threads);
                    same_bits_a_in_place_or_packed::<f32>(rng, shape, la, threads);
                }
            }
        }
    });
    // `at_each_level` runs the pair emulation only where AVX512-BF16 is absent: its kernels
    // read A in place too, so run them here as well.
    if detected_level() >= Level::Avx512Bf16 {
        let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        set_bf16_pair_emulation(true);
        force_level(Some(Level::Avx512));
        let mut rng = StdRng::seed_from_u64(0xbf16);
        for la in [RowMajor, PaddedRows] {
            same_bits_a_in_place_or_packed::<bf16>(&mut rng, (37, 70, 128), la, 2);
        }
        force_level(None);
        set_bf16_pair_emulation(false);
    }
}
