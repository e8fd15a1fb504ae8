#include "binary_op_macros.cuh"

struct BinaryAddOp {};

BINARY_OP(__half, badd_fwd_f16, badd_bwd_lhs_f16, badd_bwd_rhs_f16, BinaryAddOp,
    x + y,
    1.0,
    1.0)

BINARY_OP(float, badd_fwd_f32, badd_bwd_lhs_f32, badd_bwd_rhs_f32, BinaryAddOp,
    x + y,
    1.0,
    1.0)

BINARY_OP(double, badd_fwd_f64, badd_bwd_lhs_f64, badd_bwd_rhs_f64, BinaryAddOp,
    x + y,
    1.0,
    1.0)

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
BINARY_OP(__nv_bfloat16, badd_fwd_bf16, badd_bwd_lhs_bf16, badd_bwd_rhs_bf16, BinaryAddOp,
    x + y,
    1.0,
    1.0)
#endif // typed-amp patch: bf16
