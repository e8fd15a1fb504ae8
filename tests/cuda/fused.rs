//! The fused ops' CUDA kernels (layer norm, batch norm, the linear layer, the fused optimizer
//! update) against the CPU's fused kernels on the same inputs, and the GPT's training step on
//! both devices. Every test opens GPU 0 first and, where that fails, prints why and passes.
//!
//! # Tolerances
//!
//! Both devices compute in FP32 and round once to the working precision `E` (unit roundoff
//! `u`); they differ in the order of their sums. A sum of `n` terms in f32 is off by at most
//! `n·u₃₂` times the sum of the terms' magnitudes on the CPU, and by up to twice that on the
//! GPU, whose tensor cores truncate rather than round each addition of a 16-bit product (up to
//! one unit in the last place, `2·u₃₂`; Fasi et al., 2021). So the devices differ by at most
//! `2·u·|value|` (each rounds once) plus `3·n·u₃₂·mass`, `mass` the sum of the magnitudes of
//! everything summed into the value (computed here in f64), `n` the longest accumulation.
//! The optimizer's update is elementwise and written without contractions on both devices: the
//! same bits, queued and run per tensor or all at once.
#![cfg(feature = "cuda")]

use std::panic::catch_unwind;

use typed_amp::dfdx::nn::modules::{LayerNorm1D, Linear};
use typed_amp::loss::Loss;
use typed_amp::ops::cast::Cast;
use typed_amp::precision::{dtype_of, AmpElem};
use typed_amp::prelude::*;

/// f32's unit roundoff.
pub(crate) const U32: f64 = 1.0 / 16_777_216.0;

/// GPU 0, or `None` (with the reason printed) where there is none.
pub(crate) fn open_cuda() -> Option<Cuda> {
    match catch_unwind(|| Cuda::try_build(0, 0)) {
        Ok(Ok(dev)) => Some(dev),
        Ok(Err(err)) => {
            println!("skipping: no CUDA device ({err})");
            None
        }
        Err(_) => {
            println!("skipping: no CUDA device (opening it panicked)");
            None
        }
    }
}

/// Deterministic values in [-scale, scale) around `offset`, rounded to `E`.
pub(crate) fn values<E: AmpElem>(n: usize, seed: u64, scale: f32, offset: f32) -> Vec<E> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            <E as AmpElem>::from_f32(offset + scale * (2.0 * u - 1.0))
        })
        .collect()
}

pub(crate) fn f64s<E: AmpElem>(v: &[E]) -> Vec<f64> {
    v.iter().map(|x| f64::from(AmpElem::to_f32(*x))).collect()
}

/// A parameter's FP32 gradient as a fused op wrote it, on the host.
fn fp32_grad<D: typed_amp::device::AmpDevice>(
    dev: &D,
    grads: &typed_amp::tape::MixedGradients<D>,
    id: typed_amp::dfdx::tensor::UniqueId,
) -> Vec<f64> {
    let buf = grads.param_grad(id).expect("the fused op ran");
    typed_amp::device::HostKernel::<f32>::try_read(dev, buf)
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect()
}

fn close(what: &str, cpu: &[f64], gpu: &[f64], u: f64, n: usize, mass: &[f64]) {
    assert_eq!(cpu.len(), gpu.len(), "{what}: lengths");
    for (i, ((c, g), m)) in cpu.iter().zip(gpu).zip(mass).enumerate() {
        let bound = 2.0 * u * c.abs() + 3.0 * n as f64 * U32 * m;
        assert!(
            (c - g).abs() <= bound,
            "{what}[{i}]: CPU {c}, CUDA {g}, bound {bound}"
        );
    }
}

/// Forward and backward of a layer norm (`loss = Σ y·r`): output, input gradient, γ's and β's.
fn layer_norm_run<D, E, const M: usize>(
    dev: &D,
    x: &[E],
    r: &[E],
    params: (&[f32], &[f32]),
) -> [Vec<f64>; 4]
where
    D: typed_amp::device::AmpDevice
        + typed_amp::device::Kernels<E>
        + typed_amp::ops::layernorm::LayerNormOp<E>,
    E: AmpElem,
{
    let rows = x.len() / M;
    let ln: LayerNorm1D<M, f32, D> = LayerNorm1D {
        gamma: dev.tensor_from_vec(params.0.to_vec(), (Const::<M>,)),
        beta: dev.tensor_from_vec(params.1.to_vec(), (Const::<M>,)),
        epsilon: 1e-5,
    };
    let xt: Tensor<(usize, Const<M>), E, D> = dev.tensor_from_vec(x.to_vec(), (rows, Const));
    let rt: Tensor<(usize, Const<M>), E, D> = dev.tensor_from_vec(r.to_vec(), (rows, Const));
    let y =
        typed_amp::ops::layernorm::try_layer_norm(&ln, xt.clone().leaky_traced_mixed()).unwrap();
    let yv = f64s(&y.retaped::<NoneTape>().as_vec());
    let grads = Loss::new((y * rt).to_f32().sum())
        .backward()
        .unwrap()
        .grads()
        .clone();
    let g32 = |id| fp32_grad(dev, &grads, id);
    [
        yv,
        f64s(&grads.get(&xt).unwrap().as_vec()),
        g32(ln.gamma.id()),
        g32(ln.beta.id()),
    ]
}

