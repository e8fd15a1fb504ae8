#include "unary_op_macros.cuh"

template<typename F>
struct ScalarMulKernelOp {
    F scalar;
};

UNARY_OP(__half, smul_fwd_f16, smul_bwd_f16, ScalarMulKernelOp<__half>,
    x * op.scalar,
    op.scalar);

UNARY_OP(float, smul_fwd_f32, smul_bwd_f32, ScalarMulKernelOp<float>,
    x * op.scalar,
    op.scalar);

UNARY_OP(double, smul_fwd_f64, smul_bwd_f64, ScalarMulKernelOp<double>,
    x * op.scalar,
    op.scalar);
    

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
UNARY_OP(__nv_bfloat16, smul_fwd_bf16, smul_bwd_bf16, ScalarMulKernelOp<__nv_bfloat16>,
    x * op.scalar,
    op.scalar);
#endif // typed-amp patch: bf16
