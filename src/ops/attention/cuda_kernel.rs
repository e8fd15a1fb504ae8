//! The fused attention on CUDA (FlashAttention-2's algorithm, FP32 arithmetic on the CUDA
//! cores): scores and probabilities live in registers and shared memory, never in global memory;
//! the forward keeps one FP32 log-sum-exp per query row and head, and the backward recomputes
//! the probabilities from it.
//!
//! Every kernel runs [`BLOCK`] (256) threads as 16 groups of 16 lanes, on tiles in static
//! shared memory (at most 43.5 KiB a block, under the 48 KiB that needs no opt-in):
//!
//! - forward: a block per (64 query rows, 64 output columns, head, sequence); the query tile
//!   meets the key tiles of 64 up to the causal diagonal; a thread holds 4 query rows × 4 keys
//!   of the scores and 4 rows × 4 columns of the output, with each row's running maximum and sum
//!   (the 16 lanes of a group hold the same rows and agree on them through shuffles);
//! - backward, keys and values: a block per (64 keys, 64 columns, head, sequence), looping over
//!   query tiles of 32 from the diagonal on: `dV += Pᵀ·dY`, `dK += dSᵀ·Q`;
//! - backward, queries: a block per (64 query rows, 64 columns, head, sequence), looping over
//!   key tiles of 32 up to the diagonal: `dQ += dS·K`;
//!
//! with `dS = P ⊙ (dP − D)`, `dP = dY·Vᵀ`, `D = rowsum(dY ⊙ Y)` (a small kernel of its own). No
//! float atomics: every gradient element is summed by one thread in a fixed order, so results
//! do not change from run to run. Heads wider than 64 take one block per 64 output columns,
//! each recomputing the scores (any head width works; widths past 64 cost more).
//!
//! The scores are `scale·(q·k)` with the dot product summed in head-column order by FMAs and
//! the scale applied by one rounded multiply, identically in the three kernels, so the
//! backward's probabilities are the forward's. The tiles' shapes match the CPU kernel's blocks
//! of 64 (the same pairs of query and key blocks meet), so a NaN reaches the same outputs and
//! gradients on both devices.
//!
//! These kernels run FP32 values, and 16-bit values where tensor cores cannot: 16-bit values
//! with heads of 16, 32 or 64 columns on GPUs of compute capability 8.0 or higher run on tensor
//! cores instead (`cuda_mma.rs`: the same algorithm, grid order and masking, on `mma.sync`).

use cudarc::driver::LaunchConfig;
use dfdx::prelude::Storage;
use dfdx::tensor::{CpuError, Cuda, CudaError};

use super::{cuda_mma, AttentionDims, AttentionKernel};
use crate::device::utilities::cuda::{
    launch, launch_with, no_pair, raw, raw_mut, CudaElem, OpSource, BLOCK,
};

/// A block's own tile: query rows (forward, queries' gradient) or keys (keys' and values'
/// gradient); and the output columns per block. Fixed in the source (`AT_T`, `AT_DC`).
const TILE: usize = 64;

const SOURCE: OpSource = OpSource {
    module: "typed_amp_attention",
    templates: include_str!("attention.cuh"),
    one: |tag, ty| {
        let source = format!(
            r#"
extern "C" __global__ void __launch_bounds__(BLOCK) tamp_attn_forward_{tag}(u64 batch, u64 tokens, u64 heads, u64 hd, u32 causal, float scale, const {ty} *qkv, {ty} *y, float *lse) {{ amp_attn_forward(batch, tokens, heads, hd, causal, scale, qkv, y, lse); }}
extern "C" __global__ void tamp_attn_delta_{tag}(u64 n, u64 tokens, u64 heads, u64 hd, const {ty} *y, const {ty} *dy, float *delta) {{ amp_attn_delta(n, tokens, heads, hd, y, dy, delta); }}
extern "C" __global__ void __launch_bounds__(BLOCK) tamp_attn_dkv_{tag}(u64 batch, u64 tokens, u64 heads, u64 hd, u32 causal, u32 accumulate, float scale, const {ty} *qkv, const {ty} *dy, const float *lse, const float *delta, {ty} *dqkv) {{ amp_attn_dkv(batch, tokens, heads, hd, causal, accumulate, scale, qkv, dy, lse, delta, dqkv); }}
extern "C" __global__ void __launch_bounds__(BLOCK) tamp_attn_dq_{tag}(u64 batch, u64 tokens, u64 heads, u64 hd, u32 causal, u32 accumulate, float scale, const {ty} *qkv, const {ty} *dy, const float *lse, const float *delta, {ty} *dqkv) {{ amp_attn_dq(batch, tokens, heads, hd, causal, accumulate, scale, qkv, dy, lse, delta, dqkv); }}
"#
        );
        let names = ["attn_forward", "attn_delta", "attn_dkv", "attn_dq"]
            .map(|k| format!("tamp_{k}_{tag}"))
            .to_vec();
        (source, names)
    },
    pair: no_pair,
    arch: None,
};

fn wrong() -> CudaError {
    CudaError::Cpu(CpuError::WrongNumElements)
}

fn check(ok: bool) -> Result<(), CudaError> {
    ok.then_some(()).ok_or_else(wrong)
}

