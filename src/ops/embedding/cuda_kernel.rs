//! The fused embedding on CUDA, with the CPU kernel's arithmetic (so its bits):
//!
//! - forward: one thread per output element, `wte[token] + wpe[t]` in FP32 rounded once;
//! - the position table's gradient: one thread per table element, summing the batch's rows of
//!   that position in row order;
//! - the token table's gradient: a block per (table row, 256 columns), which scans the token ids
//!   256 at a time (a ballot per warp says which rows hold its token) and sums those rows in row
//!   order, one thread per column.
//!
//! Each sum starts from zero and is added to the old gradient once (written over a fresh one),
//! as on the CPU: no float atomics, the same bits on every run and on both devices. The scan
//! reads every token id once per (table row, column block): right for a character vocabulary,
//! slow for tens of thousands of tokens.
//!
//! A token id outside the vocabulary is not an error here (that would need the ids on the host,
//! a synchronisation of the stream): its output row is NaN, so the loss and the gradients are
//! non-finite, and the backward adds its row to no table row. Nothing is read out of bounds.

use cudarc::driver::{CudaSlice, DevicePtr, DeviceSlice, LaunchConfig};
use dfdx::prelude::Storage;
use dfdx::tensor::{CpuError, Cuda, CudaError};

use super::{EmbeddingDims, EmbeddingKernel};
use crate::device::utilities::cuda::{
    check_device, launch, launch_with, no_pair, raw, raw_mut, CudaElem, OpSource, Raw, BLOCK,
};

