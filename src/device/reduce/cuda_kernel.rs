use cudarc::driver::CudaSlice;
use dfdx::prelude::Storage;
use dfdx::tensor::{Cuda, CudaError};

use super::ReduceKernel;
use crate::device::utilities::cuda::{launch, no_pair, raw, reset_slot, CudaElem, OpSource};

const SOURCE: OpSource = OpSource {
    module: "typed_amp_reduce",
    templates: r#"
// `out` was zeroed before this launch; each block adds its partial sum. inf and NaN propagate
// through the additions.
template <typename T>
__device__ void amp_sum_squares(u64 n, const T *buf, float *out) {
    __shared__ float part[BLOCK];
    float acc = 0.0f;
    FOR_EACH(i, n) {
        float x = load(buf, i);
        acc += x * x;
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (u32 s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, part[0]);
}

// With the sign bit cleared, the bits of non-negative floats order as the floats do, and every
// NaN orders above inf: an unsigned max over the bits is the max of |x|, and NaN if any element
// is NaN. `out` was zeroed (the bits of 0.0) before this launch.
template <typename T>
__device__ void amp_max_abs(u64 n, const T *buf, float *out) {
    __shared__ u32 part[BLOCK];
    u32 m = 0;
    FOR_EACH(i, n) {
        u32 a = __float_as_uint(load(buf, i)) & 0x7fffffffu;
        m = a > m ? a : m;
    }
    part[threadIdx.x] = m;
    __syncthreads();
    for (u32 s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s && part[threadIdx.x + s] > part[threadIdx.x])
            part[threadIdx.x] = part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicMax((u32 *)out, part[0]);
}
"#,
    one: |tag, ty| {
        let source = format!(
            r#"
extern "C" __global__ void tamp_sum_squares_{tag}(u64 n, const {ty} *buf, float *out) {{ amp_sum_squares(n, buf, out); }}
extern "C" __global__ void tamp_max_abs_{tag}(u64 n, const {ty} *buf, float *out) {{ amp_max_abs(n, buf, out); }}
"#
        );
        let names = ["sum_squares", "max_abs"]
            .map(|op| format!("tamp_{op}_{tag}"))
            .to_vec();
        (source, names)
    },
    pair: no_pair,
    arch: None,
};

/// Reduces `buf` into stats slot `slot` (reset first).
fn reduce<E: CudaElem>(
    dev: &Cuda,
    op: &str,
    buf: &CudaSlice<E>,
    stats: &mut CudaSlice<f32>,
    slot: usize,
) -> Result<(), CudaError> {
    let b = raw(dev, buf)?;
    let out = reset_slot(dev, stats, slot)?;
    launch(
        dev,
        &SOURCE,
        &format!("tamp_{op}_{}", E::TAG),
        b.len,
        (b.len as u64, b.ptr, out),
    )
}

impl<E: CudaElem> ReduceKernel<E> for Cuda {
    fn try_sum_squares(
        &self,
        buf: &<Cuda as Storage<E>>::Vec,
        stats: &mut CudaSlice<f32>,
        slot: usize,
    ) -> Result<(), CudaError> {
        reduce(self, "sum_squares", &**buf, stats, slot)
    }

    fn try_max_abs(
        &self,
        buf: &<Cuda as Storage<E>>::Vec,
        stats: &mut CudaSlice<f32>,
        slot: usize,
    ) -> Result<(), CudaError> {
        reduce(self, "max_abs", &**buf, stats, slot)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn nvrtc_compiles_the_kernels() {
        crate::device::utilities::cuda::check_program(&super::SOURCE);
    }
}
