#include "unary_op_macros.cuh"

struct SinKernelOp {};

UNARY_OP(__half, sin_fwd_f16, sin_bwd_f16, SinKernelOp,
        sing(x),
        cosg(x))

UNARY_OP(float, sin_fwd_f32, sin_bwd_f32, SinKernelOp,
        sing(x),
        cosg(x))

UNARY_OP(double, sin_fwd_f64, sin_bwd_f64, SinKernelOp,
        sing(x),
        cosg(x))
        

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
UNARY_OP(__nv_bfloat16, sin_fwd_bf16, sin_bwd_bf16, SinKernelOp,
        sing(x),
        cosg(x))
#endif // typed-amp patch: bf16
