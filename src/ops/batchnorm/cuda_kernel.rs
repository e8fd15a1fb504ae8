//! The mixed batch norm on CUDA: one block per channel for the statistics (each thread's f32
//! partial sums added in f64 through shared memory, as the CPU adds its f32 run sums in f64;
//! two passes, the mean then the squared deviations from it) with the per-channel arithmetic
//! done by the block's first thread, then one thread per element for the normalization and the
//! input's gradient. Everything per channel stays on the device: no statistic is read back, no
//! constant uploaded.
//!
//! The per-channel and elementwise arithmetic is the CPU's operation for operation, written
//! with round-to-nearest intrinsics so that the compiler contracts nothing into a fused
//! multiply-add: given the same statistics the devices give the same bits (the inference
//! forward, whose statistics are the running ones, is bit for bit the CPU's); the batch
//! statistics differ from the CPU's only by the order of their sums.

use cudarc::driver::LaunchConfig;
use dfdx::prelude::{Cuda, Storage};
use dfdx::tensor::{CpuError, CudaError};
use dfdx::tensor_ops::batchnorm_parts::BatchNormLayout;

use super::{ChannelStats, MixedBatchNormKernel, RunningUpdate};
use crate::device::utilities::cuda::{
    launch, launch_with, no_pair, raw, raw_mut, CudaElem, OpSource, Raw, BLOCK,
};

const SOURCE: OpSource = OpSource {
    module: "typed_amp_batchnorm",
    templates: r#"
// A buffer's layout (the Rust side's `Dims`), by value.
struct BnDims { u64 outer, chan, inner; };

// The training forward's constants (the Rust side's `Running`): the running statistics'
// update weights as dfdx's axpy rounds them, and epsilon.
struct BnRunning { float alpha, beta_mean, beta_var, eps; };

// The channel of element i of an outer × chan × inner buffer; 32-bit division where the
// numbers fit, which they nearly always do (a 64-bit division is several times slower).
__device__ __forceinline__ u64 bn_channel(u64 i, u64 chan, u64 inner) {
    if ((i >> 32) == 0 && (inner >> 32) == 0 && (chan >> 32) == 0) {
        return (u64)(((u32)i / (u32)inner) % (u32)chan);
    }
    return (i / inner) % chan;
}

// The index of the j-th value of channel c (j < outer · inner).
__device__ __forceinline__ u64 bn_index(u64 j, u64 c, u64 chan, u64 inner) {
    u64 o, i;
    if ((j >> 32) == 0 && (inner >> 32) == 0) {
        o = (u32)j / (u32)inner;
    } else {
        o = j / inner;
    }
    i = j - o * inner;
    return (o * chan + c) * inner + i;
}

// The sum of every thread's v, in f64, in a fixed order (the same on every run); every thread
// gets it. red is the block's BLOCK doubles of shared memory.
__device__ double bn_block_sum(double *red, double v) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] = __dadd_rn(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    double r = red[0];
    __syncthreads();
    return r;
}

