//! Matrix products for the fused ops' CUDA kernels, on dfdx's cuBLAS handle (so on dfdx's
//! stream): row-major operands of a 16-bit or FP32 element type, FP32 accumulation
//! (`cublasGemmEx`, `CUBLAS_COMPUTE_32F`), an output of the operands' type or FP32, rounded once
//! (the dfdx fork sets its handle's math mode so that cuBLAS's internal reductions stay in FP32
//! for 16-bit outputs too).

use cudarc::cublas::result::{gemm_ex, CublasError};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use dfdx::tensor::{CpuError, Cuda, CudaError};

fn wrong() -> CudaError {
    CudaError::Cpu(CpuError::WrongNumElements)
}

/// cuBLAS's name for an element type, by the tag of [`super::cuda::CudaElem`].
pub(crate) fn data_type(tag: &str) -> cudaDataType {
    match tag {
        "f16" => cudaDataType::CUDA_R_16F,
        "bf16" => cudaDataType::CUDA_R_16BF,
        _ => cudaDataType::CUDA_R_32F,
    }
}

/// A row-major matrix operand: a pointer, its row stride, and whether it is stored transposed
/// (then the buffer holds the operand's transpose, row-major).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Operand {
    pub(crate) ptr: u64,
    pub(crate) ld: usize,
    pub(crate) transposed: bool,
}

/// `cublasGemmEx`'s arguments, column-major.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ColMajor {
    transa: bool,
    transb: bool,
    m: usize,
    n: usize,
    k: usize,
    a: (u64, usize),
    b: (u64, usize),
    ldc: usize,
}

/// cuBLAS's arguments for the row-major `C (m × n, row stride ldc) = A (m × k) · B (k × n)`.
///
/// cuBLAS is column-major, and a row-major `r × c` matrix of row stride `ld` is, column-major,
/// its `c × r` transpose with leading dimension `ld`. So it computes `Cᵀ (n × m) = Bᵀ · Aᵀ`: its
/// first operand is `B`'s buffer, which holds `Bᵀ` column-major unless `B` is stored transposed
/// (then it holds `B`, and cuBLAS transposes it), and its second is `A`'s, likewise.
fn col_major((m, k, n): (usize, usize, usize), a: Operand, b: Operand, ldc: usize) -> ColMajor {
    ColMajor {
        transa: b.transposed,
        transb: a.transposed,
        m: n,
        n: m,
        k,
        a: (b.ptr, b.ld),
        b: (a.ptr, a.ld),
        ldc,
    }
}

