//! typed-amp patch: the CPU reshape copies a run of elements at a time ([for_each_run]) instead
//! of computing two indices per element, and large tensors in parallel over their first
//! dimension: forward always (each task writes its own part of the output), backward when the
//! input's elements sit at distinct offsets (a permuted tensor, never a broadcast one), so that
//! the tasks add into disjoint parts of the input's gradient. Values are unchanged: each element
//! is copied, or its gradient added once, as before.

use crate::shapes::{Dtype, Shape};
use crate::tensor::{cpu::for_each_run, Cpu, Tensor, ZerosTensor};
use crate::tensor_ops::utilities::cpu_f32::{par_chunks_mut, par_for, SendPtr, PAR_MIN_ELEMS};

use std::vec::Vec;

/// Whether the offsets `Σ iₖ·stridesₖ` over `dims` are all distinct: with the strides of the
/// dimensions longer than 1 in increasing order, each is beyond the largest offset the smaller
/// ones reach.
fn distinct_offsets(dims: &[usize], strides: &[usize]) -> bool {
    let mut by_stride: Vec<(usize, usize)> = dims
        .iter()
        .zip(strides)
        .filter(|(d, _)| **d > 1)
        .map(|(d, s)| (*s, *d))
        .collect();
    by_stride.sort_unstable();
    // One past the largest offset reached by the strides so far.
    let mut reach: usize = 1;
    for (stride, dim) in by_stride {
        if stride < reach {
            return false;
        }
        match stride
            .checked_mul(dim - 1)
            .and_then(|r| r.checked_add(reach))
        {
            Some(r) => reach = r,
            None => return false,
        }
    }
    true
}

/// `out[o] = src[base + offset(o)]` over `dims` read through `strides`.
fn gather<E: Copy>(dims: &[usize], strides: &[usize], src: &[E], base: usize, out: &mut [E]) {
    for_each_run(dims, [strides], |o, [i], len, [step]| {
        let out = &mut out[o..o + len];
        let at = base + i;
        if step == 1 {
            out.copy_from_slice(&src[at..at + len]);
        } else {
            for (j, x) in out.iter_mut().enumerate() {
                *x = src[at + j * step];
            }
        }
    });
}

impl<E: Dtype> super::ReshapeKernel<E> for Cpu {
    fn forward<Src: Shape, Dst: Shape>(
        &self,
        dst: &Dst,
        inp: &Tensor<Src, E, Self>,
    ) -> Result<Tensor<Dst, E, Self>, Self::Err> {
        let mut out = self.try_zeros_like(dst)?;
        let dims = inp.shape.concrete();
        let (dims, strides) = (dims.as_ref(), inp.strides.as_ref());
        let src: &[E] = &inp.data;
        let buf = std::sync::Arc::make_mut(&mut out.data);
        let buf: &mut [E] = &mut buf[..];
        if dims.len() < 2 || buf.len() < 2 * PAR_MIN_ELEMS {
            gather(dims, strides, src, 0, buf);
        } else {
            let inner: usize = dims[1..].iter().product();
            par_chunks_mut(buf, inner, |k, piece| {
                gather(&dims[1..], &strides[1..], src, k * strides[0], piece)
            });
        }
        Ok(out)
    }
    fn backward<Src: Shape, Dst: Shape>(
        &self,
        _dst: &Dst,
        inp: &Tensor<Src, E, Self>,
        grad_inp: &mut Self::Vec,
        grad_out: &Self::Vec,
    ) -> Result<(), Self::Err> {
        let dims = inp.shape.concrete();
        let (dims, strides) = (dims.as_ref(), inp.strides.as_ref());
        let grad_out: &[E] = grad_out;
        let grad_inp: &mut [E] = grad_inp;
        if dims.len() < 2 || grad_out.len() < 2 * PAR_MIN_ELEMS || !distinct_offsets(dims, strides)
        {
            for_each_run(dims, [strides], |o, [i], len, [step]| {
                for (j, g) in grad_out[o..o + len].iter().enumerate() {
                    grad_inp[i + j * step] += *g;
                }
            });
            return Ok(());
        }
        let inner: usize = dims[1..].iter().product();
        let len = grad_inp.len();
        let gi = SendPtr(grad_inp.as_mut_ptr());
        par_for(dims[0], |k| {
            let gi = gi;
            let (base, go) = (k * strides[0], &grad_out[k * inner..(k + 1) * inner]);
            for_each_run(&dims[1..], [&strides[1..]], |o, [i], run, [step]| {
                for (j, g) in go[o..o + run].iter().enumerate() {
                    let at = base + i + j * step;
                    assert!(at < len, "a reshape's input offset lies in its buffer");
                    // SAFETY: `at` is in bounds (checked above), and the offsets are distinct
                    // (`distinct_offsets`), so no other task writes this element.
                    unsafe { *gi.0.add(at) += *g };
                }
            });
        });
        Ok(())
    }
}