// One block per channel (blockIdx.x): the batch mean and biased variance, the running
// statistics updated (running·alpha + batch·beta in f32, as dfdx's axpy), and the channel's
// mean, std = sqrt(var + eps) and a = scale / std for the normalization and the backward.
template <typename T>
__device__ void amp_bn_train_stats(BnDims dm, const T *x, const float *scale,
                                   float *running_mean, float *running_var, BnRunning k,
                                   float *mean_out, float *std_out, float *a_out) {
    __shared__ double red[BLOCK];
    u64 chan = dm.chan, inner = dm.inner, c = blockIdx.x, n = dm.outer * inner;
    float s = 0.0f;
    for (u64 j = threadIdx.x; j < n; j += BLOCK) s = __fadd_rn(s, load(x, bn_index(j, c, chan, inner)));
    double mean64 = bn_block_sum(red, (double)s) / (double)n;
    float mean = (float)mean64;
    float q = 0.0f;
    for (u64 j = threadIdx.x; j < n; j += BLOCK) {
        float d = __fsub_rn(load(x, bn_index(j, c, chan, inner)), mean);
        q = __fadd_rn(q, __fmul_rn(d, d));
    }
    double var64 = bn_block_sum(red, (double)q) / (double)n;
    if (threadIdx.x == 0) {
        float var = (float)var64;
        float sd = __fsqrt_rn(__fadd_rn(var, k.eps));
        mean_out[c] = mean;
        std_out[c] = sd;
        a_out[c] = __fdiv_rn(scale[c], sd);
        running_mean[c] = __fadd_rn(__fmul_rn(running_mean[c], k.alpha), __fmul_rn(mean, k.beta_mean));
        running_var[c] = __fadd_rn(__fmul_rn(running_var[c], k.alpha), __fmul_rn(var, k.beta_var));
    }
}

// y = (x - mean[c]) * a[c] + b[c], rounded once.
template <typename T>
__device__ void amp_bn_normalize(BnDims dm, const T *x, T *y, const float *mean, const float *a,
                                 const float *b) {
    FOR_EACH(i, dm.outer * dm.chan * dm.inner) {
        u64 c = bn_channel(i, dm.chan, dm.inner);
        store(y, i, __fadd_rn(__fmul_rn(__fsub_rn(load(x, i), mean[c]), a[c]), b[c]));
    }
}

// One block per channel: sum dy and sum dy*(x - mean), dy read as 0 where the mask (a fused
// ReLU's output; a null pointer for none) is not positive; then the input gradient's
// coefficients (coef: k1, mean(dy), k2, chan each) and the parameters' gradients (null
// pointers skipped), in f64 as the CPU computes them.
template <typename T>
__device__ void amp_bn_grad_sums(BnDims dm, const T *x, const T *dy, const T *mask,
                                 const float *mean, const float *sd, const float *scale,
                                 float *coef, float *dscale, int scale_fresh, float *dbias,
                                 int bias_fresh) {
    __shared__ double red[BLOCK];
    u64 chan = dm.chan, inner = dm.inner, c = blockIdx.x, n = dm.outer * inner;
    float m = mean[c], s0 = 0.0f, s1 = 0.0f;
    for (u64 j = threadIdx.x; j < n; j += BLOCK) {
        u64 at = bn_index(j, c, chan, inner);
        float d = load(dy, at);
        if (mask && !(load(mask, at) > 0.0f)) d = 0.0f;
        s0 = __fadd_rn(s0, d);
        s1 = __fadd_rn(s1, __fmul_rn(d, __fsub_rn(load(x, at), m)));
    }
    double t0 = bn_block_sum(red, (double)s0);
    double t1 = bn_block_sum(red, (double)s1);
    if (threadIdx.x == 0) {
        double nd = (double)n, inv = __drcp_rn((double)sd[c]);
        coef[c] = (float)__dmul_rn((double)scale[c], inv);
        coef[chan + c] = (float)__ddiv_rn(t0, nd);
        coef[2 * chan + c] = (float)__ddiv_rn(__dmul_rn(__dmul_rn(t1, inv), inv), nd);
        if (dscale) dscale[c] = (float)__dadd_rn(scale_fresh ? 0.0 : (double)dscale[c], __dmul_rn(t1, inv));
        if (dbias) dbias[c] = (float)__dadd_rn(bias_fresh ? 0.0 : (double)dbias[c], t0);
    }
}

