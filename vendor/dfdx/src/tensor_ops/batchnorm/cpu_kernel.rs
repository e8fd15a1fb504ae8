//! typed-amp patch: fused CPU batch norm. See the module docs of [super].
//!
//! The input is viewed as `outer × chan × inner` (contiguous; anything else falls back to the
//! composition). Every pass runs over `inner`-long runs of one channel, in `f32` (16-bit types
//! are converted a block at a time), in parallel over pieces of `outer` whose per-channel
//! partial sums are added in piece order (in `f64`), so results do not depend on the thread
//! count.
//!
//! Accuracy (the fork's `tests/fork/conv_kernels.rs` checks these bounds): a run of `L`
//! values is summed in 16 interleaved `f32` lanes, then the lanes in order, so each value goes
//! through at most `⌈L/16⌉ + 31` roundings; run sums are added in `f64`. A channel's mean and
//! sum of squared deviations are thus within `γ_(⌈L/16⌉+32)` (with `u = 2⁻²⁴`) of the sums of
//! the absolute values involved, far tighter than a sequential `f32` sum over the batch.

use super::{infer_fwd_composed, train_fwd_composed, BatchNormKernel, BatchNormLayout};
use crate::{
    shapes::*,
    tensor::*,
    tensor_ops::utilities::cpu_f32::{
        as_f32, as_f32_mut, from_f32, par_chunks_mut, pieces, to_f32, BLOCK,
    },
    tensor_ops::Device,
};

use std::vec::Vec;

const LANES: usize = 16;

/// `Σ x`, in 16 interleaved lanes.
#[inline]
fn sum(x: &[f32]) -> f32 {
    let (chunks, rest) = x.as_chunks::<LANES>();
    let mut acc = [0.0f32; LANES];
    for c in chunks {
        for i in 0..LANES {
            acc[i] += c[i];
        }
    }
    let mut s = 0.0f32;
    for a in acc {
        s += a;
    }
    for v in rest {
        s += *v;
    }
    s
}

/// `Σ (x − m)²`, in 16 interleaved lanes.
#[inline]
fn sum_sq_dev(x: &[f32], m: f32) -> f32 {
    let (chunks, rest) = x.as_chunks::<LANES>();
    let mut acc = [0.0f32; LANES];
    for c in chunks {
        for i in 0..LANES {
            let d = c[i] - m;
            acc[i] += d * d;
        }
    }
    let mut s = 0.0f32;
    for a in acc {
        s += a;
    }
    for v in rest {
        let d = *v - m;
        s += d * d;
    }
    s
}

/// `(Σ dy, Σ dy·(x − m))`, in 16 interleaved lanes.
#[inline]
fn sum_dy_dev(dy: &[f32], x: &[f32], m: f32) -> (f32, f32) {
    let x = &x[..dy.len()];
    let (cd, rd) = dy.as_chunks::<LANES>();
    let (cx, rx) = x.as_chunks::<LANES>();
    // Two loops over the run (in L1), so that each vectorises on its own.
    let (mut a, mut b) = ([0.0f32; LANES], [0.0f32; LANES]);
    for d in cd {
        for i in 0..LANES {
            a[i] += d[i];
        }
    }
    for (d, x) in cd.iter().zip(cx) {
        for i in 0..LANES {
            b[i] += d[i] * (x[i] - m);
        }
    }
    let (mut sa, mut sb) = (0.0f32, 0.0f32);
    for i in 0..LANES {
        sa += a[i];
        sb += b[i];
    }
    for (d, x) in rd.iter().zip(rx) {
        sa += *d;
        sb += *d * (*x - m);
    }
    (sa, sb)
}

