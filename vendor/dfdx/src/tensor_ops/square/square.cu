#include "unary_op_macros.cuh"

struct SquareKernelOp {};

UNARY_OP(__half, square_fwd_f16, square_bwd_f16, SquareKernelOp,
        x * x,
        x + x)

UNARY_OP(float, square_fwd_f32, square_bwd_f32, SquareKernelOp,
        x * x,
        x + x)

UNARY_OP(double, square_fwd_f64, square_bwd_f64, SquareKernelOp,
        x * x,
        x + x)
        

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
UNARY_OP(__nv_bfloat16, square_fwd_bf16, square_bwd_bf16, SquareKernelOp,
        x * x,
        x + x)
#endif // typed-amp patch: bf16