fn layer_norm_case<E: AmpElem>(gpu: &Cuda)
where
    Cpu: typed_amp::device::Kernels<E> + typed_amp::ops::Ops<E>,
    Cuda: typed_amp::device::Kernels<E> + typed_amp::ops::Ops<E>,
{
    const M: usize = 96;
    let rows = 300;
    let x = values::<E>(rows * M, 1, 2.0, 1.5);
    let r = values::<E>(rows * M, 2, 1.0, 0.0);
    let gamma: Vec<f32> = values::<f32>(M, 3, 0.5, 1.0);
    let beta: Vec<f32> = values::<f32>(M, 4, 0.5, 0.0);
    let cpu = layer_norm_run::<Cpu, E, M>(&Cpu::default(), &x, &r, (&gamma, &beta));
    let cuda = layer_norm_run::<Cuda, E, M>(gpu, &x, &r, (&gamma, &beta));
    // Magnitudes: a row's output involves its M inputs (the statistics) scaled by γ·rstd; a
    // column's parameter gradients involve every row.
    let u = f64::from(dtype_of::<E>().unit_roundoff());
    let (xv, rv) = (f64s(&x), f64s(&r));
    let mut y_mass = vec![0.0; rows * M];
    let mut dx_mass = vec![0.0; rows * M];
    let (mut dg_mass, mut db_mass) = (vec![0.0; M], vec![0.0; M]);
    for row in 0..rows {
        let xs = &xv[row * M..(row + 1) * M];
        let mean = xs.iter().sum::<f64>() / M as f64;
        let var = xs.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / M as f64;
        let rstd = 1.0 / (var + 1e-5).sqrt();
        let big = xs.iter().fold(0.0f64, |m, v| m.max(v.abs())) * rstd;
        let gsum: f64 = (0..M)
            .map(|c| (rv[row * M + c] * f64::from(gamma[c])).abs())
            .sum();
        for c in 0..M {
            let g = f64::from(gamma[c]).abs();
            y_mass[row * M + c] = g * (big + 1.0) + f64::from(beta[c]).abs();
            dx_mass[row * M + c] =
                rstd * (gsum / M as f64 * (2.0 + 2.0 * big) + rv[row * M + c].abs() * g);
            dg_mass[c] += rv[row * M + c].abs() * (big + 1.0);
            db_mass[c] += rv[row * M + c].abs();
        }
    }
    let what = format!("layer norm {:?}", dtype_of::<E>());
    close(&format!("{what} y"), &cpu[0], &cuda[0], u, M + 8, &y_mass);
    close(&format!("{what} dx"), &cpu[1], &cuda[1], u, M + 8, &dx_mass);
    close(
        &format!("{what} dgamma"),
        &cpu[2],
        &cuda[2],
        0.0,
        rows + M + 8,
        &dg_mass,
    );
    close(
        &format!("{what} dbeta"),
        &cpu[3],
        &cuda[3],
        0.0,
        rows + 8,
        &db_mass,
    );
}

#[test]
fn layer_norm_on_cuda_matches_the_cpu() {
    let Some(gpu) = open_cuda() else { return };
    layer_norm_case::<f32>(&gpu);
    layer_norm_case::<half::f16>(&gpu);
    layer_norm_case::<half::bf16>(&gpu);
}

// ---------------------------------------------------------------------------------------------
// Batch norm: the mixed op (16-bit activations, FP32 parameters and statistics), training
// forward and backward through the layer (with and without a fused ReLU after it), and the
// inference forward.

/// Channels of the batch norm cases.
const BN_C: usize = 6;
/// Images, height and width of the batch norm cases: 2,304 values per channel.
const BN_SHAPE: (usize, usize, usize) = (16, 12, 12);
const BN_SCALE: [f32; BN_C] = [1.5, -0.5, 0.75, 2.0, 0.3, -1.25];
const BN_BIAS: [f32; BN_C] = [0.25, 1.0, -2.0, 0.1, 0.0, 0.5];
const BN_EPS: f64 = 1e-5;

type BnInput<E, D, T = NoneTape> = Tensor<(usize, Const<BN_C>, usize, usize), E, D, T>;

