#include "unary_op_macros.cuh"

struct NegateKernelOp {};

UNARY_OP(__half, negate_fwd_f16, negate_bwd_f16, NegateKernelOp,
        -x,
        -1.0)

UNARY_OP(float, negate_fwd_f32, negate_bwd_f32, NegateKernelOp,
        -x,
        -1.0)

UNARY_OP(double, negate_fwd_f64, negate_bwd_f64, NegateKernelOp,
        -x,
        -1.0)

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
UNARY_OP(__nv_bfloat16, negate_fwd_bf16, negate_bwd_bf16, NegateKernelOp,
        -x,
        -1.0)
#endif // typed-amp patch: bf16
