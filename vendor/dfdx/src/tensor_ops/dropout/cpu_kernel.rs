use crate::{
    shapes::{Dtype, Shape},
    tensor::{cpu::try_copy_in_parallel_then, unique_id, Cpu, Tensor},
    tensor_ops::utilities::cpu_f32::{
        add_from_f32, as_f32_mut, from_f32, is_half, par_elementwise, to_f32, BLOCK,
    },
};

use num_traits::Float;
use typed_amp_kernels::dropout::mask_scale;

use super::{drop_threshold, drops};

/// typed-amp patch: the scale of kept elements, `1 / (1 − p)` rounded to f32 (0 for `p = 1`,
/// where nothing is kept).
fn keep_scale(prob: f64) -> f32 {
    if prob < 1.0 {
        (1.0 / (1.0 - prob)) as f32
    } else {
        0.0
    }
}

/// typed-amp patch: `piece` (elements `off..` of a tensor) with the dropped elements zeroed and
/// the kept ones scaled: in f32 (16-bit elements widened a block at a time), rounded once.
fn mask_piece<E: Float + Dtype>(
    seed: u64,
    threshold: u64,
    scale: f32,
    off: usize,
    piece: &mut [E],
) {
    if let Some(piece) = as_f32_mut(piece) {
        mask_scale(seed, threshold, scale, off as u64, piece);
    } else if is_half::<E>() {
        let mut buf = [0.0f32; BLOCK];
        for (b, block) in piece.chunks_mut(BLOCK).enumerate() {
            let v = &mut buf[..block.len()];
            to_f32(block, v);
            mask_scale(seed, threshold, scale, (off + b * BLOCK) as u64, v);
            from_f32(v, block);
        }
    } else {
        let scale = E::from_f32(scale).unwrap();
        for (j, x) in piece.iter_mut().enumerate() {
            *x = if drops(seed, threshold, (off + j) as u64) {
                E::zero()
            } else {
                *x * scale
            };
        }
    }
}

// typed-amp patch: the mask is drawn per element by a counter-based generator (`super::drops`,
// SplitMix64 of the seed and the element's index, as the CUDA kernels do), in parallel pieces;
// kept elements are multiplied by the f32 scale in f32 (16-bit elements widened a block at a
// time) and rounded once to `E`, as CUDA's float arithmetic does. Before, one `StdRng`
// (ChaCha12) drew a `Bernoulli` per element on one thread, in the forward and again in the
// backward, and kept elements were divided in `E`'s own scalar arithmetic: on the baby GPT
// (13 dropouts over 6.3 M elements a step) that was 16% of a CPU training step.
impl<E: Float + Dtype> super::DropoutKernel<E> for Cpu {
    fn forward<S: Shape>(
        &self,
        op: super::DropoutKernelOp,
        inp: &Tensor<S, E, Self>,
    ) -> Result<Tensor<S, E, Self>, Self::Err> {
        let threshold = drop_threshold(op.prob);
        let scale = keep_scale(op.prob);
        let data = try_copy_in_parallel_then(&inp.data, |off, piece| {
            mask_piece(op.seed, threshold, scale, off, piece)
        })?;
        Ok(Tensor {
            id: unique_id(),
            data: std::sync::Arc::new(self.storage_from_vec(data)),
            shape: inp.shape,
            strides: inp.strides,
            device: self.clone(),
            tape: Default::default(),
        })
    }

    fn backward_in_place(
        &self,
        op: super::DropoutKernelOp,
        grad: &mut Self::Vec,
    ) -> Result<bool, Self::Err> {
        let threshold = drop_threshold(op.prob);
        let scale = keep_scale(op.prob);
        par_elementwise(grad, BLOCK, |off, piece| {
            mask_piece(op.seed, threshold, scale, off, piece)
        });
        Ok(true)
    }

    fn backward(
        &self,
        op: super::DropoutKernelOp,
        grad_inp: &mut Self::Vec,
        grad_out: &Self::Vec,
    ) -> Result<(), Self::Err> {
        assert_eq!(grad_inp.len(), grad_out.len());
        let threshold = drop_threshold(op.prob);
        let scale = keep_scale(op.prob);
        let grad_out: &[E] = grad_out;
        par_elementwise(grad_inp, BLOCK, |off, piece| {
            if is_half::<E>() || as_f32_mut(piece).is_some() {
                // grad_inp += mask · scale · grad_out, in f32, rounded once to E.
                let mut buf = [0.0f32; BLOCK];
                for (b, block) in piece.chunks_mut(BLOCK).enumerate() {
                    let start = off + b * BLOCK;
                    let v = &mut buf[..block.len()];
                    to_f32(&grad_out[start..start + block.len()], v);
                    mask_scale(op.seed, threshold, scale, start as u64, v);
                    add_from_f32(v, block);
                }
            } else {
                let scale = E::from_f32(scale).unwrap();
                for (j, g) in piece.iter_mut().enumerate() {
                    if !drops(op.seed, threshold, (off + j) as u64) {
                        *g += grad_out[off + j] * scale;
                    }
                }
            }
        });
        Ok(())
    }
}
