//! Adam's and SGD's update fused with the refresh of the working copy on CUDA: one thread per
//! element updates the FP32 master, its state and the 16-bit working value in one pass. The
//! arithmetic is the CPU's (dfdx's f32 optimizers, operation for operation), written with
//! round-to-nearest intrinsics so that the compiler contracts nothing into a fused multiply-add:
//! the same inputs give the CPU's bits.

use std::collections::{BTreeMap, HashSet};

use dfdx::prelude::{AdamConfig, SgdConfig, Shape, Storage, Tensor};
use dfdx::tensor::{CpuError, Cuda, CudaError};
use dfdx::tensor_ops::{Momentum, WeightDecay};

use super::{UpdateBatchKernel, UpdateKernel};
use crate::device::utilities::cuda::{
    check_lengths, launch, launch_with, raw, raw_mut, CudaElem, OpSource,
};
use crate::device::utilities::cuda_multi;

const SOURCE: OpSource = OpSource {
    module: "typed_amp_update",
    templates: concat!(
        // cuda_multi::CHUNK (checked below).
        "#define MT_CHUNK 16384ull\n",
        r#"
// One step's constants, by value (the Rust side's `AdamConstants`). Weight decay: 0 none,
// 1 L2 (added to the gradient), 2 decoupled (added to the step).
struct AdamConstants {
    float b1, b2, om1, om2, c1, c2, lr, eps;
    int decay;
    float wd;
};

// Element i's Adam step and refresh, with weight decay `decay` (0, 1 or 2).
template <typename W>
__device__ __forceinline__ void adam_one(u64 i, float *p, float *m, float *v, const float *grad,
                                         W *working, const AdamConstants &k, int decay) {
    float pi = p[i], g = grad[i];
    if (decay == 1) g = __fadd_rn(g, __fmul_rn(k.wd, pi));
    float mi = __fadd_rn(__fmul_rn(m[i], k.b1), __fmul_rn(g, k.om1));
    float vi = __fadd_rn(__fmul_rn(v[i], k.b2), __fmul_rn(__fmul_rn(g, g), k.om2));
    float step = __fdiv_rn(__fmul_rn(k.lr, __fmul_rn(mi, k.c1)),
                           __fadd_rn(__fsqrt_rn(__fmul_rn(vi, k.c2)), k.eps));
    if (decay == 2) step = __fadd_rn(step, __fmul_rn(k.wd, pi));
    pi = __fsub_rn(pi, step);
    p[i] = pi; m[i] = mi; v[i] = vi;
    store(working, i, pi);
}

template <typename W>
__device__ void amp_adam(u64 n, float *p, float *m, float *v, const float *grad, W *working,
                         AdamConstants k) {
    FOR_EACH(i, n) adam_one(i, p, m, v, grad, working, k, k.decay);
}

// SGD's constants (the Rust side's `SgdConstants`). Momentum: 0 none, 1 classic, 2 Nesterov
// (coefficient u); weight decay as Adam's.
struct SgdConstants {
    float lr;
    int momentum;
    float u;
    int decay;
    float wd;
};

template <typename W>
__device__ __forceinline__ void sgd_one(u64 i, float *p, float *vel, const float *grad,
                                        W *working, const SgdConstants &k, int decay) {
    float pi = p[i], g = grad[i];
    if (decay == 1) g = __fadd_rn(g, __fmul_rn(k.wd, pi));
    if (k.momentum == 1) {
        float vi = __fadd_rn(g, __fmul_rn(k.u, vel[i]));
        vel[i] = vi;
        g = __fmul_rn(vi, k.lr);
    } else if (k.momentum == 2) {
        float vi = __fadd_rn(g, __fmul_rn(k.u, vel[i]));
        vel[i] = vi;
        g = __fmul_rn(__fadd_rn(g, __fmul_rn(k.u, vi)), k.lr);
    } else {
        g = __fmul_rn(g, k.lr);
    }
    if (decay == 2) g = __fadd_rn(g, __fmul_rn(k.wd, pi));
    pi = __fsub_rn(pi, g);
    p[i] = pi;
    store(working, i, pi);
}

template <typename W>
__device__ void amp_sgd(u64 n, float *p, float *vel, const float *grad, W *working,
                        SgdConstants k) {
    FOR_EACH(i, n) sgd_one(i, p, vel, grad, working, k, k.decay);
}

// The same over every tensor of a table (ops/utilities/cuda_multi.rs). Adam's tensors are
// [p, m, v, grad, working, length, decay]; SGD's [p, velocity, grad, working, length, decay].
template <typename W>
__device__ void amp_adam_many(const u64 *table, u64 tensors, u64 chunks, AdamConstants k) {
    for (u64 c = blockIdx.x; c < chunks; c += gridDim.x) {
        u64 word = table[tensors * 7 + c];
        const u64 *t = table + 7 * (word & 0xffffffffull);
        u64 len = t[5], start = (word >> 32) * MT_CHUNK;
        u64 end = start + MT_CHUNK < len ? start + MT_CHUNK : len;
        for (u64 i = start + threadIdx.x; i < end; i += blockDim.x)
            adam_one(i, (float *)t[0], (float *)t[1], (float *)t[2], (const float *)t[3], (W *)t[4],
                     k, (int)t[6]);
    }
}

template <typename W>
__device__ void amp_sgd_many(const u64 *table, u64 tensors, u64 chunks, SgdConstants k) {
    for (u64 c = blockIdx.x; c < chunks; c += gridDim.x) {
        u64 word = table[tensors * 6 + c];
        const u64 *t = table + 6 * (word & 0xffffffffull);
        u64 len = t[4], start = (word >> 32) * MT_CHUNK;
        u64 end = start + MT_CHUNK < len ? start + MT_CHUNK : len;
        for (u64 i = start + threadIdx.x; i < end; i += blockDim.x)
            sgd_one(i, (float *)t[0], (float *)t[1], (const float *)t[2], (W *)t[3], k, (int)t[5]);
    }
}
"#
    ),
    one: |tag, ty| {
        let source = format!(
            r#"
extern "C" __global__ void tamp_adam_refresh_{tag}(u64 n, float *p, float *m, float *v, const float *grad, {ty} *working, AdamConstants k) {{ amp_adam(n, p, m, v, grad, working, k); }}
extern "C" __global__ void tamp_sgd_refresh_{tag}(u64 n, float *p, float *vel, const float *grad, {ty} *working, SgdConstants k) {{ amp_sgd(n, p, vel, grad, working, k); }}
extern "C" __global__ void tamp_adam_many_{tag}(const u64 *table, u64 tensors, u64 chunks, AdamConstants k) {{ amp_adam_many<{ty}>(table, tensors, chunks, k); }}
extern "C" __global__ void tamp_sgd_many_{tag}(const u64 *table, u64 tensors, u64 chunks, SgdConstants k) {{ amp_sgd_many<{ty}>(table, tensors, chunks, k); }}
"#
        );
        let names = ["adam_refresh", "sgd_refresh", "adam_many", "sgd_many"]
            .map(|k| format!("tamp_{k}_{tag}"))
            .to_vec();
        (source, names)
    },
    pair: crate::device::utilities::cuda::no_pair,
    arch: None,
};

