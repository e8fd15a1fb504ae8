//! The fused layer norm on CUDA: one warp per row (statistics by warp shuffles, in FP32, two
//! passes: the mean, then the squared deviations from it), the parameters' gradients as
//! per-chunk column sums added in chunk order (deterministic, no atomics).

use cudarc::driver::LaunchConfig;
use dfdx::prelude::{Cuda, Storage};
use dfdx::tensor::{CpuError, CudaError};

use super::{MixedLayerNormKernel, RowStats};
use crate::device::utilities::cuda::{
    launch_with, no_pair, raw, raw_mut, CudaElem, OpSource, BLOCK,
};

/// Rows per chunk of the parameters' gradient sums.
const CHUNK: usize = 256;

const SOURCE: OpSource = OpSource {
    module: "typed_amp_layernorm",
    templates: r#"
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// One warp per row, BLOCK / 32 rows per block. A beta pointer of 0 means no bias.
template <typename T>
__device__ void amp_ln_forward(u64 rows, u64 width, const T *x, T *y, const float *gamma,
                               const float *beta, float eps, float *mean, float *rstd) {
    u64 row = (u64)blockIdx.x * (BLOCK / 32) + threadIdx.x / 32;
    unsigned lane = threadIdx.x % 32;
    if (row >= rows) return;
    u64 at = row * width;
    float s = 0.0f;
    for (u64 c = lane; c < width; c += 32) s += load(x, at + c);
    float m = warp_sum(s) / (float)width;
    float v = 0.0f;
    for (u64 c = lane; c < width; c += 32) { float d = load(x, at + c) - m; v += d * d; }
    float r = 1.0f / sqrtf(warp_sum(v) / (float)width + eps);
    for (u64 c = lane; c < width; c += 32) {
        float b = beta ? beta[c] : 0.0f;
        store(y, at + c, (load(x, at + c) - m) * r * gamma[c] + b);
    }
    if (lane == 0) { mean[row] = m; rstd[row] = r; }
}

// The input's gradient, one warp per row: dx = rstd·(g − mean(g) − x̂·mean(g·x̂)), g = dy·γ.
template <typename T>
__device__ void amp_ln_backward_input(u64 rows, u64 width, const T *x, const T *dy, T *gx,
                                      int accumulate, const float *gamma, const float *mean,
                                      const float *rstd) {
    u64 row = (u64)blockIdx.x * (BLOCK / 32) + threadIdx.x / 32;
    unsigned lane = threadIdx.x % 32;
    if (row >= rows) return;
    u64 at = row * width;
    float m = mean[row], r = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (u64 c = lane; c < width; c += 32) {
        float xh = (load(x, at + c) - m) * r;
        float g = load(dy, at + c) * gamma[c];
        sg += g;
        sgx += g * xh;
    }
    float mg = warp_sum(sg) / (float)width, mgx = warp_sum(sgx) / (float)width;
    for (u64 c = lane; c < width; c += 32) {
        float xh = (load(x, at + c) - m) * r;
        float g = load(dy, at + c) * gamma[c];
        float d = r * (g - mg - xh * mgx);
        if (accumulate) d += load(gx, at + c);
        store(gx, at + c, d);
    }
}

// Column sums of dy·x̂ and dy over one chunk of rows: blockIdx.y is the chunk, threads the
// columns. partial is chunks × 2 × width.
template <typename T>
__device__ void amp_ln_backward_params(u64 rows, u64 width, u64 chunk, const T *x, const T *dy,
                                       const float *mean, const float *rstd, float *partial) {
    u64 c = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    u64 r0 = (u64)blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
    float dg = 0.0f, db = 0.0f;
    for (u64 r = r0; r < r1; r++) {
        float g = load(dy, r * width + c);
        dg += g * (load(x, r * width + c) - mean[r]) * rstd[r];
        db += g;
    }
    partial[blockIdx.y * 2 * width + c] = dg;
    partial[blockIdx.y * 2 * width + width + c] = db;
}

// The chunks' sums added in chunk order into the FP32 gradients (written over a fresh one);
// a null gradient pointer is skipped.
extern "C" __global__ void tamp_ln_reduce_params(u64 width, u64 chunks, const float *partial,
                                                 float *dgamma, int gamma_fresh, float *dbeta,
                                                 int beta_fresh) {
    u64 c = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    float dg = 0.0f, db = 0.0f;
    for (u64 k = 0; k < chunks; k++) {
        dg += partial[k * 2 * width + c];
        db += partial[k * 2 * width + width + c];
    }
    if (dgamma) dgamma[c] = gamma_fresh ? dg : dgamma[c] + dg;
    if (dbeta) dbeta[c] = beta_fresh ? db : dbeta[c] + db;
}
"#,
    one: |tag, ty| {
        let source = format!(
            r#"
extern "C" __global__ void tamp_ln_forward_{tag}(u64 rows, u64 width, const {ty} *x, {ty} *y, const float *gamma, const float *beta, float eps, float *mean, float *rstd) {{ amp_ln_forward(rows, width, x, y, gamma, beta, eps, mean, rstd); }}
extern "C" __global__ void tamp_ln_backward_input_{tag}(u64 rows, u64 width, const {ty} *x, const {ty} *dy, {ty} *gx, int accumulate, const float *gamma, const float *mean, const float *rstd) {{ amp_ln_backward_input(rows, width, x, dy, gx, accumulate, gamma, mean, rstd); }}
extern "C" __global__ void tamp_ln_backward_params_{tag}(u64 rows, u64 width, u64 chunk, const {ty} *x, const {ty} *dy, const float *mean, const float *rstd, float *partial) {{ amp_ln_backward_params(rows, width, chunk, x, dy, mean, rstd, partial); }}
"#
        );
        let mut names: Vec<String> = ["ln_forward", "ln_backward_input", "ln_backward_params"]
            .map(|k| format!("tamp_{k}_{tag}"))
            .to_vec();
        // The reduction is FP32 whatever the precision: listed once, with the FP32 kernels.
        if tag == "f32" {
            names.push("tamp_ln_reduce_params".to_string());
        }
        (source, names)
    },
    pair: no_pair,
    arch: None,
};