/// Calls `f(c, run)` for each run of one channel's values in `rows` (whole `chan × inner` rows),
/// as `f32` (16-bit types converted a block at a time).
#[inline]
fn for_runs<E: Dtype>(lay: &BatchNormLayout, rows: &[E], mut f: impl FnMut(usize, &[f32])) {
    let row_len = lay.chan * lay.inner;
    if let Some(rows) = as_f32(rows) {
        for row in rows.chunks_exact(row_len) {
            for (c, run) in row.chunks_exact(lay.inner).enumerate() {
                f(c, run);
            }
        }
    } else {
        let mut buf = [0.0f32; BLOCK];
        for row in rows.chunks_exact(row_len) {
            for (c, run) in row.chunks_exact(lay.inner).enumerate() {
                for block in run.chunks(BLOCK) {
                    let b = &mut buf[..block.len()];
                    to_f32(block, b);
                    f(c, b);
                }
            }
        }
    }
}

/// Sums `f(c, run)` per channel over pieces of `outer` in parallel; returns the `chan` totals,
/// each piece's partial added in piece order.
fn per_chan_sums<E: Dtype, const K: usize>(
    lay: &BatchNormLayout,
    data: &[E],
    f: impl Fn(usize, &[f32]) -> [f32; K] + Send + Sync,
) -> Vec<[f64; K]> {
    let row_len = lay.chan * lay.inner;
    let n_pieces = pieces(lay.outer);
    let per_piece = lay.outer.div_ceil(n_pieces);
    let mut partials = std::vec![[0.0f64; K]; n_pieces * lay.chan];
    par_chunks_mut(&mut partials, lay.chan, |i, part| {
        let r0 = (i * per_piece).min(lay.outer);
        let r1 = ((i + 1) * per_piece).min(lay.outer);
        for_runs(lay, &data[r0 * row_len..r1 * row_len], |c, run| {
            let s = f(c, run);
            for k in 0..K {
                part[c][k] += s[k] as f64;
            }
        });
    });
    let mut total = std::vec![[0.0f64; K]; lay.chan];
    for part in partials.chunks_exact(lay.chan) {
        for (t, p) in total.iter_mut().zip(part) {
            for k in 0..K {
                t[k] += p[k];
            }
        }
    }
    total
}

/// `y = (x − mean[c]) · a[c] + b[c]`, elementwise over `x` into `y` (same layout), in parallel.
fn affine<E: Dtype>(
    lay: &BatchNormLayout,
    x: &[E],
    y: &mut [E],
    mean: &[f32],
    a: &[f32],
    b: &[f32],
) {
    let row_len = lay.chan * lay.inner;
    let per_piece = lay.outer.div_ceil(pieces(lay.outer));
    let apply = |c: usize, x: &[f32], y: &mut [f32]| {
        let (m, a, b) = (mean[c], a[c], b[c]);
        for (y, x) in y.iter_mut().zip(x) {
            *y = (*x - m) * a + b;
        }
    };
    par_chunks_mut(y, per_piece * row_len, |i, y| {
        let x = &x[i * per_piece * row_len..][..y.len()];
        if as_f32(x).is_some() {
            let (x, y) = (as_f32(x).unwrap(), as_f32_mut(y).unwrap());
            let runs = x.chunks_exact(lay.inner).zip(y.chunks_exact_mut(lay.inner));
            for (r, (x, y)) in runs.enumerate() {
                apply(r % lay.chan, x, y);
            }
        } else {
            let (mut xb, mut yb) = ([0.0f32; BLOCK], [0.0f32; BLOCK]);
            let runs = x.chunks_exact(lay.inner).zip(y.chunks_exact_mut(lay.inner));
            for (r, (x, y)) in runs.enumerate() {
                for (x, y) in x.chunks(BLOCK).zip(y.chunks_mut(BLOCK)) {
                    let (xb, yb) = (&mut xb[..x.len()], &mut yb[..x.len()]);
                    to_f32(x, xb);
                    apply(r % lay.chan, xb, yb);
                    from_f32(yb, y);
                }
            }
        }
    });
}