/// One Adam step's constants, passed to the kernel by value (its `AdamConstants`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct AdamConstants {
    b1: f32,
    b2: f32,
    /// `1 − β₁` and `1 − β₂`, in f32 as the CPU computes them.
    om1: f32,
    om2: f32,
    /// The bias corrections `1 / (1 − βᵗ)`.
    c1: f32,
    c2: f32,
    lr: f32,
    eps: f32,
    decay: i32,
    wd: f32,
}

// SAFETY: plain old data of the layout the kernel's struct declares (ten 4-byte fields, C
// order), passed by value.
unsafe impl cudarc::driver::DeviceRepr for AdamConstants {}

/// One SGD step's constants, passed to the kernel by value (its `SgdConstants`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct SgdConstants {
    lr: f32,
    /// 0 none, 1 classic, 2 Nesterov.
    momentum: i32,
    u: f32,
    decay: i32,
    wd: f32,
}

// SAFETY: plain old data of the layout the kernel's struct declares (five 4-byte fields, C
// order), passed by value.
unsafe impl cudarc::driver::DeviceRepr for SgdConstants {}

const _: () = assert!(
    cuda_multi::CHUNK == 16384,
    "MT_CHUNK in the kernels' source"
);

/// Updates queued on CUDA: per kernel (optimizer and working precision), each tensor's table
/// words, and the step's constants (one set per batch; each tensor's weight decay, resolved by
/// its rank, is in its words).
#[doc(hidden)]
#[derive(Default)]
pub struct CudaUpdateBatch {
    adam: Option<AdamConstants>,
    adam_wd: Option<f32>,
    sgd: Option<SgdConstants>,
    sgd_wd: Option<f32>,
    adam_groups: BTreeMap<String, Vec<[u64; 7]>>,
    sgd_groups: BTreeMap<String, Vec<[u64; 6]>>,
    /// The masters updated.
    written: HashSet<u64>,
}

/// Makes room in `batch` for an update of the master at `param`: runs what `batch` holds first
/// if that updates `param` already (a master updated twice is updated twice, in order, as
/// unqueued updates would be, not raced by one launch).
fn room_for(dev: &Cuda, batch: &mut CudaUpdateBatch, param: u64) -> Result<(), CudaError> {
    if !batch.written.insert(param) {
        dev.try_flush_update(std::mem::take(batch))?;
        batch.written.insert(param);
    }
    Ok(())
}

