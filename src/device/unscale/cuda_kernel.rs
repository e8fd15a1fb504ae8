use std::collections::{BTreeMap, HashSet};

use cudarc::driver::{CudaSlice, DevicePtr, DeviceSlice};
use dfdx::prelude::Storage;
use dfdx::tensor::{CpuError, Cuda, CudaError};

use super::{UnscaleBatchKernel, UnscaleKernel};
use crate::device::utilities::cuda::{
    check_device, check_lengths, launch, launch_with, raw, raw_mut, reset_slot, CudaElem, OpSource,
};
use crate::device::utilities::cuda_multi;

const SOURCE: OpSource = OpSource {
    module: "typed_amp_unscale",
    templates: concat!(
        // cuda_multi::CHUNK (checked below).
        "#define MT_CHUNK 16384ull\n",
        r#"
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

// The same over every tensor of a table (ops/utilities/cuda_multi.rs): each tensor's words are
// [src, dst, length, flag slot]; block b takes chunks b, b + gridDim.x, ... Each chunk's check
// sets its tensor's flag, which was zeroed before this launch.
template <typename S, typename D>
__device__ void amp_unscale_many(const u64 *table, u64 tensors, u64 chunks, float inv_scale,
                                 float *stats) {
    for (u64 k = blockIdx.x; k < chunks; k += gridDim.x) {
        u64 word = table[tensors * 4 + k];
        const u64 *t = table + 4 * (word & 0xffffffffull);
        const S *src = (const S *)t[0];
        D *dst = (D *)t[1];
        u64 len = t[2], start = (word >> 32) * MT_CHUNK;
        u64 end = start + MT_CHUNK < len ? start + MT_CHUNK : len;
        int bad = 0;
        for (u64 i = start + threadIdx.x; i < end; i += blockDim.x) {
            store(dst, i, load(src, i) * inv_scale);
            bad |= (__float_as_uint((float)load(dst, i)) & 0x7fffffffu) > 0x5e800000u;
        }
        if (__syncthreads_or(bad) && threadIdx.x == 0) stats[t[3]] = 1.0f;
    }
}
"#
    ),
    one: |tag, ty| {
        let source = format!(
            r#"
extern "C" __global__ void tamp_unscale_in_place_{tag}(u64 n, {ty} *buf, float inv_scale, float *flag) {{ amp_unscale(n, buf, buf, inv_scale, flag); }}
"#
        );
        (source, vec![format!("tamp_unscale_in_place_{tag}")])
    },
    pair: |stag, sty, dtag, dty| {
        // Working gradients are unscaled into FP32 master gradients, or in place.
        let mut source = String::new();
        let mut names = Vec::new();
        if dtag == "f32" {
            source.push_str(&format!(
                r#"
extern "C" __global__ void tamp_unscale_{stag}_{dtag}(u64 n, const {sty} *src, {dty} *dst, float inv_scale, float *flag) {{ amp_unscale(n, src, dst, inv_scale, flag); }}
"#
            ));
            names.push(format!("tamp_unscale_{stag}_{dtag}"));
        }
        if dtag == "f32" || stag == dtag {
            source.push_str(&format!(
                r#"
extern "C" __global__ void tamp_unscale_many_{stag}_{dtag}(const u64 *table, u64 tensors, u64 chunks, float inv_scale, float *stats) {{ amp_unscale_many<{sty}, {dty}>(table, tensors, chunks, inv_scale, stats); }}
"#
            ));
            names.push(format!("tamp_unscale_many_{stag}_{dtag}"));
        }
        (source, names)
    },
    arch: None,
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

    unsafe fn try_queue_unscale_in_place(
        &self,
        batch: &mut CudaUnscaleBatch,
        buf: &mut <Self as Storage<E>>::Vec,
        inv_scale: f32,
        stats: &mut CudaSlice<f32>,
        slot: usize,
    ) -> Result<(), CudaError> {
        let b = raw_mut(self, &mut **buf)?;
        check_slot(stats, slot)?;
        let tag = E::TAG;
        queue_unscale(
            self,
            batch,
            stats,
            format!("tamp_unscale_many_{tag}_{tag}"),
            [b.ptr, b.ptr, b.len as u64, slot as u64],
            inv_scale,
        )
    }

    unsafe fn try_queue_unscale_to_f32(
        &self,
        batch: &mut CudaUnscaleBatch,
        src: <Self as Storage<E>>::Vec,
        dst: &mut <Self as Storage<f32>>::Vec,
        inv_scale: f32,
        stats: &mut CudaSlice<f32>,
        slot: usize,
    ) -> Result<(), CudaError> {
        let (s, d) = (raw(self, &*src)?, raw_mut(self, &mut **dst)?);
        check_lengths(s, d)?;
        check_slot(stats, slot)?;
        queue_unscale(
            self,
            batch,
            stats,
            format!("tamp_unscale_many_{}_f32", E::TAG),
            [s.ptr, d.ptr, s.len as u64, slot as u64],
            inv_scale,
        )?;
        batch.keep.push(Box::new(src));
        Ok(())
    }
}