/// `gx += k1[c] · (dy − mdy[c] − (x − mean[c]) · k2[c])`, elementwise, in parallel.
///
/// typed-amp patch: `gx =` instead of `+=` unless `accumulate` (a fresh gradient is written,
/// not read), and `dy` taken as zero where `mask` (a fused ReLU's output) is not positive.
#[allow(clippy::too_many_arguments)]
fn input_grad<E: Dtype>(
    lay: &BatchNormLayout,
    x: &[E],
    dy: &[E],
    mask: Option<&[E]>,
    gx: &mut [E],
    accumulate: bool,
    mean: &[f32],
    k1: &[f32],
    mdy: &[f32],
    k2: &[f32],
) {
    let row_len = lay.chan * lay.inner;
    let per_piece = lay.outer.div_ceil(pieces(lay.outer));
    let apply = |c: usize, x: &[f32], dy: &[f32], y: Option<&[f32]>, gx: &mut [f32]| {
        let (m, k1, mdy, k2) = (mean[c], k1[c], mdy[c], k2[c]);
        let grad = |x: f32, dy: f32| k1 * (dy - mdy - (x - m) * k2);
        match (y, accumulate) {
            (None, true) => {
                for ((g, x), dy) in gx.iter_mut().zip(x).zip(dy) {
                    *g += grad(*x, *dy);
                }
            }
            (None, false) => {
                for ((g, x), dy) in gx.iter_mut().zip(x).zip(dy) {
                    *g = grad(*x, *dy);
                }
            }
            (Some(y), acc) => {
                for (((g, x), dy), y) in gx.iter_mut().zip(x).zip(dy).zip(y) {
                    let dy = if *y > 0.0 { *dy } else { 0.0 };
                    let v = grad(*x, dy);
                    *g = if acc { *g + v } else { v };
                }
            }
        }
    };
    par_chunks_mut(gx, per_piece * row_len, |i, gx| {
        let start = i * per_piece * row_len;
        let x = &x[start..][..gx.len()];
        let dy = &dy[start..][..gx.len()];
        let y = mask.map(|m| &m[start..][..gx.len()]);
        let f32_views = (as_f32(x), as_f32(dy), y.map(as_f32));
        if let (Some(x), Some(dy), None | Some(Some(_))) = f32_views {
            let y = y.map(|y| as_f32(y).unwrap());
            let gx = as_f32_mut(gx).unwrap();
            let mut r = 0;
            for ((x, dy), gx) in x
                .chunks_exact(lay.inner)
                .zip(dy.chunks_exact(lay.inner))
                .zip(gx.chunks_exact_mut(lay.inner))
            {
                let y = y.map(|y| &y[r * lay.inner..][..lay.inner]);
                apply(r % lay.chan, x, dy, y, gx);
                r += 1;
            }
        } else {
            let mut xb = [0.0f32; BLOCK];
            let mut db = [0.0f32; BLOCK];
            let mut yb = [0.0f32; BLOCK];
            let mut gb = [0.0f32; BLOCK];
            for (r, (start, gx)) in (0..)
                .step_by(lay.inner)
                .zip(gx.chunks_exact_mut(lay.inner))
                .enumerate()
            {
                let x = &x[start..][..lay.inner];
                let dy = &dy[start..][..lay.inner];
                let y = y.map(|y| &y[start..][..lay.inner]);
                for (b, gx) in gx.chunks_mut(BLOCK).enumerate() {
                    let (o, n) = (b * BLOCK, gx.len());
                    to_f32(&x[o..o + n], &mut xb[..n]);
                    to_f32(&dy[o..o + n], &mut db[..n]);
                    if let Some(y) = y {
                        to_f32(&y[o..o + n], &mut yb[..n]);
                    }
                    if accumulate {
                        to_f32(gx, &mut gb[..n]);
                    }
                    let yv = y.map(|_| &yb[..n]);
                    apply(r % lay.chan, &xb[..n], &db[..n], yv, &mut gb[..n]);
                    from_f32(&gb[..n], gx);
                }
            }
        }
    });
}

