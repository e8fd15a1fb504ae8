//! ReLU, fused into the op that produced its input where it can be: when the input is the
//! output of an op that offered the fusion (the fused linear op, [`crate::ops::linear`], and
//! batch norm, [`crate::ops::batchnorm`]) recorded just before, and nothing else holds that
//! output, the ReLU overwrites it in place and that op's backward applies the ReLU's derivative
//! (by the ReLU's output: positive where its input was) to its output gradient before using it
//! (the linear op in the pass that sums its bias gradient). The output keeps the input's id, so
//! its gradient is the one the op reads. Otherwise dfdx's ReLU runs.
//!
//! The fused derivative zeroes the gradient where the input was not positive, as PyTorch's
//! `threshold_backward` does; dfdx's multiplies it by zero, which turns an infinite gradient
//! there into NaN. Either way the product reaching the weights is the same for finite values.

mod cpu_kernel;
#[cfg(feature = "cuda")]
mod cuda_kernel;
mod kernel;
mod op;

use dfdx::prelude::{PutTape, Shape, SplitTape, Tape, Tensor};

use crate::device::{AmpDevice, Kernels};
use crate::ops::fused_activation::{ActivationSlot, FusedActivation};
use crate::precision::AmpElem;
use crate::tape::AmpTape;

pub use kernel::ReluKernel;
pub use op::ReluOp;

/// `max(x, 0)`, differentiable on a [`MixedTape`](crate::tape::MixedTape), by the device's
/// [`ReluOp`] (see the module documentation).
pub fn try_relu<S, E, D, T>(x: Tensor<S, E, D, T>) -> Result<Tensor<S, E, D, T>, D::Err>
where
    S: Shape,
    E: AmpElem,
    D: AmpDevice + Kernels<E> + ReluOp<E>,
    T: AmpTape<D> + Tape<E, D>,
{
    D::try_relu(x)
}

/// ReLU fused into the op before it where that op offered and nothing else holds its output,
/// else dfdx's op.
pub fn try_relu_fused<S, E, D, T>(x: Tensor<S, E, D, T>) -> Result<Tensor<S, E, D, T>, D::Err>
where
    S: Shape,
    E: AmpElem,
    D: AmpDevice + Kernels<E> + ReluKernel<E>,
    T: AmpTape<D> + Tape<E, D>,
{
    let (mut x, mut tape) = x.split_tape();
    let offer = tape
        .take_activation(x.id())
        .and_then(|slot| slot.downcast::<ActivationSlot<S, E, D>>().ok());
    if let Some(slot) = offer {
        let dev = x.device().clone();
        if let Some(buf) = x.storage_mut_if_unique() {
            ReluKernel::<E>::try_relu_in_place(&dev, buf)?;
            slot.put(FusedActivation::Relu(x.clone()));
            return Ok(x.put_tape(tape));
        }
    }
    x.put_tape(tape).try_relu()
}

/// ReLU fused on a device with [`ReluKernel`]s.
macro_rules! fused_relu_op {
    ($device:ty, $elem:ident: $bound:path) => {
        impl<$elem: $bound> ReluOp<$elem> for $device {
            fn try_relu<S: Shape, T>(
                x: Tensor<S, $elem, Self, T>,
            ) -> Result<Tensor<S, $elem, Self, T>, Self::Err>
            where
                Self: AmpDevice + Kernels<$elem>,
                T: AmpTape<Self> + Tape<$elem, Self>,
            {
                try_relu_fused(x)
            }
        }
    };
}

fused_relu_op!(dfdx::prelude::Cpu, E: AmpElem);
#[cfg(feature = "cuda")]
fused_relu_op!(dfdx::prelude::Cuda, E: crate::device::utilities::cuda::CudaElem);
