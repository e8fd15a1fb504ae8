//! FP8 matrix products on CUDA through cuBLASLt, on dfdx's stream: row-major FP8 codes (E4M3
//! or E5M2), FP32 accumulation (`CUBLAS_COMPUTE_32F`, fast accumulation off), each operand's
//! `1 / scale` applied by cuBLASLt from a device pointer (`A_SCALE_POINTER`,
//! `B_SCALE_POINTER`), an FP32 output, written or added to (`beta` 0 or 1).
//!
//! cuBLASLt's FP8 products have rules of their own, checked here before anything is queued
//! ([`Fp8GemmError`], never undefined behaviour):
//!
//! - the device's compute capability is 8.9 or above (Ada, Hopper and later);
//! - the product is "TN" in cuBLASLt's column-major terms: its first operand transposed and its
//!   second not. In row-major terms that is `C (m × n) = A (m × k) · Bᵀ`, `B` stored `n × k`:
//!   both operands with `k` along their rows. The callers keep transposed copies of the codes
//!   where a product needs the other orientation;
//! - not both operands E5M2;
//! - `k` (both operands' leading dimension) a multiple of 16, and `m` and `n` too (the output's
//!   leading dimension, and 16-byte aligned rows of the codes);
//!
//! the cuBLASLt handle is created once per device and process, and the products use no
//! workspace (the heuristic is asked for an algorithm that needs none), so nothing is
//! allocated per call but the two scale factors.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys::{
    cublasComputeType_t, cublasLtMatmulDescAttributes_t as Attr,
    cublasLtMatmulPreferenceAttributes_t as Pref, cudaDataType, cudaStream_t,
};
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceSlice};
use dfdx::tensor::{CpuError, Cuda, CudaError};

/// An FP8 format as cuBLASLt names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fp8Type {
    /// OCP E4M3 (`CUDA_R_8F_E4M3`).
    E4M3,
    /// OCP E5M2 (`CUDA_R_8F_E5M2`).
    E5M2,
}

impl Fp8Type {
    fn data_type(self) -> cudaDataType {
        match self {
            Fp8Type::E4M3 => cudaDataType::CUDA_R_8F_E4M3,
            Fp8Type::E5M2 => cudaDataType::CUDA_R_8F_E5M2,
        }
    }
}

/// Why cuBLASLt cannot run an FP8 product (the caller runs the 16-bit product instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fp8GemmError {
    /// The device's compute capability (major, minor) is below 8.9.
    Capability(i32, i32),
    /// Both operands E5M2, which cuBLASLt does not multiply.
    BothE5M2,
    /// A dimension (m, n, k) that is not a multiple of 16.
    Shape(usize, usize, usize),
}

impl std::fmt::Display for Fp8GemmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fp8GemmError::Capability(major, minor) => write!(
                f,
                "FP8 products need compute capability 8.9 or above; this GPU has {major}.{minor}"
            ),
            Fp8GemmError::BothE5M2 => write!(f, "cuBLASLt does not multiply E5M2 by E5M2"),
            Fp8GemmError::Shape(m, n, k) => write!(
                f,
                "cuBLASLt's FP8 products need every dimension a multiple of 16; this one is {m} × {k} · {k} × {n}"
            ),
        }
    }
}

/// Whether `dev` runs FP8 products (compute capability 8.9 or above).
pub(crate) fn fp8_capable(dev: &Cuda) -> Result<Result<(), Fp8GemmError>, CudaError> {
    let d = dev.cuda_device();
    let major = d.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = d.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    Ok(if (major, minor) >= (8, 9) {
        Ok(())
    } else {
        Err(Fp8GemmError::Capability(major, minor))
    })
}

/// Whether cuBLASLt multiplies an `m × k` operand of `a` by an `n × k` one of `b` (see the
/// module documentation).
pub(crate) fn qualifies(
    (m, n, k): (usize, usize, usize),
    a: Fp8Type,
    b: Fp8Type,
) -> Result<(), Fp8GemmError> {
    if a == Fp8Type::E5M2 && b == Fp8Type::E5M2 {
        return Err(Fp8GemmError::BothE5M2);
    }
    if m % 16 != 0 || n % 16 != 0 || k % 16 != 0 || m == 0 || n == 0 || k == 0 {
        return Err(Fp8GemmError::Shape(m, n, k));
    }
    Ok(())
}