/// The step's constants, the same for every tensor of a batch, compared bit for bit (a bug in
/// the caller otherwise).
fn same<K: Copy, const N: usize>(
    slot: &mut Option<K>,
    k: K,
    bits: impl Fn(&K) -> [u32; N],
) -> Result<(), CudaError> {
    match slot {
        Some(old) if bits(old) != bits(&k) => Err(CudaError::Cpu(CpuError::WrongNumElements)),
        _ => {
            *slot = Some(k);
            Ok(())
        }
    }
}

fn adam_bits(k: &AdamConstants) -> [u32; 10] {
    let f = |x: f32| x.to_bits();
    [
        f(k.b1),
        f(k.b2),
        f(k.om1),
        f(k.om2),
        f(k.c1),
        f(k.c2),
        f(k.lr),
        f(k.eps),
        k.decay as u32,
        f(k.wd),
    ]
}

fn sgd_bits(k: &SgdConstants) -> [u32; 5] {
    [
        k.lr.to_bits(),
        k.momentum as u32,
        k.u.to_bits(),
        k.decay as u32,
        k.wd.to_bits(),
    ]
}

/// Launches one multi-tensor kernel per group.
fn flush_groups<const W: usize, K: cudarc::driver::DeviceRepr + Copy>(
    dev: &Cuda,
    groups: &BTreeMap<String, Vec<[u64; W]>>,
    len_word: usize,
    k: K,
) -> Result<(), CudaError> {
    for (kernel, entries) in groups {
        let (words, chunks) = cuda_multi::table_words(entries, len_word)?;
        if chunks == 0 {
            continue;
        }
        let table = cuda_multi::device_table(dev, kernel, &words)?;
        launch_with(
            dev,
            &SOURCE,
            kernel,
            cuda_multi::config(chunks),
            (table, entries.len() as u64, chunks as u64, k),
        )?;
    }
    Ok(())
}

impl UpdateBatchKernel for Cuda {
    type Batch = CudaUpdateBatch;

    fn try_flush_update(&self, batch: CudaUpdateBatch) -> Result<(), CudaError> {
        if let Some(k) = batch.adam {
            let wd = batch.adam_wd.unwrap_or(0.0);
            flush_groups(self, &batch.adam_groups, 5, AdamConstants { wd, ..k })?;
        }
        if let Some(k) = batch.sgd {
            let wd = batch.sgd_wd.unwrap_or(0.0);
            flush_groups(self, &batch.sgd_groups, 4, SgdConstants { wd, ..k })?;
        }
        Ok(())
    }
}

/// Adam's constants for step `t` as the CPU computes them (f64 → f32, then f32 arithmetic).
fn adam_constants(t: i32, cfg: &AdamConfig) -> AdamConstants {
    let [b1, b2] = cfg.betas.map(|b| b as f32);
    let (kind, wd) = decay(cfg.weight_decay, cfg.lr);
    AdamConstants {
        b1,
        b2,
        om1: 1.0f32 - b1,
        om2: 1.0f32 - b2,
        c1: (1.0f32 - b1.powi(t)).recip(),
        c2: (1.0f32 - b2.powi(t)).recip(),
        lr: cfg.lr as f32,
        eps: cfg.eps as f32,
        decay: kind,
        wd,
    }
}

fn sgd_constants(cfg: &SgdConfig) -> SgdConstants {
    let (momentum, u) = match cfg.momentum {
        None => (0, 0.0),
        Some(Momentum::Classic(u)) => (1, u as f32),
        Some(Momentum::Nesterov(u)) => (2, u as f32),
    };
    let (decay, wd) = decay(cfg.weight_decay, cfg.lr);
    SgdConstants {
        lr: cfg.lr as f32,
        momentum,
        u,
        decay,
        wd,
    }
}

/// The weight decay as the kernels take it, and its coefficient (decoupled decay scaled by the
/// learning rate, as dfdx's f32 kernels scale it).
fn decay(wd: Option<WeightDecay>, lr: f64) -> (i32, f32) {
    match wd {
        None => (0, 0.0),
        Some(WeightDecay::L2(x)) => (1, x as f32),
        // Matrices-only decay was resolved by the tensor's rank before the kernel.
        Some(WeightDecay::Decoupled(x) | WeightDecay::DecoupledMatrices(x)) => (2, (x * lr) as f32),
    }
}

