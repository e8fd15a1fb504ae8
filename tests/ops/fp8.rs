//! FP8 tensors (`typed_amp::fp8`): quantisation error bounds by format and granularity, the
//! scale recipes (current, delayed with history and margin), parts and concatenation without
//! rounding, the products against the f64 product of the dequantised operands with a bound
//! from the accumulation length, and every typed run-time error.

use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use typed_amp::fp8::{
    forward_product, gradient_product, widen, Current, Delayed, DelayedScaling, Fp8Element,
    Fp8Error, Fp8Parts, Fp8Tensor, Granularity, PerRow, PerTensor, E4M3, E5M2,
};

const U32: f64 = 1.0 / (1u64 << 24) as f64;

fn data(seed: u64, n: usize, spread: i32) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| rng.gen_range(-1.0f32..1.0) * 2f32.powi(rng.gen_range(-spread..=spread)))
        .collect()
}

/// `|x̃ - x| ≤ (u_F + 2u) |x| + (half the smallest subnormal) / scale`: one rounding to the
/// format (relative `u_F = 2^-(M+1)` among normals, absolute half a subnormal step below),
/// plus the f32 roundings of `x · scale` and `code / scale`.
fn check_quantization_error<F: Fp8Element, G: Granularity>(x: &[f32], rows: usize, cols: usize) {
    let t = Fp8Tensor::<F, G, Current>::quantize(x, rows, cols).unwrap();
    let back = t.dequantize();
    let u_f = 2f64.powi(-(F::MANTISSA_BITS as i32) - 1);
    let half_sub = 2f64.powi(-F::BIAS - F::MANTISSA_BITS as i32);
    for i in 0..rows {
        let scale = t.scales()[G::scale_index(i)] as f64;
        // The amax of the values that share this row's scale.
        let group_amax = (0..rows)
            .filter(|&r| G::scale_index(r) == G::scale_index(i))
            .flat_map(|r| &x[r * cols..(r + 1) * cols])
            .fold(0f32, |m, v| m.max(v.abs()));
        for j in 0..cols {
            let (v, q) = (x[i * cols + j] as f64, back[i * cols + j] as f64);
            let bound = (u_f + 2.0 * U32) * v.abs() + half_sub / scale * (1.0 + 4.0 * U32);
            assert!(
                (q - v).abs() <= bound,
                "{} {}: {v:e} -> {q:e}, bound {bound:e}",
                F::NAME,
                G::NAME
            );
            // No value comes back beyond its scale's amax by more than the roundings at the top.
            assert!(q.abs() <= group_amax as f64 * (1.0 + 4.0 * U32));
        }
    }
}

#[test]
fn quantization_error_is_one_rounding_of_the_format() {
    let x = data(1, 64 * 48, 6);
    check_quantization_error::<E4M3, PerTensor>(&x, 64, 48);
    check_quantization_error::<E4M3, PerRow>(&x, 64, 48);
    check_quantization_error::<E5M2, PerTensor>(&x, 64, 48);
    check_quantization_error::<E5M2, PerRow>(&x, 64, 48);
}

#[test]
fn the_amax_maps_to_the_formats_maximum_and_per_row_scales_isolate_an_outlier() {
    let mut x = data(2, 4 * 16, 2);
    x[5] = 1e6; // an outlier in row 0
    let t = Fp8Tensor::<E4M3, PerTensor, Current>::quantize(&x, 4, 16).unwrap();
    assert_eq!(t.scales(), &[448.0 / 1e6]);
    assert_eq!(t.codes().bits()[5], 0x7E, "the amax is E4M3's 448");
    let r = Fp8Tensor::<E4M3, PerRow, Current>::quantize(&x, 4, 16).unwrap();
    assert_eq!(r.scales().len(), 4);
    assert_eq!(r.scales()[0], 448.0 / 1e6);
    let err = |q: &[f32]| -> f64 { (16..64).map(|i| (q[i] as f64 - x[i] as f64).abs()).sum() };
    // Rows 1..4 lose far less per row than under the outlier's scale (their small values fall
    // into E4M3's subnormals there).
    assert!(err(&r.dequantize()) * 4.0 < err(&t.dequantize()));
    // E5M2's amax code.
    let e = Fp8Tensor::<E5M2, PerTensor, Current>::quantize(&x, 4, 16).unwrap();
    assert_eq!(e.codes().bits()[5], 0x7B);
}

