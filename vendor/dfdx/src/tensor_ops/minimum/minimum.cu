#include "binary_op_macros.cuh"

struct MinimumKernelOp {};

template<typename T>
__device__ T op_f(T x, T y) {
    return ming(x, y);
}

template<typename T>
__device__ T op_dfdx(T x, T y) {
    return (x < y) ? 1.0 : ((x > y) ? 0.0 : 0.5);
}

template<typename T>
__device__ T op_dfdy(T x, T y) {
    return (x < y) ? 0.0 : ((x > y) ? 1.0 : 0.5);
}

BINARY_OP(__half, minimum_fwd_f16, minimum_bwd_lhs_f16, minimum_bwd_rhs_f16, MinimumKernelOp,
    op_f(x, y),
    op_dfdx(x, y),
    op_dfdy(x, y)
)

BINARY_OP(float, minimum_fwd_f32, minimum_bwd_lhs_f32, minimum_bwd_rhs_f32, MinimumKernelOp,
    op_f(x, y),
    op_dfdx(x, y),
    op_dfdy(x, y)
)

BINARY_OP(double, minimum_fwd_f64, minimum_bwd_lhs_f64, minimum_bwd_rhs_f64, MinimumKernelOp,
    op_f(x, y),
    op_dfdx(x, y),
    op_dfdy(x, y)
)

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
BINARY_OP(__nv_bfloat16, minimum_fwd_bf16, minimum_bwd_lhs_bf16, minimum_bwd_rhs_bf16, MinimumKernelOp,
    op_f(x, y),
    op_dfdx(x, y),
    op_dfdy(x, y)
)
#endif // typed-amp patch: bf16
