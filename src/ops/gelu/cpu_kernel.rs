use dfdx::prelude::{Cpu, CpuError, Storage};
use rayon::prelude::*;
use typed_amp_kernels::math::{gelu_derivative_slice, gelu_slice};

use super::GeluKernel;
use crate::device::utilities::cpu::{
    as_f32_mut, check_lengths, map_f32_chunks, par_new_from, CHUNK, TASK,
};
use crate::precision::AmpElem;

impl<E: AmpElem> GeluKernel<E> for Cpu {
    fn try_gelu_keeping_input(
        &self,
        y: &mut <Self as Storage<E>>::Vec,
        input: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), CpuError> {
        check_lengths(y.len(), input.len())?;
        y.par_chunks_mut(TASK)
            .zip(input.par_chunks_mut(TASK))
            .for_each(|(y, input)| {
                input.copy_from_slice(y);
                map_f32_chunks(y, gelu_slice);
            });
        Ok(())
    }

    fn try_gelu_new(
        &self,
        input: &<Self as Storage<E>>::Vec,
    ) -> Result<Option<<Self as Storage<E>>::Vec>, CpuError> {
        let y = par_new_from(input, |y| map_f32_chunks(y, gelu_slice))?;
        Ok(Some(self.storage_from_vec(y)))
    }

    fn try_gelu_backward(
        &self,
        input: &<Self as Storage<E>>::Vec,
        grad: &mut <Self as Storage<E>>::Vec,
    ) -> Result<(), CpuError> {
        check_lengths(input.len(), grad.len())?;
        grad.par_chunks_mut(TASK)
            .zip(input.par_chunks(TASK))
            .for_each(|(grad, input)| {
                let (mut d, mut g) = ([0f32; CHUNK], [0f32; CHUNK]);
                for (gc, xc) in grad.chunks_mut(CHUNK).zip(input.chunks(CHUNK)) {
                    let n = xc.len();
                    let d = &mut d[..n];
                    E::slice_to_f32(xc, d);
                    gelu_derivative_slice(d);
                    match as_f32_mut::<E>(gc) {
                        Some(gc) => gc.iter_mut().zip(d.iter()).for_each(|(g, d)| *g *= d),
                        None => {
                            let g = &mut g[..n];
                            E::slice_to_f32(gc, g);
                            g.iter_mut().zip(d.iter()).for_each(|(g, d)| *g *= d);
                            E::slice_from_f32(g, gc);
                        }
                    }
                }
            });
        Ok(())
    }
}

/// `out = gelu(input)`, rounded to `E`: the values [`GeluKernel::try_gelu_keeping_input`]
/// writes over its input (the same pass: [`gelu_slice`] is elementwise and gives the same bits
/// in every lane and in the tail), for an op that recomputes a fused GELU's output from the
/// input the GELU kept ([`crate::ops::fused_activation::GeluOutput`]).
pub(crate) fn gelu_into<E: AmpElem>(input: &[E], out: &mut [E]) {
    out.copy_from_slice(input);
    map_f32_chunks(out, gelu_slice);
}