// gx (+)= k1 * (dy - mean(dy) - (x - mean) * k2), dy masked as in amp_bn_grad_sums.
template <typename T>
__device__ void amp_bn_input_grad(BnDims dm, const T *x, const T *dy, const T *mask, T *gx,
                                  int accumulate, const float *mean, const float *coef) {
    u64 chan = dm.chan, inner = dm.inner;
    FOR_EACH(i, dm.outer * chan * inner) {
        u64 c = bn_channel(i, chan, inner);
        float d = load(dy, i);
        if (mask && !(load(mask, i) > 0.0f)) d = 0.0f;
        float k1 = coef[c], mdy = coef[chan + c], k2 = coef[2 * chan + c];
        float v = __fmul_rn(k1, __fsub_rn(__fsub_rn(d, mdy), __fmul_rn(__fsub_rn(load(x, i), mean[c]), k2)));
        if (accumulate) v = __fadd_rn(load(gx, i), v);
        store(gx, i, v);
    }
}

// The inference forward's a = scale / sqrt(running_var + eps), per channel.
extern "C" __global__ void tamp_bn_infer_scale(u64 chan, const float *scale, const float *var,
                                               float eps, float *a) {
    FOR_EACH(c, chan) a[c] = __fdiv_rn(scale[c], __fsqrt_rn(__fadd_rn(var[c], eps)));
}
"#,
    one: |tag, ty| {
        let source = format!(
            r#"
extern "C" __global__ void tamp_bn_train_stats_{tag}(BnDims dm, const {ty} *x, const float *scale, float *running_mean, float *running_var, BnRunning k, float *mean_out, float *std_out, float *a_out) {{ amp_bn_train_stats(dm, x, scale, running_mean, running_var, k, mean_out, std_out, a_out); }}
extern "C" __global__ void tamp_bn_normalize_{tag}(BnDims dm, const {ty} *x, {ty} *y, const float *mean, const float *a, const float *b) {{ amp_bn_normalize(dm, x, y, mean, a, b); }}
extern "C" __global__ void tamp_bn_grad_sums_{tag}(BnDims dm, const {ty} *x, const {ty} *dy, const {ty} *mask, const float *mean, const float *sd, const float *scale, float *coef, float *dscale, int scale_fresh, float *dbias, int bias_fresh) {{ amp_bn_grad_sums(dm, x, dy, mask, mean, sd, scale, coef, dscale, scale_fresh, dbias, bias_fresh); }}
extern "C" __global__ void tamp_bn_input_grad_{tag}(BnDims dm, const {ty} *x, const {ty} *dy, const {ty} *mask, {ty} *gx, int accumulate, const float *mean, const float *coef) {{ amp_bn_input_grad(dm, x, dy, mask, gx, accumulate, mean, coef); }}
"#
        );
        let mut names: Vec<String> = [
            "bn_train_stats",
            "bn_normalize",
            "bn_grad_sums",
            "bn_input_grad",
        ]
        .map(|k| format!("tamp_{k}_{tag}"))
        .to_vec();
        // The inference scale is FP32 whatever the precision: listed once, with the FP32
        // kernels.
        if tag == "f32" {
            names.push("tamp_bn_infer_scale".to_string());
        }
        (source, names)
    },
    pair: no_pair,
    arch: None,
};

fn wrong() -> CudaError {
    CudaError::Cpu(CpuError::WrongNumElements)
}

fn total(lay: &BatchNormLayout) -> usize {
    lay.outer * lay.chan * lay.inner
}

/// Checks that `bufs` hold `len` elements each.
fn check(len: usize, bufs: &[Raw]) -> Result<(), CudaError> {
    if bufs.iter().all(|b| b.len == len) {
        Ok(())
    } else {
        Err(wrong())
    }
}

/// A buffer's layout, passed to the kernels by value (their `BnDims`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Dims {
    outer: u64,
    chan: u64,
    inner: u64,
}

// SAFETY: plain old data of the layout the kernels' struct declares (three 8-byte fields, C
// order), passed by value.
unsafe impl cudarc::driver::DeviceRepr for Dims {}

/// The training forward's constants, passed by value (the kernels' `BnRunning`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Running {
    alpha: f32,
    beta_mean: f32,
    beta_var: f32,
    eps: f32,
}