/// Each channel's exact (f64) statistics of `x`: mean, biased variance, mean magnitude.
fn bn_stats(x: &[f64]) -> Vec<(f64, f64, f64)> {
    let (b, h, w) = BN_SHAPE;
    let n = (b * h * w) as f64;
    (0..BN_C)
        .map(|c| {
            let vals: Vec<f64> = (0..b)
                .flat_map(|i| (0..h * w).map(move |k| (i * BN_C + c) * h * w + k))
                .map(|j| x[j])
                .collect();
            let mean = vals.iter().sum::<f64>() / n;
            let var = vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
            let abs = vals.iter().map(|v| v.abs()).sum::<f64>() / n;
            (mean, var, abs)
        })
        .collect()
}

fn bn_channel(j: usize) -> usize {
    let (_, h, w) = BN_SHAPE;
    (j / (h * w)) % BN_C
}

/// The input, in `E`, offset (so that the centred values are small beside the raw ones), and
/// moved away from the ReLU's kink: no exact output lies within 0.01 of zero, so that both
/// devices' fused ReLUs pass the same gradients (their outputs differ by far less).
fn bn_input<E: AmpElem>(seed: u64) -> Vec<E> {
    let (b, h, w) = BN_SHAPE;
    let mut x = values::<E>(b * BN_C * h * w, seed, 2.0, 1.0);
    for _ in 0..50 {
        let xv = f64s(&x);
        let stats = bn_stats(&xv);
        let mut moved = false;
        for (j, v) in xv.iter().enumerate() {
            let c = bn_channel(j);
            let (mean, var, _) = stats[c];
            let a = f64::from(BN_SCALE[c]) / (var + BN_EPS).sqrt();
            let y = (v - mean) * a + f64::from(BN_BIAS[c]);
            if y.abs() < 0.01 {
                let away = if y < 0.0 { -0.05 } else { 0.05 };
                x[j] = <E as AmpElem>::from_f32((v + away / a) as f32);
                moved = true;
            }
        }
        if !moved {
            return x;
        }
    }
    panic!("the batch norm input keeps values at the ReLU's kink");
}

/// A training forward and backward of a batch norm (`loss = Σ y·r`, `y` after a fused ReLU if
/// `relu`): output, input gradient, the scale's and the bias's gradients, the running mean and
/// variance.
fn batch_norm_run<D, E>(dev: &D, x: &[E], r: &[E], relu: bool) -> [Vec<f64>; 6]
where
    D: typed_amp::device::AmpDevice
        + typed_amp::device::Kernels<E>
        + typed_amp::ops::Ops<E>
        + DeviceBuildExt,
    E: AmpElem,
{
    use typed_amp::amp::norm::MixedNormMut;
    use typed_amp::dfdx::nn::modules::BatchNorm2D;
    let (b, h, w) = BN_SHAPE;
    let mut bn: BatchNorm2D<BN_C, f32, D> =
        dev.build_module::<typed_amp::dfdx::nn::builders::BatchNorm2D<BN_C>, f32>();
    bn.scale = dev.tensor(BN_SCALE);
    bn.bias = dev.tensor(BN_BIAS);
    let xt: BnInput<E, D> = dev.tensor_from_vec(x.to_vec(), (b, Const, h, w));
    let rt: BnInput<E, D> = dev.tensor_from_vec(r.to_vec(), (b, Const, h, w));
    let y: BnInput<E, D, typed_amp::tape::MixedTape<D>> = bn
        .try_forward_mixed_mut(xt.clone().leaky_traced_mixed())
        .unwrap();
    let y = if relu {
        typed_amp::ops::relu::try_relu(y).unwrap()
    } else {
        y
    };
    let yv = f64s(&y.retaped::<NoneTape>().as_vec());
    let grads = Loss::new((y * rt).to_f32().sum())
        .backward()
        .unwrap()
        .grads()
        .clone();
    let g32 = |id| fp32_grad(dev, &grads, id);
    let widen = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<_>>();
    [
        yv,
        f64s(&grads.get(&xt).unwrap().as_vec()),
        g32(bn.scale.id()),
        g32(bn.bias.id()),
        widen(bn.running_mean.as_vec()),
        widen(bn.running_var.as_vec()),
    ]
}

/// The inference forward of a batch norm with the given running statistics, as bits.
fn batch_norm_infer_bits<D, E>(dev: &D, x: &[E], mean: &[f32], var: &[f32]) -> Vec<u32>
where
    D: typed_amp::device::AmpDevice
        + typed_amp::device::Kernels<E>
        + typed_amp::ops::Ops<E>
        + DeviceBuildExt,
    E: AmpElem,
{
    use typed_amp::amp::norm::MixedNorm;
    use typed_amp::dfdx::nn::modules::BatchNorm2D;
    let (b, h, w) = BN_SHAPE;
    let mut bn: BatchNorm2D<BN_C, f32, D> =
        dev.build_module::<typed_amp::dfdx::nn::builders::BatchNorm2D<BN_C>, f32>();
    bn.scale = dev.tensor(BN_SCALE);
    bn.bias = dev.tensor(BN_BIAS);
    bn.running_mean = dev.tensor_from_vec(mean.to_vec(), (Const,));
    bn.running_var = dev.tensor_from_vec(var.to_vec(), (Const,));
    let xt: BnInput<E, D> = dev.tensor_from_vec(x.to_vec(), (b, Const, h, w));
    bn.try_forward_mixed(xt)
        .unwrap()
        .as_vec()
        .into_iter()
        .map(|v| AmpElem::to_f32(v).to_bits())
        .collect()
}

