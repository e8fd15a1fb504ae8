//! Times small products with and without the small-product path (no packing), one thread:
//! the three layouts of the main job's ViT attention products, then square products up to the
//! path's size limit (2¹⁵ multiply-adds; above it both modes run the blocked driver).
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

impl Shape {
    fn new(
        name: &'static str,
        (m, k, n): (usize, usize, usize),
        a: (usize, usize),
        b: (usize, usize),
    ) -> Self {
        Shape {
            name,
            m,
            k,
            n,
            a,
            b,
        }
    }
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
            let (a, b) = (view(&a, s.m, s.k, s.a), view(&b, s.k, s.n, s.b));
            gemm_slices(a, b, &mut c, s.n, 1, false, 1);
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e3);
    }
    std::hint::black_box(&c);
    best
}

fn main() {
    // Per (sample, head) of a 4-head attention over 17 tokens of width 64 (rows of 64): the
    // six products of a block come in three layouts.
    let mut shapes = vec![
        Shape::new("QKᵀ, dO·Vᵀ", (17, 16, 17), (64, 1), (1, 64)),
        Shape::new("PV, dP·K", (17, 17, 16), (17, 1), (64, 1)),
        Shape::new("Pᵀ·dO, dPᵀ·Q", (17, 17, 16), (1, 17), (64, 1)),
    ];
    for d in [16, 24, 32, 40] {
        shapes.push(Shape::new(
            "square, B rows",
            (d, d / 2, d),
            (d / 2, 1),
            (d, 1),
        ));
    }
    println!(
        "level {:?}; ms for 512 products, best of 5; one thread",
        level()
    );
    println!(
        "{:16} {:>4} {:>4} {:>4} {:>8} {:>8} {:>6}",
        "shape", "m", "k", "n", "small", "driver", "ratio"
    );
    for s in &shapes {
        set_small_products(true);
        let small = time(s, 512);
        set_small_products(false);
        let driver = time(s, 512);
        set_small_products(true);
        println!(
            "{:16} {:4} {:4} {:4} {:8.3} {:8.3} {:6.2}",
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
