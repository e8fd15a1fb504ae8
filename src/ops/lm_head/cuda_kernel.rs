//! The fused head on CUDA: the three products on cuBLAS (dfdx's handle, so on dfdx's stream)
//! with FP32 accumulation: the logits and the weight's gradient stored in FP32, the hidden
//! states' gradient in `E` (rounded once: reductions inside cuBLAS stay in FP32); the
//! cross-entropy one warp per row, the mean loss summed by one block in f64 in row order (no
//! float atomics), the logits' gradient one thread per element with the loss's gradient read on
//! the device.
//!
//! A target outside the vocabulary cannot be an error here without copying the targets to the
//! host (a synchronisation of the stream in the middle of every step): the kernels check each
//! target before reading the logit it names, and a bad one makes its row's loss term and its
//! whole row of the logits' gradient NaN. The loss is then NaN and the step's gradients
//! non-finite, which the scaler's check (or the caller's) sees; nothing is read out of bounds.
//! The CPU, whose targets are on the host anyway, returns an error instead. Targets come from
//! the data pipeline, which is where they should be validated.

use cudarc::driver::{CudaSlice, DevicePtr, DeviceSlice, LaunchConfig};
use dfdx::prelude::Storage;
use dfdx::tensor::{CpuError, Cuda, CudaError};

use super::{LmHeadDims, LmHeadKernel};
use crate::device::utilities::cuda::{
    check_device, launch, launch_with, raw, raw_mut, CudaElem, OpSource, Raw, BLOCK,
};
use crate::device::utilities::cuda_gemm::{gemm, Operand};
use crate::device::CastKernel;

const SOURCE: OpSource = OpSource {
    module: "typed_amp_lm_head",
    templates: r#"
#define CE_NAN __uint_as_float(0x7fc00000u)
#define CE_NEG_INF __uint_as_float(0xff800000u)

// One warp per row (BLOCK / 32 rows per block, grid-stride over rows): the row's maximum
// (fmaxf skips NaN), the sum of exp(x − max) in f64 (NaN and inf propagate), lse = max +
// (float)log(sum) as the CPU computes it; the row's loss term lse − logit[target] into
// `terms`, NaN for a target outside the vocabulary (whose logit is not read).
extern "C" __global__ void tamp_ce_forward(u64 rows, u64 vocab, const float *logits,
                                           const u64 *targets, float *lse, float *terms) {
    const u32 lane = threadIdx.x % 32;
    const u64 warps = (u64)gridDim.x * (BLOCK / 32);
    for (u64 r = (u64)blockIdx.x * (BLOCK / 32) + threadIdx.x / 32; r < rows; r += warps) {
        const float *row = logits + r * vocab;
        float mx = CE_NEG_INF;
        for (u64 v = lane; v < vocab; v += 32) mx = fmaxf(mx, row[v]);
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        double sum = 0.0;
        for (u64 v = lane; v < vocab; v += 32) sum += (double)expf(row[v] - mx);
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane == 0) {
            const float l = mx + (float)log(sum);
            const u64 t = targets[r];
            lse[r] = l;
            terms[r] = t < vocab ? l - row[t] : CE_NAN;
        }
    }
}

// The mean of the rows' terms, by one block: per-thread f64 sums over a fixed stride, then a
// tree; the same order on every run. `loss[0]` = (float)(sum / max(rows, 1)).
extern "C" __global__ void tamp_ce_mean(u64 rows, const float *terms, float *loss) {
    __shared__ double part[BLOCK];
    double acc = 0.0;
    for (u64 r = threadIdx.x; r < rows; r += BLOCK) acc += (double)terms[r];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (u32 s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) loss[0] = (float)(part[0] / (double)(rows > 0 ? rows : 1));
}

// dlogits = (g / rows_f)·(exp(x − lse) − onehot(target)), one element per thread, rounded
// once to T; a row whose target is outside the vocabulary is NaN throughout.
template <typename T>
__device__ void amp_ce_backward(u64 rows, u64 vocab, float rows_f, const float *logits,
                                const float *lse, const u64 *targets, const float *g,
                                T *dlogits) {
    const float weight = g[0] / rows_f;
    FOR_EACH(i, rows * vocab) {
        const u64 r = i / vocab, v = i % vocab, t = targets[r];
        float p = expf(logits[i] - lse[r]);
        if (v == t) p -= 1.0f;
        p *= weight;
        store(dlogits, i, t < vocab ? p : CE_NAN);
    }
}
"#,
    one: |tag, ty| {
        let source = format!(
            r#"
extern "C" __global__ void tamp_ce_backward_{tag}(u64 rows, u64 vocab, float rows_f, const float *logits, const float *lse, const u64 *targets, const float *g, {ty} *dlogits) {{ amp_ce_backward(rows, vocab, rows_f, logits, lse, targets, g, dlogits); }}
"#
        );
        let mut names = vec![format!("tamp_ce_backward_{tag}")];
        // The forward's two kernels do not depend on the precision: they are in the templates,
        // compiled once, and listed once (with the first precision's names).
        if tag == "f32" {
            names.extend(["tamp_ce_forward", "tamp_ce_mean"].map(String::from));
        }
        (source, names)
    },
    pair: crate::device::utilities::cuda::no_pair,
    arch: None,
};