/// A cuBLASLt handle; the library's handles may be used from any thread.
struct Handle(cudarc::cublaslt::sys::cublasLtHandle_t);
// SAFETY: a cuBLASLt handle is not tied to a thread (NVIDIA's documentation); it is only ever
// used under the lock below, and never destroyed (it lives as long as the process).
unsafe impl Send for Handle {}

/// One handle per device ordinal.
static HANDLES: Mutex<BTreeMap<usize, Handle>> = Mutex::new(BTreeMap::new());

fn blas(e: lt::CublasError) -> CudaError {
    // dfdx's error has cuBLAS's status type; cuBLASLt's has the same values under another
    // binding, so the status is carried over by its value.
    let code = e.0 as u32;
    let status = match code {
        1 => cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED,
        3 => cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED,
        7 => cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE,
        8 => cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_ARCH_MISMATCH,
        13 => cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_EXECUTION_FAILED,
        15 => cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
        _ => cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_INTERNAL_ERROR,
    };
    CudaError::Blas(cudarc::cublas::result::CublasError(status))
}

/// Descriptors destroyed when the product returns (on every path).
struct Descriptors {
    desc: Option<cudarc::cublaslt::sys::cublasLtMatmulDesc_t>,
    layouts: Vec<cudarc::cublaslt::sys::cublasLtMatrixLayout_t>,
    pref: Option<cudarc::cublaslt::sys::cublasLtMatmulPreference_t>,
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: each was created once by this product and is destroyed once, here; cuBLASLt
        // copies what a queued product needs, so destroying them after queueing is allowed.
        unsafe {
            if let Some(d) = self.desc.take() {
                let _ = lt::destroy_matmul_desc(d);
            }
            for l in self.layouts.drain(..) {
                let _ = lt::destroy_matrix_layout(l);
            }
            if let Some(p) = self.pref.take() {
                let _ = lt::destroy_matmul_pref(p);
            }
        }
    }
}

/// A row-major FP8 operand: codes, their format, and the `1 / scale` that turns them into
/// values.
pub(crate) struct Fp8Operand<'a> {
    pub(crate) codes: &'a CudaSlice<u8>,
    pub(crate) format: Fp8Type,
    pub(crate) inv_scale: f32,
}