const SOURCE: OpSource = OpSource {
    module: "typed_amp_embedding",
    templates: r#"
// y[r, c] = wte[ids[r], c] + wpe[r % tokens, c]; n = rows · width.
template <typename T>
__device__ void amp_embed_forward(u64 n, u64 tokens, u64 width, u64 vocab, const u64 *ids,
                                  const T *wte, const T *wpe, T *y) {
    FOR_EACH(i, n) {
        const u64 r = i / width, c = i % width, t = ids[r], pos = r % tokens;
        const float x = t < vocab ? load(wte, t * width + c) + load(wpe, pos * width + c)
                                  : __uint_as_float(0x7fc00000u);
        store(y, i, x);
    }
}

// dwpe[p, c] (+)= Σ_b dy[b·tokens + p, c], b ascending; n = positions · width. Positions past
// the tokens add 0, as on the CPU.
template <typename T>
__device__ void amp_embed_dwpe(u64 n, u64 batch, u64 tokens, u64 width, u32 fresh, const T *dy,
                               float *dwpe) {
    FOR_EACH(i, n) {
        const u64 p = i / width, c = i % width;
        float s = 0.0f;
        if (p < tokens)
            for (u64 b = 0; b < batch; ++b) s += load(dy, (b * tokens + p) * width + c);
        dwpe[i] = (fresh ? 0.0f : dwpe[i]) + s;
    }
}

// dwte[v, c] (+)= Σ_{ids[r] = v} dy[r, c], r ascending. Block `blk` (grid-stride) is table row
// blk / tiles, columns (blk % tiles)·BLOCK + threadIdx.x. Every thread of a block takes part in
// the scan and its barriers; only those with a column add.
template <typename T>
__device__ void amp_embed_dwte(u64 rows, u64 width, u64 vocab, u32 fresh, const u64 *ids,
                               const T *dy, float *dwte) {
    __shared__ u32 hits[BLOCK / 32];
    const u64 tiles = (width + BLOCK - 1) / BLOCK;
    for (u64 blk = blockIdx.x; blk < vocab * tiles; blk += gridDim.x) {
        const u64 v = blk / tiles, c = (blk % tiles) * BLOCK + threadIdx.x;
        float s = 0.0f;
        for (u64 r0 = 0; r0 < rows; r0 += BLOCK) {
            const u64 r = r0 + threadIdx.x;
            const u32 bits = __ballot_sync(0xffffffffu, r < rows && ids[r] == v);
            __syncthreads();  // the previous scan step's readers of `hits` are done
            if (threadIdx.x % 32 == 0) hits[threadIdx.x / 32] = bits;
            __syncthreads();
            if (c < width) {
                for (u32 w = 0; w < BLOCK / 32; ++w) {
                    for (u32 m = hits[w]; m != 0; m &= m - 1) {
                        const u64 hit = r0 + w * 32 + (u32)(__ffs(m) - 1);
                        s += load(dy, hit * width + c);
                    }
                }
            }
        }
        if (c < width) {
            const u64 at = v * width + c;
            dwte[at] = (fresh ? 0.0f : dwte[at]) + s;
        }
    }
}
"#,
    one: |tag, ty| {
        let source = format!(
            r#"
extern "C" __global__ void tamp_embed_forward_{tag}(u64 n, u64 tokens, u64 width, u64 vocab, const u64 *ids, const {ty} *wte, const {ty} *wpe, {ty} *y) {{ amp_embed_forward(n, tokens, width, vocab, ids, wte, wpe, y); }}
extern "C" __global__ void tamp_embed_dwpe_{tag}(u64 n, u64 batch, u64 tokens, u64 width, u32 fresh, const {ty} *dy, float *dwpe) {{ amp_embed_dwpe(n, batch, tokens, width, fresh, dy, dwpe); }}
extern "C" __global__ void tamp_embed_dwte_{tag}(u64 rows, u64 width, u64 vocab, u32 fresh, const u64 *ids, const {ty} *dy, float *dwte) {{ amp_embed_dwte(rows, width, vocab, fresh, ids, dy, dwte); }}
"#
        );
        let names = ["embed_forward", "embed_dwpe", "embed_dwte"]
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

/// The token ids' pointer and length (`usize` is not a [`CudaElem`]).
fn raw_ids(dev: &Cuda, ids: &CudaSlice<usize>) -> Result<Raw, CudaError> {
    check_device(dev, &ids.device())?;
    Ok(Raw {
        ptr: *ids.device_ptr(),
        len: ids.len(),
    })
}

/// The CPU kernel's checks that do not read the ids: rows (returned), at most `positions`
/// tokens, one id per row, and the tables' and outputs' sizes within `usize`.
fn check_dims(d: &EmbeddingDims, ids: Raw) -> Result<usize, CudaError> {
    let rows = d.batch.checked_mul(d.tokens).ok_or_else(wrong)?;
    check(
        d.tokens <= d.positions
            && ids.len == rows
            && rows.checked_mul(d.width).is_some()
            && d.vocab.checked_mul(d.width).is_some()
            && d.positions.checked_mul(d.width).is_some(),
    )?;
    Ok(rows)
}

impl<E: CudaElem> EmbeddingKernel<E> for Cuda {
    fn try_embed_forward(
        &self,
        d: EmbeddingDims,
        tokens: &<Self as Storage<usize>>::Vec,
        wte: &<Self as Storage<E>>::Vec,
        wpe: &<Self as Storage<E>>::Vec,
        y: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), CudaError> {
        let ids = raw_ids(self, tokens)?;
        let rows = check_dims(&d, ids)?;
        let (te, pe, out) = (
            raw(self, &**wte)?,
            raw(self, &**wpe)?,
            raw_mut(self, &mut **y)?,
        );
        let w = d.width;
        check(te.len == d.vocab * w && pe.len == d.positions * w && out.len == rows * w)?;
        launch(
            self,
            &SOURCE,
            &format!("tamp_embed_forward_{}", E::TAG),
            out.len,
            (
                out.len as u64,
                d.tokens as u64,
                w as u64,
                d.vocab as u64,
                ids.ptr,
                te.ptr,
                pe.ptr,
                out.ptr,
            ),
        )
    }

    fn try_embed_backward(
        &self,
        d: EmbeddingDims,
        tokens: &<Self as Storage<usize>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        dwte: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
        dwpe: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
    ) -> Result<(), CudaError> {
        let ids = raw_ids(self, tokens)?;
        let rows = check_dims(&d, ids)?;
        let g = raw(self, &**dy)?;
        let w = d.width;
        let te = match dwte {
            Some((buf, fresh)) => Some((raw_mut(self, &mut **buf)?, fresh)),
            None => None,
        };
        let pe = match dwpe {
            Some((buf, fresh)) => Some((raw_mut(self, &mut **buf)?, fresh)),
            None => None,
        };
        check(
            g.len == rows * w
                && te.is_none_or(|(t, _)| t.len == d.vocab * w)
                && pe.is_none_or(|(p, _)| p.len == d.positions * w),
        )?;
        if let Some((t, fresh)) = te {
            let tiles = w.div_ceil(BLOCK as usize);
            // Grid-stride over (table row, column block); none for an empty table.
            let blocks = d.vocab.saturating_mul(tiles).min(65_535) as u32;
            launch_with(
                self,
                &SOURCE,
                &format!("tamp_embed_dwte_{}", E::TAG),
                LaunchConfig {
                    grid_dim: (blocks, 1, 1),
                    block_dim: (BLOCK, 1, 1),
                    shared_mem_bytes: 0,
                },
                (
                    rows as u64,
                    w as u64,
                    d.vocab as u64,
                    u32::from(fresh),
                    ids.ptr,
                    g.ptr,
                    t.ptr,
                ),
            )?;
        }
        if let Some((p, fresh)) = pe {
            launch(
                self,
                &SOURCE,
                &format!("tamp_embed_dwpe_{}", E::TAG),
                p.len,
                (
                    p.len as u64,
                    d.batch as u64,
                    d.tokens as u64,
                    w as u64,
                    u32::from(fresh),
                    g.ptr,
                    p.ptr,
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
}
