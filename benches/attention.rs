//! The fused attention op alone on the CPU: its forward and backward kernels at the main job's
//! shapes (the ViT's 17 tokens of 4 heads × 16, the small and baby GPTs' causal ones), in each
//! precision, with the multiply-adds they do and the rate that makes.
//!
//! Run with `cargo bench --bench attention` (add `-- --reps N` for more timed repetitions,
//! `--only vit|gpt-small|gpt-baby` for one shape, `--dtype f32|f16|bf16` for one precision). Prints milliseconds per pass (median over
//! the repetitions) for FP32, FP16 and BF16 `q`, `k`, `v` (the scores are FP32 in every case).

use std::time::Instant;

use bench_timing::median;
use half::{bf16, f16};
use typed_amp::dfdx::prelude::*;
use typed_amp::ops::attention::{AttentionDims, AttentionKernel};
use typed_amp::precision::AmpElem;

struct Shape {
    name: &'static str,
    dims: AttentionDims,
}

fn shapes() -> Vec<Shape> {
    let dims = |batch, tokens, heads, head_dim, causal| AttentionDims {
        batch,
        tokens,
        heads,
        head_dim,
        causal,
    };
    vec![
        Shape {
            name: "vit",
            dims: dims(128, 17, 4, 16, false),
        },
        Shape {
            name: "gpt-small",
            dims: dims(12, 64, 4, 32, true),
        },
        Shape {
            name: "gpt-baby",
            dims: dims(64, 256, 6, 64, true),
        },
    ]
}

/// Multiply-adds of one forward pass (`QKᵀ` and `PV`; half of each under a causal mask,
/// counting the diagonal).
fn forward_macs(d: &AttentionDims) -> f64 {
    let t = d.tokens as f64;
    let pairs = if d.causal { t * (t + 1.0) / 2.0 } else { t * t };
    2.0 * pairs * (d.batch * d.heads * d.head_dim) as f64
}

/// A deterministic buffer of `n` values in about [−1, 1].
fn values<E: AmpElem>(n: usize, seed: u64) -> Vec<E> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            <E as AmpElem>::from_f32((s >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        })
        .collect()
}

fn run<E: AmpElem>(shape: &Shape, reps: usize)
where
    Cpu: AttentionKernel<E>,
{
    let d = shape.dims;
    let dev = Cpu::default();
    let n_qkv = d.rows() * 3 * d.width();
    let n_y = d.rows() * d.width();
    let qkv: Tensor<(usize,), E, Cpu> = dev.tensor_from_vec(values::<E>(n_qkv, 1), (n_qkv,));
    let dy: Tensor<(usize,), E, Cpu> = dev.tensor_from_vec(values::<E>(n_y, 2), (n_y,));
    let mut y: Tensor<(usize,), E, Cpu> = dev.zeros_like(&(n_y,));
    let mut dqkv: Tensor<(usize,), E, Cpu> = dev.zeros_like(&(n_qkv,));
    let (mut fwd, mut bwd) = (Vec::new(), Vec::new());
    for rep in 0..reps + 2 {
        let t0 = Instant::now();
        let lse =
            AttentionKernel::<E>::try_attention_forward(&dev, d, qkv.storage(), y.storage_mut())
                .expect("forward");
        let t1 = Instant::now();
        AttentionKernel::<E>::try_attention_backward(
            &dev,
            d,
            qkv.storage(),
            y.storage(),
            dy.storage(),
            &lse,
            (dqkv.storage_mut(), false),
        )
        .expect("backward");
        let t2 = Instant::now();
        // The first two repetitions warm the allocator and the pool.
        if rep >= 2 {
            fwd.push((t1 - t0).as_secs_f64() * 1e3);
            bwd.push((t2 - t1).as_secs_f64() * 1e3);
        }
    }
    let (f, b) = (median(&fwd), median(&bwd));
    let macs = forward_macs(&d);
    // The backward recomputes the scores and runs four products: 2.5 times the forward's.
    let rate = |ms: f64, m: f64| 2.0 * m / (ms * 1e-3) / 1e9;
    println!(
        "  {:<5} forward {:>8.3} ms ({:>6.1} GFLOP/s)   backward {:>8.3} ms ({:>6.1} GFLOP/s)",
        typed_amp::precision::dtype_of::<E>().name(),
        f,
        rate(f, macs),
        b,
        rate(b, 2.5 * macs)
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let reps = value("--reps").and_then(|v| v.parse().ok()).unwrap_or(20);
    let only = value("--only");
    let dtype = value("--dtype");
    println!(
        "typed-amp fused attention on the CPU ({} threads; median of {reps} repetitions)",
        rayon::current_num_threads()
    );
    for shape in shapes() {
        if only.as_deref().is_some_and(|o| o != shape.name) {
            continue;
        }
        let d = shape.dims;
        println!(
            "{}: batch {}, {} tokens, {} heads × {}{}",
            shape.name,
            d.batch,
            d.tokens,
            d.heads,
            d.head_dim,
            if d.causal { ", causal" } else { "" }
        );
        let wanted = |name: &str| dtype.as_deref().is_none_or(|d| d == name);
        if wanted("f32") {
            run::<f32>(&shape, reps);
        }
        if wanted("f16") {
            run::<f16>(&shape, reps);
        }
        if wanted("bf16") {
            run::<bf16>(&shape, reps);
        }
    }
}
