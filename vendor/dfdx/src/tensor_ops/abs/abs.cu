#include "unary_op_macros.cuh"

struct AbsKernelOp {};

UNARY_OP(__half, abs_fwd_f16, abs_bwd_f16, AbsKernelOp,
        absg(x),
        x == __float2half(0.0) ? __float2half(0.0) : copysigng(__float2half(1.0), x));

UNARY_OP(float, abs_fwd_f32, abs_bwd_f32, AbsKernelOp,
        absg(x),
        x == 0.0 ? 0.0f : copysigng(1.0f, x));

UNARY_OP(double, abs_fwd_f64, abs_bwd_f64, AbsKernelOp,
        absg(x),
        x == 0.0 ? 0.0 : copysigng(1.0, x));

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
UNARY_OP(__nv_bfloat16, abs_fwd_bf16, abs_bwd_bf16, AbsKernelOp,
        absg(x),
        x == __float2bfloat16(0.0) ? __float2bfloat16(0.0) : copysigng(__float2bfloat16(1.0), x));
#endif // typed-amp patch: bf16
