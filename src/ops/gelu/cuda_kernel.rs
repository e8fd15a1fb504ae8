//! Exact GELU's kernels on CUDA: the forward that keeps its input, and the backward in place,
//! each in float and rounded once (the formulas of dfdx's `accurate_gelu.cu`).

use dfdx::prelude::Storage;
use dfdx::tensor::{Cuda, CudaError};

use super::GeluKernel;
use crate::device::utilities::cuda::{
    check_lengths, launch, no_pair, raw, raw_mut, CudaElem, OpSource,
};

const SOURCE: OpSource = OpSource {
    module: "typed_amp_gelu",
    templates: r#"
// 1/√2 and 2/√π, as dfdx's M_SQRT1_2 and M_2_SQRTPI rounded to float.
#define AMP_SQRT1_2 0.70710678118654752440f
#define AMP_2_SQRTPI 1.12837916709551257390f

template <typename T>
__device__ void amp_gelu_keeping_input(u64 n, T *y, T *input) {
    FOR_EACH(i, n) {
        input[i] = y[i];
        float x = load(y, i);
        store(y, i, 0.5f * x * (1.0f + erff(x * AMP_SQRT1_2)));
    }
}

template <typename T>
__device__ void amp_gelu_backward(u64 n, const T *input, T *grad) {
    FOR_EACH(i, n) {
        float x = load(input, i);
        float normal = AMP_2_SQRTPI * expf(0.5f * -(x * x));
        float left = 0.5f * x;
        float right = 1.0f + erff(AMP_SQRT1_2 * x);
        float d = 0.5f * right + left * normal * AMP_SQRT1_2;
        store(grad, i, load(grad, i) * d);
    }
}
"#,
    one: |tag, ty| {
        let source = format!(
            r#"
extern "C" __global__ void tamp_gelu_keeping_input_{tag}(u64 n, {ty} *y, {ty} *input) {{ amp_gelu_keeping_input(n, y, input); }}
extern "C" __global__ void tamp_gelu_backward_{tag}(u64 n, const {ty} *input, {ty} *grad) {{ amp_gelu_backward(n, input, grad); }}
"#
        );
        (
            source,
            vec![
                format!("tamp_gelu_keeping_input_{tag}"),
                format!("tamp_gelu_backward_{tag}"),
            ],
        )
    },
    pair: no_pair,
    arch: None,
};

impl<E: CudaElem> GeluKernel<E> for Cuda {
    fn try_gelu_keeping_input(
        &self,
        y: &mut <Self as Storage<E>>::Vec,
        input: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), CudaError> {
        let (y, i) = (raw_mut(self, &mut **y)?, raw_mut(self, &mut **input)?);
        check_lengths(y, i)?;
        launch(
            self,
            &SOURCE,
            &format!("tamp_gelu_keeping_input_{}", E::TAG),
            y.len,
            (y.len as u64, y.ptr, i.ptr),
        )
    }

    fn try_gelu_backward(
        &self,
        input: &<Self as Storage<E>>::Vec,
        grad: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), CudaError> {
        let (i, g) = (raw(self, &**input)?, raw_mut(self, &mut **grad)?);
        check_lengths(i, g)?;
        launch(
            self,
            &SOURCE,
            &format!("tamp_gelu_backward_{}", E::TAG),
            i.len,
            (i.len as u64, i.ptr, g.ptr),
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
