#include "unary_op_macros.cuh"

struct SqrtKernelOp {};

UNARY_OP(__half, sqrt_fwd_f16, sqrt_bwd_f16, SqrtKernelOp,
        sqrtg(x),
        recipg(y + y))

UNARY_OP(float, sqrt_fwd_f32, sqrt_bwd_f32, SqrtKernelOp,
        sqrtg(x),
        recipg(y + y))

UNARY_OP(double, sqrt_fwd_f64, sqrt_bwd_f64, SqrtKernelOp,
        sqrtg(x),
        recipg(y + y))
        

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
UNARY_OP(__nv_bfloat16, sqrt_fwd_bf16, sqrt_bwd_bf16, SqrtKernelOp,
        sqrtg(x),
        recipg(y + y))
#endif // typed-amp patch: bf16
