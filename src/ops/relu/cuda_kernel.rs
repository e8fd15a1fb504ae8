//! ReLU's kernels on CUDA: in place, and the mask of its backward (a select: an infinite
//! gradient where the output is 0 gives 0, as on the CPU).

use dfdx::prelude::Storage;
use dfdx::tensor::{Cuda, CudaError};

use super::ReluKernel;
use crate::device::utilities::cuda::{
    check_lengths, launch, no_pair, raw, raw_mut, CudaElem, OpSource,
};

const SOURCE: OpSource = OpSource {
    module: "typed_amp_relu",
    templates: r#"
// Not fmaxf: NaN becomes 0, as with dfdx's `x.max(0)` and the CPU kernel, and so does -0.
template <typename T>
__device__ void amp_relu(u64 n, T *y) {
    FOR_EACH(i, n) { float v = load(y, i); store(y, i, v > 0.0f ? v : 0.0f); }
}

template <typename T>
__device__ void amp_relu_mask(u64 n, const T *out, T *grad) {
    FOR_EACH(i, n) { if (!(load(out, i) > 0.0f)) store(grad, i, 0.0f); }
}
"#,
    one: |tag, ty| {
        let source = format!(
            r#"
extern "C" __global__ void tamp_relu_{tag}(u64 n, {ty} *y) {{ amp_relu(n, y); }}
extern "C" __global__ void tamp_relu_mask_{tag}(u64 n, const {ty} *out, {ty} *grad) {{ amp_relu_mask(n, out, grad); }}
"#
        );
        (
            source,
            vec![format!("tamp_relu_{tag}"), format!("tamp_relu_mask_{tag}")],
        )
    },
    pair: no_pair,
    arch: None,
};

impl<E: CudaElem> ReluKernel<E> for Cuda {
    fn try_relu_in_place(&self, y: &mut <Self as Storage<E>>::Vec) -> Result<(), CudaError> {
        let y = raw_mut(self, &mut **y)?;
        launch(
            self,
            &SOURCE,
            &format!("tamp_relu_{}", E::TAG),
            y.len,
            (y.len as u64, y.ptr),
        )
    }

    fn try_relu_mask(
        &self,
        out: &<Self as Storage<E>>::Vec,
        grad: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), CudaError> {
        let (o, g) = (raw(self, &**out)?, raw_mut(self, &mut **grad)?);
        check_lengths(o, g)?;
        launch(
            self,
            &SOURCE,
            &format!("tamp_relu_mask_{}", E::TAG),
            o.len,
            (o.len as u64, o.ptr, g.ptr),
        )
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn nvrtc_compiles_the_kernels() {
        crate::device::utilities::cuda::check_program(&super::SOURCE);
    }
}
