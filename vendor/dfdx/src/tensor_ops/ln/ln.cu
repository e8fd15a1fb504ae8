#include "unary_op_macros.cuh"

struct LnKernelOp {};

UNARY_OP(__half, ln_fwd_f16, ln_bwd_f16, LnKernelOp,
        logg(x),
        recipg(x))

UNARY_OP(float, ln_fwd_f32, ln_bwd_f32, LnKernelOp,
        logg(x),
        recipg(x))

UNARY_OP(double, ln_fwd_f64, ln_bwd_f64, LnKernelOp,
        logg(x),
        recipg(x))
        

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
UNARY_OP(__nv_bfloat16, ln_fwd_bf16, ln_bwd_bf16, LnKernelOp,
        logg(x),
        recipg(x))
#endif // typed-amp patch: bf16
