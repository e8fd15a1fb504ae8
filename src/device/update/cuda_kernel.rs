//! Adam's and SGD's update fused with the refresh of the working copy on CUDA: one thread per
//! element updates the FP32 master, its state and the 16-bit working value in one pass. The
//! arithmetic is the CPU's (dfdx's f32 optimizers, operation for operation), written with
//! round-to-nearest intrinsics so that the compiler contracts nothing into a fused multiply-add:
//! the same inputs give the CPU's bits.

use dfdx::prelude::{AdamConfig, SgdConfig, Shape, Storage, Tensor};
use dfdx::tensor::{Cuda, CudaError};
use dfdx::tensor_ops::{Momentum, WeightDecay};

use super::UpdateKernel;
use crate::device::utilities::cuda::{check_lengths, launch, raw, raw_mut, CudaElem, OpSource};

const SOURCE: OpSource = OpSource {
    module: "typed_amp_update",
    templates: r#"
// One step's constants, by value (the Rust side's `AdamConstants`). Weight decay: 0 none,
// 1 L2 (added to the gradient), 2 decoupled (added to the step).
struct AdamConstants {
    float b1, b2, om1, om2, c1, c2, lr, eps;
    int decay;
    float wd;
};

template <typename W>
__device__ void amp_adam(u64 n, float *p, float *m, float *v, const float *grad, W *working,
                         AdamConstants k) {
    float b1 = k.b1, b2 = k.b2, om1 = k.om1, om2 = k.om2, c1 = k.c1, c2 = k.c2, lr = k.lr;
    float eps = k.eps, wd = k.wd;
    int decay = k.decay;
    FOR_EACH(i, n) {
        float pi = p[i], g = grad[i];
        if (decay == 1) g = __fadd_rn(g, __fmul_rn(wd, pi));
        float mi = __fadd_rn(__fmul_rn(m[i], b1), __fmul_rn(g, om1));
        float vi = __fadd_rn(__fmul_rn(v[i], b2), __fmul_rn(__fmul_rn(g, g), om2));
        float step = __fdiv_rn(__fmul_rn(lr, __fmul_rn(mi, c1)),
                               __fadd_rn(__fsqrt_rn(__fmul_rn(vi, c2)), eps));
        if (decay == 2) step = __fadd_rn(step, __fmul_rn(wd, pi));
        pi = __fsub_rn(pi, step);
        p[i] = pi; m[i] = mi; v[i] = vi;
        store(working, i, pi);
    }
}

// Momentum: 0 none, 1 classic, 2 Nesterov (coefficient u).
template <typename W>
__device__ void amp_sgd(u64 n, float *p, float *vel, const float *grad, W *working, float lr,
                        int momentum, float u, int decay, float wd) {
    FOR_EACH(i, n) {
        float pi = p[i], g = grad[i];
        if (decay == 1) g = __fadd_rn(g, __fmul_rn(wd, pi));
        if (momentum == 1) {
            float vi = __fadd_rn(g, __fmul_rn(u, vel[i]));
            vel[i] = vi;
            g = __fmul_rn(vi, lr);
        } else if (momentum == 2) {
            float vi = __fadd_rn(g, __fmul_rn(u, vel[i]));
            vel[i] = vi;
            g = __fmul_rn(__fadd_rn(g, __fmul_rn(u, vi)), lr);
        } else {
            g = __fmul_rn(g, lr);
        }
        if (decay == 2) g = __fadd_rn(g, __fmul_rn(wd, pi));
        pi = __fsub_rn(pi, g);
        p[i] = pi;
        store(working, i, pi);
    }
}
"#,
    one: |tag, ty| {
        let source = format!(
            r#"
extern "C" __global__ void tamp_adam_refresh_{tag}(u64 n, float *p, float *m, float *v, const float *grad, {ty} *working, AdamConstants k) {{ amp_adam(n, p, m, v, grad, working, k); }}
extern "C" __global__ void tamp_sgd_refresh_{tag}(u64 n, float *p, float *vel, const float *grad, {ty} *working, float lr, int momentum, float u, int decay, float wd) {{ amp_sgd(n, p, vel, grad, working, lr, momentum, u, decay, wd); }}
"#
        );
        let names = ["adam_refresh", "sgd_refresh"]
            .map(|k| format!("tamp_{k}_{tag}"))
            .to_vec();
        (source, names)
    },
    pair: crate::device::utilities::cuda::no_pair,
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
        // The CPU's constants, computed the same way (f64 → f32, then f32 arithmetic).
        let [b1, b2] = cfg.betas.map(|b| b as f32);
        let c1 = (1.0f32 - b1.powi(t)).recip();
        let c2 = (1.0f32 - b2.powi(t)).recip();
        let (kind, wd) = decay(cfg.weight_decay, cfg.lr);
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
                AdamConstants {
                    b1,
                    b2,
                    om1: 1.0f32 - b1,
                    om2: 1.0f32 - b2,
                    c1,
                    c2,
                    lr: cfg.lr as f32,
                    eps: cfg.eps as f32,
                    decay: kind,
                    wd,
                },
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
        let (momentum, u) = match cfg.momentum {
            None => (0, 0.0),
            Some(Momentum::Classic(u)) => (1, u as f32),
            Some(Momentum::Nesterov(u)) => (2, u as f32),
        };
        let (kind, wd) = decay(cfg.weight_decay, cfg.lr);
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
                cfg.lr as f32,
                momentum,
                u,
                kind,
                wd,
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