/// Per-channel values of a rank-1 tensor, as `f32`.
fn chan_f32<E: Dtype, const C: usize>(t: &Tensor<Rank1<C>, E, Cpu>) -> Vec<f32> {
    let mut v = std::vec![0.0f32; C];
    let data: Vec<E> = t.as_vec();
    to_f32(&data, &mut v);
    v
}

/// `std = √(var + ε)` and `a = scale / std`, per channel, as upstream computes them (in `f32`).
fn std_and_scale(var: &[f32], scale: &[f32], epsilon: f64) -> (Vec<f32>, Vec<f32>) {
    let eps = epsilon as f32;
    let std: Vec<f32> = var.iter().map(|v| (*v + eps).sqrt()).collect();
    let a = scale.iter().zip(&std).map(|(s, d)| *s / *d).collect();
    (std, a)
}

impl<E: Dtype> BatchNormKernel<E> for Cpu {
    fn try_batchnorm_train<const C: usize, S: Shape, T: Tape<E, Self>, Ax: Axes>(
        x: Tensor<S, E, Self, T>,
        var: &mut Tensor<Rank1<C>, E, Self>,
        mean: &mut Tensor<Rank1<C>, E, Self>,
        scale: &Tensor<Rank1<C>, E, Self>,
        bias: &Tensor<Rank1<C>, E, Self>,
        epsilon: f64,
        momentum: f64,
    ) -> Result<Tensor<S, E, Self, T>, Self::Err>
    where
        Self: Device<E>,
        S: HasAxes<Ax> + ReduceShapeTo<Rank1<C>, Ax>,
    {
        let lay = BatchNormLayout::of::<S, Ax>(&x.shape);
        if x.strides != x.shape.strides() || lay.chan != C || lay.per_chan() < 2 {
            return train_fwd_composed(x, var, mean, scale, bias, epsilon, momentum);
        }
        train_fused(lay, x, var, mean, scale, bias, epsilon, momentum)
    }

    fn try_batchnorm_infer<const C: usize, S: Shape, Ax: Axes>(
        x: Tensor<S, E, Self>,
        var: &Tensor<Rank1<C>, E, Self>,
        mean: &Tensor<Rank1<C>, E, Self>,
        scale: &Tensor<Rank1<C>, E, Self>,
        bias: &Tensor<Rank1<C>, E, Self>,
        epsilon: f64,
    ) -> Result<Tensor<S, E, Self>, Self::Err>
    where
        Self: Device<E>,
        Rank1<C>: BroadcastShapeTo<S, Ax>,
    {
        let lay = BatchNormLayout::of::<S, Ax>(&x.shape);
        if x.strides != x.shape.strides() || lay.chan != C {
            return infer_fwd_composed(x, var, mean, scale, bias, epsilon);
        }
        infer_fused(lay, x, var, mean, scale, bias, epsilon)
    }
}

/// Adds `Σ dy` and `Σ dy·(x − mean[c])` of the runs in `x`, `dy` (whole rows) to `part[c]`.
///
/// typed-amp patch: `dy` taken as zero where `mask` (a fused ReLU's output) is not positive.
fn dy_dev_sums<E: Dtype>(
    lay: &BatchNormLayout,
    x: &[E],
    dy: &[E],
    mask: Option<&[E]>,
    mean: &[f32],
    part: &mut [[f64; 2]],
) {
    let mut add = |c: usize, dy: &[f32], x: &[f32]| {
        let (a, b) = sum_dy_dev(dy, x, mean[c]);
        part[c][0] += a as f64;
        part[c][1] += b as f64;
    };
    if let (Some(x), Some(dy), None) = (as_f32(x), as_f32(dy), mask) {
        let runs = x.chunks_exact(lay.inner).zip(dy.chunks_exact(lay.inner));
        for (r, (x, dy)) in runs.enumerate() {
            add(r % lay.chan, dy, x);
        }
    } else {
        let (mut xb, mut db, mut yb) = ([0.0f32; BLOCK], [0.0f32; BLOCK], [0.0f32; BLOCK]);
        let runs = (0..).step_by(lay.inner).take(x.len() / lay.inner.max(1));
        for (r, start) in runs.enumerate() {
            let (x, dy) = (&x[start..][..lay.inner], &dy[start..][..lay.inner]);
            let y = mask.map(|m| &m[start..][..lay.inner]);
            for (o, xs) in (0..).step_by(BLOCK).zip(x.chunks(BLOCK)) {
                let n = xs.len();
                to_f32(xs, &mut xb[..n]);
                to_f32(&dy[o..o + n], &mut db[..n]);
                if let Some(y) = y {
                    to_f32(&y[o..o + n], &mut yb[..n]);
                    for (d, y) in db[..n].iter_mut().zip(&yb[..n]) {
                        *d = if *y > 0.0 { *d } else { 0.0 };
                    }
                }
                add(r % lay.chan, &db[..n], &xb[..n]);
            }
        }
    }
}