const _: () = assert!(
    cuda_multi::CHUNK == 16384,
    "MT_CHUNK in the kernels' source"
);

/// Unscales queued on CUDA: per kernel (source and destination precision), each tensor's
/// table words `[src, dst, length, slot]`.
#[doc(hidden)]
#[derive(Default)]
pub struct CudaUnscaleBatch {
    inv_scale: f32,
    groups: BTreeMap<String, Vec<[u64; 4]>>,
    /// The sources unscaled into FP32 buffers, kept until they are read.
    keep: Vec<Box<dyn std::any::Any>>,
    /// The buffers written.
    written: HashSet<u64>,
}

/// Queues an unscale writing `words[1]` into `batch`, after running what `batch` holds if that
/// writes the same buffer already (a buffer unscaled twice is unscaled twice, in order, as
/// unqueued unscales would be, not raced by one launch).
fn queue_unscale(
    dev: &Cuda,
    batch: &mut CudaUnscaleBatch,
    stats: &mut CudaSlice<f32>,
    kernel: String,
    words: [u64; 4],
    inv_scale: f32,
) -> Result<(), CudaError> {
    if !batch.written.insert(words[1]) {
        dev.try_flush_unscale(std::mem::take(batch), stats)?;
        batch.written.insert(words[1]);
    }
    batch.queue(kernel, words, inv_scale)
}

impl CudaUnscaleBatch {
    fn queue(&mut self, kernel: String, words: [u64; 4], inv_scale: f32) -> Result<(), CudaError> {
        if self.groups.values().any(|g| !g.is_empty()) && inv_scale != self.inv_scale {
            // One batch, one scale: a bug in the caller.
            return Err(CudaError::Cpu(CpuError::WrongNumElements));
        }
        self.inv_scale = inv_scale;
        self.groups.entry(kernel).or_default().push(words);
        Ok(())
    }
}

fn check_slot(stats: &CudaSlice<f32>, slot: usize) -> Result<(), CudaError> {
    if slot < stats.len() {
        Ok(())
    } else {
        // Too few slots for the tensors visited: a bug in the caller.
        Err(CudaError::Cpu(CpuError::WrongNumElements))
    }
}

impl UnscaleBatchKernel for Cuda {
    type Batch = CudaUnscaleBatch;

    fn try_flush_unscale(
        &self,
        batch: CudaUnscaleBatch,
        stats: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        check_device(self, &stats.device())?;
        // The flags are only ever set by the kernels: zero them first, one memset per run of
        // consecutive slots (a walk's slots are consecutive: usually one).
        let mut slots: Vec<usize> = batch
            .groups
            .values()
            .flatten()
            .map(|w| w[3] as usize)
            .collect();
        slots.sort_unstable();
        let mut i = 0;
        while i < slots.len() {
            let mut j = i + 1;
            while j < slots.len() && slots[j] <= slots[j - 1] + 1 {
                j += 1;
            }
            let mut run = stats.slice_mut(slots[i]..slots[j - 1] + 1);
            self.cuda_device().memset_zeros(&mut run)?;
            i = j;
        }
        let flags = *stats.device_ptr();
        for (kernel, entries) in &batch.groups {
            let (words, chunks) = cuda_multi::table_words(entries, 2)?;
            if chunks == 0 {
                // Empty tensors only: their flags are zeroed, nothing to read.
                continue;
            }
            let table = cuda_multi::device_table(self, kernel, &words)?;
            launch_with(
                self,
                &SOURCE,
                kernel,
                cuda_multi::config(chunks),
                (
                    table,
                    entries.len() as u64,
                    chunks as u64,
                    batch.inv_scale,
                    flags,
                ),
            )?;
        }
        // The sources may return to dfdx's cache now: anything that reuses them is queued after
        // the kernels that read them.
        drop(batch.keep);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn nvrtc_compiles_the_kernels() {
        crate::device::utilities::cuda::check_program(&super::SOURCE);
    }
}
