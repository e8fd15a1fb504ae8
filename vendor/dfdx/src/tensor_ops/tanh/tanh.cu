#include "unary_op_macros.cuh"

struct TanhKernelOp {};

template<typename T>
__device__ __forceinline__ T tanh_bwd(T y) {
    T one = 1.0;
    return one - y * y;
}

UNARY_OP(__half, tanh_fwd_f16, tanh_bwd_f16, TanhKernelOp,
        tanhg(x),
        tanh_bwd(y))

UNARY_OP(float, tanh_fwd_f32, tanh_bwd_f32, TanhKernelOp,
        tanhg(x),
        tanh_bwd(y))

UNARY_OP(double, tanh_fwd_f64, tanh_bwd_f64, TanhKernelOp,
        tanhg(x),
        tanh_bwd(y))
        

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
UNARY_OP(__nv_bfloat16, tanh_fwd_bf16, tanh_bwd_bf16, TanhKernelOp,
        tanhg(x),
        tanh_bwd(y))
#endif // typed-amp patch: bf16
