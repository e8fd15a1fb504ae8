#include "cuda_utils.cuh"

template<typename T>
__device__ void choose_fwd(
    const size_t numel,
    const size_t num_dims,
    const size_t *dims,
    const bool *cond,
    const size_t *cond_strides,
    const T *lhs,
    const size_t *lhs_strides,
    const T *rhs,
    const size_t *rhs_strides,
    T *out
) {
    for (unsigned int out_i = blockIdx.x * blockDim.x + threadIdx.x; out_i < numel; out_i += blockDim.x * gridDim.x) {
        unsigned int lhs_i = get_strided_index(out_i, num_dims, dims, lhs_strides);
        unsigned int rhs_i = get_strided_index(out_i, num_dims, dims, rhs_strides);
        unsigned int cond_i = get_strided_index(out_i, num_dims, dims, cond_strides);
        out[out_i] = cond[cond_i] ? lhs[lhs_i] : rhs[rhs_i];
    }
}

template<typename T>
__device__ void choose_bwd(
    const size_t numel,
    const size_t num_dims,
    const size_t *dims,
    const bool *cond,
    const size_t *cond_strides,
    T *grad_lhs,
    const size_t *lhs_strides,
    T *grad_rhs,
    const size_t *rhs_strides,
    const T *grad_out
) {
    for (unsigned int out_i = blockIdx.x * blockDim.x + threadIdx.x; out_i < numel; out_i += blockDim.x * gridDim.x) {
        unsigned int lhs_i = get_strided_index(out_i, num_dims, dims, lhs_strides);
        unsigned int rhs_i = get_strided_index(out_i, num_dims, dims, rhs_strides);
        unsigned int cond_i = get_strided_index(out_i, num_dims, dims, cond_strides);
        atomicAdd(cond[cond_i] ? grad_lhs + lhs_i : grad_rhs + rhs_i, grad_out[out_i]);
    }
}

#define CHOOSE(TYPENAME, FWD, BWD) \
extern "C" __global__ void FWD( \
    const size_t numel, \
    const size_t num_dims, \
    const Dims dims_arg, \
    const bool *cond, \
    const Dims cond_strides_arg, \
    const TYPENAME *lhs, \
    const Dims lhs_strides_arg, \
    const TYPENAME *rhs, \
    const Dims rhs_strides_arg, \
    TYPENAME *out \
) { \
    const size_t *dims = dims_arg.v; /* typed-amp patch */ \
    const size_t *cond_strides = cond_strides_arg.v; /* typed-amp patch */ \
    const size_t *lhs_strides = lhs_strides_arg.v; /* typed-amp patch */ \
    const size_t *rhs_strides = rhs_strides_arg.v; /* typed-amp patch */ \
    choose_fwd(numel, num_dims, dims, cond, cond_strides, lhs, lhs_strides, rhs, rhs_strides, out); \
} \
extern "C" __global__ void BWD( \
    const size_t numel, \
    const size_t num_dims, \
    const Dims dims_arg, \
    const bool *cond, \
    const Dims cond_strides_arg, \
    TYPENAME *grad_lhs, \
    const Dims lhs_strides_arg, \
    TYPENAME *grad_rhs, \
    const Dims rhs_strides_arg, \
    const TYPENAME *grad_out \
) { \
    const size_t *dims = dims_arg.v; /* typed-amp patch */ \
    const size_t *cond_strides = cond_strides_arg.v; /* typed-amp patch */ \
    const size_t *lhs_strides = lhs_strides_arg.v; /* typed-amp patch */ \
    const size_t *rhs_strides = rhs_strides_arg.v; /* typed-amp patch */ \
    choose_bwd(numel, num_dims, dims, cond, cond_strides, grad_lhs, lhs_strides, grad_rhs, rhs_strides, grad_out); \
}

CHOOSE(__half, choose_fwd_f16, choose_bwd_f16);
CHOOSE(float, choose_fwd_f32, choose_bwd_f32);
CHOOSE(double, choose_fwd_f64, choose_bwd_f64);

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
CHOOSE(__nv_bfloat16, choose_fwd_bf16, choose_bwd_bf16);
#endif // typed-amp patch: bf16