#[test]
fn an_all_zero_tensor_has_scale_one_and_sixteen_bit_sources_quantize_like_their_f32_values() {
    let t = Fp8Tensor::<E4M3, PerRow, Current>::quantize(&[0.0f32; 6], 2, 3).unwrap();
    assert_eq!(t.scales(), &[1.0, 1.0]);
    assert_eq!(t.dequantize(), vec![0.0; 6]);
    let x = data(3, 40, 8);
    let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    let xh: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
    let wb: Vec<f32> = xb.iter().map(|v| v.to_f32()).collect();
    let wh: Vec<f32> = xh.iter().map(|v| v.to_f32()).collect();
    assert_eq!(
        Fp8Tensor::<E4M3, PerRow>::quantize(&xb, 5, 8).unwrap(),
        Fp8Tensor::<E4M3, PerRow>::quantize(&wb, 5, 8).unwrap()
    );
    assert_eq!(
        Fp8Tensor::<E5M2>::quantize(&xh, 5, 8).unwrap(),
        Fp8Tensor::<E5M2>::quantize(&wh, 5, 8).unwrap()
    );
}

#[test]
fn delayed_scaling_uses_the_largest_amax_of_the_last_h_steps_with_its_margin() {
    let mut s = DelayedScaling::<3, 1>::new();
    for a in [1.0, 4.0, 2.0] {
        s.record_amax(a).unwrap();
    }
    assert_eq!(s.history(), vec![1.0, 4.0, 2.0]);
    assert_eq!(s.scale::<E4M3>().unwrap(), 448.0 / 4.0 / 2.0);
    assert_eq!(s.scale::<E5M2>().unwrap(), 57344.0 / 4.0 / 2.0);
    s.record_amax(1.0).unwrap(); // drops 1.0
    s.record_amax(1.0).unwrap(); // drops 4.0
    assert_eq!(s.history(), vec![2.0, 1.0, 1.0]);
    assert_eq!(s.scale::<E4M3>().unwrap(), 448.0 / 2.0 / 2.0);

    // Quantising uses the history's scale, then records the tensor's own amax.
    let mut s = DelayedScaling::<2>::from_first(&[0.5, -8.0]).unwrap();
    let x = [1.0f32, 2.0, -16.0, 4.0];
    let t = Fp8Tensor::<E4M3, PerTensor, Delayed<2>>::quantize_delayed(&x, 2, 2, &mut s).unwrap();
    assert_eq!(t.scales(), &[448.0 / 8.0]);
    // -16 · 56 = -896 saturates at -448 (the recipe's clamp when the amax grows).
    assert_eq!(t.dequantize(), vec![1.0, 2.0, -8.0, 4.0]);
    assert_eq!(s.history(), vec![8.0, 16.0]);
    assert_eq!(s.scale::<E4M3>().unwrap(), 28.0);
}

