#include "unary_op_macros.cuh"

struct CosKernelOp {};

UNARY_OP(__half, cos_fwd_f16, cos_bwd_f16, CosKernelOp,
        cosg(x),
        -sing(x))

UNARY_OP(float, cos_fwd_f32, cos_bwd_f32, CosKernelOp,
        cosg(x),
        -sing(x))

UNARY_OP(double, cos_fwd_f64, cos_bwd_f64, CosKernelOp,
        cosg(x),
        -sing(x))

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
UNARY_OP(__nv_bfloat16, cos_fwd_bf16, cos_bwd_bf16, CosKernelOp,
        cosg(x),
        -sing(x))
#endif // typed-amp patch: bf16
