//! The fused attention on tensor cores (`attention_mma.cuh`): 16-bit `q`, `k`, `v` with heads of
//! 16, 32 or 64 columns on GPUs of compute capability 8.0 or higher (Ampere, Ada, Hopper,
//! Blackwell), FlashAttention-2's algorithm on `mma.sync` with FP32 scores and accumulators.
//! Every other case (FP32 values, other head widths, older GPUs) runs the CUDA-core kernels of
//! `cuda_kernel.rs`, which this module leaves as they are; so does setting
//! `TYPED_AMP_CUDA_ATTENTION=fp32` in the environment (read once per process), which exists
//! to compare the two paths on one GPU.
//!
//! What differs from the CUDA-core kernels is the arithmetic, not the algorithm: the products
//! run on tensor cores (their FP32 accumulation has its own order), and the probabilities and
//! the scores' gradient are rounded once to the working precision before their products, as
//! the CPU kernel does. The grid order, the causal limits, the masking and padding rules and
//! the log-sum-exps' layout are the CUDA-core kernels', so the delta kernel is shared.

use std::sync::OnceLock;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::LaunchConfig;
use dfdx::tensor::{CpuError, Cuda, CudaError};

use super::AttentionDims;
use crate::device::utilities::cuda::{launch_with, no_pair, CudaElem, OpSource, Raw};

/// Rows (query rows or keys) a block owns: four warps of 16 (`AM_T`).
const TILE: usize = 64;

/// Threads per block (`AM_THREADS`).
const THREADS: u32 = 128;

/// Head widths the kernels are instantiated for.
const HEAD_DIMS: [usize; 3] = [16, 32, 64];

pub(super) const MMA_SOURCE: OpSource = OpSource {
    module: "typed_amp_attention_mma",
    templates: include_str!("attention_mma.cuh"),
    one: |tag, ty| {
        if tag == "f32" {
            // Tensor cores take 16-bit operands; FP32 runs the CUDA-core kernels.
            return (String::new(), Vec::new());
        }
        let mut source = String::new();
        let mut names = Vec::new();
        for hd in HEAD_DIMS {
            source.push_str(&format!(
                r#"
extern "C" __global__ void __launch_bounds__(AM_THREADS) tamp_attn_mma_forward_{hd}_{tag}(u64 batch, u64 tokens, u64 heads, u32 causal, float scale, const {ty} *qkv, {ty} *y, float *lse) {{ am_attn_forward<{ty}, {hd}>(batch, tokens, heads, causal, scale, qkv, y, lse); }}
extern "C" __global__ void __launch_bounds__(AM_THREADS) tamp_attn_mma_dkv_{hd}_{tag}(u64 batch, u64 tokens, u64 heads, u32 causal, u32 accumulate, float scale, const {ty} *qkv, const {ty} *dy, const float *lse, const float *delta, {ty} *dqkv) {{ am_attn_dkv<{ty}, {hd}, AM_T>(batch, tokens, heads, causal, accumulate, scale, qkv, dy, lse, delta, dqkv); }}
extern "C" __global__ void __launch_bounds__(AM_THREADS) tamp_attn_mma_dq_{hd}_{tag}(u64 batch, u64 tokens, u64 heads, u32 causal, u32 accumulate, float scale, const {ty} *qkv, const {ty} *dy, const float *lse, const float *delta, {ty} *dqkv) {{ am_attn_dq<{ty}, {hd}>(batch, tokens, heads, causal, accumulate, scale, qkv, dy, lse, delta, dqkv); }}
"#
            ));
            names.extend(["forward", "dkv", "dq"].map(|k| format!("tamp_attn_mma_{k}_{hd}_{tag}")));
        }
        (source, names)
    },
    pair: no_pair,
    arch: Some("compute_80"),
};

/// Whether the environment asks for the CUDA-core kernels (`TYPED_AMP_CUDA_ATTENTION=fp32`).
fn cuda_cores_asked() -> bool {
    static ASKED: OnceLock<bool> = OnceLock::new();
    *ASKED.get_or_init(|| {
        std::env::var("TYPED_AMP_CUDA_ATTENTION").is_ok_and(|v| v.eq_ignore_ascii_case("fp32"))
    })
}

/// The head width to run on tensor cores, or `None` for the CUDA-core kernels.
pub(super) fn mma_head<E: CudaElem>(
    dev: &Cuda,
    d: &AttentionDims,
) -> Result<Option<usize>, CudaError> {
    if E::TAG == "f32" || !HEAD_DIMS.contains(&d.head_dim) || cuda_cores_asked() {
        return Ok(None);
    }
    let major = dev
        .cuda_device()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    Ok((major >= 8).then_some(d.head_dim))
}

/// One block of [`THREADS`] per (tile of [`TILE`] rows, head, sequence); grids past `i32::MAX`
/// blocks are refused.
fn grid(d: &AttentionDims) -> Result<LaunchConfig, CudaError> {
    let blocks = d
        .tokens
        .div_ceil(TILE)
        .checked_mul(d.heads)
        .and_then(|n| n.checked_mul(d.batch))
        .filter(|&n| n <= i32::MAX as usize)
        .ok_or(CudaError::Cpu(CpuError::WrongNumElements))?;
    Ok(LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// The forward on tensor cores; buffers checked by the caller.
pub(super) fn forward<E: CudaElem>(
    dev: &Cuda,
    d: &AttentionDims,
    hd: usize,
    (qkv, y, lse): (Raw, Raw, Raw),
) -> Result<(), CudaError> {
    launch_with(
        dev,
        &MMA_SOURCE,
        &format!("tamp_attn_mma_forward_{hd}_{}", E::TAG),
        grid(d)?,
        (
            d.batch as u64,
            d.tokens as u64,
            d.heads as u64,
            u32::from(d.causal),
            d.scale(),
            qkv.ptr,
            y.ptr,
            lse.ptr,
        ),
    )
}

/// The keys', values' and queries' gradients on tensor cores, after the delta kernel; buffers
/// checked by the caller. The two kernels write disjoint parts of each packed gradient row.
pub(super) fn backward<E: CudaElem>(
    dev: &Cuda,
    d: &AttentionDims,
    hd: usize,
    accumulate: bool,
    (qkv, dy, lse, delta, dqkv): (Raw, Raw, Raw, Raw, Raw),
) -> Result<(), CudaError> {
    let cfg = grid(d)?;
    for kernel in ["dkv", "dq"] {
        launch_with(
            dev,
            &MMA_SOURCE,
            &format!("tamp_attn_mma_{kernel}_{hd}_{}", E::TAG),
            cfg,
            (
                d.batch as u64,
                d.tokens as u64,
                d.heads as u64,
                u32::from(d.causal),
                u32::from(accumulate),
                d.scale(),
                qkv.ptr,
                dy.ptr,
                lse.ptr,
                delta.ptr,
                dqkv.ptr,
            ),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn nvrtc_compiles_the_kernels() {
        crate::device::utilities::cuda::check_program_of(&super::MMA_SOURCE, &["f16", "bf16"]);
    }

    /// The host sizes the grid and the block by `TILE` and `THREADS`, the kernels by the
    /// source's: they must agree.
    #[test]
    fn the_grid_and_the_kernels_agree_on_the_tile() {
        let t = super::MMA_SOURCE.templates;
        assert!(t.contains(&format!("#define AM_T {} ", super::TILE)));
        assert!(t.contains(&format!("#define AM_THREADS {}\n", super::THREADS)));
    }
}
