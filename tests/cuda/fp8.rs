//! The FP8 linear op on CUDA (cuBLASLt's FP8 products) against the CPU's FP8 op on the same
//! inputs: on a layer whose sizes are multiples of 16 (FP8 products on both devices) and on one
//! whose are not (CUDA runs the 16-bit linear op, which the CPU's 16-bit op is compared with).
//! The codes themselves are compared bit for bit by the unit tests of
//! `src/ops/fp8_linear/cuda_kernel.rs`. Every test opens GPU 0 first and, where that fails or
//! its compute capability is below 8.9, prints why and passes.
//!
//! # Tolerances
//!
//! Both devices multiply the same codes (scaled by the same scales: outside a working copy's
//! forward each is the tensor's own amax's), exactly, and add the products in FP32 before one
//! rounding to the working precision (unit roundoff `u`); they differ in the order of the
//! additions, and Hopper's FP8 tensor cores add within each step of 32 terms with about 14 bits
//! of significand before cuBLASLt promotes the sum to FP32 (DeepSeek-V3 report, §3.3.2), so
//! each such step can be off by `32 · 2⁻¹⁴` of its terms' magnitudes. The devices differ by at
//! most `2·u·|value|` plus `(3·n·u₃₂ + 32·2⁻¹⁴)·mass`, `mass` the sum of the magnitudes of the
//! dequantised products summed into the value (computed here in f64), `n` the sum's length.
//! The bias gradient is a column sum of the unquantised output gradient in FP32 on CUDA (in f64
//! on the CPU): `3·n·u₃₂·mass`.
#![cfg(feature = "cuda")]

use typed_amp::dfdx::nn::modules::Linear;
use typed_amp::fp8::{widen, Fp8Tensor, Hybrid, E4M3, E5M2};
use typed_amp::loss::Loss;
use typed_amp::ops::fp8_linear::{try_fp8_linear, Fp8LinearOp};
use typed_amp::prelude::*;

use super::fused::{f64s, open_cuda, U32};

/// What Hopper's FP8 accumulation can lose per unit of mass (see the module documentation).
const TENSOR_CORE: f64 = 32.0 / 16_384.0;
/// bf16's unit roundoff.
const U_BF16: f64 = 1.0 / 256.0;

fn open_fp8_cuda() -> Option<Cuda> {
    let dev = open_cuda()?;
    use cudarc::driver::sys::CUdevice_attribute::{
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as MAJOR,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR as MINOR,
    };
    let d = dev.cuda_device();
    let cc = (d.attribute(MAJOR).unwrap(), d.attribute(MINOR).unwrap());
    if cc < (8, 9) {
        println!(
            "skipping: compute capability {}.{} has no FP8 products",
            cc.0, cc.1
        );
        return None;
    }
    Some(dev)
}

/// Deterministic values in [-scale, scale), rounded to bf16.
fn values(n: usize, seed: u64, scale: f32) -> Vec<bf16> {
    super::fused::values(n, seed, scale, 0.0)
}

/// Output, input gradient, FP32 weight and bias gradients of `Σ y·r`, `y` the layer's output by
/// the FP8 op (`fp8`) or the 16-bit one.
fn run<D, const I: usize, const O: usize>(
    dev: &D,
    x: &[bf16],
    r: &[bf16],
    (w, b): (&[bf16], &[bf16]),
    fp8: bool,
) -> [Vec<f64>; 4]
where
    D: typed_amp::device::AmpDevice
        + typed_amp::device::Kernels<bf16>
        + typed_amp::ops::linear::LinearOp<bf16>
        + Fp8LinearOp<bf16>,
{
    let rows = x.len() / I;
    let layer: Linear<I, O, bf16, D> = Linear {
        weight: dev.tensor_from_vec(w.to_vec(), (Const, Const)),
        bias: dev.tensor_from_vec(b.to_vec(), (Const,)),
    };
    let xt: Tensor<(usize, Const<I>), bf16, D> = dev.tensor_from_vec(x.to_vec(), (rows, Const));
    let rt: Tensor<(usize, Const<O>), bf16, D> = dev.tensor_from_vec(r.to_vec(), (rows, Const));
    let traced = xt.clone().leaky_traced_mixed();
    let y = if fp8 {
        try_fp8_linear::<Hybrid, _, I, O, _, _, _, _>(&layer, traced).unwrap()
    } else {
        typed_amp::ops::linear::try_linear(&layer, traced).unwrap()
    };
    let yv = f64s(&y.retaped::<NoneTape>().as_vec());
    let grads = Loss::new((y * rt).to_f32().sum())
        .backward()
        .unwrap()
        .grads()
        .clone();
    let g32 = |id| -> Vec<f64> {
        let buf = grads.param_grad(id).expect("the op ran");
        typed_amp::device::HostKernel::<f32>::try_read(dev, buf)
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect()
    };
    [
        yv,
        f64s(&grads.get(&xt).unwrap().as_vec()),
        g32(layer.weight.id()),
        g32(layer.bias.id()),
    ]
}

