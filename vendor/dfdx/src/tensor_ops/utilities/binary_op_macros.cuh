#include "cuda_utils.cuh"

// typed-amp patch: `info` (dims and strides) is a kernel parameter passed by value (`Info3`, see
// cuda_utils.cuh) instead of a pointer to a buffer copied from the host on every launch; each
// backward kernel takes its own three arrays (the right-hand one's were at offsets 3 to 5 of one
// shared buffer of six). The indexing arithmetic is unchanged.

#define LONG_BINARY_OP(TYPENAME, FORWARD, BACKWARD_LHS, BACKWARD_RHS, OP_STRUCT, FUNC, DFDX, DFDY) \
extern "C" __global__ void FORWARD( \
    const OP_STRUCT op, \
    const size_t numel, \
    const size_t num_dims, \
    const Info3 info_arg, \
    const TYPENAME *lhs, \
    const TYPENAME *rhs, \
    TYPENAME *out \
) { \
    const size_t *info = info_arg.v; \
    const size_t *dims = info; \
    const size_t *lhs_strides = info + num_dims; \
    const size_t *rhs_strides = info + 2 * num_dims; \
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < numel; i += blockDim.x * gridDim.x) { \
        unsigned int tmp_i = i; \
        unsigned int lhs_i = 0; \
        unsigned int rhs_i = 0; \
        for (int d = num_dims - 1; d >= 0; d--) { \
            unsigned int i_dim = tmp_i % dims[d]; \
            lhs_i += i_dim * lhs_strides[d]; \
            rhs_i += i_dim * rhs_strides[d]; \
            tmp_i /= dims[d]; \
        } \
        TYPENAME x = lhs ? lhs[lhs_i] : out[i]; \
        TYPENAME y = rhs ? rhs[rhs_i] : out[i]; \
        TYPENAME fx; \
        FUNC\
        out[i] = fx; \
    } \
} \
\
extern "C" __global__ void BACKWARD_LHS( \
    const OP_STRUCT op, \
    const size_t numel, \
    const size_t num_dims, \
    const Info3 info_arg, \
    const TYPENAME *lhs, \
    TYPENAME *grad_lhs, \
    const size_t chunk_len, \
    const TYPENAME *rhs, \
    const TYPENAME *grad_out \
) { \
    const size_t *info = info_arg.v; \
    const size_t *dims = info + 0 * num_dims; \
    const size_t *out_strides = info + 1 * num_dims; \
    const size_t *rhs_strides = info + 2 * num_dims; \
    TYPENAME zero = 0.0; \
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < numel; i += blockDim.x * gridDim.x) { \
        unsigned int tmp_i = i; \
        unsigned int out_i = 0; \
        unsigned int rhs_i = 0; \
        for (int d = num_dims - 1; d >= 0; d--) { \
            unsigned int i_dim = tmp_i % dims[d]; \
            out_i += i_dim * out_strides[d]; \
            rhs_i += i_dim * rhs_strides[d]; \
            tmp_i /= dims[d]; \
        } \
        TYPENAME x = lhs ? lhs[i / chunk_len] : zero; \
        TYPENAME y = rhs ? rhs[rhs_i] : zero; \
        TYPENAME go = grad_out[out_i]; \
        TYPENAME dfdx = (DFDX); \
        chunk_sum(chunk_len, dfdx * go, grad_lhs); \
    } \
} \
\
extern "C" __global__ void BACKWARD_RHS( \
    const OP_STRUCT op, \
    const size_t numel, \
    const size_t num_dims, \
    const Info3 info_arg, \
    const TYPENAME *lhs, \
    const TYPENAME *rhs, \
    TYPENAME *grad_rhs, \
    const size_t chunk_len, \
    const TYPENAME *grad_out \
) { \
    const size_t *info = info_arg.v; \
    const size_t *dims = info + 0 * num_dims; \
    const size_t *out_strides = info + 1 * num_dims; \
    const size_t *lhs_strides = info + 2 * num_dims; \
    TYPENAME zero = 0.0; \
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < numel; i += blockDim.x * gridDim.x) { \
        unsigned int tmp_i = i; \
        unsigned int lhs_i = 0; \
        unsigned int out_i = 0; \
        for (int d = num_dims - 1; d >= 0; d--) { \
            unsigned int i_dim = tmp_i % dims[d]; \
            lhs_i += i_dim * lhs_strides[d]; \
            out_i += i_dim * out_strides[d]; \
            tmp_i /= dims[d]; \
        } \
        TYPENAME x = lhs ? lhs[lhs_i] : zero; \
        TYPENAME y = rhs ? rhs[i / chunk_len] : zero; \
        TYPENAME go = grad_out[out_i]; \
        TYPENAME dfdy = (DFDY); \
        chunk_sum(chunk_len, dfdy * go, grad_rhs); \
    } \
}

#define BINARY_OP(TYPENAME, FORWARD, BACKWARD_LHS, BACKWARD_RHS, OP_STRUCT, FUNC, DFDX, DFDY) \
    LONG_BINARY_OP(TYPENAME, FORWARD, BACKWARD_LHS, BACKWARD_RHS, OP_STRUCT, fx = (FUNC);, DFDX, DFDY)