fn wrong() -> CudaError {
    CudaError::Cpu(CpuError::WrongNumElements)
}

/// A launch of one warp per row.
fn rows_config(rows: usize) -> LaunchConfig {
    let per_block = (BLOCK / 32) as usize;
    LaunchConfig {
        grid_dim: (rows.div_ceil(per_block) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl<E: CudaElem> MixedLayerNormKernel<E> for Cuda {
    fn try_ln_forward(
        &self,
        width: usize,
        x: &<Self as Storage<E>>::Vec,
        y: &mut <Self as Storage<E>>::Vec,
        gamma: &<Self as Storage<f32>>::Vec,
        beta: Option<&<Self as Storage<f32>>::Vec>,
        epsilon: f64,
    ) -> Result<RowStats<Self>, CudaError> {
        let (xr, yr, g) = (
            raw(self, &**x)?,
            raw_mut(self, &mut **y)?,
            raw(self, &**gamma)?,
        );
        let b = beta.map(|b| raw(self, &**b)).transpose()?;
        if width == 0
            || xr.len % width != 0
            || yr.len != xr.len
            || g.len != width
            || b.is_some_and(|b| b.len != width)
        {
            return Err(wrong());
        }
        let rows = xr.len / width;
        let mut stats = RowStats::<Self> {
            mean: Storage::<f32>::try_alloc_len(self, rows)?,
            rstd: Storage::<f32>::try_alloc_len(self, rows)?,
        };
        let (m, r) = (
            raw_mut(self, &mut *stats.mean)?,
            raw_mut(self, &mut *stats.rstd)?,
        );
        launch_with(
            self,
            &SOURCE,
            &format!("tamp_ln_forward_{}", E::TAG),
            rows_config(rows),
            (
                rows as u64,
                width as u64,
                xr.ptr,
                yr.ptr,
                g.ptr,
                b.map_or(0, |b| b.ptr),
                epsilon as f32,
                m.ptr,
                r.ptr,
            ),
        )?;
        Ok(stats)
    }

    fn try_ln_backward(
        &self,
        width: usize,
        x: &<Self as Storage<E>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        gx: Option<(&mut <Self as Storage<E>>::Vec, bool)>,
        gamma: &<Self as Storage<f32>>::Vec,
        stats: &RowStats<Self>,
        dgamma: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
        dbeta: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
    ) -> Result<(), CudaError> {
        let (xr, dyr, g) = (raw(self, &**x)?, raw(self, &**dy)?, raw(self, &**gamma)?);
        let (m, r) = (raw(self, &*stats.mean)?, raw(self, &*stats.rstd)?);
        if width == 0 || xr.len % width != 0 || dyr.len != xr.len || g.len != width {
            return Err(wrong());
        }
        let rows = xr.len / width;
        if m.len != rows || r.len != rows {
            return Err(wrong());
        }
        if let Some((gx, accumulate)) = gx {
            let gxr = raw_mut(self, &mut **gx)?;
            if gxr.len != xr.len {
                return Err(wrong());
            }
            launch_with(
                self,
                &SOURCE,
                &format!("tamp_ln_backward_input_{}", E::TAG),
                rows_config(rows),
                (
                    rows as u64,
                    width as u64,
                    xr.ptr,
                    dyr.ptr,
                    gxr.ptr,
                    i32::from(accumulate),
                    g.ptr,
                    m.ptr,
                    r.ptr,
                ),
            )?;
        }
        if dgamma.is_none() && dbeta.is_none() {
            return Ok(());
        }
        let chunks = rows.div_ceil(CHUNK).max(1);
        let mut partial = Storage::<f32>::try_alloc_len(self, chunks * 2 * width)?;
        let p = raw_mut(self, &mut *partial)?;
        let columns = width.div_ceil(BLOCK as usize) as u32;
        launch_with(
            self,
            &SOURCE,
            &format!("tamp_ln_backward_params_{}", E::TAG),
            LaunchConfig {
                grid_dim: (columns, chunks as u32, 1),
                block_dim: (BLOCK, 1, 1),
                shared_mem_bytes: 0,
            },
            (
                rows as u64,
                width as u64,
                CHUNK as u64,
                xr.ptr,
                dyr.ptr,
                m.ptr,
                r.ptr,
                p.ptr,
            ),
        )?;
        let grad =
            |g: Option<(&mut <Self as Storage<f32>>::Vec, bool)>| -> Result<(u64, i32), CudaError> {
                match g {
                    Some((g, fresh)) => {
                        let gr = raw_mut(self, &mut **g)?;
                        if gr.len != width {
                            return Err(wrong());
                        }
                        Ok((gr.ptr, i32::from(fresh)))
                    }
                    None => Ok((0, 0)),
                }
            };
        let ((dg, dg_fresh), (db, db_fresh)) = (grad(dgamma)?, grad(dbeta)?);
        launch_with(
            self,
            &SOURCE,
            "tamp_ln_reduce_params",
            LaunchConfig {
                grid_dim: (columns, 1, 1),
                block_dim: (BLOCK, 1, 1),
                shared_mem_bytes: 0,
            },
            (
                width as u64,
                chunks as u64,
                p.ptr,
                dg,
                dg_fresh,
                db,
                db_fresh,
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
