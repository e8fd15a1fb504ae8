//! The fused linear layer on CUDA: the products on dfdx's cuBLAS handle with FP32 accumulation
//! (`cublasGemmEx`); where a sum follows the product (the bias forward, the input's gradient
//! added to an earlier one) the product goes to an FP32 buffer and one kernel adds and rounds
//! once, as the CPU's store does (cuBLAS's `beta·C` rounds the product to a 16-bit C's type
//! first: 2⁻¹² off on an H200 for an fp16 output of 0.11 behind a product of 0.29). The weight's
//! gradient comes from an FP32-output product (never rounded to 16 bits), the bias's as
//! per-chunk column sums added in chunk order.

use cudarc::driver::LaunchConfig;
use dfdx::prelude::{Cuda, Storage};
use dfdx::tensor::{CpuError, CudaError};

use super::{LinearDims, LinearKernel};
use crate::device::utilities::cuda::{
    launch, launch_with, no_pair, raw, raw_mut, CudaElem, OpSource, BLOCK,
};
use crate::device::utilities::cuda_gemm::{gemm, Operand};
use crate::device::CastKernel;
use crate::ops::relu::ReluKernel;

/// Rows per chunk of the bias gradient's column sums.
const CHUNK: usize = 256;

const SOURCE: OpSource = OpSource {
    module: "typed_amp_linear",
    templates: r#"
// y[r, c] = round(acc[r, c] + bias[c]): the FP32 product and the bias, rounded once (as the
// CPU's store does; cuBLAS's beta·C would round the product to 16 bits before the sum).
template <typename T>
__device__ void amp_bias_store(u64 n, u64 cols, const float *acc, const T *bias, T *y) {
    FOR_EACH(i, n) store(y, i, acc[i] + load(bias, i % cols));
}

// Column sums of one chunk of rows: blockIdx.y is the chunk, threads the columns.
template <typename T>
__device__ void amp_column_sums(u64 rows, u64 cols, u64 chunk, const T *g, float *partial) {
    u64 c = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    u64 r0 = (u64)blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
    float s = 0.0f;
    for (u64 r = r0; r < r1; r++) s += load(g, r * cols + c);
    partial[blockIdx.y * cols + c] = s;
}

// The chunks' sums in chunk order into the FP32 gradient (written over a fresh one).
extern "C" __global__ void tamp_linear_reduce_columns(u64 cols, u64 chunks, const float *partial,
                                                      float *grad, int fresh) {
    u64 c = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float s = 0.0f;
    for (u64 k = 0; k < chunks; k++) s += partial[k * cols + c];
    grad[c] = fresh ? s : grad[c] + s;
}
"#,
    one: |tag, ty| {
        let source = format!(
            r#"
extern "C" __global__ void tamp_linear_bias_store_{tag}(u64 n, u64 cols, const float *acc, const {ty} *bias, {ty} *y) {{ amp_bias_store(n, cols, acc, bias, y); }}
extern "C" __global__ void tamp_linear_column_sums_{tag}(u64 rows, u64 cols, u64 chunk, const {ty} *g, float *partial) {{ amp_column_sums(rows, cols, chunk, g, partial); }}
"#
        );
        let mut names: Vec<String> = ["linear_bias_store", "linear_column_sums"]
            .map(|k| format!("tamp_{k}_{tag}"))
            .to_vec();
        // The reduction is FP32 whatever the precision: listed once, with the FP32 kernels.
        if tag == "f32" {
            names.push("tamp_linear_reduce_columns".to_string());
        }
        (source, names)
    },
    pair: no_pair,
    arch: None,
};

fn check(ok: bool) -> Result<(), CudaError> {
    ok.then_some(())
        .ok_or(CudaError::Cpu(CpuError::WrongNumElements))
}

/// Whether `rows` rows of `cols`, `rs` apart, fit a buffer of `len`.
fn fits(len: usize, rows: usize, cols: usize, rs: usize) -> bool {
    rows == 0
        || cols == 0
        || (rows - 1)
            .checked_mul(rs)
            .and_then(|x| x.checked_add(cols))
            .is_some_and(|end| end <= len)
}

impl<E: CudaElem> LinearKernel<E> for Cuda {
    fn try_linear_forward(
        &self,
        d: LinearDims,
        x: &<Self as Storage<E>>::Vec,
        x_rs: usize,
        w: &<Self as Storage<E>>::Vec,
        b: Option<&<Self as Storage<E>>::Vec>,
        y: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), CudaError> {
        let (xr, wr, yr) = (raw(self, &**x)?, raw(self, &**w)?, raw_mut(self, &mut **y)?);
        let br = b.map(|b| raw(self, &**b)).transpose()?;
        check(
            fits(xr.len, d.rows, d.inputs, x_rs)
                && wr.len == d.outputs * d.inputs
                && br.is_none_or(|b| b.len == d.outputs)
                && yr.len == d.rows * d.outputs,
        )?;
        let product = |c: (u64, &str, usize)| {
            // y (or the FP32 product) = x · Wᵀ, W stored O × I.
            gemm(
                self,
                (d.rows, d.inputs, d.outputs),
                (
                    Operand {
                        ptr: xr.ptr,
                        ld: x_rs,
                        transposed: false,
                    },
                    Operand {
                        ptr: wr.ptr,
                        ld: d.inputs,
                        transposed: true,
                    },
                    E::TAG,
                ),
                c,
                0.0,
            )
        };
        let Some(br) = br else {
            return product((yr.ptr, E::TAG, d.outputs));
        };
        let mut acc = Storage::<f32>::try_alloc_len(self, yr.len)?;
        let ar = raw_mut(self, &mut *acc)?;
        product((ar.ptr, "f32", d.outputs))?;
        launch(
            self,
            &SOURCE,
            &format!("tamp_linear_bias_store_{}", E::TAG),
            yr.len,
            (yr.len as u64, d.outputs as u64, ar.ptr, br.ptr, yr.ptr),
        )
    }