/// The CPU's and CUDA's batch norms on the same input. Both compute the statistics in FP32
/// (the CPU in runs of 16 lanes, at most `N/16 + 32` additions per value; CUDA in chains of
/// `N/256` per thread), adding partial sums in f64, and everything after them with the same
/// FP32 operations; the bounds are the header's with `n = N/16 + 40` and, per value, the mass
/// of what reaches it through the statistics (the mean's error scales with the mean magnitude
/// `S`, the variance's relative error moves `a = scale/std` by `n·u₃₂/2` relatively). The
/// inference forward, whose statistics are given, is the same arithmetic on both: the same bits.
fn batch_norm_case<E: AmpElem>(gpu: &Cuda, seed: u64)
where
    Cpu: typed_amp::device::Kernels<E> + typed_amp::ops::Ops<E>,
    Cuda: typed_amp::device::Kernels<E> + typed_amp::ops::Ops<E>,
{
    let (b, h, w) = BN_SHAPE;
    let per_chan = b * h * w;
    let x = bn_input::<E>(seed);
    let r = values::<E>(x.len(), seed + 1, 1.0, 0.0);
    let (xv, rv) = (f64s(&x), f64s(&r));
    let stats = bn_stats(&xv);
    let u = f64::from(dtype_of::<E>().unit_roundoff());
    let n = per_chan / 16 + 40;
    for relu in [false, true] {
        let cpu = batch_norm_run::<Cpu, E>(&Cpu::default(), &x, &r, relu);
        let cuda = batch_norm_run::<Cuda, E>(gpu, &x, &r, relu);
        let what = format!("batch norm {:?} relu {relu}", dtype_of::<E>());
        // The gradient reaching each value: r, where the (fused) ReLU passes it.
        let dz: Vec<f64> = (0..x.len())
            .map(|j| if relu && cpu[0][j] <= 0.0 { 0.0 } else { rv[j] })
            .collect();
        let (mut dz_abs, mut dz_dev) = (vec![0.0; BN_C], vec![0.0; BN_C]);
        for (j, d) in dz.iter().enumerate() {
            let c = bn_channel(j);
            let (mean, _, s) = stats[c];
            dz_abs[c] += d.abs();
            dz_dev[c] += d.abs() * ((xv[j] - mean).abs() + s);
        }
        let (mut y_mass, mut dx_mass) = (vec![0.0; x.len()], vec![0.0; x.len()]);
        for j in 0..x.len() {
            let c = bn_channel(j);
            let (mean, var, s) = stats[c];
            let std = (var + BN_EPS).sqrt();
            let a = f64::from(BN_SCALE[c]).abs() / std;
            let dev = (xv[j] - mean).abs();
            y_mass[j] = a * (s + dev) + f64::from(BN_BIAS[c]).abs();
            let k2 = dz_dev[c] / (per_chan as f64 * std * std);
            dx_mass[j] = a * (dz[j].abs() + dz_abs[c] / per_chan as f64 + (dev + s) * k2);
        }
        let ds_mass: Vec<f64> = (0..BN_C)
            .map(|c| dz_dev[c] / (stats[c].1 + BN_EPS).sqrt())
            .collect();
        let rm_mass: Vec<f64> = stats.iter().map(|(_, _, s)| *s).collect();
        let rv_mass: Vec<f64> = stats.iter().map(|(_, v, _)| 1.0 + 2.0 * v).collect();
        close(&format!("{what} y"), &cpu[0], &cuda[0], u, n, &y_mass);
        close(&format!("{what} dx"), &cpu[1], &cuda[1], u, n, &dx_mass);
        close(
            &format!("{what} dscale"),
            &cpu[2],
            &cuda[2],
            0.0,
            n,
            &ds_mass,
        );
        close(&format!("{what} dbias"), &cpu[3], &cuda[3], 0.0, n, &dz_abs);
        close(
            &format!("{what} running mean"),
            &cpu[4],
            &cuda[4],
            0.0,
            n,
            &rm_mass,
        );
        close(
            &format!("{what} running var"),
            &cpu[5],
            &cuda[5],
            0.0,
            n,
            &rv_mass,
        );
        let narrow = |v: &[f64]| v.iter().map(|v| *v as f32).collect::<Vec<_>>();
        let (mean, var) = (narrow(&cpu[4]), narrow(&cpu[5]));
        assert_eq!(
            batch_norm_infer_bits::<Cpu, E>(&Cpu::default(), &x, &mean, &var),
            batch_norm_infer_bits::<Cuda, E>(gpu, &x, &mean, &var),
            "{what}: inference"
        );
    }
}