#[test]
fn bad_run_time_input_is_a_typed_error() {
    type T = Fp8Tensor<E4M3, PerTensor, Current>;
    assert!(matches!(
        T::quantize(&[1.0f32, f32::NAN], 1, 2),
        Err(Fp8Error::NonFiniteAmax { .. })
    ));
    assert!(matches!(
        Fp8Tensor::<E4M3, PerRow>::quantize(&[1.0f32, 2.0, f32::INFINITY, 0.0], 2, 2),
        Err(Fp8Error::NonFiniteAmax { amax }) if amax == f32::INFINITY
    ));
    assert!(matches!(
        T::quantize(&[1.0f32; 5], 2, 3),
        Err(Fp8Error::Shape(_))
    ));
    assert!(matches!(
        T::quantize(&[1.0f32; 5], usize::MAX, 2),
        Err(Fp8Error::Shape(_))
    ));
    // A NaN in an earlier row of a per-tensor scaled tensor is not hidden by later rows.
    assert!(matches!(
        T::quantize(&[f32::NAN, 1.0, 2.0, 3.0], 2, 2),
        Err(Fp8Error::NonFiniteAmax { .. })
    ));
    assert!(matches!(
        Fp8Tensor::<E5M2, PerTensor>::quantize(&[1.0, -f32::NAN, 2.0, 3.0, 4.0, 5.0], 3, 2),
        Err(Fp8Error::NonFiniteAmax { .. })
    ));
    // An amax so small that 448 / amax overflows f32.
    assert!(matches!(
        T::quantize(&[f32::from_bits(1)], 1, 1),
        Err(Fp8Error::BadScale { .. })
    ));
    // Delayed scaling: a fresh history, a history of zeros, a non-finite amax.
    let mut s = DelayedScaling::<4>::new();
    let q = |s: &mut DelayedScaling<4>, x: &[f32]| {
        Fp8Tensor::<E4M3, PerTensor, Delayed<4>>::quantize_delayed(x, 1, x.len(), s)
    };
    assert_eq!(q(&mut s, &[1.0]), Err(Fp8Error::EmptyHistory { len: 4 }));
    s.record_amax(0.0).unwrap();
    assert_eq!(q(&mut s, &[1.0]), Err(Fp8Error::EmptyHistory { len: 4 }));
    assert!(matches!(
        s.record_amax(f32::NAN),
        Err(Fp8Error::NonFiniteAmax { .. })
    ));
    s.record_amax(2.0).unwrap();
    let before = s.clone();
    assert!(matches!(
        q(&mut s, &[1.0, f32::NEG_INFINITY]),
        Err(Fp8Error::NonFiniteAmax { .. })
    ));
    assert_eq!(s, before, "nothing recorded from a non-finite tensor");
    assert!(matches!(q(&mut s, &[1.0, 2.0]).map(|_| ()), Ok(())));
    assert!(matches!(
        DelayedScaling::<4>::from_first(&[f32::NAN]),
        Err(Fp8Error::NonFiniteAmax { .. })
    ));
    // Parts: bad scales, wrong counts.
    let parts = |scales: Vec<f32>, n: usize| Fp8Parts {
        codes: vec![E4M3(0x38); n],
        scales,
        rows: 2,
        cols: 2,
    };
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert!(matches!(
            Fp8Tensor::<E4M3, PerRow>::from_parts(parts(vec![1.0, bad], 4)),
            Err(Fp8Error::BadScale { .. })
        ));
    }
    assert!(matches!(
        Fp8Tensor::<E4M3, PerRow>::from_parts(parts(vec![1.0], 4)),
        Err(Fp8Error::Shape(_))
    ));
    assert!(matches!(
        Fp8Tensor::<E4M3, PerTensor>::from_parts(parts(vec![1.0], 3)),
        Err(Fp8Error::Shape(_))
    ));
    // Products and concatenation of mismatched shapes.
    let a = Fp8Tensor::<E4M3>::quantize(&[1.0f32; 6], 2, 3).unwrap();
    let b = Fp8Tensor::<E4M3>::quantize(&[1.0f32; 4], 2, 2).unwrap();
    assert!(matches!(forward_product(&a, &b), Err(Fp8Error::Shape(_))));
    let a = Fp8Tensor::<E4M3, PerRow>::quantize(&[1.0f32; 6], 2, 3).unwrap();
    let b = Fp8Tensor::<E4M3, PerRow>::quantize(&[1.0f32; 4], 2, 2).unwrap();
    assert!(matches!(a.concat_rows(b), Err(Fp8Error::Shape(_))));
    // Errors are sentences that say what to do.
    let msg = Fp8Error::EmptyHistory { len: 4 }.to_string();
    assert!(msg.contains("record"), "{msg}");
}