/// Row-major `C = A·B + beta·C` (`beta` 0 or 1) with FP32 accumulation: `A` and `B` of element
/// type `ab_tag`, `C` of `c_tag`, every pointer on `dev` and addressing what the shapes and
/// strides reach (the callers check lengths first).
pub(crate) fn gemm(
    dev: &Cuda,
    shape: (usize, usize, usize),
    (a, b, ab_tag): (Operand, Operand, &str),
    (c, c_tag, ldc): (u64, &str, usize),
    beta: f32,
) -> Result<(), CudaError> {
    let g = col_major(shape, a, b, ldc);
    let int = |x: usize| i32::try_from(x).map_err(|_| wrong());
    let op = |t: bool| {
        if t {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        }
    };
    let (m, n, k) = (int(g.m)?, int(g.n)?, int(g.k)?);
    let (lda, ldb, ldc) = (int(g.a.1)?, int(g.b.1)?, int(g.ldc)?);
    let handle = *dev.cublas().handle();
    let alpha = 1.0f32;
    // SAFETY: the pointers are device memory of `dev` holding at least what the dimensions and
    // leading dimensions reach (checked by the callers), of the element types named; alpha and
    // beta are host FP32 values (the handle's default pointer mode, FP32 for
    // CUBLAS_COMPUTE_32F); the handle is bound to dfdx's stream, so the product runs in order
    // with the kernels around it. m, n, k > 0 (the callers handle empty products).
    unsafe {
        gemm_ex(
            handle,
            op(g.transa),
            op(g.transb),
            m,
            n,
            k,
            (&alpha as *const f32).cast(),
            g.a.0 as *const _,
            data_type(ab_tag),
            lda,
            g.b.0 as *const _,
            data_type(ab_tag),
            ldb,
            (&beta as *const f32).cast(),
            c as *mut _,
            data_type(c_tag),
            ldc,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e: CublasError| CudaError::Blas(e))
}

#[cfg(test)]
mod tests {
    use super::{col_major, ColMajor, Operand};

    /// `cublasGemmEx`'s definition on host slices (pointers are offsets into `bufs`):
    /// column-major `C = op(A)·op(B) + beta·C`.
    fn cublas_reference(g: &ColMajor, bufs: &mut [Vec<f64>], c: usize, beta: f64) {
        let at = |t: bool, ld: usize, row: usize, col: usize| {
            if t {
                col + row * ld
            } else {
                row + col * ld
            }
        };
        let mut out = bufs[c].clone();
        for i in 0..g.m {
            for j in 0..g.n {
                let mut acc = 0.0;
                for p in 0..g.k {
                    acc += bufs[g.a.0 as usize][at(g.transa, g.a.1, i, p)]
                        * bufs[g.b.0 as usize][at(g.transb, g.b.1, p, j)];
                }
                let o = &mut out[i + j * g.ldc];
                *o = acc + beta * *o;
            }
        }
        bufs[c] = out;
    }

    /// The three products of the head through `col_major` and the reference above, against
    /// the row-major products computed directly.
    #[test]
    fn column_major_arguments_compute_the_row_major_products() {
        let (rows, width, vocab) = (5, 3, 7);
        let val = |n: usize, s: f64| {
            (0..n)
                .map(|i| ((i * 7 + 3) % 11) as f64 * s - 2.0)
                .collect()
        };
        let (h, w, dl): (Vec<f64>, Vec<f64>, Vec<f64>) = (
            val(rows * width, 0.5),
            val(vocab * width, 0.25),
            val(rows * vocab, 0.125),
        );
        let old_dh: Vec<f64> = val(rows * width, 1.0);
        let old_dw: Vec<f64> = val(vocab * width, 0.75);
        // Buffers: 0 h, 1 w, 2 dlogits, 3 logits, 4 dh, 5 dw.
        let mut bufs = vec![
            h.clone(),
            w.clone(),
            dl.clone(),
            vec![9.0; rows * vocab],
            old_dh.clone(),
            old_dw.clone(),
        ];
        let op = |ptr: u64, ld: usize, transposed: bool| Operand {
            ptr,
            ld,
            transposed,
        };
        let g = col_major(
            (rows, width, vocab),
            op(0, width, false),
            op(1, width, true),
            vocab,
        );
        cublas_reference(&g, &mut bufs, 3, 0.0);
        let g = col_major(
            (rows, vocab, width),
            op(2, vocab, false),
            op(1, width, false),
            width,
        );
        cublas_reference(&g, &mut bufs, 4, 1.0);
        let g = col_major(
            (vocab, rows, width),
            op(2, vocab, true),
            op(0, width, false),
            width,
        );
        cublas_reference(&g, &mut bufs, 5, 1.0);
        for r in 0..rows {
            for v in 0..vocab {
                let want: f64 = (0..width)
                    .map(|c| h[r * width + c] * w[v * width + c])
                    .sum();
                assert_eq!(bufs[3][r * vocab + v], want, "logits[{r}][{v}]");
            }
            for c in 0..width {
                let want: f64 = (0..vocab)
                    .map(|v| dl[r * vocab + v] * w[v * width + c])
                    .sum();
                assert_eq!(
                    bufs[4][r * width + c],
                    want + old_dh[r * width + c],
                    "dh[{r}][{c}]"
                );
            }
        }
        for v in 0..vocab {
            for c in 0..width {
                let want: f64 = (0..rows)
                    .map(|r| dl[r * vocab + v] * h[r * width + c])
                    .sum();
                assert_eq!(
                    bufs[5][v * width + c],
                    want + old_dw[v * width + c],
                    "dw[{v}][{c}]"
                );
            }
        }
    }
}