/// The CPU kernel's shape checks: non-empty heads, buffers of the right lengths; and the
/// log-sum-exps' length, `batch × heads × tokens`.
fn check_dims(d: &AttentionDims, qkv: usize, out: usize) -> Result<usize, CudaError> {
    let rows = d.batch.checked_mul(d.tokens);
    let width = d.heads.checked_mul(d.head_dim);
    let (Some(rows), Some(width)) = (rows, width) else {
        return Err(wrong());
    };
    check(
        d.heads > 0
            && d.head_dim > 0
            && width.checked_mul(3).and_then(|w3| rows.checked_mul(w3)) == Some(qkv)
            && rows.checked_mul(width) == Some(out),
    )?;
    rows.checked_mul(d.heads).ok_or_else(wrong)
}

/// One block per (tile of [`TILE`] rows, head, sequence, [`TILE`] output columns), 256 threads,
/// static shared memory only. Grids past `i32::MAX` blocks are refused.
fn tiled(d: &AttentionDims) -> Result<LaunchConfig, CudaError> {
    let blocks = d
        .tokens
        .div_ceil(TILE)
        .checked_mul(d.head_dim.div_ceil(TILE))
        .and_then(|n| n.checked_mul(d.heads))
        .and_then(|n| n.checked_mul(d.batch))
        .filter(|&n| n <= i32::MAX as usize)
        .ok_or_else(wrong)?;
    Ok(LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

impl<E: CudaElem> AttentionKernel<E> for Cuda {
    fn try_attention_forward(
        &self,
        d: AttentionDims,
        qkv: &<Self as Storage<E>>::Vec,
        y: &mut <Self as Storage<E>>::Vec,
    ) -> Result<<Self as Storage<f32>>::Vec, CudaError> {
        let (x, out) = (raw(self, &**qkv)?, raw_mut(self, &mut **y)?);
        let n = check_dims(&d, x.len, out.len)?;
        let cfg = tiled(&d)?;
        let mut lse = Storage::<f32>::try_alloc_len(self, n)?;
        let l = raw_mut(self, &mut *lse)?;
        if let Some(hd) = cuda_mma::mma_head::<E>(self, &d)? {
            cuda_mma::forward::<E>(self, &d, hd, (x, out, l))?;
            return Ok(lse);
        }
        launch_with(
            self,
            &SOURCE,
            &format!("tamp_attn_forward_{}", E::TAG),
            cfg,
            (
                d.batch as u64,
                d.tokens as u64,
                d.heads as u64,
                d.head_dim as u64,
                u32::from(d.causal),
                d.scale(),
                x.ptr,
                out.ptr,
                l.ptr,
            ),
        )?;
        Ok(lse)
    }

    fn try_attention_backward(
        &self,
        d: AttentionDims,
        qkv: &<Self as Storage<E>>::Vec,
        y: &<Self as Storage<E>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        lse: &<Self as Storage<f32>>::Vec,
        (dqkv, accumulate): (&mut <Self as Storage<E>>::Vec, bool),
    ) -> Result<(), CudaError> {
        let (x, out, dout, l) = (
            raw(self, &**qkv)?,
            raw(self, &**y)?,
            raw(self, &**dy)?,
            raw(self, &**lse)?,
        );
        let dx = raw_mut(self, &mut **dqkv)?;
        let n = check_dims(&d, x.len, out.len)?;
        check(dout.len == out.len && dx.len == x.len && l.len == n)?;
        let cfg = tiled(&d)?;
        if n == 0 {
            return Ok(());
        }
        let mut delta = Storage::<f32>::try_alloc_len(self, n)?;
        let dl = raw_mut(self, &mut *delta)?;
        launch(
            self,
            &SOURCE,
            &format!("tamp_attn_delta_{}", E::TAG),
            n,
            (
                n as u64,
                d.tokens as u64,
                d.heads as u64,
                d.head_dim as u64,
                out.ptr,
                dout.ptr,
                dl.ptr,
            ),
        )?;
        if let Some(hd) = cuda_mma::mma_head::<E>(self, &d)? {
            return cuda_mma::backward::<E>(self, &d, hd, accumulate, (x, dout, l, dl, dx));
        }
        // The two kernels write disjoint parts of each packed gradient row: K and V, then Q.
        for kernel in ["attn_dkv", "attn_dq"] {
            launch_with(
                self,
                &SOURCE,
                &format!("tamp_{kernel}_{}", E::TAG),
                cfg,
                (
                    d.batch as u64,
                    d.tokens as u64,
                    d.heads as u64,
                    d.head_dim as u64,
                    u32::from(d.causal),
                    u32::from(accumulate),
                    d.scale(),
                    x.ptr,
                    dout.ptr,
                    l.ptr,
                    dl.ptr,
                    dx.ptr,
                ),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn nvrtc_compiles_the_kernels() {
        crate::device::utilities::cuda::check_program(&super::SOURCE);
    }

    /// The host sizes the grid by `TILE`, the kernels decode their block by the source's tile
    /// sizes: they must agree.
    #[test]
    fn the_grid_and_the_kernels_agree_on_the_tile() {
        let t = super::SOURCE.templates;
        assert!(t.contains(&format!("#define AT_T {} ", super::TILE)));
        assert!(t.contains(&format!("#define AT_DC {} ", super::TILE)));
    }
}
