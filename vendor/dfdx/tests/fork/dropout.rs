//! The fork's dropout on the CPU: its mask is the counter-based SplitMix64 draw that the CUDA
//! kernels make (`dropout.cu`), a Bernoulli(p) per element, the same in the forward and the
//! backward, and kept elements are multiplied by `1 / (1 − p)` (rounded to f32) in f32.

use typed_amp_dfdx::prelude::*;
use typed_amp_dfdx::tensor::RandomU64;

/// SplitMix64's `(i + 1)`-th output for `seed`, written out independently of the fork's.
fn splitmix64(seed: u64, i: u64) -> u64 {
    let mut state = seed;
    let mut out = 0;
    for _ in 0..=i {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out = z ^ (z >> 31);
    }
    out
}

/// The values `1 + i mod 7` (never zero, so a zero output is a dropped element).
fn inputs(n: usize) -> Vec<f32> {
    (0..n).map(|i| 1.0 + (i % 7) as f32).collect()
}

#[test]
fn the_mask_is_splitmix64_of_the_seed_and_index_and_kept_values_are_scaled_once() {
    // More elements than one parallel chunk (2^14), and not a multiple of it.
    let n = 40_003;
    let p = 0.2;
    let dev = Cpu::seed_from_u64(11);
    // The dropout's seed is the device's next u64: a twin device shows it.
    let seed = Cpu::seed_from_u64(11).random_u64();
    let x = inputs(n);
    let t = dev.tensor_from_vec(x.clone(), (n,));
    let y = t.dropout(p).as_vec();
    let threshold = (p * 2.0 * (1u64 << 63) as f64) as u64;
    // The first elements against the independent generator (it is quadratic in the index).
    for i in 0..2_000 {
        let dropped = splitmix64(seed, i as u64) < threshold;
        let expected = if dropped {
            0.0
        } else {
            x[i] * (1.0 / 0.8f64) as f32
        };
        assert_eq!(y[i], expected, "element {i}");
    }
    // Kept elements everywhere are x · f32(1 / 0.8).
    for (i, (&yi, &xi)) in y.iter().zip(&x).enumerate() {
        assert!(yi == 0.0 || yi == xi * (1.0 / 0.8f64) as f32, "element {i}");
    }
    // The dropped count is Binomial(n, p): within 5 standard deviations of n·p.
    let dropped = y.iter().filter(|&&v| v == 0.0).count() as f64;
    let (mean, sd) = (n as f64 * p, (n as f64 * p * (1.0 - p)).sqrt());
    assert!(
        (dropped - mean).abs() < 5.0 * sd,
        "{dropped} of {n} dropped, expected {mean} ± {sd}"
    );
}

#[test]
fn the_backward_draws_the_forward_mask_again() {
    let n = 33_000;
    let dev = Cpu::seed_from_u64(3);
    let x = dev.tensor_from_vec(inputs(n), (n,));
    let c: Vec<f32> = (0..n).map(|i| ((i % 5) as f32 - 2.0) * 0.5).collect();
    let ct = dev.tensor_from_vec(c.clone(), (n,));
    let y = x.leaky_trace().dropout(0.3);
    let kept: Vec<bool> = y.as_vec().iter().map(|&v| v != 0.0).collect();
    let g = (y * ct).sum().backward();
    let gx = g.get(&x).as_vec();
    for i in 0..n {
        let expected = if kept[i] {
            c[i] * (1.0 / 0.7f64) as f32
        } else {
            0.0
        };
        assert_eq!(gx[i], expected, "element {i}");
    }
}

#[test]
fn probabilities_zero_and_one_keep_and_drop_everything() {
    let dev = Cpu::seed_from_u64(0);
    let x = dev.tensor_from_vec(inputs(1_000), (1_000,));
    assert_eq!(x.clone().dropout(0.0).as_vec(), inputs(1_000));
    let g = x.leaky_trace().dropout(1.0).sum().backward();
    assert!(g.get(&x).as_vec().iter().all(|&v| v == 0.0));
    let y = dev.tensor_from_vec(inputs(1_000), (1_000,)).dropout(1.0);
    assert!(y.as_vec().iter().all(|&v| v == 0.0));
}