#[test]
fn batch_norm_on_cuda_matches_the_cpu() {
    // The input's preparation runs without a GPU too: it must terminate.
    let _ = bn_input::<half::f16>(41);
    let Some(gpu) = open_cuda() else { return };
    batch_norm_case::<f32>(&gpu, 41);
    batch_norm_case::<half::f16>(&gpu, 43);
    batch_norm_case::<half::bf16>(&gpu, 45);
}

/// Forward and backward of a linear layer and the ReLU after it (`loss = Σ relu(y)·r`).
fn linear_run<D, E, const I: usize, const O: usize>(
    dev: &D,
    x: &[E],
    r: &[E],
    (w, b): (&[E], &[E]),
) -> [Vec<f64>; 4]
where
    D: typed_amp::device::AmpDevice
        + typed_amp::device::Kernels<E>
        + typed_amp::ops::linear::LinearOp<E>
        + typed_amp::ops::relu::ReluOp<E>,
    E: AmpElem,
{
    let rows = x.len() / I;
    let layer: Linear<I, O, E, D> = Linear {
        weight: dev.tensor_from_vec(w.to_vec(), (Const, Const)),
        bias: dev.tensor_from_vec(b.to_vec(), (Const,)),
    };
    let xt: Tensor<(usize, Const<I>), E, D> = dev.tensor_from_vec(x.to_vec(), (rows, Const));
    let rt: Tensor<(usize, Const<O>), E, D> = dev.tensor_from_vec(r.to_vec(), (rows, Const));
    let y = typed_amp::ops::linear::try_linear(&layer, xt.clone().leaky_traced_mixed()).unwrap();
    let y = typed_amp::ops::relu::try_relu(y).unwrap();
    let yv = f64s(&y.retaped::<NoneTape>().as_vec());
    let grads = Loss::new((y * rt).to_f32().sum())
        .backward()
        .unwrap()
        .grads()
        .clone();
    let g32 = |id| fp32_grad(dev, &grads, id);
    [
        yv,
        f64s(&grads.get(&xt).unwrap().as_vec()),
        g32(layer.weight.id()),
        g32(layer.bias.id()),
    ]
}

fn linear_case<E: AmpElem>(gpu: &Cuda)
where
    Cpu: typed_amp::device::Kernels<E> + typed_amp::ops::Ops<E>,
    Cuda: typed_amp::device::Kernels<E> + typed_amp::ops::Ops<E>,
{
    const I: usize = 72;
    const O: usize = 40;
    let rows = 270;
    let x = values::<E>(rows * I, 5, 1.0, 0.0);
    let r = values::<E>(rows * O, 6, 1.0, 0.0);
    let w = values::<E>(O * I, 7, 0.3, 0.0);
    let b = values::<E>(O, 8, 0.5, 0.0);
    let cpu = linear_run::<Cpu, E, I, O>(&Cpu::default(), &x, &r, (&w, &b));
    let cuda = linear_run::<Cuda, E, I, O>(gpu, &x, &r, (&w, &b));
    let u = f64::from(dtype_of::<E>().unit_roundoff());
    let (xv, rv, wv, bv) = (f64s(&x), f64s(&r), f64s(&w), f64s(&b));
    // Where the pre-activation is near 0 the devices may disagree on the ReLU's side: those
    // outputs and their gradients are compared with the larger bound of both sides' magnitudes
    // (the mask only ever zeroes).
    let y_mass: Vec<f64> = (0..rows * O)
        .map(|k| {
            let (row, o) = (k / O, k % O);
            (0..I)
                .map(|i| (xv[row * I + i] * wv[o * I + i]).abs())
                .sum::<f64>()
                + bv[o].abs()
        })
        .collect();
    let dx_mass: Vec<f64> = (0..rows * I)
        .map(|k| {
            let (row, i) = (k / I, k % I);
            (0..O)
                .map(|o| (rv[row * O + o] * wv[o * I + i]).abs())
                .sum()
        })
        .collect();
    let dw_mass: Vec<f64> = (0..O * I)
        .map(|k| {
            let (o, i) = (k / I, k % I);
            (0..rows)
                .map(|row| (rv[row * O + o] * xv[row * I + i]).abs())
                .sum()
        })
        .collect();
    let db_mass: Vec<f64> = (0..O)
        .map(|o| (0..rows).map(|row| rv[row * O + o].abs()).sum())
        .collect();
    // Outputs whose sign the devices could disagree on (|y| within both sides' error of 0) are
    // masked differently; none of these random values lands there (checked).
    for (k, m) in y_mass.iter().enumerate() {
        let (c, g) = (cpu[0][k], cuda[0][k]);
        if c == 0.0 || g == 0.0 {
            assert!(
                c.abs().max(g.abs()) <= 2.0 * u * m + 2.0 * (I + 8) as f64 * U32 * m,
                "ReLU's side at {k}"
            );
        }
    }
    let what = format!("linear {:?}", dtype_of::<E>());
    close(&format!("{what} y"), &cpu[0], &cuda[0], u, I + 8, &y_mass);
    close(&format!("{what} dx"), &cpu[1], &cuda[1], u, O + 8, &dx_mass);
    close(
        &format!("{what} dW"),
        &cpu[2],
        &cuda[2],
        0.0,
        rows + 8,
        &dw_mass,
    );
    close(
        &format!("{what} db"),
        &cpu[3],
        &cuda[3],
        0.0,
        rows + 8,
        &db_mass,
    );
}