fn wrong() -> CudaError {
    CudaError::Cpu(CpuError::WrongNumElements)
}

fn check(ok: bool) -> Result<(), CudaError> {
    ok.then_some(()).ok_or_else(wrong)
}

/// The buffers' lengths, `rows × width` and `rows × vocab`, as the CPU kernel checks them.
fn check_dims(d: &LmHeadDims) -> Result<(usize, usize), CudaError> {
    let hidden = d.rows.checked_mul(d.width);
    let logits = d.rows.checked_mul(d.vocab);
    match (hidden, logits, d.vocab.checked_mul(d.width)) {
        (Some(h), Some(l), Some(_)) if d.vocab > 0 => Ok((h, l)),
        _ => Err(wrong()),
    }
}

/// The token ids' pointer and length (`usize` is not a [`CudaElem`]).
fn raw_ids(dev: &Cuda, ids: &CudaSlice<usize>) -> Result<Raw, CudaError> {
    check_device(dev, &ids.device())?;
    Ok(Raw {
        ptr: *ids.device_ptr(),
        len: ids.len(),
    })
}

/// One warp per row, at most 65,535 blocks (the kernel strides over the rest).
fn warp_rows(rows: usize) -> LaunchConfig {
    let per_block = (BLOCK / 32) as usize;
    LaunchConfig {
        grid_dim: (rows.div_ceil(per_block).min(65_535) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl<E: CudaElem> LmHeadKernel<E> for Cuda {
    fn try_head_logits(
        &self,
        d: LmHeadDims,
        h: &<Self as Storage<E>>::Vec,
        w: &<Self as Storage<E>>::Vec,
        logits: &mut <Self as Storage<f32>>::Vec,
    ) -> Result<(), CudaError> {
        let (hidden, n) = check_dims(&d)?;
        let (hr, wr, lr) = (
            raw(self, &**h)?,
            raw(self, &**w)?,
            raw_mut(self, &mut **logits)?,
        );
        check(hr.len == hidden && wr.len == d.vocab * d.width && lr.len == n)?;
        if n == 0 {
            return Ok(());
        }
        if d.width == 0 {
            // Empty dot products.
            return Ok(self.cuda_device().memset_zeros(&mut **logits)?);
        }
        // logits (rows × vocab) = h (rows × width) · wᵀ, wᵀ stored as w (vocab × width).
        gemm(
            self,
            (d.rows, d.width, d.vocab),
            (
                Operand {
                    ptr: hr.ptr,
                    ld: d.width,
                    transposed: false,
                },
                Operand {
                    ptr: wr.ptr,
                    ld: d.width,
                    transposed: true,
                },
                E::TAG,
            ),
            (lr.ptr, "f32", d.vocab),
            0.0,
        )
    }

    fn try_cross_entropy_forward(
        &self,
        d: LmHeadDims,
        logits: &<Self as Storage<f32>>::Vec,
        targets: &<Self as Storage<usize>>::Vec,
        loss: &mut <Self as Storage<f32>>::Vec,
        lse: &mut <Self as Storage<f32>>::Vec,
    ) -> Result<(), CudaError> {
        let (_, n) = check_dims(&d)?;
        let (lg, t) = (raw(self, &**logits)?, raw_ids(self, targets)?);
        let (ls, se) = (raw_mut(self, &mut **loss)?, raw_mut(self, &mut **lse)?);
        check(lg.len == n && t.len == d.rows && ls.len == 1 && se.len == d.rows)?;
        let mut terms = Storage::<f32>::try_alloc_len(self, d.rows)?;
        let tm = raw_mut(self, &mut *terms)?;
        launch_with(
            self,
            &SOURCE,
            "tamp_ce_forward",
            warp_rows(d.rows),
            (d.rows as u64, d.vocab as u64, lg.ptr, t.ptr, se.ptr, tm.ptr),
        )?;
        // One block, whatever the rows (none: a loss of 0, as on the CPU).
        launch_with(
            self,
            &SOURCE,
            "tamp_ce_mean",
            LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (BLOCK, 1, 1),
                shared_mem_bytes: 0,
            },
            (d.rows as u64, tm.ptr, ls.ptr),
        )
    }

    fn try_cross_entropy_backward(
        &self,
        d: LmHeadDims,
        logits: &<Self as Storage<f32>>::Vec,
        lse: &<Self as Storage<f32>>::Vec,
        targets: &<Self as Storage<usize>>::Vec,
        g: &<Self as Storage<f32>>::Vec,
        dlogits: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), CudaError> {
        let (_, n) = check_dims(&d)?;
        let (lg, se, t, gr) = (
            raw(self, &**logits)?,
            raw(self, &**lse)?,
            raw_ids(self, targets)?,
            raw(self, &**g)?,
        );
        let dl = raw_mut(self, &mut **dlogits)?;
        check(lg.len == n && dl.len == n && t.len == d.rows && se.len == d.rows && gr.len == 1)?;
        // The CPU's divisor, `rows.max(1) as f32`.
        let rows_f = d.rows.max(1) as f32;
        launch(
            self,
            &SOURCE,
            &format!("tamp_ce_backward_{}", E::TAG),
            n,
            (
                d.rows as u64,
                d.vocab as u64,
                rows_f,
                lg.ptr,
                se.ptr,
                t.ptr,
                gr.ptr,
                dl.ptr,
            ),
        )
    }

    fn try_head_backward(
        &self,
        d: LmHeadDims,
        dlogits: &<Self as Storage<E>>::Vec,
        h: &<Self as Storage<E>>::Vec,
        w: &<Self as Storage<E>>::Vec,
        dh: Option<(&mut <Self as Storage<E>>::Vec, bool)>,
        dw: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
    ) -> Result<(), CudaError> {
        let (hidden, n) = check_dims(&d)?;
        let (dl, hr, wr) = (raw(self, &**dlogits)?, raw(self, &**h)?, raw(self, &**w)?);
        check(dl.len == n && hr.len == hidden && wr.len == d.vocab * d.width)?;
        let (dh, dh_buf) = match dh {
            Some((g, accumulate)) => {
                let r = raw_mut(self, &mut **g)?;
                (Some((r, accumulate)), Some((g, accumulate)))
            }
            None => (None, None),
        };
        let dw = match dw {
            Some((g, fresh)) => Some((raw_mut(self, &mut **g)?, fresh, g)),
            None => None,
        };
        // Every length checked before anything is launched.
        check(
            dh.is_none_or(|(g, _)| g.len == hidden)
                && dw
                    .as_ref()
                    .is_none_or(|(g, _, _)| g.len == d.vocab * d.width),
        )?;
        if let Some((g, accumulate)) = dh {
            // dh (rows × width) = dlogits (rows × vocab) · w (vocab × width); vocab > 0. Added
            // to an earlier gradient, the product goes to FP32 first and the sum is rounded once
            // (cuBLAS's beta·C would round the product to dh's type before the sum).
            if d.rows > 0 && d.width > 0 {
                let mut acc = if accumulate {
                    Some(Storage::<f32>::try_alloc_len(self, g.len)?)
                } else {
                    None
                };
                let target = match acc.as_mut() {
                    Some(acc) => (raw_mut(self, &mut **acc)?.ptr, "f32", d.width),
                    None => (g.ptr, E::TAG, d.width),
                };
                gemm(
                    self,
                    (d.rows, d.vocab, d.width),
                    (
                        Operand {
                            ptr: dl.ptr,
                            ld: d.vocab,
                            transposed: false,
                        },
                        Operand {
                            ptr: wr.ptr,
                            ld: d.width,
                            transposed: false,
                        },
                        E::TAG,
                    ),
                    target,
                    0.0,
                )?;
                if let (Some(acc), Some((dh, _))) = (acc, dh_buf) {
                    CastKernel::<f32, E>::try_add_cast(self, &acc, dh)?;
                }
            }
        }
        if let Some((g, fresh, buf)) = dw {
            if g.len == 0 {
                return Ok(());
            }
            if d.rows == 0 {
                // No terms: a fresh gradient is zero, an old one unchanged.
                if fresh {
                    self.cuda_device().memset_zeros(&mut **buf)?;
                }
                return Ok(());
            }
            // dw (vocab × width) = dlogitsᵀ (vocab × rows) · h (rows × width), dlogitsᵀ
            // stored as dlogits (rows × vocab). FP32, added to the old gradient unless fresh.
            gemm(
                self,
                (d.vocab, d.rows, d.width),
                (
                    Operand {
                        ptr: dl.ptr,
                        ld: d.vocab,
                        transposed: true,
                    },
                    Operand {
                        ptr: hr.ptr,
                        ld: d.width,
                        transposed: false,
                    },
                    E::TAG,
                ),
                (g.ptr, "f32", d.width),
                if fresh { 0.0 } else { 1.0 },
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
