//! The linear layer as one op: `y = act(x · Wᵀ + b)`, with the bias (and a ReLU or exact GELU
//! that follows, see [`crate::ops::relu`] and [`crate::ops::gelu`]) applied as the product's
//! output is stored (GELU in one pass over it just after), and a backward that
//!
//! - masks the output gradient by the ReLU and sums the bias gradient in one pass over it (or
//!   multiplies it by GELU's derivative first, where an exact GELU fused, [`crate::ops::gelu`]);
//! - writes the weight gradient straight into an FP32 buffer ([`MixedGradients::param_grad`](crate::tape::MixedGradients::param_grad)):
//!   the product accumulates in FP32 anyway, so a 16-bit weight's gradient is never rounded to
//!   16 bits and widened again, and its buffer, reused from the last pass, is overwritten
//!   rather than zeroed and added to;
//! - skips the input's gradient where nobody reads it (a model's input).
//!
//! `#[amp]` runs dfdx's `Linear` and `UnbiasedLinear` through it ([`crate::amp::kind::Linear`]).
//! How it runs is the device's ([`LinearOp`]): the default is the layer's own forward (dfdx's
//! matmul and broadcast add); the CPU (on `typed_amp_kernels`' GEMM, the bias in the product's
//! store) and CUDA (cuBLAS with FP32 accumulation, the FP32 weight gradient from the product's
//! FP32 output) run the fused op ([`try_linear_fused`]). Inputs that are not contiguous rows run
//! the layer's own forward on every device.

mod cpu_kernel;
#[cfg(feature = "cuda")]
mod cuda_kernel;
mod kernel;
mod layer;
mod op;

use dfdx::nn::modules::Module;
use dfdx::prelude::{HasShape, PutTape, SplitTape, Storage, Tensor};

use crate::device::{AmpDevice, Kernels};
use crate::ops::fused_activation::{ActivationSlot, FusedActivation};
use crate::ops::gelu::GeluKernel;
use crate::precision::AmpElem;
use crate::tape::AmpTape;

pub use kernel::{LinearDims, LinearKernel};
pub use layer::{LinearInput, LinearParts};
pub use op::LinearOp;

/// Runs `layer` on `x` by the device's [`LinearOp`].
pub fn try_linear<S, const I: usize, const O: usize, E, D, T, L>(
    layer: &L,
    x: Tensor<S, E, D, T>,
) -> Result<Tensor<S::Output, E, D, T>, D::Err>
where
    S: LinearInput<I, O>,
    E: AmpElem,
    D: AmpDevice + Kernels<E> + LinearOp<E>,
    T: AmpTape<D>,
    L: LinearParts<I, O, E, D>
        + Module<Tensor<S, E, D, T>, Output = Tensor<S::Output, E, D, T>, Error = D::Err>,
{
    D::try_linear(layer, x)
}

