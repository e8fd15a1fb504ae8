#include "unary_op_macros.cuh"

struct ExpKernelOp {};

UNARY_OP(__half, exp_fwd_f16, exp_bwd_f16, ExpKernelOp,
        expg(x),
        y)

UNARY_OP(float, exp_fwd_f32, exp_bwd_f32, ExpKernelOp,
        expg(x),
        y)

UNARY_OP(double, exp_fwd_f64, exp_bwd_f64, ExpKernelOp,
        expg(x),
        y)
        

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
UNARY_OP(__nv_bfloat16, exp_fwd_bf16, exp_bwd_bf16, ExpKernelOp,
        expg(x),
        y)
#endif // typed-amp patch: bf16
