#include "cuda_utils.cuh"

#define CMP_OP(TYPENAME, FWD, SCALAR_FWD, SYMBOL) \
extern "C" __global__ void FWD( \
    const size_t numel, \
    const size_t num_dims, \
    const Dims dims_arg, \
    const TYPENAME *lhs, \
    const Dims lhs_strides_arg, \
    const TYPENAME *rhs, \
    const Dims rhs_strides_arg, \
    bool *out, \
    const Dims out_strides_arg \
) { \
    const size_t *dims = dims_arg.v; /* typed-amp patch */ \
    const size_t *lhs_strides = lhs_strides_arg.v; /* typed-amp patch */ \
    const size_t *rhs_strides = rhs_strides_arg.v; /* typed-amp patch */ \
    const size_t *out_strides = out_strides_arg.v; /* typed-amp patch */ \
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < numel; i += blockDim.x * gridDim.x) { \
        unsigned int lhs_i = get_strided_index(i, num_dims, dims, lhs_strides); \
        unsigned int rhs_i = get_strided_index(i, num_dims, dims, rhs_strides); \
        unsigned int out_i = get_strided_index(i, num_dims, dims, out_strides); \
        out[out_i] = lhs[lhs_i] SYMBOL rhs[rhs_i]; \
    } \
} \
\
extern "C" __global__ void SCALAR_FWD( \
    const size_t numel, \
    const size_t num_dims, \
    const Dims dims_arg, \
    const TYPENAME *lhs, \
    const Dims lhs_strides_arg, \
    TYPENAME scalar, \
    bool *out, \
    const Dims out_strides_arg \
) { \
    const size_t *dims = dims_arg.v; /* typed-amp patch */ \
    const size_t *lhs_strides = lhs_strides_arg.v; /* typed-amp patch */ \
    const size_t *out_strides = out_strides_arg.v; /* typed-amp patch */ \
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < numel; i += blockDim.x * gridDim.x) { \
        unsigned int lhs_i = get_strided_index(i, num_dims, dims, lhs_strides); \
        unsigned int out_i = get_strided_index(i, num_dims, dims, out_strides); \
        out[out_i] = lhs[lhs_i] SYMBOL scalar; \
    } \
}

CMP_OP(__half, eq_fwd_f16, scalar_eq_fwd_f16, ==)
CMP_OP(__half, ne_fwd_f16, scalar_ne_fwd_f16, !=)
CMP_OP(__half, gt_fwd_f16, scalar_gt_fwd_f16, >)
CMP_OP(__half, ge_fwd_f16, scalar_ge_fwd_f16, >=)
CMP_OP(__half, lt_fwd_f16, scalar_lt_fwd_f16, <)
CMP_OP(__half, le_fwd_f16, scalar_le_fwd_f16, <=)

CMP_OP(float, eq_fwd_f32, scalar_eq_fwd_f32, ==)
CMP_OP(float, ne_fwd_f32, scalar_ne_fwd_f32, !=)
CMP_OP(float, gt_fwd_f32, scalar_gt_fwd_f32, >)
CMP_OP(float, ge_fwd_f32, scalar_ge_fwd_f32, >=)
CMP_OP(float, lt_fwd_f32, scalar_lt_fwd_f32, <)
CMP_OP(float, le_fwd_f32, scalar_le_fwd_f32, <=)

CMP_OP(double, eq_fwd_f64, scalar_eq_fwd_f64, ==)
CMP_OP(double, ne_fwd_f64, scalar_ne_fwd_f64, !=)
CMP_OP(double, gt_fwd_f64, scalar_gt_fwd_f64, >)
CMP_OP(double, ge_fwd_f64, scalar_ge_fwd_f64, >=)
CMP_OP(double, lt_fwd_f64, scalar_lt_fwd_f64, <)
CMP_OP(double, le_fwd_f64, scalar_le_fwd_f64, <=)

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
CMP_OP(__nv_bfloat16, eq_fwd_bf16, scalar_eq_fwd_bf16, ==)
CMP_OP(__nv_bfloat16, ne_fwd_bf16, scalar_ne_fwd_bf16, !=)
CMP_OP(__nv_bfloat16, gt_fwd_bf16, scalar_gt_fwd_bf16, >)
CMP_OP(__nv_bfloat16, ge_fwd_bf16, scalar_ge_fwd_bf16, >=)
CMP_OP(__nv_bfloat16, lt_fwd_bf16, scalar_lt_fwd_bf16, <)
CMP_OP(__nv_bfloat16, le_fwd_bf16, scalar_le_fwd_bf16, <=)
#endif // typed-amp patch: bf16