impl<E: CudaElem> UpdateKernel<E> for Cuda {
    fn try_adam_refresh<S: Shape>(
        &self,
        t: i32,
        cfg: &AdamConfig,
        param: &mut Tensor<S, f32, Self>,
        moment1: &mut <Self as Storage<f32>>::Vec,
        moment2: &mut <Self as Storage<f32>>::Vec,
        grad: &<Self as Storage<f32>>::Vec,
        working: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), CudaError> {
        let p = raw_mut(self, &mut **param.storage_mut())?;
        let (m, v) = (
            raw_mut(self, &mut **moment1)?,
            raw_mut(self, &mut **moment2)?,
        );
        let (g, w) = (raw(self, &**grad)?, raw_mut(self, &mut **working)?);
        for other in [m, v, g, w] {
            check_lengths(p, other)?;
        }
        launch(
            self,
            &SOURCE,
            &format!("tamp_adam_refresh_{}", E::TAG),
            p.len,
            (
                p.len as u64,
                p.ptr,
                m.ptr,
                v.ptr,
                g.ptr,
                w.ptr,
                adam_constants(t, cfg),
            ),
        )
    }

    fn try_sgd_refresh<S: Shape>(
        &self,
        cfg: &SgdConfig,
        param: &mut Tensor<S, f32, Self>,
        velocity: &mut <Self as Storage<f32>>::Vec,
        grad: &<Self as Storage<f32>>::Vec,
        working: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), CudaError> {
        let p = raw_mut(self, &mut **param.storage_mut())?;
        let vel = raw_mut(self, &mut **velocity)?;
        let (g, w) = (raw(self, &**grad)?, raw_mut(self, &mut **working)?);
        for other in [vel, g, w] {
            check_lengths(p, other)?;
        }
        launch(
            self,
            &SOURCE,
            &format!("tamp_sgd_refresh_{}", E::TAG),
            p.len,
            (
                p.len as u64,
                p.ptr,
                vel.ptr,
                g.ptr,
                w.ptr,
                sgd_constants(cfg),
            ),
        )
    }

    unsafe fn try_queue_adam_refresh<S: Shape>(
        &self,
        batch: &mut CudaUpdateBatch,
        t: i32,
        cfg: &AdamConfig,
        param: &mut Tensor<S, f32, Self>,
        moment1: &mut <Self as Storage<f32>>::Vec,
        moment2: &mut <Self as Storage<f32>>::Vec,
        grad: &<Self as Storage<f32>>::Vec,
        working: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), CudaError> {
        let p = raw_mut(self, &mut **param.storage_mut())?;
        let (m, v) = (
            raw_mut(self, &mut **moment1)?,
            raw_mut(self, &mut **moment2)?,
        );
        let (g, w) = (raw(self, &**grad)?, raw_mut(self, &mut **working)?);
        for other in [m, v, g, w] {
            check_lengths(p, other)?;
        }
        room_for(self, batch, p.ptr)?;
        // The tensor's kind of weight decay goes in its words; the constants are the batch's.
        let k = adam_constants(t, cfg);
        same(
            &mut batch.adam,
            AdamConstants {
                decay: 0,
                wd: 0.0,
                ..k
            },
            adam_bits,
        )?;
        if k.decay != 0 {
            same(&mut batch.adam_wd, k.wd, |w| [w.to_bits()])?;
        }
        let kind = k.decay;
        batch
            .adam_groups
            .entry(format!("tamp_adam_many_{}", E::TAG))
            .or_default()
            .push([p.ptr, m.ptr, v.ptr, g.ptr, w.ptr, p.len as u64, kind as u64]);
        Ok(())
    }

    unsafe fn try_queue_sgd_refresh<S: Shape>(
        &self,
        batch: &mut CudaUpdateBatch,
        cfg: &SgdConfig,
        param: &mut Tensor<S, f32, Self>,
        velocity: &mut <Self as Storage<f32>>::Vec,
        grad: &<Self as Storage<f32>>::Vec,
        working: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), CudaError> {
        let p = raw_mut(self, &mut **param.storage_mut())?;
        let vel = raw_mut(self, &mut **velocity)?;
        let (g, w) = (raw(self, &**grad)?, raw_mut(self, &mut **working)?);
        for other in [vel, g, w] {
            check_lengths(p, other)?;
        }
        room_for(self, batch, p.ptr)?;
        let k = sgd_constants(cfg);
        same(
            &mut batch.sgd,
            SgdConstants {
                decay: 0,
                wd: 0.0,
                ..k
            },
            sgd_bits,
        )?;
        if k.decay != 0 {
            same(&mut batch.sgd_wd, k.wd, |w| [w.to_bits()])?;
        }
        let kind = k.decay;
        batch
            .sgd_groups
            .entry(format!("tamp_sgd_many_{}", E::TAG))
            .or_default()
            .push([p.ptr, vel.ptr, g.ptr, w.ptr, p.len as u64, kind as u64]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn nvrtc_compiles_the_kernels() {
        crate::device::utilities::cuda::check_program(&super::SOURCE);
    }
}
