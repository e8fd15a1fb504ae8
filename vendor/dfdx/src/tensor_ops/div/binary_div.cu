#include "binary_op_macros.cuh"

struct BinaryDivOp {};

BINARY_OP(__half, bdiv_fwd_f16, bdiv_bwd_lhs_f16, bdiv_bwd_rhs_f16, BinaryDivOp,
    x / y,
    recipg(y),
    -x / (y * y))

BINARY_OP(float, bdiv_fwd_f32, bdiv_bwd_lhs_f32, bdiv_bwd_rhs_f32, BinaryDivOp,
    x / y,
    recipg(y),
    -x / (y * y))

BINARY_OP(double, bdiv_fwd_f64, bdiv_bwd_lhs_f64, bdiv_bwd_rhs_f64, BinaryDivOp,
    x / y,
    recipg(y),
    -x / (y * y))
   

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
BINARY_OP(__nv_bfloat16, bdiv_fwd_bf16, bdiv_bwd_lhs_bf16, bdiv_bwd_rhs_bf16, BinaryDivOp,
    x / y,
    recipg(y),
    -x / (y * y))
#endif // typed-amp patch: bf16
