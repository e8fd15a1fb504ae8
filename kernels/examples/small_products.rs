//! Times small products with and without the small-product path (no packing), one thread:
//! the attention shapes of the main job's ViT, then square ones around the size limit.
//!
//! `cargo run --release -p typed-amp-kernels --example small_products`

use std::time::Instant;

use typed_amp_kernels::{gemm_slices, level, set_small_products, MatRef};

/// One product shape with its strides: A `m × k`, B `k × n`, C row-major `m × n`.
struct Shape {
    name: &'static str,
    m: usize,
    k: usize,
    n: usize,
    a: (usize, usize),
    b: (usize, usize),
}

/// Milliseconds for `reps` products of `s` (best of five runs).
fn time(s: &Shape, reps: usize) -> f64 {
    let len =
        |rows: usize, cols: usize, (rs, cs): (usize, usize)| (rows - 1) * rs + (cols - 1) * cs + 1;
    let a: Vec<f32> = (0..len(s.m, s.k, s.a))
        .map(|i| (i % 7) as f32 * 0.25)
        .collect();
    let b: Vec<f32> = (0..len(s.k, s.n, s.b))
        .map(|i| (i % 5) as f32 * 0.5)
        .collect();
    let mut c = vec![0.0f32; s.m * s.n];
    let view = |data, rows, cols, (rs, cs)| MatRef {
        data,
        rows,
        cols,
        rs,
        cs,
    };
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..reps {
            gemm_slices(
                view(&a, s.m, s.k, s.a),
                view(&b, s.k, s.n, s.b),
                &mut c,
                s.n,
                1,
                false,
                1,
            );
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e3);
    }
    std::hint::black_box(&c);
    best
}

fn main() {
    // Per (sample, head) of a 4-head attention over 17 tokens of width 64: rows of 64.
    let attention = [
        Shape {
            name: "QKᵀ 17×16·16×17",
            m: 17,
            k: 16,
            n: 17,
            a: (64, 1),
            b: (1, 64),
        },
        Shape {
            name: "PV 17×17·17×16",
            m: 17,
            k: 17,
            n: 16,
            a: (17, 1),
            b: (64, 1),
        },
        Shape {
            name: "dP·K 17×17·17×16",
            m: 17,
            k: 17,
            n: 16,
            a: (17, 1),
            b: (64, 1),
        },
        Shape {
            name: "Pᵀ·dO 17×17·17×16",
            m: 17,
            k: 17,
            n: 16,
            a: (1, 17),
            b: (64, 1),
        },
        Shape {
            name: "dO·Vᵀ 17×16·16×17",
            m: 17,
            k: 16,
            n: 17,
            a: (64, 1),
            b: (1, 64),
        },
    ];
    let square: Vec<Shape> = [16, 32, 48, 64, 80]
        .iter()
        .map(|&d| Shape {
            name: "square, B rows",
            m: d,
            k: d / 2,
            n: d,
            a: (d / 2, 1),
            b: (d, 1),
        })
        .collect();
    println!(
        "level {:?}; ms for 512 products, best of 5; one thread",
        level()
    );
    println!(
        "{:22} {:>5} {:>5} {:>5} {:>10} {:>10} {:>7}",
        "shape", "m", "k", "n", "small", "driver", "ratio"
    );
    for s in attention.iter().chain(&square) {
        set_small_products(true);
        let small = time(s, 512);
        set_small_products(false);
        let driver = time(s, 512);
        set_small_products(true);
        println!(
            "{:22} {:5} {:5} {:5} {:10.3} {:10.3} {:7.2}",
            s.name,
            s.m,
            s.k,
            s.n,
            small,
            driver,
            driver / small
        );
    }
}
