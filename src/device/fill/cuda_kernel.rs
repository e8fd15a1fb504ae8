use cudarc::driver::CudaSlice;
use dfdx::prelude::Storage;
use dfdx::tensor::{Cuda, CudaError};

use super::FillKernel;
use crate::device::utilities::cuda::{launch, no_pair, raw_mut, CudaElem, OpSource};

const SOURCE: OpSource = OpSource {
    module: "typed_amp_fill",
    templates: r#"
template <typename T>
__device__ void amp_fill(u64 n, T *buf, float value) {
    FOR_EACH(i, n) store(buf, i, value);
}

template <typename T>
__device__ void amp_scale(u64 n, T *buf, float factor) {
    FOR_EACH(i, n) store(buf, i, load(buf, i) * factor);
}

// Comparisons with NaN are false, so NaN passes through, as with Rust's `f32::clamp`.
template <typename T>
__device__ void amp_clamp(u64 n, T *buf, float limit) {
    FOR_EACH(i, n) {
        float x = load(buf, i);
        store(buf, i, x > limit ? limit : (x < -limit ? -limit : x));
    }
}
"#,
    one: |tag, ty| {
        let source = format!(
            r#"
extern "C" __global__ void tamp_fill_{tag}(u64 n, {ty} *buf, float value) {{ amp_fill(n, buf, value); }}
extern "C" __global__ void tamp_scale_{tag}(u64 n, {ty} *buf, float factor) {{ amp_scale(n, buf, factor); }}
extern "C" __global__ void tamp_clamp_{tag}(u64 n, {ty} *buf, float limit) {{ amp_clamp(n, buf, limit); }}
"#
        );
        let names = ["fill", "scale", "clamp"]
            .map(|op| format!("tamp_{op}_{tag}"))
            .to_vec();
        (source, names)
    },
    pair: no_pair,
    arch: None,
};

/// Applies an elementwise kernel taking one scalar, `x`, to `buf` in place.
fn map_scalar<E: CudaElem>(
    dev: &Cuda,
    op: &str,
    buf: &mut CudaSlice<E>,
    x: f32,
) -> Result<(), CudaError> {
    let b = raw_mut(dev, buf)?;
    launch(
        dev,
        &SOURCE,
        &format!("tamp_{op}_{}", E::TAG),
        b.len,
        (b.len as u64, b.ptr, x),
    )
}

impl<E: CudaElem> FillKernel<E> for Cuda {
    fn try_fill(&self, buf: &mut <Cuda as Storage<E>>::Vec, value: f32) -> Result<(), CudaError> {
        if value.to_bits() == 0 {
            // +0.0 is all-zero bits in every precision: a memset, as dfdx zeroes its buffers.
            raw_mut(self, &mut **buf)?;
            return Ok(self.cuda_device().memset_zeros(&mut **buf)?);
        }
        map_scalar(self, "fill", &mut **buf, value)
    }

    fn try_scale(&self, buf: &mut <Cuda as Storage<E>>::Vec, factor: f32) -> Result<(), CudaError> {
        map_scalar(self, "scale", &mut **buf, factor)
    }

    fn try_clamp(&self, buf: &mut <Cuda as Storage<E>>::Vec, limit: f32) -> Result<(), CudaError> {
        map_scalar(self, "clamp", &mut **buf, limit)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn nvrtc_compiles_the_kernels() {
        crate::device::utilities::cuda::check_program(&super::SOURCE);
    }
}
