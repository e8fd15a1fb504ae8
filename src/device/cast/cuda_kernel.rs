use dfdx::prelude::Storage;
use dfdx::tensor::{Cuda, CudaError};

use super::CastKernel;
use crate::device::utilities::cuda::{
    check_lengths, launch, none, raw, raw_mut, CudaElem, OpSource,
};

const SOURCE: OpSource = OpSource {
    module: "typed_amp_cast",
    templates: r#"
template <typename S, typename D>
__device__ void amp_copy_cast(u64 n, const S *src, D *dst) {
    FOR_EACH(i, n) store(dst, i, load(src, i));
}

template <typename S, typename D>
__device__ void amp_add_cast(u64 n, const S *src, D *dst) {
    FOR_EACH(i, n) store(dst, i, load(dst, i) + load(src, i));
}
"#,
    one: none,
    pair: |stag, sty, dtag, dty| {
        let source = format!(
            r#"
extern "C" __global__ void tamp_copy_cast_{stag}_{dtag}(u64 n, const {sty} *src, {dty} *dst) {{ amp_copy_cast(n, src, dst); }}
extern "C" __global__ void tamp_add_cast_{stag}_{dtag}(u64 n, const {sty} *src, {dty} *dst) {{ amp_add_cast(n, src, dst); }}
"#
        );
        let names = ["copy_cast", "add_cast"]
            .map(|op| format!("tamp_{op}_{stag}_{dtag}"))
            .to_vec();
        (source, names)
    },
    arch: None,
};

impl<Src: CudaElem, Dst: CudaElem> CastKernel<Src, Dst> for Cuda {
    fn try_copy_cast(
        &self,
        src: &<Cuda as Storage<Src>>::Vec,
        dst: &mut <Cuda as Storage<Dst>>::Vec,
    ) -> Result<(), CudaError> {
        let (s, d) = (raw(self, &**src)?, raw_mut(self, &mut **dst)?);
        check_lengths(s, d)?;
        launch(
            self,
            &SOURCE,
            &format!("tamp_copy_cast_{}_{}", Src::TAG, Dst::TAG),
            s.len,
            (s.len as u64, s.ptr, d.ptr),
        )
    }

    fn try_add_cast(
        &self,
        src: &<Cuda as Storage<Src>>::Vec,
        dst: &mut <Cuda as Storage<Dst>>::Vec,
    ) -> Result<(), CudaError> {
        let (s, d) = (raw(self, &**src)?, raw_mut(self, &mut **dst)?);
        check_lengths(s, d)?;
        launch(
            self,
            &SOURCE,
            &format!("tamp_add_cast_{}_{}", Src::TAG, Dst::TAG),
            s.len,
            (s.len as u64, s.ptr, d.ptr),
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
