//! Matrix products for the fused ops' CUDA kernels, on dfdx's cuBLAS handle (its stream):
//! row-major operands of any precision, FP32 accumulation, an output of the operands' precision
//! or FP32 (`cublasGemmEx`), one rounding.

use cudarc::cublas::result::gemm_ex;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use dfdx::tensor::{CpuError, Cuda, CudaError};

/// cuBLAS's name for an element type, by the tag of [`super::cuda::CudaElem`].
pub(crate) fn data_type(tag: &str) -> cudaDataType {
    match tag {
        "f16" => cudaDataType::CUDA_R_16F,
        "bf16" => cudaDataType::CUDA_R_16BF,
        _ => cudaDataType::CUDA_R_32F,
    }
}

/// A row-major matrix operand on the device: its pointer, its element type's tag, its row
/// stride (elements), and whether the product reads it transposed (then it is stored as the
/// transpose of the operand the product needs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Operand<'a> {
    pub(crate) ptr: u64,
    pub(crate) tag: &'a str,
    pub(crate) ld: usize,
    pub(crate) transposed: bool,
}

/// Row-major `C (m × n, row stride ldc) = alpha · A·B + beta · C` with `A` (`m × k`) and `B`
/// (`k × n`) read from `a` and `b` as described by [`Operand`], FP32 accumulation, `C` of
/// element type `c_tag`.
///
/// cuBLAS is column-major: a row-major matrix is its transpose there, so this computes
/// `Cᵀ = Bᵀ·Aᵀ`, which needs no copies (dfdx's CUDA matmul does the same).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_rows(
    dev: &Cuda,
    (m, k, n): (usize, usize, usize),
    a: Operand<'_>,
    b: Operand<'_>,
    (c, c_tag, ldc): (u64, &str, usize),
    alpha: f32,
    beta: f32,
) -> Result<(), CudaError> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    let int = |x: usize| i32::try_from(x).map_err(|_| CudaError::Cpu(CpuError::WrongNumElements));
    let op = |t: bool| {
        if t {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        }
    };
    // Cᵀ (n × m) = op(B)ᵀ (n × k) · op(A)ᵀ (k × m): the row-major B is Bᵀ to cuBLAS, which is
    // op(B)ᵀ as stored unless B is read transposed.
    let (m_, n_, k_) = (int(n)?, int(m)?, int(k)?);
    let blas = dev.cublas();
    // SAFETY: the caller passes device pointers of this device addressing at least the
    // elements the dimensions and strides reach, of the element types named; alpha and beta are
    // host values (cuBLAS's default pointer mode, as dfdx uses it); the handle is bound to dfdx's
    // stream, so the product is ordered with the ops around it.
    unsafe {
        gemm_ex(
            *blas.handle(),
            op(b.transposed),
            op(a.transposed),
            m_,
            n_,
            k_,
            (&alpha as *const f32).cast(),
            b.ptr as *const _,
            data_type(b.tag),
            int(b.ld)?,
            a.ptr as *const _,
            data_type(a.tag),
            int(a.ld)?,
            (&beta as *const f32).cast(),
            c as *mut _,
            data_type(c_tag),
            int(ldc)?,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(CudaError::Blas)
}
