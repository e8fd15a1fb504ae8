//! Exact GELU (`x·Φ(x)`, dfdx's `AccurateGeLU`, the MLP activation of GPT-2 and ViT), fused into
//! the linear op before it where it can be: when the input is the output of a fused linear op
//! ([`crate::ops::linear`]) recorded just before and nothing else holds it, one pass keeps the
//! product's output (GELU's input, which its derivative needs) and overwrites it with the GELU,
//! and the linear op's backward multiplies its output gradient by GELU's derivative in place
//! before using it, instead of dfdx's op writing the input's gradient into a buffer of its own
//! for the linear op to read. The output keeps the input's id, so its gradient is the one the
//! linear op reads. Otherwise (another op before it, or its output shared) dfdx's op runs.
//!
//! Both paths compute the same formulas in FP32 and round once (dfdx's op on 16-bit tensors
//! widens, computes in FP32 and rounds once too, [`typed_amp_kernels::math::gelu`] and
//! [`gelu_derivative`](typed_amp_kernels::math::gelu_derivative) on the CPU), so they agree
//! value for value; the fused one keeps the same two tensors (GELU's input and output) and
//! allocates one gradient fewer. It also offers its output to the op after it as the GELU of
//! the input it keeps (`fused_activation::GeluOutput`): an FP8 linear op there recomputes it in its backward
//! pass instead of keeping its codes ([`crate::ops::fp8_linear`]), and then the output is kept
//! by no one.

mod cpu_kernel;
#[cfg(feature = "cuda")]
mod cuda_kernel;
mod kernel;
mod op;

use std::rc::Rc;

use dfdx::prelude::{HasShape, PutTape, Shape, SplitTape, Storage, Tape, Tensor};

use crate::device::{AmpDevice, Kernels};
use crate::ops::fused_activation::{ActivationSlot, FusedActivation, GeluOutput};
use crate::precision::AmpElem;
use crate::tape::AmpTape;

pub(crate) use cpu_kernel::gelu_into;
pub use kernel::GeluKernel;
pub use op::GeluOp;

/// `x·Φ(x)`, differentiable on a [`MixedTape`](crate::tape::MixedTape), by the device's
/// [`GeluOp`] (see the module documentation).
pub fn try_gelu<S, E, D, T>(x: Tensor<S, E, D, T>) -> Result<Tensor<S, E, D, T>, D::Err>
where
    S: Shape,
    E: AmpElem,
    D: AmpDevice + Kernels<E> + GeluOp<E>,
    T: AmpTape<D> + Tape<E, D>,
{
    D::try_gelu(x)
}

/// GELU fused into the linear op before it where that op offered and nothing else holds its
/// output, else dfdx's op.
pub fn try_gelu_fused<S, E, D, T>(x: Tensor<S, E, D, T>) -> Result<Tensor<S, E, D, T>, D::Err>
where
    S: Shape,
    E: AmpElem,
    D: AmpDevice + Kernels<E> + GeluKernel<E>,
    T: AmpTape<D> + Tape<E, D>,
{
    let (mut x, mut tape) = x.split_tape();
    let offer = tape
        .take_activation(x.id())
        .and_then(|slot| slot.downcast::<ActivationSlot<S, E, D>>().ok())
        .filter(|slot| slot.takes_gelu());
    if let Some(slot) = offer {
        let (dev, shape) = (x.device().clone(), *x.shape());
        if let Some(buf) = x.storage_mut_if_unique() {
            // The output keeps the linear op's output's id (its backward looks the gradient up
            // by it): the new values go into `x`, and the buffer they replace is the kept input.
            let input: Tensor<S, E, D> = match GeluKernel::<E>::try_gelu_new(&dev, buf)? {
                Some(mut y) => {
                    std::mem::swap(buf, &mut y);
                    Storage::<E>::tensor_from_storage(&dev, shape, y)
                }
                None => {
                    let mut input: Tensor<S, E, D> = dev.try_zeros_like(&shape)?;
                    GeluKernel::<E>::try_gelu_keeping_input(&dev, buf, input.storage_mut())?;
                    input
                }
            };
            slot.put(FusedActivation::Gelu(input));
            // An FP8 linear op next may recompute this output from the input kept here.
            tape.offer_activation(x.id(), Rc::new(GeluOutput(slot)));
            return Ok(x.put_tape(tape));
        }
    }
    x.put_tape(tape).try_accurate_gelu()
}

/// GELU fused on a device with [`GeluKernel`]s.
macro_rules! fused_gelu_op {
    ($device:ty, $elem:ident: $bound:path) => {
        impl<$elem: $bound> GeluOp<$elem> for $device {
            fn try_gelu<S: Shape, T>(
                x: Tensor<S, $elem, Self, T>,
            ) -> Result<Tensor<S, $elem, Self, T>, Self::Err>
            where
                Self: AmpDevice + Kernels<$elem>,
                T: AmpTape<Self> + Tape<$elem, Self>,
            {
                try_gelu_fused(x)
            }
        }
    };
}

fused_gelu_op!(dfdx::prelude::Cpu, E: AmpElem);
#[cfg(feature = "cuda")]
fused_gelu_op!(dfdx::prelude::Cuda, E: crate::device::utilities::cuda::CudaElem);