#[test]
fn the_linear_layer_on_cuda_matches_the_cpu() {
    let Some(gpu) = open_cuda() else { return };
    linear_case::<f32>(&gpu);
    linear_case::<half::f16>(&gpu);
    linear_case::<half::bf16>(&gpu);
}

/// GELU and its derivative (dfdx's `AccurateGeLU`, forward and backward) on both devices: each
/// computes in FP32 (the CUDA kernel for 16-bit types since the fork's patch) and rounds once.
/// Their `erf`s differ by at most 2 ulp (CUDA's `erff`) and 1.3 ulp (typed_amp_kernels'), so
/// `1 + erf` by `4·u₃₂` absolutely; the products around it add a few `u₃₂` relative; each
/// result is rounded once to `E` on each device. So `|Δ| ≤ 2u·|y| + 8·u₃₂·(|x| + |y| + 1)`.
fn gelu_case<E: AmpElem>(gpu: &Cuda)
where
    Cpu: typed_amp::device::Kernels<E>,
    Cuda: typed_amp::device::Kernels<E>,
{
    let n = 4001;
    // -6 .. 6, negative inputs included: where 1 + erf(x/√2) is small.
    let xs: Vec<E> = (0..n)
        .map(|i| <E as AmpElem>::from_f32(-6.0 + 12.0 * i as f32 / (n - 1) as f32))
        .collect();
    fn run<D: typed_amp::device::AmpDevice + typed_amp::device::Kernels<E>, E: AmpElem>(
        dev: &D,
        xs: &[E],
    ) -> (Vec<f64>, Vec<f64>) {
        let x: Tensor<(usize,), E, D> = dev.tensor_from_vec(xs.to_vec(), (xs.len(),));
        let y = x.clone().leaky_traced_mixed().accurate_gelu();
        let yv = f64s(&y.retaped::<NoneTape>().as_vec());
        let grads = Loss::new(y.to_f32().sum())
            .backward()
            .unwrap()
            .grads()
            .clone();
        (yv, f64s(&grads.get(&x).unwrap().as_vec()))
    }
    let (cy, cd) = run::<Cpu, E>(&Cpu::default(), &xs);
    let (gy, gd) = run::<Cuda, E>(gpu, &xs);
    let u = f64::from(dtype_of::<E>().unit_roundoff());
    for (i, x) in f64s(&xs).iter().enumerate() {
        for (what, c, g) in [("gelu", cy[i], gy[i]), ("gelu'", cd[i], gd[i])] {
            let bound = 2.0 * u * c.abs() + 8.0 * U32 * (x.abs() + c.abs() + 1.0);
            assert!(
                (c - g).abs() <= bound,
                "{what}({x}) {:?}: CPU {c}, CUDA {g}, bound {bound}",
                dtype_of::<E>()
            );
        }
    }
}

#[test]
fn gelu_on_cuda_matches_the_cpu() {
    let Some(gpu) = open_cuda() else { return };
    gelu_case::<f32>(&gpu);
    gelu_case::<half::f16>(&gpu);
    gelu_case::<half::bf16>(&gpu);
}

