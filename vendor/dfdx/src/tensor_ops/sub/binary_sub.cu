#include "binary_op_macros.cuh"

struct BinarySubKernelOp {};

BINARY_OP(__half, bsub_fwd_f16, bsub_bwd_lhs_f16, bsub_bwd_rhs_f16, BinarySubKernelOp,
    x - y,
    1.0,
    -1.0)

BINARY_OP(float, bsub_fwd_f32, bsub_bwd_lhs_f32, bsub_bwd_rhs_f32, BinarySubKernelOp,
    x - y,
    1.0,
    -1.0)

BINARY_OP(double, bsub_fwd_f64, bsub_bwd_lhs_f64, bsub_bwd_rhs_f64, BinarySubKernelOp,
    x - y,
    1.0,
    -1.0)
   

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
BINARY_OP(__nv_bfloat16, bsub_fwd_bf16, bsub_bwd_lhs_bf16, bsub_bwd_rhs_bf16, BinarySubKernelOp,
    x - y,
    1.0,
    -1.0)
#endif // typed-amp patch: bf16