#[test]
fn parts_and_per_row_concatenation_keep_every_bit() {
    let x = data(4, 3 * 5, 10);
    let y = data(5, 2 * 5, 3);
    let a = Fp8Tensor::<E5M2, PerRow>::quantize(&x, 3, 5).unwrap();
    let b = Fp8Tensor::<E5M2, PerRow>::quantize(&y, 2, 5).unwrap();
    let back = Fp8Tensor::<E5M2, PerRow>::from_parts(a.clone().into_parts()).unwrap();
    assert_eq!(back, a);
    let mut expect = a.dequantize();
    expect.extend(b.dequantize());
    let c = a.concat_rows(b).unwrap();
    assert_eq!((c.rows(), c.cols(), c.scales().len()), (5, 5, 5));
    let got = widen(&c);
    assert_eq!(
        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        expect.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

/// `|y - ŷ| ≤ γ(k + 4) Σ_l |x̃_il| |w̃_jl|`, `ŷ` the f64 product of the dequantised operands:
/// exact code products, an f32 sum of `k` terms, two scale multiplications, and the f32
/// roundings of the two dequantised operands the reference reads (`γ(n) = n·u / (1 - n·u)`).
fn check_product<A: Fp8Element, B: Fp8Element>(
    y: &[f32],
    a: &[f32],
    b: &[f32],
    (m, k, n): (usize, usize, usize),
) {
    let g = |t: f64| t * U32 / (1.0 - t * U32);
    let mut worst = 0.0f64;
    for i in 0..m {
        for j in 0..n {
            let (mut exact, mut abs) = (0.0f64, 0.0f64);
            for l in 0..k {
                let p = a[i * k + l] as f64 * b[j * k + l] as f64;
                exact += p;
                abs += p.abs();
            }
            let bound = g((k + 4) as f64) * abs;
            let err = (y[i * n + j] as f64 - exact).abs();
            assert!(
                err <= bound,
                "{}×{} ({i}, {j}) of k = {k}: {} vs {exact:e}, bound {bound:e}",
                A::NAME,
                B::NAME,
                y[i * n + j]
            );
            worst = worst.max(if abs > 0.0 { err / abs } else { 0.0 });
        }
    }
    println!(
        "{}×{} m={m} k={k} n={n}: worst |err|/Σ|p| = {worst:e}",
        A::NAME,
        B::NAME
    );
}

#[test]
fn products_are_within_the_accumulation_bound_of_the_f64_product_of_the_dequantised_operands() {
    for (m, k, n) in [(1, 1, 1), (7, 33, 5), (16, 1000, 24), (3, 4099, 2)] {
        let x = data(10 + k as u64, m * k, 4);
        let w = data(20 + k as u64, n * k, 4);
        let dy = data(30 + k as u64, m * k, 12);
        let xt = Fp8Tensor::<E4M3, PerRow>::quantize(&x, m, k).unwrap();
        let wt = Fp8Tensor::<E4M3, PerTensor>::quantize(&w, n, k).unwrap();
        let y = forward_product(&xt, &wt).unwrap();
        check_product::<E4M3, E4M3>(&y, &xt.dequantize(), &wt.dequantize(), (m, k, n));
        let dyt = Fp8Tensor::<E5M2, PerTensor>::quantize(&dy, m, k).unwrap();
        let wr = Fp8Tensor::<E4M3, PerRow>::quantize(&w, n, k).unwrap();
        let g = gradient_product(&dyt, &wr).unwrap();
        check_product::<E5M2, E4M3>(&g, &dyt.dequantize(), &wr.dequantize(), (m, k, n));
    }
    // A product with a scale that is not a power of two, far from 1: a missed or doubled
    // scale would be off by orders of magnitude.
    let x = Fp8Tensor::<E4M3>::quantize(&[1e-3f32, 2e-3], 1, 2).unwrap();
    let w = Fp8Tensor::<E4M3>::quantize(&[3e3f32, -1e3], 1, 2).unwrap();
    let y = forward_product(&x, &w).unwrap();
    assert!((y[0] - 1.0).abs() < 0.15, "{y:?}");
}
