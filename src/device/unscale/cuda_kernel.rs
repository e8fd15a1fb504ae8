use cudarc::driver::CudaSlice;
use dfdx::prelude::Storage;
use dfdx::tensor::{Cuda, CudaError};

use super::UnscaleKernel;
use crate::device::utilities::cuda::{
    check_lengths, launch, raw, raw_mut, reset_slot, CudaElem, OpSource,
};

const SOURCE: OpSource = OpSource {
    module: "typed_amp_unscale",
    templates: r#"
// `src` and `dst` may be the same buffer: each element is read before it is written, by the same
// thread. The result is checked as stored, after the division and the rounding to `D`: that is
// what the optimizer would receive. A magnitude above GRADIENT_LIMIT (2^62, bits 0x5e800000;
// inf and NaN have larger bits) is an overflow too: its square would overflow FP32 in Adam's
// second moment. `flag` was zeroed in stream order before this launch and is
// only ever set, so blocks need not agree on who writes it.
template <typename S, typename D>
__device__ void amp_unscale(u64 n, const S *src, D *dst, float inv_scale, float *flag) {
    int bad = 0;
    FOR_EACH(i, n) {
        store(dst, i, load(src, i) * inv_scale);
        bad |= (__float_as_uint((float)load(dst, i)) & 0x7fffffffu) > 0x5e800000u;
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1.0f;
}
"#,
    one: |tag, ty| {
        let source = format!(
            r#"
extern "C" __global__ void tamp_unscale_in_place_{tag}(u64 n, {ty} *buf, float inv_scale, float *flag) {{ amp_unscale(n, buf, buf, inv_scale, flag); }}
"#
        );
        (source, vec![format!("tamp_unscale_in_place_{tag}")])
    },
    pair: |stag, sty, dtag, dty| {
        // Working gradients are unscaled into FP32 master gradients only.
        if dtag != "f32" {
            return (String::new(), Vec::new());
        }
        let source = format!(
            r#"
extern "C" __global__ void tamp_unscale_{stag}_{dtag}(u64 n, const {sty} *src, {dty} *dst, float inv_scale, float *flag) {{ amp_unscale(n, src, dst, inv_scale, flag); }}
"#
        );
        (source, vec![format!("tamp_unscale_{stag}_{dtag}")])
    },
};

impl<E: CudaElem> UnscaleKernel<E> for Cuda {
    fn try_unscale_to_f32(
        &self,
        src: &<Cuda as Storage<E>>::Vec,
        dst: &mut <Cuda as Storage<f32>>::Vec,
        inv_scale: f32,
        stats: &mut CudaSlice<f32>,
        slot: usize,
    ) -> Result<(), CudaError> {
        let (s, d) = (raw(self, &**src)?, raw_mut(self, &mut **dst)?);
        check_lengths(s, d)?;
        let flag = reset_slot(self, stats, slot)?;
        launch(
            self,
            &SOURCE,
            &format!("tamp_unscale_{}_f32", E::TAG),
            s.len,
            (s.len as u64, s.ptr, d.ptr, inv_scale, flag),
        )
    }

    fn try_unscale_in_place(
        &self,
        buf: &mut <Cuda as Storage<E>>::Vec,
        inv_scale: f32,
        stats: &mut CudaSlice<f32>,
        slot: usize,
    ) -> Result<(), CudaError> {
        let b = raw_mut(self, &mut **buf)?;
        let flag = reset_slot(self, stats, slot)?;
        launch(
            self,
            &SOURCE,
            &format!("tamp_unscale_in_place_{}", E::TAG),
            b.len,
            (b.len as u64, b.ptr, inv_scale, flag),
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