// SAFETY: plain old data of the layout the kernels' struct declares (four 4-byte fields, C
// order), passed by value.
unsafe impl cudarc::driver::DeviceRepr for Running {}

/// One block per channel.
fn channels_config(lay: &BatchNormLayout) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (lay.chan as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The layout's dimensions as the kernels take them.
fn dims(lay: &BatchNormLayout) -> Result<Dims, CudaError> {
    // A grid has at most 2^31 − 1 blocks along x.
    if lay.chan > i32::MAX as usize {
        return Err(wrong());
    }
    Ok(Dims {
        outer: lay.outer as u64,
        chan: lay.chan as u64,
        inner: lay.inner as u64,
    })
}

impl<E: CudaElem> MixedBatchNormKernel<E> for Cuda {
    fn try_bn_train_forward(
        &self,
        lay: &BatchNormLayout,
        x: &<Self as Storage<E>>::Vec,
        y: &mut <Self as Storage<E>>::Vec,
        scale: &<Self as Storage<f32>>::Vec,
        bias: &<Self as Storage<f32>>::Vec,
        running: RunningUpdate<'_, Self>,
        epsilon: f64,
    ) -> Result<ChannelStats<Self>, CudaError> {
        let dm = dims(lay)?;
        let (xr, yr) = (raw(self, &**x)?, raw_mut(self, &mut **y)?);
        let (s, b) = (raw(self, &**scale)?, raw(self, &**bias)?);
        let (rm, rv) = (
            raw_mut(self, &mut **running.mean)?,
            raw_mut(self, &mut **running.var)?,
        );
        check(total(lay), &[xr, yr])?;
        check(lay.chan, &[s, b, rm, rv])?;
        if lay.per_chan() < 2 {
            // The unbiased variance divides by n − 1.
            return Err(wrong());
        }
        let n = lay.per_chan() as f64;
        let mut stats = ChannelStats::<Self> {
            mean: Storage::<f32>::try_alloc_len(self, lay.chan)?,
            std: Storage::<f32>::try_alloc_len(self, lay.chan)?,
        };
        let mut a = Storage::<f32>::try_alloc_len(self, lay.chan)?;
        let (m, sd, ar) = (
            raw_mut(self, &mut *stats.mean)?,
            raw_mut(self, &mut *stats.std)?,
            raw_mut(self, &mut *a)?,
        );
        // The running statistics' constants as dfdx's axpy rounds them (f64 → f32).
        let momentum = running.momentum;
        launch_with(
            self,
            &SOURCE,
            &format!("tamp_bn_train_stats_{}", E::TAG),
            channels_config(lay),
            (
                dm,
                xr.ptr,
                s.ptr,
                rm.ptr,
                rv.ptr,
                Running {
                    alpha: (1.0 - momentum) as f32,
                    beta_mean: momentum as f32,
                    beta_var: (momentum * n / (n - 1.0)) as f32,
                    eps: epsilon as f32,
                },
                m.ptr,
                sd.ptr,
                ar.ptr,
            ),
        )?;
        launch(
            self,
            &SOURCE,
            &format!("tamp_bn_normalize_{}", E::TAG),
            xr.len,
            (dm, xr.ptr, yr.ptr, m.ptr, ar.ptr, b.ptr),
        )?;
        Ok(stats)
    }

    fn try_bn_infer_forward(
        &self,
        lay: &BatchNormLayout,
        x: &<Self as Storage<E>>::Vec,
        y: &mut <Self as Storage<E>>::Vec,
        scale: &<Self as Storage<f32>>::Vec,
        bias: &<Self as Storage<f32>>::Vec,
        running_mean: &<Self as Storage<f32>>::Vec,
        running_var: &<Self as Storage<f32>>::Vec,
        epsilon: f64,
    ) -> Result<(), CudaError> {
        let dm = dims(lay)?;
        let (xr, yr) = (raw(self, &**x)?, raw_mut(self, &mut **y)?);
        let (s, b) = (raw(self, &**scale)?, raw(self, &**bias)?);
        let (rm, rv) = (raw(self, &**running_mean)?, raw(self, &**running_var)?);
        check(total(lay), &[xr, yr])?;
        check(lay.chan, &[s, b, rm, rv])?;
        let mut a = Storage::<f32>::try_alloc_len(self, lay.chan)?;
        let ar = raw_mut(self, &mut *a)?;
        launch(
            self,
            &SOURCE,
            "tamp_bn_infer_scale",
            lay.chan,
            (dm.chan, s.ptr, rv.ptr, epsilon as f32, ar.ptr),
        )?;
        launch(
            self,
            &SOURCE,
            &format!("tamp_bn_normalize_{}", E::TAG),
            xr.len,
            (dm, xr.ptr, yr.ptr, rm.ptr, ar.ptr, b.ptr),
        )
    }

    fn try_bn_backward(
        &self,
        lay: &BatchNormLayout,
        x: &<Self as Storage<E>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        mask: Option<&<Self as Storage<E>>::Vec>,
        gx: Option<(&mut <Self as Storage<E>>::Vec, bool)>,
        scale: &<Self as Storage<f32>>::Vec,
        stats: &ChannelStats<Self>,
        dscale: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
        dbias: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
    ) -> Result<(), CudaError> {
        let dm = dims(lay)?;
        let (xr, dyr) = (raw(self, &**x)?, raw(self, &**dy)?);
        let mr = mask.map(|m| raw(self, &**m)).transpose()?;
        let (s, m, sd) = (
            raw(self, &**scale)?,
            raw(self, &*stats.mean)?,
            raw(self, &*stats.std)?,
        );
        check(total(lay), &[xr, dyr])?;
        if let Some(mr) = mr {
            check(total(lay), &[mr])?;
        }
        check(lay.chan, &[s, m, sd])?;
        let grad =
            |g: Option<(&mut <Self as Storage<f32>>::Vec, bool)>| -> Result<(u64, i32), CudaError> {
                match g {
                    Some((g, fresh)) => {
                        let gr = raw_mut(self, &mut **g)?;
                        check(lay.chan, &[gr])?;
                        Ok((gr.ptr, i32::from(fresh)))
                    }
                    None => Ok((0, 0)),
                }
            };
        let ((ds, ds_fresh), (db, db_fresh)) = (grad(dscale)?, grad(dbias)?);
        let gxr = match gx {
            Some((gx, accumulate)) => {
                let gxr = raw_mut(self, &mut **gx)?;
                check(total(lay), &[gxr])?;
                Some((gxr, accumulate))
            }
            None => None,
        };
        let mut coef = Storage::<f32>::try_alloc_len(self, 3 * lay.chan)?;
        let cr = raw_mut(self, &mut *coef)?;
        launch_with(
            self,
            &SOURCE,
            &format!("tamp_bn_grad_sums_{}", E::TAG),
            channels_config(lay),
            (
                dm,
                xr.ptr,
                dyr.ptr,
                mr.map_or(0, |m| m.ptr),
                m.ptr,
                sd.ptr,
                s.ptr,
                cr.ptr,
                ds,
                ds_fresh,
                db,
                db_fresh,
            ),
        )?;
        let Some((gxr, accumulate)) = gxr else {
            return Ok(());
        };
        launch(
            self,
            &SOURCE,
            &format!("tamp_bn_input_grad_{}", E::TAG),
            xr.len,
            (
                dm,
                xr.ptr,
                dyr.ptr,
                mr.map_or(0, |m| m.ptr),
                gxr.ptr,
                i32::from(accumulate),
                m.ptr,
                cr.ptr,
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn nvrtc_compiles_the_kernels() {
        crate::device::utilities::cuda::check_program(&super::SOURCE);
    }
}