/// Row-major `C (m × n, FP32) = A (m × k) · Bᵀ + beta · C`, `B` stored `n × k` (see the module
/// documentation for what qualifies), FP32 accumulation, the operands' `1 / scale` applied.
pub(crate) fn gemm_fp8(
    dev: &Cuda,
    (m, n, k): (usize, usize, usize),
    a: Fp8Operand<'_>,
    b: Fp8Operand<'_>,
    c: &mut CudaSlice<f32>,
    beta: f32,
) -> Result<Result<(), Fp8GemmError>, CudaError> {
    if let Err(e) = fp8_capable(dev)? {
        return Ok(Err(e));
    }
    if let Err(e) = qualifies((m, n, k), a.format, b.format) {
        return Ok(Err(e));
    }
    let wrong = || CudaError::Cpu(CpuError::WrongNumElements);
    if a.codes.len() < m * k || b.codes.len() < n * k || c.len() != m * n {
        return Err(wrong());
    }
    let d = dev.cuda_device();
    for owner in [a.codes.device(), b.codes.device(), c.device()] {
        super::cuda::check_device(dev, &owner)?;
    }
    // The scale factors on the device, as cuBLASLt reads them; freed in stream order after the
    // product.
    let scales = d.htod_sync_copy(&[a.inv_scale, b.inv_scale])?;
    let scale_a = *scales.device_ptr();
    let scale_b = scale_a + std::mem::size_of::<f32>() as u64;
    let mut handles = HANDLES.lock().unwrap_or_else(PoisonError::into_inner);
    let handle = match handles.get(&d.ordinal()) {
        Some(h) => h.0,
        None => {
            d.bind_to_thread()?;
            let h = lt::create_handle().map_err(blas)?;
            handles.insert(d.ordinal(), Handle(h));
            h
        }
    };
    let int = |x: usize| i64::try_from(x).map_err(|_| wrong());
    // Column-major, C (m × n) row-major is Cᵀ (n × m) with leading dimension n: cuBLASLt
    // computes Cᵀ = op(B's buffer) · op(A's buffer) where B's buffer (n × k row-major) is
    // column-major k × n, transposed ("T"), and A's (m × k row-major) is column-major k × m,
    // as it is ("N").
    let mut ds = Descriptors {
        desc: None,
        layouts: Vec::new(),
        pref: None,
    };
    ds.desc = Some(
        lt::create_matmul_desc(
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cudaDataType::CUDA_R_32F,
        )
        .map_err(blas)?,
    );
    let desc = ds.desc.unwrap_or(std::ptr::null_mut());
    let transposed: i32 = 1; // CUBLAS_OP_T
    let set = |attr: Attr, ptr: *const std::ffi::c_void, size: usize| {
        // SAFETY: `desc` is a live descriptor; `ptr` addresses `size` bytes of the attribute's
        // type (an i32 operation, a device pointer), read during the call.
        unsafe { lt::set_matmul_desc_attribute(desc, attr, ptr, size) }.map_err(blas)
    };
    set(
        Attr::CUBLASLT_MATMUL_DESC_TRANSA,
        (&transposed as *const i32).cast(),
        4,
    )?;
    set(
        Attr::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
        (&scale_b as *const u64).cast(),
        8,
    )?;
    set(
        Attr::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
        (&scale_a as *const u64).cast(),
        8,
    )?;
    // cuBLASLt's A is B's buffer (k × n column-major, ld k), its B is A's (k × m, ld k).
    let layout_a = lt::create_matrix_layout(b.format.data_type(), k as u64, n as u64, int(k)?)
        .map_err(blas)?;
    ds.layouts.push(layout_a);
    let layout_b = lt::create_matrix_layout(a.format.data_type(), k as u64, m as u64, int(k)?)
        .map_err(blas)?;
    ds.layouts.push(layout_b);
    let layout_c = lt::create_matrix_layout(cudaDataType::CUDA_R_32F, n as u64, m as u64, int(n)?)
        .map_err(blas)?;
    ds.layouts.push(layout_c);
    ds.pref = Some(lt::create_matmul_pref().map_err(blas)?);
    let pref = ds.pref.unwrap_or(std::ptr::null_mut());
    let no_workspace: u64 = 0;
    // SAFETY: `pref` is live; the attribute is a u64 byte count.
    unsafe {
        lt::set_matmul_pref_attribute(
            pref,
            Pref::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            (&no_workspace as *const u64).cast(),
            8,
        )
    }
    .map_err(blas)?;
    let heuristic =
        lt::get_matmul_algo_heuristic(handle, desc, layout_a, layout_b, layout_c, layout_c, pref)
            .map_err(blas)?;
    let alpha = 1.0f32;
    let c_ptr = *c.device_ptr_mut();
    let stream = *d.cu_stream() as cudaStream_t;
    // SAFETY: every pointer is device memory of `dev` holding what the layouts reach (lengths
    // and owners checked above; the scales live until the product has run, freed in stream
    // order); alpha and beta are host FP32 values (the descriptor's default pointer mode); C is
    // D (in place, allowed with the same layout); the algorithm is the heuristic's for these
    // descriptors and needs no workspace; the stream is dfdx's, so the product runs in order
    // with the kernels around it.
    unsafe {
        lt::matmul(
            handle,
            desc,
            (&alpha as *const f32).cast(),
            (&beta as *const f32).cast(),
            *b.codes.device_ptr() as *const _,
            layout_a,
            *a.codes.device_ptr() as *const _,
            layout_b,
            c_ptr as *const _,
            layout_c,
            c_ptr as *mut _,
            layout_c,
            &heuristic.algo,
            std::ptr::null_mut(),
            0,
            stream,
        )
    }
    .map_err(blas)?;
    drop(handles);
    drop(scales);
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::{qualifies, Fp8GemmError, Fp8Type};

    #[test]
    fn cublaslt_rules_are_checked_before_a_product() {
        use Fp8Type::{E4M3, E5M2};
        assert_eq!(qualifies((32, 16, 64), E4M3, E4M3), Ok(()));
        assert_eq!(qualifies((32, 16, 64), E5M2, E4M3), Ok(()));
        assert_eq!(qualifies((32, 16, 64), E4M3, E5M2), Ok(()));
        assert_eq!(
            qualifies((32, 16, 64), E5M2, E5M2),
            Err(Fp8GemmError::BothE5M2)
        );
        for shape in [(33, 16, 64), (32, 8, 64), (32, 16, 40), (0, 16, 16)] {
            assert_eq!(
                qualifies(shape, E4M3, E4M3),
                Err(Fp8GemmError::Shape(shape.0, shape.1, shape.2))
            );
        }
    }
}
