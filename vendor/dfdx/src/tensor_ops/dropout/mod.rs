mod cpu_kernel;

#[cfg(feature = "cuda")]
mod cuda_kernel;

use crate::{
    shapes::*,
    tensor::{PutTape, RandomU64, SplitTape, Storage, Tape, Tensor},
};

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DropoutKernelOp {
    pub seed: u64,
    pub prob: f64,
}

pub trait DropoutKernel<E: Dtype>: Storage<E> + RandomU64 {
    fn forward<S: Shape>(
        &self,
        op: DropoutKernelOp,
        inp: &Tensor<S, E, Self>,
    ) -> Result<Tensor<S, E, Self>, Self::Err>;
    /// typed-amp patch: takes no input tensor. The mask is drawn again from the op's seed, so
    /// the backward needs only the gradients; holding the input kept a whole activation alive
    /// until the backward for its length alone.
    fn backward(
        &self,
        op: DropoutKernelOp,
        grad_inp: &mut Self::Vec,
        grad_out: &Self::Vec,
    ) -> Result<(), Self::Err>;

    /// typed-amp patch: the backward for an input with no gradient yet, in place over the
    /// output's gradient (`grad = mask · scale · grad`), which then becomes the input's: no
    /// zero-filled buffer to add into. Returns whether the device did it; the default does not
    /// (the op then runs [DropoutKernel::backward]).
    fn backward_in_place(
        &self,
        op: DropoutKernelOp,
        grad: &mut Self::Vec,
    ) -> Result<bool, Self::Err> {
        let _ = (op, grad);
        Ok(false)
    }
}

/// typed-amp patch: the drop threshold of a Bernoulli(`prob`) draw from a uniform `u64`: an
/// element is dropped when its draw is below `prob · 2^64` (rand_distr 0.4's `Bernoulli`
/// threshold), or always for `prob = 1` (`u64::MAX`).
///
/// # Panics
/// If `prob` is not in `[0, 1]`, as `Bernoulli::new(prob).unwrap()` did.
pub(crate) fn drop_threshold(prob: f64) -> u64 {
    assert!(
        (0.0..=1.0).contains(&prob),
        "dropout probability {prob} is not in [0, 1]"
    );
    if prob == 1.0 {
        u64::MAX
    } else {
        // rand_distr 0.4's `Bernoulli::new`: `(p * SCALE) as u64`, SCALE = 2^64.
        (prob * 2.0 * (1u64 << 63) as f64) as u64
    }
}

/// typed-amp patch: whether element `i` is dropped: the `(i + 1)`-th output of SplitMix64
/// seeded with `seed` is below `threshold`. A counter-based draw, so any element's draw is
/// computed on its own (in parallel, in the backward again, on the GPU by `dropout.cu`'s
/// `dropout_drops`, which is the same formula: the CPU and CUDA masks agree for a seed). Defined
/// in typed-amp-kernels beside `mask_scale`, the vector loop that applies it.
#[cfg(feature = "cpu")]
pub(crate) use typed_amp_kernels::dropout::drops;

/// Zeros elements with probability `p` and scales all elements by `1 / (1 - p)`.
///
/// Described in paper: [Improving neural networks by preventing co-adaptation of feature detectors](https://arxiv.org/abs/1207.0580)
///
/// Example:
/// ```rust
/// # use dfdx::prelude::*;
/// # let dev: Cpu = Default::default();
/// let t = dev.tensor([1.0f32, 2.0, 3.0, 4.0]);
/// let r = t.dropout(0.5);
/// assert_eq!(r.array(), [2.0, 0.0, 6.0, 0.0]);
/// ```
///
/// ### Implementation details:
///
/// To reduce memory usage, this function first samples a u64 seed from `rng`,
/// and then instantiates two identical [rand::rngs::StdRng] with that seed. These rngs
/// are used in both the forward pass and backward pass to generate identical
/// random numbers, so the masking is the same for both.
pub fn dropout<S: Shape, E: Dtype, D: DropoutKernel<E>, T: Tape<E, D>>(
    t: Tensor<S, E, D, T>,
    prob: impl Into<f64>,
) -> Tensor<S, E, D, T> {
    t.dropout(prob)
}

impl<S: Shape, E: Dtype, D: DropoutKernel<E>, T: Tape<E, D>> Tensor<S, E, D, T> {
    /// See [dropout]
    pub fn dropout(self, prob: impl Into<f64>) -> Self {
        self.try_dropout(prob).unwrap()
    }
    /// See [dropout]
    pub fn try_dropout(self, prob: impl Into<f64>) -> Result<Self, D::Err> {
        let seed = self.device.random_u64();
        let prob = prob.into();
        let op = DropoutKernelOp { seed, prob };
        let (inp, mut tape) = self.split_tape();
        let out = inp.device.forward(op, &inp)?;
        let inp_ghost = inp.ghost();
        let out_ghost = out.ghost();
        let dev = inp.device.clone();
        // typed-amp patch: the input itself is not kept (see `DropoutKernel::backward`).
        drop(inp);
        tape.add_backward_op(move |grads| {
            // typed-amp patch: the output's gradient, read by nobody after this op, becomes
            // the input's where the input has none yet.
            if let Some(mut grad) = grads.take_temporary_for(&out_ghost, &inp_ghost) {
                if dev.backward_in_place(op, &mut grad)? {
                    grads.insert(inp_ghost.id, grad);
                    return Ok(());
                }
                grads.insert(out_ghost.id, grad);
            }
            grads.try_alloc_for(&inp_ghost)?;
            grads.try_alloc_for(&out_ghost)?;
            let (grad_inp, grad_out) = grads.mut_and_ref(&inp_ghost, &out_ghost);
            dev.backward(op, grad_inp, grad_out)
        });
        Ok(out.put_tape(tape))
    }
}

