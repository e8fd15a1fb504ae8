use dfdx::prelude::{Cpu, CpuError};

use super::CastKernel;
use rayon::prelude::*;

use crate::device::utilities::cpu::{
    as_f32_mut, check_lengths, for_each_f32_chunk, par_new_from, same_type, CHUNK, TASK,
};
use crate::precision::AmpElem;

/// `dst = convert(src)` on one thread.
fn copy_cast<Src: AmpElem, Dst: AmpElem>(src: &[Src], dst: &mut [Dst]) {
    if let Some(dst) = as_f32_mut::<Dst>(dst) {
        Src::slice_to_f32(src, dst);
    } else {
        for_each_f32_chunk::<Src>(src, |at, chunk| {
            Dst::slice_from_f32(chunk, &mut dst[at..at + chunk.len()])
        });
    }
}

/// `dst += convert(src)` on one thread, each sum rounded once.
fn add_cast<Src: AmpElem, Dst: AmpElem>(src: &[Src], dst: &mut [Dst]) {
    if let Some(dst) = as_f32_mut::<Dst>(dst) {
        for_each_f32_chunk::<Src>(src, |at, chunk| {
            for (d, s) in dst[at..at + chunk.len()].iter_mut().zip(chunk) {
                *d += *s;
            }
        });
        return;
    }
    let mut acc = [0f32; CHUNK];
    for_each_f32_chunk::<Src>(src, |at, chunk| {
        let out = &mut dst[at..at + chunk.len()];
        let acc = &mut acc[..chunk.len()];
        Dst::slice_to_f32(out, acc);
        for (a, s) in acc.iter_mut().zip(chunk) {
            *a += *s;
        }
        Dst::slice_from_f32(acc, out);
    });
}

// Elementwise, so split across threads in tasks of `TASK` elements: the same bits. A buffer of
// one task (a weight, a bias) stays on the calling thread: no fork and join for it, and a
// model's set-up (casting its weights) touches no worker thread, whose first allocation would
// reserve a 64 MiB arena before the CLI's memory check has counted on it.
impl<Src: AmpElem, Dst: AmpElem> CastKernel<Src, Dst> for Cpu {
    fn try_copy_cast(
        &self,
        src: &<Self as dfdx::prelude::Storage<Src>>::Vec,
        dst: &mut <Self as dfdx::prelude::Storage<Dst>>::Vec,
    ) -> Result<(), CpuError> {
        check_lengths(src.len(), dst.len())?;
        if src.len() <= TASK {
            copy_cast(src, dst);
            return Ok(());
        }
        dst.par_chunks_mut(TASK)
            .zip(src.par_chunks(TASK))
            .for_each(|(dst, src)| copy_cast(src, dst));
        Ok(())
    }

    fn try_copy_cast_new(
        &self,
        src: &<Self as dfdx::prelude::Storage<Src>>::Vec,
    ) -> Result<<Self as dfdx::prelude::Storage<Dst>>::Vec, CpuError> {
        // A buffer of the same precision: copied into new memory in parallel pieces.
        if let Some(src) = same_type::<Src, Dst>(src).filter(|src| src.len() > TASK) {
            return Ok(self.storage_from_vec(par_new_from(src, |_| {})?));
        }
        let mut dst = dfdx::prelude::Storage::<Dst>::try_alloc_len(self, src.len())?;
        self.try_copy_cast(src, &mut dst)?;
        Ok(dst)
    }

    fn try_add_cast(
        &self,
        src: &<Self as dfdx::prelude::Storage<Src>>::Vec,
        dst: &mut <Self as dfdx::prelude::Storage<Dst>>::Vec,
    ) -> Result<(), CpuError> {
        check_lengths(src.len(), dst.len())?;
        if src.len() <= TASK {
            add_cast(src, dst);
            return Ok(());
        }
        dst.par_chunks_mut(TASK)
            .zip(src.par_chunks(TASK))
            .for_each(|(dst, src)| add_cast(src, dst));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dfdx::prelude::*;
    use half::f16;

    #[test]
    fn casts_round_trip_and_accumulate() {
        let dev = Cpu::default();
        let values: Vec<f32> = (0..CHUNK + 3).map(|i| i as f32 * 0.5).collect();
        let n = values.len();
        let src: Tensor<(usize,), f32, Cpu> = dev.tensor_from_vec(values, (n,));
        let ones: Tensor<(usize,), f16, Cpu> = dev.tensor_from_vec(vec![f16::ONE; n], (n,));
        let mut half = ones.storage().clone();
        CastKernel::<f32, f16>::try_add_cast(&dev, src.storage(), &mut half).unwrap();
        assert_eq!(half[10].to_f32(), 6.0);
        let mut back = src.storage().clone();
        CastKernel::<f16, f32>::try_copy_cast(&dev, &half, &mut back).unwrap();
        assert_eq!(back[CHUNK + 2], 1.0 + (CHUNK + 2) as f32 * 0.5);
        let short: Tensor<(usize,), f32, Cpu> = dev.tensor_from_vec(vec![1.0], (1,));
        assert!(CastKernel::<f32, f32>::try_copy_cast(&dev, short.storage(), &mut back).is_err());
    }
}