/// The fused training forward (see [BatchNormKernel::try_batchnorm_train]), for a contiguous
/// `x` of layout `lay`.
#[allow(clippy::too_many_arguments)]
fn train_fused<const C: usize, S: Shape, E: Dtype, T: Tape<E, Cpu>>(
    lay: BatchNormLayout,
    x: Tensor<S, E, Cpu, T>,
    var: &mut Tensor<Rank1<C>, E, Cpu>,
    mean: &mut Tensor<Rank1<C>, E, Cpu>,
    scale: &Tensor<Rank1<C>, E, Cpu>,
    bias: &Tensor<Rank1<C>, E, Cpu>,
    epsilon: f64,
    momentum: f64,
) -> Result<Tensor<S, E, Cpu, T>, CpuError> {
    let n = lay.per_chan() as f64;
    let (x, mut tape) = x.split_tape();
    let dev = x.device.clone();

    // Batch statistics: the mean, then the mean of squared deviations from it (in f64 from
    // f32 run sums).
    let sums = per_chan_sums(&lay, &x.data, |_, run| [sum(run)]);
    let mean64: Vec<f64> = sums.iter().map(|s| s[0] / n).collect();
    let mean32: Vec<f32> = mean64.iter().map(|m| *m as f32).collect();
    let sq = per_chan_sums(&lay, &x.data, |c, run| [sum_sq_dev(run, mean32[c])]);
    let var64: Vec<f64> = sq.iter().map(|s| s[0] / n).collect();

    // Running statistics, updated as upstream does (through axpy, with the batch statistics
    // in E; the variance unbiased).
    let to_e = |v: &[f64]| -> Vec<E> { v.iter().map(|v| E::from_f64(*v).unwrap()).collect() };
    let mean_e = dev.try_tensor_from_vec(to_e(&mean64), (Const::<C>,))?;
    let var_e = dev.try_tensor_from_vec(to_e(&var64), (Const::<C>,))?;
    mean.try_axpy(1.0 - momentum, &mean_e, momentum)?;
    var.try_axpy(1.0 - momentum, &var_e, momentum * n / (n - 1.0))?;

    // Normalize and apply the affine map, in f32: y = (x − mean) · (scale / std) + bias.
    let var32: Vec<f32> = var64.iter().map(|v| *v as f32).collect();
    let scale32 = chan_f32(scale);
    let bias32 = chan_f32(bias);
    let (std32, a32) = std_and_scale(&var32, &scale32, epsilon);
    let mut out = dev.try_zeros_like(&x.shape)?;
    affine(
        &lay,
        &x.data,
        &mut std::sync::Arc::make_mut(&mut out.data)[..],
        &mean32,
        &a32,
        &bias32,
    );

    let x_ghost = x.ghost();
    let scale_ghost = scale.ghost();
    let bias_ghost = bias.ghost();
    let out_ghost = out.ghost();
    tape.add_backward_op(move |grads| {
        grads.try_alloc_for(&x_ghost)?;
        grads.try_alloc_for(&scale_ghost)?;
        grads.try_alloc_for(&bias_ghost)?;
        grads.try_alloc_for(&out_ghost)?;
        let (grad_x, grad_out) = grads.mut_and_ref(&x_ghost, &out_ghost);
        // Σ dy and Σ dy·(x − mean) per channel.
        let sums = {
            let row_len = lay.chan * lay.inner;
            let n_pieces = pieces(lay.outer);
            let per_piece = lay.outer.div_ceil(n_pieces);
            let mut partials = std::vec![[0.0f64; 2]; n_pieces * lay.chan];
            let (xd, gd): (&[E], &[E]) = (&x.data, grad_out);
            par_chunks_mut(&mut partials, lay.chan, |i, part| {
                let r0 = (i * per_piece).min(lay.outer);
                let r1 = ((i + 1) * per_piece).min(lay.outer);
                let xs = &xd[r0 * row_len..r1 * row_len];
                let ds = &gd[r0 * row_len..r1 * row_len];
                // typed-amp patch: no mask (only `parts::grad_sums` passes one).
                dy_dev_sums(&lay, xs, ds, None, &mean32, part);
            });
            let mut total = std::vec![[0.0f64; 2]; lay.chan];
            for part in partials.chunks_exact(lay.chan) {
                for (t, p) in total.iter_mut().zip(part) {
                    t[0] += p[0];
                    t[1] += p[1];
                }
            }
            total
        };
        // dx = (scale / std) · (dy − mean(dy) − (x − mean) · Σ dy·(x − mean) / (n · std²))
        let inv_std: Vec<f64> = std32.iter().map(|s| 1.0 / *s as f64).collect();
        let k1: Vec<f32> = (0..lay.chan)
            .map(|c| (scale32[c] as f64 * inv_std[c]) as f32)
            .collect();
        let mdy: Vec<f32> = sums.iter().map(|s| (s[0] / n) as f32).collect();
        let k2: Vec<f32> = (0..lay.chan)
            .map(|c| (sums[c][1] * inv_std[c] * inv_std[c] / n) as f32)
            .collect();
        // typed-amp patch: no mask, and added to `grad_x` (`accumulate`), as before.
        input_grad(
            &lay, &x.data, grad_out, None, grad_x, true, &mean32, &k1, &mdy, &k2,
        );
        // d scale = Σ dy·(x − mean) / std, d bias = Σ dy.
        let add = |g: &mut [E], v: &dyn Fn(usize) -> f64| {
            for (c, g) in g.iter_mut().enumerate() {
                *g = E::from_f64(g.to_f64().unwrap() + v(c)).unwrap();
            }
        };
        add(grads.get_mut(&scale_ghost), &|c| sums[c][1] * inv_std[c]);
        add(grads.get_mut(&bias_ghost), &|c| sums[c][0]);
        Ok(())
    });
    Ok(out.put_tape(tape))
}

