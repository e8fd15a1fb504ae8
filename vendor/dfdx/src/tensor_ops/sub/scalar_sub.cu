#include "unary_op_macros.cuh"

template<typename F>
struct ScalarSubKernelOp {
    F scalar;
};

UNARY_OP(__half, ssub_fwd_f16, ssub_bwd_f16, ScalarSubKernelOp<__half>,
    x - op.scalar,
    1.0);

UNARY_OP(float, ssub_fwd_f32, ssub_bwd_f32, ScalarSubKernelOp<float>,
        x - op.scalar,
        1.0);

UNARY_OP(double, ssub_fwd_f64, ssub_bwd_f64, ScalarSubKernelOp<double>,
    x - op.scalar,
    1.0);
    

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
UNARY_OP(__nv_bfloat16, ssub_fwd_bf16, ssub_bwd_bf16, ScalarSubKernelOp<__nv_bfloat16>,
    x - op.scalar,
    1.0);
#endif // typed-amp patch: bf16
