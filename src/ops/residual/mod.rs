//! The residual connection's sum `x + f(x)` as one op whose backward moves no gradient of the
//! branch: the sum is written over the branch's output, whose id it keeps, so the sum's
//! gradient *is* the branch's (∂(b + x)/∂b = 1) and the branch's ops read it where it already
//! is; only the skip's gradient is written, once (a copy, or an add where it already has one).
//!
//! dfdx's `add`, which this replaces in [`Residual`](dfdx::nn::modules::Residual), keeps a
//! new output and in its backward allocates and adds into a gradient for each operand: two
//! read-modify-write passes over the activations and an allocation, per residual connection,
//! per step. Both compute `round(b + x)` in FP32 (the same bits); where the branch's output is
//! shared with another reader, or the two are not laid out alike, dfdx's `add` runs.

use dfdx::prelude::{HasShape, PutTape, Shape, SplitTape, Tape, Tensor, TryAdd};

use crate::device::{AmpDevice, CastKernel, Kernels};
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// `branch + skip`, rounded once, differentiable on a [`MixedTape`](crate::tape::MixedTape)
/// (see the module documentation).
pub fn try_residual_add<S, E, D, T>(
    branch: Tensor<S, E, D, T>,
    skip: Tensor<S, E, D, T>,
) -> Result<Tensor<S, E, D, T>, D::Err>
where
    S: Shape,
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
    T: AmpTape<D> + Tape<E, D>,
    Tensor<S, E, D, T>: TryAdd<Tensor<S, E, D, T>, Err = D::Err>,
{
    let alike = branch.shape().concrete() == skip.shape().concrete()
        && branch.strides() == branch.shape().strides()
        && skip.strides() == skip.shape().strides();
    if !alike {
        return branch.try_add(skip);
    }
    let (mut branch, branch_tape) = branch.split_tape();
    let (skip, skip_tape) = skip.split_tape();
    let dev = branch.device().clone();
    let Some(sum) = branch.storage_mut_if_unique() else {
        return branch
            .put_tape(branch_tape)
            .try_add(skip.put_tape(skip_tape));
    };
    CastKernel::<E, E>::try_add_cast(&dev, skip.storage(), sum)?;
    let mut tape = branch_tape.merge(skip_tape);
    let sum_id = branch.id();
    tape.record_mixed(move |grads| {
        let store = grads.store_mut::<E>();
        if !store.wants_grad(&skip) {
            return Ok(());
        }
        // The sum's gradient stays where it is, the branch's; the skip's gets a copy of it.
        let Some(dsum) = store.remove(sum_id) else {
            return Ok(());
        };
        match store.remove(skip.id()) {
            Some(mut dskip) => {
                CastKernel::<E, E>::try_add_cast(&dev, &dsum, &mut dskip)?;
                store.insert(skip.id(), dskip);
            }
            None => {
                let dskip = CastKernel::<E, E>::try_copy_cast_new(&dev, &dsum)?;
                store.insert(skip.id(), dskip);
            }
        }
        store.insert(sum_id, dsum);
        Ok(())
    });
    Ok(branch.put_tape(tape))
}
