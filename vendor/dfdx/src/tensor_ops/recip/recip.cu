#include "unary_op_macros.cuh"

struct RecipKernelOp {};

UNARY_OP(
    __half, recip_fwd_f16, recip_bwd_f16, RecipKernelOp,
    recipg(x),
    -y * y
)

UNARY_OP(
    float, recip_fwd_f32, recip_bwd_f32, RecipKernelOp,
    recipg(x),
    -y * y
)

UNARY_OP(
    double, recip_fwd_f64, recip_bwd_f64, RecipKernelOp,
    recipg(x),
    -y * y
)

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
UNARY_OP(
    __nv_bfloat16, recip_fwd_bf16, recip_bwd_bf16, RecipKernelOp,
    recipg(x),
    -y * y
)
#endif // typed-amp patch: bf16
