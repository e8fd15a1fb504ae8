//! Nanoseconds per element of the slice forms in `typed_amp_kernels::math` (GELU, its
//! derivative, `exp`) and of dropout's mask (`dropout::mask_scale`, p = 0.2) at the CPU's
//! detected level, one thread, over a million values spread across [−5, 5] (both branches of
//! `erf`'s approximation): the elementwise costs a transformer's step pays on every MLP
//! activation, every attention probability and every dropout; and layer norm's forward and
//! backward rows (`norm`, rows of 384, the baby GPT's width, and of 64, the ViT's), per element.
//!
//! ```text
//! cargo bench -p typed-amp-kernels --bench math
//! ```
//! `TYPED_AMP_KERNELS` applies (e.g. `=portable` for the scalar build).

use std::time::Instant;

use typed_amp_kernels::dropout::mask_scale;
use typed_amp_kernels::math::{exp_slice, gelu_derivative_slice, gelu_slice};
use typed_amp_kernels::norm::{layer_norm_backward_row, layer_norm_forward_row};

const LEN: usize = 1 << 20;

/// A slice form: the function over every element, in place.
type SliceForm = fn(&mut [f32]);
const RUNS: usize = 31;

fn main() {
    println!(
        "level {:?} (detected {:?}); ns per element, median of {RUNS} passes over {LEN} values",
        typed_amp_kernels::level(),
        typed_amp_kernels::detected_level()
    );
    let xs: Vec<f32> = (0..LEN).map(|i| (i % 2000) as f32 * 0.005 - 5.0).collect();
    let forms: [(&str, SliceForm); 8] = [
        ("gelu_slice", gelu_slice),
        ("gelu_derivative_slice", gelu_derivative_slice),
        ("exp_slice", exp_slice),
        ("dropout mask_scale", dropout_mask),
        ("layer norm forward, 384", layer_norm_forward_rows::<384>),
        ("layer norm backward, 384", layer_norm_backward_rows::<384>),
        ("layer norm forward, 64", layer_norm_forward_rows::<64>),
        ("layer norm backward, 64", layer_norm_backward_rows::<64>),
    ];
    let mut v = xs.clone();
    for (name, f) in forms {
        let mut ns = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            v.copy_from_slice(&xs);
            let t = Instant::now();
            f(&mut v);
            ns.push(t.elapsed().as_secs_f64() * 1e9 / LEN as f64);
            std::hint::black_box(&v);
        }
        println!("{name:<24} {:>7.3}", bench_timing::median(&ns));
    }
}

/// Dropout at p = 0.2 (threshold 0.2 · 2⁶⁴), kept elements scaled by 1.25, from element 0.
fn dropout_mask(xs: &mut [f32]) {
    mask_scale(0x5eed, 0x3333_3333_3333_3400, 1.25, 0, xs);
}

/// Every whole row of `W` normalised in place (γ 1.1, β 0.1).
fn layer_norm_forward_rows<const W: usize>(xs: &mut [f32]) {
    let (gamma, beta) = ([1.1f32; W], [0.1f32; W]);
    for row in xs.chunks_exact_mut(W) {
        std::hint::black_box(layer_norm_forward_row(row, &gamma, &beta, 1e-5));
    }
}

/// Every whole row's backward with the input's gradient (the row as `x`, a fixed `dy`), the
/// parameter gradients summed over all rows.
fn layer_norm_backward_rows<const W: usize>(xs: &mut [f32]) {
    let gamma = [1.1f32; W];
    let dy: Vec<f32> = (0..W).map(|i| (i % 7) as f32 * 0.25 - 0.75).collect();
    let (mut dgamma, mut dbeta) = (vec![0f64; W], vec![0f64; W]);
    let mut g = vec![0f32; W];
    for row in xs.chunks_exact_mut(W) {
        g.copy_from_slice(&dy);
        layer_norm_backward_row(
            row,
            &mut g,
            &gamma,
            (0.05, 1.3),
            &mut dgamma,
            &mut dbeta,
            true,
        );
        std::hint::black_box(&g);
    }
    std::hint::black_box((&dgamma, &dbeta));
}
