#include "binary_op_macros.cuh"

struct BinaryMulKernalOp {};

BINARY_OP(__half, bmul_fwd_f16, bmul_bwd_lhs_f16, bmul_bwd_rhs_f16, BinaryMulKernalOp,
    x * y,
    y,
    x)

BINARY_OP(float, bmul_fwd_f32, bmul_bwd_lhs_f32, bmul_bwd_rhs_f32, BinaryMulKernalOp,
    x * y,
    y,
    x)

BINARY_OP(double, bmul_fwd_f64, bmul_bwd_lhs_f64, bmul_bwd_rhs_f64, BinaryMulKernalOp,
    x * y,
    y,
    x)
   

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
BINARY_OP(__nv_bfloat16, bmul_fwd_bf16, bmul_bwd_lhs_bf16, bmul_bwd_rhs_bf16, BinaryMulKernalOp,
    x * y,
    y,
    x)
#endif // typed-amp patch: bf16