/// One fused Adam (or SGD) step with refresh on each device, from the same state: the master,
/// the moments and the working copy come out bit for bit alike.
fn update_case<E: AmpElem>(gpu: &Cuda)
where
    Cpu: typed_amp::device::Kernels<E>,
    Cuda: typed_amp::device::Kernels<E>,
{
    use typed_amp::device::UpdateKernel;
    let n = 5000;
    let p0 = values::<f32>(n, 11, 1.0, 0.0);
    let g0 = values::<f32>(n, 12, 0.1, 0.0);
    let m0 = values::<f32>(n, 13, 0.01, 0.0);
    let v0: Vec<f32> = values::<f32>(n, 14, 0.001, 0.001)
        .into_iter()
        .map(f32::abs)
        .collect();
    let configs = [
        AdamConfig::default(),
        AdamConfig {
            lr: 3e-4,
            betas: [0.9, 0.99],
            eps: 1e-8,
            weight_decay: Some(WeightDecay::Decoupled(0.1)),
        },
        AdamConfig {
            weight_decay: Some(WeightDecay::L2(0.01)),
            ..Default::default()
        },
    ];
    fn run<D: typed_amp::device::AmpDevice + typed_amp::device::Kernels<E>, E: AmpElem>(
        dev: &D,
        cfg: &AdamConfig,
        (p0, g0, m0, v0): (&[f32], &[f32], &[f32], &[f32]),
    ) -> [Vec<u32>; 4] {
        let n = p0.len();
        let mut p: Tensor<(usize,), f32, D> = dev.tensor_from_vec(p0.to_vec(), (n,));
        let g: Tensor<(usize,), f32, D> = dev.tensor_from_vec(g0.to_vec(), (n,));
        let mut m: Tensor<(usize,), f32, D> = dev.tensor_from_vec(m0.to_vec(), (n,));
        let mut v: Tensor<(usize,), f32, D> = dev.tensor_from_vec(v0.to_vec(), (n,));
        let mut w: Tensor<(usize,), E, D> = dev.zeros_like(&(n,));
        UpdateKernel::<E>::try_adam_refresh(
            dev,
            3,
            cfg,
            &mut p,
            m.storage_mut(),
            v.storage_mut(),
            g.storage(),
            w.storage_mut(),
        )
        .unwrap();
        let bits = |t: Vec<f32>| t.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        [
            bits(p.as_vec()),
            bits(m.as_vec()),
            bits(v.as_vec()),
            bits(w.as_vec().into_iter().map(AmpElem::to_f32).collect()),
        ]
    }
    for cfg in &configs {
        let cpu = run::<Cpu, E>(&Cpu::default(), cfg, (&p0, &g0, &m0, &v0));
        let cuda = run::<Cuda, E>(gpu, cfg, (&p0, &g0, &m0, &v0));
        for (what, (c, g)) in ["master", "moment 1", "moment 2", "working"]
            .iter()
            .zip(cpu.iter().zip(&cuda))
        {
            assert_eq!(c, g, "{what} {:?} {cfg:?}", dtype_of::<E>());
        }
    }
}

#[test]
fn the_fused_update_on_cuda_gives_the_cpus_bits() {
    let Some(gpu) = open_cuda() else { return };
    update_case::<f32>(&gpu);
    update_case::<half::f16>(&gpu);
    update_case::<half::bf16>(&gpu);
}

/// Several tensors' Adam and SGD updates queued and run by one flush (on CUDA one multi-tensor
/// launch per working precision over a table of the tensors): lengths that end mid-chunk, and
/// weight decay on some tensors only (as `DecoupledMatrices` resolves it by rank). The same
/// elementwise arithmetic as the unqueued kernels: the CPU's bits.
fn batched_update_case<E: AmpElem>(gpu: &Cuda)
where
    Cpu: typed_amp::device::Kernels<E>,
    Cuda: typed_amp::device::Kernels<E>,
{
    use typed_amp::device::UpdateKernel;
    let lens = [5000, 1, 20_000, 16_384];
    let decayed = [true, false, true, false];
    fn run<D: typed_amp::device::AmpDevice + typed_amp::device::Kernels<E>, E: AmpElem>(
        dev: &D,
        lens: &[usize],
        decayed: &[bool],
        adam: bool,
    ) -> Vec<Vec<u32>> {
        let mut tensors: Vec<_> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let s = 100 + 10 * i as u64;
                let t = |v: Vec<f32>| -> Tensor<(usize,), f32, D> { dev.tensor_from_vec(v, (n,)) };
                let v2: Vec<f32> = values::<f32>(n, s + 3, 0.001, 0.001)
                    .into_iter()
                    .map(f32::abs)
                    .collect();
                (
                    t(values::<f32>(n, s, 1.0, 0.0)),
                    t(values::<f32>(n, s + 1, 0.1, 0.0)),
                    t(values::<f32>(n, s + 2, 0.01, 0.0)),
                    t(v2),
                    dev.zeros_like(&(n,)) as Tensor<(usize,), E, D>,
                )
            })
            .collect();
        let mut batch = Default::default();
        for ((p, g, m, v, w), decay) in tensors.iter_mut().zip(decayed) {
            // SAFETY: every buffer stays in `tensors`, untouched, until the flush.
            unsafe {
                if adam {
                    let cfg = AdamConfig {
                        weight_decay: decay.then_some(WeightDecay::Decoupled(0.1)),
                        ..Default::default()
                    };
                    UpdateKernel::<E>::try_queue_adam_refresh(
                        dev,
                        &mut batch,
                        3,
                        &cfg,
                        p,
                        m.storage_mut(),
                        v.storage_mut(),
                        g.storage(),
                        w.storage_mut(),
                    )
                } else {
                    let cfg = SgdConfig {
                        lr: 0.05,
                        momentum: Some(Momentum::Nesterov(0.9)),
                        weight_decay: decay.then_some(WeightDecay::L2(0.01)),
                    };
                    UpdateKernel::<E>::try_queue_sgd_refresh(
                        dev,
                        &mut batch,
                        &cfg,
                        p,
                        m.storage_mut(),
                        g.storage(),
                        w.storage_mut(),
                    )
                }
            }
            .unwrap();
        }
        dev.try_flush_update(batch).unwrap();
        let bits = |t: Vec<f32>| t.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        tensors
            .iter()
            .flat_map(|(p, _, m, v, w)| {
                [
                    bits(p.as_vec()),
                    bits(m.as_vec()),
                    bits(v.as_vec()),
                    bits(w.as_vec().into_iter().map(AmpElem::to_f32).collect()),
                ]
            })
            .collect()
    }
    for adam in [true, false] {
        let cpu = run::<Cpu, E>(&Cpu::default(), &lens, &decayed, adam);
        let cuda = run::<Cuda, E>(gpu, &lens, &decayed, adam);
        for (i, (c, g)) in cpu.iter().zip(&cuda).enumerate() {
            assert!(c == g, "adam {adam}, buffer {i}, {:?}", dtype_of::<E>());
        }
    }
}