/// The fused inference forward (see [BatchNormKernel::try_batchnorm_infer]), for a contiguous
/// `x` of layout `lay`.
fn infer_fused<const C: usize, S: Shape, E: Dtype>(
    lay: BatchNormLayout,
    x: Tensor<S, E, Cpu>,
    var: &Tensor<Rank1<C>, E, Cpu>,
    mean: &Tensor<Rank1<C>, E, Cpu>,
    scale: &Tensor<Rank1<C>, E, Cpu>,
    bias: &Tensor<Rank1<C>, E, Cpu>,
    epsilon: f64,
) -> Result<Tensor<S, E, Cpu>, CpuError> {
    let (std32, a32) = std_and_scale(&chan_f32(var), &chan_f32(scale), epsilon);
    let _ = std32;
    let mut out = x.device.try_zeros_like(&x.shape)?;
    affine(
        &lay,
        &x.data,
        &mut std::sync::Arc::make_mut(&mut out.data)[..],
        &chan_f32(mean),
        &a32,
        &chan_f32(bias),
    );
    Ok(out)
}

/// typed-amp patch: the passes of the fused kernels above, each over an `outer × chan × inner`
/// contiguous buffer of any dtype with per-channel values in `f32`, for a batch norm whose
/// activations and parameters differ in precision (typed-amp's).
pub mod parts {
    use super::*;

