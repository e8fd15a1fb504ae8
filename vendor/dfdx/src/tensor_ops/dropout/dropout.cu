#include "cuda_fp16.h"

// typed-amp patch: the mask is drawn here, on the device, instead of on the host and copied to a
// new device buffer on every forward and backward. Element i is dropped when the (i + 1)-th
// output of SplitMix64 seeded with the op's seed is below `threshold` (rand_distr's Bernoulli:
// `threshold` = p · 2^64, u64::MAX for p = 1, which drops everything); forward and backward draw
// the same mask from the same seed.
__device__ __forceinline__ bool dropout_drops(
    const unsigned long long seed,
    const unsigned long long threshold,
    const unsigned long long i
) {
    unsigned long long z = seed + (i + 1ULL) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z = z ^ (z >> 31);
    return threshold == 0xFFFFFFFFFFFFFFFFULL || z < threshold;
}

#define DROPOUT(TYPENAME, FWD, BWD) \
extern "C" __global__ void FWD( \
    const TYPENAME prob, \
    const size_t numel, \
    const TYPENAME *inp, \
    const unsigned long long seed, \
    const unsigned long long threshold, \
    TYPENAME *out \
) { \
    TYPENAME zero = 0.0; \
    TYPENAME one = 1.0; \
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < numel; i += blockDim.x * gridDim.x) { \
        TYPENAME scalar = dropout_drops(seed, threshold, i) ? zero : (one / (one - prob)); \
        out[i] = inp[i] * scalar; \
    } \
} \
extern "C" __global__ void BWD( \
    const TYPENAME prob, \
    const size_t numel, \
    const unsigned long long seed, \
    const unsigned long long threshold, \
    TYPENAME *grad_inp, \
    const TYPENAME *grad_out \
) { \
    TYPENAME zero = 0.0; \
    TYPENAME one = 1.0; \
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < numel; i += blockDim.x * gridDim.x) { \
        grad_inp[i] += dropout_drops(seed, threshold, i) ? zero : (grad_out[i] / (one - prob)); \
    } \
}

DROPOUT(__half, dropout_fwd_f16, dropout_bwd_f16);
DROPOUT(float, dropout_fwd_f32, dropout_bwd_f32);
DROPOUT(double, dropout_fwd_f64, dropout_bwd_f64);

#include "cuda_bf16.h" // typed-amp patch
#if __CUDA_ARCH__ >= 800 // typed-amp patch: bf16 kernels (bf16 arithmetic needs sm_80+)
DROPOUT(__nv_bfloat16, dropout_fwd_bf16, dropout_bwd_bf16);
#endif // typed-amp patch: bf16