    fn try_linear_backward_bias(
        &self,
        d: LinearDims,
        relu_out: Option<&<Self as Storage<E>>::Vec>,
        dy: &mut <Self as Storage<E>>::Vec,
        db: Option<(&mut <Self as Storage<f32>>::Vec, bool)>,
    ) -> Result<(), CudaError> {
        if let Some(out) = relu_out {
            ReluKernel::<E>::try_relu_mask(self, out, dy)?;
        }
        let Some((db, fresh)) = db else {
            return Ok(());
        };
        let (g, dbr) = (raw(self, &**dy)?, raw_mut(self, &mut **db)?);
        check(g.len == d.rows * d.outputs && dbr.len == d.outputs)?;
        let chunks = d.rows.div_ceil(CHUNK).max(1);
        let mut partial = Storage::<f32>::try_alloc_len(self, chunks * d.outputs)?;
        let p = raw_mut(self, &mut *partial)?;
        let columns = d.outputs.div_ceil(BLOCK as usize) as u32;
        launch_with(
            self,
            &SOURCE,
            &format!("tamp_linear_column_sums_{}", E::TAG),
            LaunchConfig {
                grid_dim: (columns, chunks as u32, 1),
                block_dim: (BLOCK, 1, 1),
                shared_mem_bytes: 0,
            },
            (d.rows as u64, d.outputs as u64, CHUNK as u64, g.ptr, p.ptr),
        )?;
        launch_with(
            self,
            &SOURCE,
            "tamp_linear_reduce_columns",
            LaunchConfig {
                grid_dim: (columns, 1, 1),
                block_dim: (BLOCK, 1, 1),
                shared_mem_bytes: 0,
            },
            (
                d.outputs as u64,
                chunks as u64,
                p.ptr,
                dbr.ptr,
                i32::from(fresh),
            ),
        )
    }

    fn try_linear_backward_weight(
        &self,
        d: LinearDims,
        dz: &<Self as Storage<E>>::Vec,
        x: &<Self as Storage<E>>::Vec,
        x_rs: usize,
        (dw, fresh): (&mut <Self as Storage<f32>>::Vec, bool),
    ) -> Result<(), CudaError> {
        let (g, xr, dwr) = (
            raw(self, &**dz)?,
            raw(self, &**x)?,
            raw_mut(self, &mut **dw)?,
        );
        check(
            g.len == d.rows * d.outputs
                && fits(xr.len, d.rows, d.inputs, x_rs)
                && dwr.len == d.outputs * d.inputs,
        )?;
        // dW (O × I, FP32) = dzᵀ · x.
        gemm(
            self,
            (d.outputs, d.rows, d.inputs),
            (
                Operand {
                    ptr: g.ptr,
                    ld: d.outputs,
                    transposed: true,
                },
                Operand {
                    ptr: xr.ptr,
                    ld: x_rs,
                    transposed: false,
                },
                E::TAG,
            ),
            (dwr.ptr, "f32", d.inputs),
            if fresh { 0.0 } else { 1.0 },
        )
    }

    fn try_linear_backward_input(
        &self,
        d: LinearDims,
        dz: &<Self as Storage<E>>::Vec,
        w: &<Self as Storage<E>>::Vec,
        dx: &mut <Self as Storage<E>>::Vec,
        dx_rs: usize,
    ) -> Result<(), CudaError> {
        let (g, wr, dxr) = (
            raw(self, &**dz)?,
            raw(self, &**w)?,
            raw_mut(self, &mut **dx)?,
        );
        check(
            g.len == d.rows * d.outputs
                && wr.len == d.outputs * d.inputs
                && fits(dxr.len, d.rows, d.inputs, dx_rs),
        )?;
        // dx += dz · W: the product in FP32 and added with one rounding where dx is one
        // contiguous block (always, for the layers typed-amp runs), else by cuBLAS's beta.
        let contiguous = dx_rs == d.inputs && dxr.len == d.rows * d.inputs;
        let mut acc = if contiguous {
            Some(Storage::<f32>::try_alloc_len(self, dxr.len)?)
        } else {
            None
        };
        let target = match acc.as_mut() {
            Some(acc) => (raw_mut(self, &mut **acc)?.ptr, "f32", d.inputs),
            None => (dxr.ptr, E::TAG, dx_rs),
        };
        gemm(
            self,
            (d.rows, d.outputs, d.inputs),
            (
                Operand {
                    ptr: g.ptr,
                    ld: d.outputs,
                    transposed: false,
                },
                Operand {
                    ptr: wr.ptr,
                    ld: d.inputs,
                    transposed: false,
                },
                E::TAG,
            ),
            target,
            if contiguous { 0.0 } else { 1.0 },
        )?;
        match acc {
            Some(acc) => CastKernel::<f32, E>::try_add_cast(self, &acc, dx),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn nvrtc_compiles_the_kernels() {
        crate::device::utilities::cuda::check_program(&super::SOURCE);
    }
}
