#include "unary_op_macros.cuh"

template<typename T>
struct ScalarDivKernelOp {
    T scalar;
};

UNARY_OP(__half, sdiv_fwd_f16, sdiv_bwd_f16, ScalarDivKernelOp<__half>,
    x / op.scalar,
    recipg(op.scalar));

UNARY_OP(float, sdiv_fwd_f32, sdiv_bwd_f32, ScalarDivKernelOp<float>,
    x / op.scalar,
    recipg(op.scalar));

UNARY_OP(double, sdiv_fwd_f64, sdiv_bwd_f64, ScalarDivKernelOp<double>,
    x / op.scalar,
    recipg(op.scalar));

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
UNARY_OP(__nv_bfloat16, sdiv_fwd_bf16, sdiv_bwd_bf16, ScalarDivKernelOp<__nv_bfloat16>,
    x / op.scalar,
    recipg(op.scalar));
#endif // typed-amp patch: bf16