fn close(what: &str, cpu: &[f64], gpu: &[f64], u: f64, slack: &[f64]) {
    assert_eq!(cpu.len(), gpu.len(), "{what}: lengths");
    for (i, ((c, g), s)) in cpu.iter().zip(gpu).zip(slack).enumerate() {
        let bound = 2.0 * u * c.abs() + s;
        assert!(
            (c - g).abs() <= bound,
            "{what}[{i}]: CPU {c}, CUDA {g}, bound {bound}"
        );
    }
}

/// `Σ_k |a[i, k]·b[j, k]|` for `a` (`m × k`), `b` (`n × k`), row-major `m × n`.
fn masses(a: &[f64], b: &[f64], k: usize) -> Vec<f64> {
    let mut out = Vec::new();
    for ra in a.chunks(k) {
        for rb in b.chunks(k) {
            out.push(ra.iter().zip(rb).map(|(p, q)| (p * q).abs()).sum());
        }
    }
    out
}

fn transpose(v: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    (0..cols)
        .flat_map(|c| (0..rows).map(move |r| (r, c)))
        .map(|(r, c)| v[r * cols + c])
        .collect()
}

fn case<const I: usize, const O: usize>(gpu: &Cuda, rows: usize, seed: u64) {
    let x = values(rows * I, seed, 2.0);
    let w = values(O * I, seed + 1, 0.2);
    let b = values(O, seed + 2, 0.5);
    let r = values(rows * O, seed + 3, 1e-2);
    let what = format!("rows {rows}, {I}→{O}");
    let qualifies = rows.is_multiple_of(16) && I.is_multiple_of(16) && O.is_multiple_of(16);
    let cpu_dev = Cpu::default();
    // Where cuBLASLt cannot multiply, CUDA runs the 16-bit op: the CPU's 16-bit op is the
    // reference then.
    let cpu = run::<Cpu, I, O>(&cpu_dev, &x, &r, (&w, &b), qualifies);
    let cuda = run::<Cuda, I, O>(gpu, &x, &r, (&w, &b), true);
    let deq = |v: &[bf16], rows: usize, cols: usize, e5m2: bool| -> Vec<f64> {
        let out = if !qualifies {
            v.iter().map(|x| x.to_f32()).collect()
        } else if e5m2 {
            widen(&Fp8Tensor::<E5M2>::quantize(v, rows, cols).unwrap())
        } else {
            widen(&Fp8Tensor::<E4M3>::quantize(v, rows, cols).unwrap())
        };
        out.into_iter().map(f64::from).collect()
    };
    let (xq, wq, dyq) = (
        deq(&x, rows, I, false),
        deq(&w, O, I, false),
        deq(&r, rows, O, true),
    );
    let per = |n: usize| 3.0 * n as f64 * U32 + if qualifies { TENSOR_CORE } else { 0.0 };
    let slack =
        |mass: Vec<f64>, n: usize| -> Vec<f64> { mass.into_iter().map(|m| per(n) * m).collect() };
    // y = x·Wᵀ + b.
    let mut my = masses(&xq, &wq, I);
    for (i, m) in my.iter_mut().enumerate() {
        *m += f64::from(b[i % O].to_f32().abs());
    }
    close(
        &format!("output, {what}"),
        &cpu[0],
        &cuda[0],
        U_BF16,
        &slack(my, I + 1),
    );
    // dx = dy·W: dy (rows × O) by (Wᵀ, I × O).
    let mdx = masses(&dyq, &transpose(&wq, O, I), O);
    close(
        &format!("input gradient, {what}"),
        &cpu[1],
        &cuda[1],
        U_BF16,
        &slack(mdx, O),
    );
    // dW = dyᵀ·x: (dyᵀ, O × rows) by (xᵀ, I × rows).
    let mdw = masses(&transpose(&dyq, rows, O), &transpose(&xq, rows, I), rows);
    close(
        &format!("weight gradient, {what}"),
        &cpu[2],
        &cuda[2],
        0.0,
        &slack(mdw, rows),
    );
    let mdb: Vec<f64> = (0..O)
        .map(|j| {
            (0..rows)
                .map(|i| f64::from(r[i * O + j].to_f32().abs()))
                .sum()
        })
        .collect();
    let db_slack: Vec<f64> = mdb.iter().map(|m| 3.0 * rows as f64 * U32 * m).collect();
    close(
        &format!("bias gradient, {what}"),
        &cpu[3],
        &cuda[3],
        0.0,
        &db_slack,
    );
}

#[test]
fn the_fp8_linear_layer_on_cuda_matches_the_cpus() {
    let Some(gpu) = open_fp8_cuda() else {
        return;
    };
    // Multiples of 16: FP8 products on cuBLASLt.
    case::<64, 32>(&gpu, 48, 1);
    // Not: the 16-bit op on CUDA, against the CPU's.
    case::<24, 8>(&gpu, 5, 2);
}