#[test]
fn the_batched_update_on_cuda_gives_the_cpus_bits() {
    let Some(gpu) = open_cuda() else { return };
    batched_update_case::<f32>(&gpu);
    batched_update_case::<half::f16>(&gpu);
    batched_update_case::<half::bf16>(&gpu);
}

/// The small GPT's first training steps under O0 and O2-BF16 on both devices, from the same
/// initial weights and batch: the losses agree to the working precision's rounding.
#[test]
fn the_gpt_trains_alike_on_cuda_and_the_cpu() {
    use typed_amp_models::gpt::{GptModel, GptSmallO0, GptSmallO2Bf16};
    let Some(gpu) = open_cuda() else { return };
    fn losses<M: GptModel<D>, D: typed_amp::device::AmpDevice>(dev: &D) -> Vec<f32>
    where
        typed_amp::dfdx::optim::Adam<typed_amp::amp::MasterOf<M, D>, f32, D>:
            typed_amp::optim::MasterOptimizer<typed_amp::amp::MasterOf<M, D>, D>,
    {
        let mut model = M::try_build(dev).unwrap();
        // The same weights on both devices: built from the host's values.
        typed_amp_models::gpt::init_gpt(&mut model, M::SIZE).unwrap();
        let mut opt = typed_amp::dfdx::optim::Adam::new(model.master(), AdamConfig::default());
        let mut scaler = M::scaler();
        let mut grads = model.alloc_grads().unwrap();
        let t = M::SIZE.context();
        let ids: Vec<usize> = (0..4 * t).map(|i| (i * 31 + i / 7) % 60).collect();
        let next: Vec<usize> = (0..4 * t)
            .map(|i| ((i + 1) * 31 + (i + 1) / 7) % 60)
            .collect();
        let x: Tensor<(usize, usize), usize, D> = dev.tensor_from_vec(ids, (4, t));
        let y: Tensor<(usize, usize), usize, D> = dev.tensor_from_vec(next, (4, t));
        let mut out = Vec::new();
        for _ in 0..3 {
            let loss = M::try_loss(model.working_mut(), x.clone().traced_mixed(grads), &y).unwrap();
            out.push(loss.value());
            let scaled = scaler.scale(loss).backward().unwrap();
            let unscaled = scaler.unscale(&mut model, scaled).unwrap();
            grads = scaler
                .update(scaler.step(&mut opt, unscaled).unwrap())
                .unwrap();
        }
        out
    }
    // The devices' random initialisations differ: compare each device's first loss with the
    // uniform prediction's, ln(84), and each run's decrease.
    for (name, cpu, cuda) in [
        (
            "O0",
            losses::<GptSmallO0, Cpu>(&Cpu::default()),
            losses::<GptSmallO0, Cuda>(&gpu),
        ),
        (
            "O2-BF16",
            losses::<GptSmallO2Bf16, Cpu>(&Cpu::default()),
            losses::<GptSmallO2Bf16, Cuda>(&gpu),
        ),
    ] {
        println!("{name}: CPU {cpu:?}, CUDA {cuda:?}");
        for run in [&cpu, &cuda] {
            assert!(
                (run[0] - (84f32).ln()).abs() < 0.1,
                "{name}: first loss {run:?}"
            );
            assert!(run[2] < run[0], "{name}: no progress {run:?}");
        }
    }
}