#[cfg(test)]
mod tests {
    use crate::{tensor::*, tensor_ops::*, tests::*};

    #[test]
    fn test_dropout_all_0d() {
        let dev: TestDevice = Default::default();
        let t = dev.tensor([3.0, 4.0, 5.0]).to_dtype::<TestDtype>();
        let r = t.leaky_trace().dropout(1.0);
        assert_close_to_literal!(r, [0.0, 0.0, 0.0]);
        let g = r.sum().backward();
        assert_close_to_literal!(g.get(&t), [0.0, 0.0, 0.0]);
    }

    /// typed-amp patch: where the store frees temporaries, the input's gradient is the output's
    /// masked in place (`backward_in_place`): the same values as adding into a zeroed buffer.
    #[test]
    fn test_dropout_backward_in_place_matches_the_accumulating_one() {
        let data: Vec<f32> = (0..70_000)
            .map(|i| ((i % 97) as f32 - 48.0) / 7.0)
            .collect();
        let grads_of = |retain: bool| {
            let dev = Cpu::seed_from_u64(7);
            let t: Tensor<(usize,), TestDtype, Cpu> = dev
                .tensor_from_vec(data.clone(), (data.len(),))
                .to_dtype::<TestDtype>();
            let mut grads = Gradients::leaky();
            if retain {
                grads.retain_leafs(&[t.id]);
            }
            // `t * 3` is a temporary, so its gradient may be the dropout's output's, reused.
            let y = (t.trace(grads) * 3.0).dropout(0.25);
            let w: Tensor<(usize,), TestDtype, Cpu> = dev
                .tensor_from_vec(data.iter().map(|x| x * 0.5).collect(), (data.len(),))
                .to_dtype::<TestDtype>();
            let g = (y * w).sum().backward();
            g.get(&t).as_vec()
        };
        let (accumulated, in_place) = (grads_of(false), grads_of(true));
        assert!(accumulated.iter().any(|g| *g == TestDtype::default()));
        assert_eq!(accumulated, in_place);
    }

    #[test]
    fn test_dropout_none_0d() {
        let dev: TestDevice = Default::default();
        let t = dev.tensor([3.0, 4.0, 5.0]).to_dtype::<TestDtype>();
        let r = t.leaky_trace().dropout(0.0);
        assert_close_to_literal!(r, [3.0, 4.0, 5.0]);
        let g = r.sum().backward();
        assert_close_to_literal!(g.get(&t), [1.0, 1.0, 1.0]);
    }

    #[test]
    // typed-amp patch: the expected values are upstream's mask (a ChaCha12 Bernoulli draw per
    // element); the fork draws SplitMix64 of the seed and index, as its CUDA kernels do, which
    // drops other elements. tests/fork/dropout.rs checks the fork's mask.
    #[ignore = "upstream's dropout mask; the fork's SplitMix64 mask is checked by tests/fork/dropout.rs"]
    fn test_dropout_1d_with_non_positive_values() {
        let dev: TestDevice = TestDevice::seed_from_u64(1);
        let t = dev
            .tensor([-0.0, 2.0, -3.0, -4.0, -0.0])
            .to_dtype::<TestDtype>();
        let r = t.leaky_trace().dropout(0.5);
        assert_close_to_literal!(r, [0.0, 4.0, -6.0, -8.0, 0.0]);
        let g = r.mean().backward();
        assert_close_to_literal!(g.get(&t), [0.4, 0.4, 0.4, 0.4, 0.0]);
    }

    #[test]
    // typed-amp patch: the expected values are upstream's mask (a ChaCha12 Bernoulli draw per
    // element); the fork draws SplitMix64 of the seed and index, as its CUDA kernels do, which
    // drops other elements. tests/fork/dropout.rs checks the fork's mask.
    #[ignore = "upstream's dropout mask; the fork's SplitMix64 mask is checked by tests/fork/dropout.rs"]
    fn test_dropout_2d() {
        let dev: TestDevice = Default::default();
        let t = dev
            .tensor([[0.05, 0.1, -0.2], [0.3, -0.4, 0.5]])
            .to_dtype::<TestDtype>();
        let r = t.leaky_trace().dropout(0.6);
        assert_close_to_literal!(r, [[0.125, 0.0, -0.5], [0.0, -1.0, 0.0]]);
        // NOTE: .exp() so we ensure result grad is used properly
        let g = r.exp().mean().backward();
        assert_close_to_literal!(
            g.get(&t),
            [[0.4721452, 0.0, 0.25272113], [0.0, 0.1532831, 0.0]]
        );
    }
}