    pub use super::super::BatchNormLayout;

    /// The batch statistics: per channel, the mean and the (biased) variance, in `f64` from
    /// `f32` run sums, as the fused training forward computes them.
    pub fn batch_stats<E: Dtype>(lay: &BatchNormLayout, x: &[E]) -> (Vec<f64>, Vec<f64>) {
        let n = lay.per_chan() as f64;
        let sums = per_chan_sums(lay, x, |_, run| [sum(run)]);
        let mean64: Vec<f64> = sums.iter().map(|s| s[0] / n).collect();
        let mean32: Vec<f32> = mean64.iter().map(|m| *m as f32).collect();
        let sq = per_chan_sums(lay, x, |c, run| [sum_sq_dev(run, mean32[c])]);
        let var64 = sq.iter().map(|s| s[0] / n).collect();
        (mean64, var64)
    }

    /// `std = √(var + ε)` and `a = scale / std`, per channel, in `f32`.
    pub fn std_and_scale(var: &[f32], scale: &[f32], epsilon: f64) -> (Vec<f32>, Vec<f32>) {
        super::std_and_scale(var, scale, epsilon)
    }

    /// `y = (x − mean[c]) · a[c] + b[c]`, rounded once into `y`'s dtype, in parallel.
    pub fn normalize<E: Dtype>(
        lay: &BatchNormLayout,
        x: &[E],
        y: &mut [E],
        mean: &[f32],
        a: &[f32],
        b: &[f32],
    ) {
        affine(lay, x, y, mean, a, b)
    }

    /// Per channel, `Σ dy` and `Σ dy·(x − mean[c])`, in `f64` from `f32` run sums, `dy` taken
    /// as zero where `mask` (a fused ReLU's output) is not positive.
    pub fn grad_sums<E: Dtype>(
        lay: &BatchNormLayout,
        x: &[E],
        dy: &[E],
        mask: Option<&[E]>,
        mean: &[f32],
    ) -> Vec<[f64; 2]> {
        let row_len = lay.chan * lay.inner;
        let n_pieces = pieces(lay.outer);
        let per_piece = lay.outer.div_ceil(n_pieces);
        let mut partials = std::vec![[0.0f64; 2]; n_pieces * lay.chan];
        par_chunks_mut(&mut partials, lay.chan, |i, part| {
            let r0 = (i * per_piece).min(lay.outer);
            let r1 = ((i + 1) * per_piece).min(lay.outer);
            let xs = &x[r0 * row_len..r1 * row_len];
            let ds = &dy[r0 * row_len..r1 * row_len];
            let ms = mask.map(|m| &m[r0 * row_len..r1 * row_len]);
            dy_dev_sums(lay, xs, ds, ms, mean, part);
        });
        let mut total = std::vec![[0.0f64; 2]; lay.chan];
        for part in partials.chunks_exact(lay.chan) {
            for (t, p) in total.iter_mut().zip(part) {
                t[0] += p[0];
                t[1] += p[1];
            }
        }
        total
    }

    /// `gx (+)= k1[c] · (dy − mdy[c] − (x − mean[c]) · k2[c])` (added only with `accumulate`),
    /// `dy` taken as zero where `mask` is not positive, in parallel.
    #[allow(clippy::too_many_arguments)]
    pub fn input_grad<E: Dtype>(
        lay: &BatchNormLayout,
        x: &[E],
        dy: &[E],
        mask: Option<&[E]>,
        gx: &mut [E],
        accumulate: bool,
        mean: &[f32],
        k1: &[f32],
        mdy: &[f32],
        k2: &[f32],
    ) {
        super::input_grad(lay, x, dy, mask, gx, accumulate, mean, k1, mdy, k2)
    }
}
