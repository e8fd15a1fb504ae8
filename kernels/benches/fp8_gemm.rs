//! GFLOP/s of the FP8 product (`gemm_fp8`, E4M3 × E4M3 with per-tensor scales, widened to
//! bf16 and multiplied by the bf16 GEMM) against the bf16 GEMM itself (`gemm_epilogue_slices`
//! with an f32 C) on the same shape, timed alternately, medians. A plain binary.
//!
//! `cargo bench -p typed-amp-kernels --bench fp8_gemm [-- SIZE]` (default 1024);
//! `TYPED_AMP_KERNELS` applies.

use std::time::Instant;

use bench_timing::median;
use half::bf16;
use rand::{rngs::StdRng, Rng, SeedableRng};
use typed_amp_kernels::convert::{Fp8Format, E4M3};
use typed_amp_kernels::{gemm_epilogue_slices, gemm_fp8, level, Epilogue, MatMut, MatRef};

fn main() {
    let size: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1024);
    let (m, n, k) = (size, size, size);
    let threads = rayon::current_num_threads();
    let mut rng = StdRng::seed_from_u64(7);
    let a8: Vec<E4M3> = (0..m * k)
        .map(|_| E4M3::from_f32(rng.gen_range(-448.0..448.0)))
        .collect();
    let b8: Vec<E4M3> = (0..n * k)
        .map(|_| E4M3::from_f32(rng.gen_range(-448.0..448.0)))
        .collect();
    let a16: Vec<bf16> = a8.iter().map(|c| c.to_bf16()).collect();
    let b16: Vec<bf16> = b8.iter().map(|c| c.to_bf16()).collect();
    let mut c = vec![0f32; m * n];
    // A row-major m × k; B the transpose of a row-major n × k (a linear layer's weights).
    let fp8 = |c: &mut [f32]| {
        gemm_fp8(
            MatRef {
                data: &a8,
                rows: m,
                cols: k,
                rs: k,
                cs: 1,
            },
            MatRef {
                data: &b8,
                rows: k,
                cols: n,
                rs: 1,
                cs: k,
            },
            &[1.0 / 64.0],
            &[1.0 / 32.0],
            MatMut {
                data: c,
                rows: m,
                cols: n,
                rs: n,
                cs: 1,
            },
            threads,
        );
    };
    let bf = |c: &mut [f32]| {
        gemm_epilogue_slices::<bf16, f32>(
            MatRef {
                data: &a16,
                rows: m,
                cols: k,
                rs: k,
                cs: 1,
            },
            MatRef {
                data: &b16,
                rows: k,
                cols: n,
                rs: 1,
                cs: k,
            },
            MatMut {
                data: c,
                rows: m,
                cols: n,
                rs: n,
                cs: 1,
            },
            &Epilogue {
                alpha: 1.0 / 2048.0,
                ..Epilogue::STORE
            },
            threads,
        );
    };
    fp8(&mut c);
    bf(&mut c);
    let flop = 2.0 * (m * n * k) as f64;
    let (mut t8, mut t16) = (Vec::new(), Vec::new());
    for _ in 0..15 {
        let t = Instant::now();
        fp8(&mut c);
        t8.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        bf(&mut c);
        t16.push(t.elapsed().as_secs_f64());
    }
    // The widening alone (both operands, one thread), the FP8 product's extra work.
    let mut w = vec![bf16::ZERO; m * k];
    let mut tw = Vec::new();
    for _ in 0..15 {
        let t = Instant::now();
        typed_amp_kernels::convert::fp8_to_bf16(&a8, &mut w);
        typed_amp_kernels::convert::fp8_to_bf16(&b8, &mut w);
        tw.push(t.elapsed().as_secs_f64());
    }
    println!(
        "medians: FP8 product {:.2} ms, bf16 product {:.2} ms, widening both operands {:.3} ms",
        median(&t8) * 1e3,
        median(&t16) * 1e3,
        median(&tw) * 1e3
    );
    let (g8, g16) = (flop / median(&t8) / 1e9, flop / median(&t16) / 1e9);
    println!(
        "{m}×{k}×{n}, level {}, {threads} threads: FP8 (E4M3×E4M3 → f32) {g8:.1} GFLOP/s, \
         bf16 (→ f32) {g16:.1} GFLOP/s, ratio {:.3}",
        level().name(),
        g8 / g16
    );
}