/// Runs `layer` on `x` as one fused op where the input is contiguous rows, else with the
/// layer's own forward.
pub fn try_linear_fused<S, const I: usize, const O: usize, E, D, T, L>(
    layer: &L,
    x: Tensor<S, E, D, T>,
) -> Result<Tensor<S::Output, E, D, T>, D::Err>
where
    S: LinearInput<I, O>,
    E: AmpElem,
    D: AmpDevice + Kernels<E> + LinearKernel<E> + GeluKernel<E>,
    T: AmpTape<D>,
    L: LinearParts<I, O, E, D>
        + Module<Tensor<S, E, D, T>, Output = Tensor<S::Output, E, D, T>, Error = D::Err>,
{
    let shape = *x.shape();
    let Some(x_rs) = shape.row_stride(x.strides()) else {
        return layer.try_forward(x);
    };
    let _timing = typed_amp_kernels::timing::scope(typed_amp_kernels::timing::Kind::Products);
    let dims = LinearDims {
        rows: shape.num_elements() / I.max(1),
        inputs: I,
        outputs: O,
    };
    let (x, mut tape) = x.split_tape();
    let dev = x.device().clone();
    let y = LinearKernel::<E>::try_linear_forward_new(
        &dev,
        dims,
        x.storage(),
        x_rs,
        layer.weight().storage(),
        layer.bias().map(|b| b.storage()),
    )?;
    let y: Tensor<S::Output, E, D> = Storage::<E>::tensor_from_storage(&dev, shape.output(), y);
    let (weight, bias) = (layer.weight().clone(), layer.bias().cloned());
    let y_id = y.id();
    // This op's backward applies ReLU's or GELU's derivative to its output gradient.
    let fused = ActivationSlot::<S::Output, E, D>::new(true);
    let activation = fused.clone();
    tape.record_mixed(move |grads| {
        let _timing = typed_amp_kernels::timing::scope(typed_amp_kernels::timing::Kind::Products);
        // This op is the only reader of its output's gradient: it takes it and works in place.
        let Some(mut dy) = grads.store_mut::<E>().remove(y_id) else {
            return Ok(());
        };
        let relu_out = match activation.take() {
            Some(FusedActivation::Relu(out)) => Some(out),
            Some(FusedActivation::Gelu(input)) => {
                GeluKernel::<E>::try_gelu_backward(&dev, input.storage(), &mut dy)?;
                None
            }
            None => None,
        };
        let relu_out = relu_out.as_ref().map(|t| t.storage());
        {
            let db = match &bias {
                Some(bias) => grads.param_grad_mut(bias.id(), O, &dev)?,
                None => None,
            };
            LinearKernel::<E>::try_linear_backward_bias(&dev, dims, relu_out, &mut dy, db)?;
        }
        if let Some(dw) = grads.param_grad_mut(weight.id(), O * I, &dev)? {
            LinearKernel::<E>::try_linear_backward_weight(&dev, dims, &dy, x.storage(), x_rs, dw)?;
        }
        let store = grads.store_mut::<E>();
        // The first gradient of a contiguous input: written into a new buffer, not added to
        // a zero-filled one.
        let fresh = store.get_ref_checked(&x).is_none()
            && x_rs == I
            && Storage::<E>::len(&dev, x.storage()) == dims.rows * I;
        if store.wants_grad(&x) && fresh {
            let dx = LinearKernel::<E>::try_linear_backward_input_new(
                &dev,
                dims,
                &dy,
                weight.storage(),
            )?;
            store.insert(x.id(), dx);
        } else if store.wants_grad(&x) {
            let dx = store.get_or_alloc_mut(&x)?;
            LinearKernel::<E>::try_linear_backward_input(
                &dev,
                dims,
                &dy,
                weight.storage(),
                dx,
                x_rs,
            )?;
        }
        Ok(())
    });
    tape.offer_activation(y.id(), fused);
    Ok(y.put_tape(tape))
}

/// The fused op on a device with [`LinearKernel`]s.
macro_rules! fused_linear_op {
    ($device:ty, $elem:ident: $bound:path) => {
        impl<$elem: $bound> LinearOp<$elem> for $device {
            fn try_linear<S, const I: usize, const O: usize, T, L>(
                layer: &L,
                x: Tensor<S, $elem, Self, T>,
            ) -> Result<Tensor<S::Output, $elem, Self, T>, Self::Err>
            where
                Self: AmpDevice + Kernels<$elem>,
                S: LinearInput<I, O>,
                T: AmpTape<Self>,
                L: LinearParts<I, O, $elem, Self>
                    + Module<
                        Tensor<S, $elem, Self, T>,
                        Output = Tensor<S::Output, $elem, Self, T>,
                        Error = Self::Err,
                    >,
            {
                try_linear_fused(layer, x)
            }
        }
    };
}

fused_linear_op!(dfdx::prelude::Cpu, E: AmpElem);
#[cfg(feature = "cuda")]
fused_linear_op!(dfdx::prelude::Cuda, E: crate::device::utilities::cuda::CudaElem);
