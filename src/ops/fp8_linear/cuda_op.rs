//! The CUDA device's FP8 linear op: the CPU op's recipe (see the [module](super)
//! documentation), with the codes from the quantise kernels of `cuda_kernel.rs` and the
//! products on cuBLASLt (`device/utilities/cuda_gemm_fp8.rs`).
//!
//! cuBLASLt multiplies FP8 operands only "TN" (both with the sum's dimension along their rows),
//! so the forward product reads the input's and the weight's codes as they are, and the forward
//! pass keeps the transposes the backward products need (the input's and the weight's codes,
//! transposed, in place of the input), as Transformer Engine does; the output gradient's
//! codes are transposed for the weight gradient. Each product goes to an FP32 buffer, and one
//! kernel adds the bias (forward) or the gradient already there (input gradient) and rounds
//! once into the working precision, as the CPU's store does; the weight gradient is the FP32
//! product itself, added by cuBLASLt's `beta = 1` where the buffer holds an earlier one.
//!
//! Where cuBLASLt cannot run the products the call runs as the 16-bit CUDA linear op
//! ([`crate::ops::linear`]), taking no amaxes: a GPU below compute capability 8.9 (noted once
//! on standard error), a layer whose rows, inputs or outputs are not multiples of 16, a recipe
//! whose backward product would be E5M2 by E5M2. The CPU op's non-finite rules hold as they
//! are: an inf or NaN in the input or weight runs the 16-bit op, a non-finite output gradient
//! makes both gradients NaN, and nothing non-finite is recorded.
//!
//! Each quantisation reads its amax back (a wait for the stream): the scales of the
//! products and the decision between FP8 and the 16-bit op are the host's, as on the CPU.

use std::sync::Once;

use cudarc::driver::CudaSlice;
use dfdx::nn::modules::Module;
use dfdx::prelude::{HasShape, PutTape, SplitTape, Storage, Tape, Tensor, ZerosTensor};
use dfdx::tensor::{CpuError, Cuda, CudaError};

use super::call_start::{contiguous_rows, layer_state};
use super::cuda_kernel;
use crate::device::utilities::cuda::CudaElem;
use crate::device::utilities::cuda_gemm_fp8::{
    fp8_capable, gemm_fp8, qualifies, Fp8GemmError, Fp8Operand, Fp8Type,
};
use crate::device::{AmpDevice, CastKernel, FillKernel, Kernels};
use crate::fp8::{
    scale_from_amax, Fp8Element, Fp8Kind, Fp8Recipe, Fp8Source, LayerScaling, Role, ScalingMode,
};
use crate::ops::fused_activation::{ActivationSlot, FusedActivation};
use crate::ops::gelu::GeluKernel;
use crate::ops::linear::{LinearDims, LinearInput, LinearKernel, LinearOp, LinearParts};
use crate::tape::AmpTape;

/// A quantised tensor on the device: its codes, format and scale.
struct Codes {
    codes: CudaSlice<u8>,
    format: Fp8Type,
    scale: f32,
}

impl Codes {
    fn operand(&self) -> Fp8Operand<'_> {
        Fp8Operand {
            codes: &self.codes,
            format: self.format,
            inv_scale: 1.0 / self.scale,
        }
    }
}

fn fp8_type<F: Fp8Element>() -> Fp8Type {
    match F::KIND {
        Fp8Kind::E4M3 => Fp8Type::E4M3,
        Fp8Kind::E5M2 => Fp8Type::E5M2,
    }
}

/// A product refused after the shapes were checked: a bug, reported as a length mismatch.
fn refused(_: Fp8GemmError) -> CudaError {
    CudaError::Cpu(CpuError::WrongNumElements)
}

/// `data` quantised to `F` for `role`, with its amax, as the CPU op's `quantize`: the history's
/// scale where it has one (one launch casts and finds the amax), else the amax first and the
/// scale from it (1 for an all-zero or non-finite tensor, which the caller then does not use).
fn quantize<F: Fp8Element, M: ScalingMode, E: CudaElem>(
    dev: &Cuda,
    state: Option<&LayerScaling>,
    role: Role,
    data: &<Cuda as Storage<E>>::Vec,
) -> Result<(Codes, f32), CudaError> {
    let known = state.and_then(|s| s.scale::<F>(role, M::MARGIN));
    let (scale, first) = match known {
        Some(scale) => (scale, None),
        None => {
            let a = cuda_kernel::amax::<E>(dev, data)?;
            let scale = if a > 0.0 {
                scale_from_amax(F::MAX, a, M::MARGIN).unwrap_or(1.0)
            } else {
                1.0
            };
            (scale, Some(a))
        }
    };
    let (codes, a) = cuda_kernel::quantize::<F, E>(dev, data, scale)?;
    let codes = Codes {
        codes,
        format: fp8_type::<F>(),
        scale,
    };
    Ok((codes, first.unwrap_or(a)))
}

/// Why this call cannot run FP8 products on cuBLASLt, if it cannot.
fn unqualified<R: Fp8Recipe>(
    dev: &Cuda,
    dims: LinearDims,
) -> Result<Option<Fp8GemmError>, CudaError> {
    if let Err(e) = fp8_capable(dev)? {
        static NOTE: Once = Once::new();
        NOTE.call_once(|| {
            eprintln!("typed-amp: {e}: FP8 linear layers run as 16-bit linear layers on it");
        });
        return Ok(Some(e));
    }
    let fwd = fp8_type::<R::Forward>();
    let bwd = fp8_type::<R::Backward>();
    // The three products multiply over inputs, outputs and rows, and give rows × outputs,
    // rows × inputs and outputs × inputs: every one of them must be a multiple of 16.
    let shape = (dims.rows, dims.outputs, dims.inputs);
    Ok(qualifies(shape, fwd, fwd)
        .and_then(|()| qualifies(shape, bwd, fwd))
        .err())
}

/// The CUDA device's FP8 linear op (see the [module](self) documentation).
pub(super) fn try_fp8_linear_cuda<R, S, const I: usize, const O: usize, E, T, L>(
    layer: &L,
    x: Tensor<S, E, Cuda, T>,
) -> Result<Tensor<S::Output, E, Cuda, T>, CudaError>
where
    R: Fp8Recipe,
    S: LinearInput<I, O>,
    E: CudaElem + Fp8Source,
    Cuda: AmpDevice + Kernels<E> + LinearOp<E>,
    T: AmpTape<Cuda> + Tape<E, Cuda>,
    L: LinearParts<I, O, E, Cuda>
        + Module<Tensor<S, E, Cuda, T>, Output = Tensor<S::Output, E, Cuda, T>, Error = CudaError>,
{
    type Fwd<R> = <R as Fp8Recipe>::Forward;
    type Bwd<R> = <R as Fp8Recipe>::Backward;
    type Mode<R> = <R as Fp8Recipe>::Scaling;
    let state = layer_state::<R>();
    let records = <T as Tape<E, Cuda>>::OWNS_TAPE;
    let shape = *x.shape();
    let Some(rows) = contiguous_rows(&shape, x.strides()) else {
        return crate::ops::linear::try_linear(layer, x);
    };
    let dims = LinearDims {
        rows,
        inputs: I,
        outputs: O,
    };
    let dev = x.device().clone();
    if unqualified::<R>(&dev, dims)?.is_some() {
        return crate::ops::linear::try_linear(layer, x);
    }
    let timing = typed_amp_kernels::timing::scope(typed_amp_kernels::timing::Kind::Products);
    let (qx, ax) = quantize::<Fwd<R>, Mode<R>, E>(&dev, state.as_ref(), Role::Input, x.storage())?;
    let (qw, aw) = quantize::<Fwd<R>, Mode<R>, E>(
        &dev,
        state.as_ref(),
        Role::Weight,
        layer.weight().storage(),
    )?;
    if !(ax.is_finite() && aw.is_finite()) {
        drop(timing);
        return crate::ops::linear::try_linear(layer, x);
    }
    if let (true, Some(s)) = (records, &state) {
        s.observe(Role::Input, ax);
        s.observe(Role::Weight, aw);
    }
    let bias = layer.bias().cloned();
    let (x, mut tape) = x.split_tape();
    let mut y: Tensor<S::Output, E, Cuda> = dev.try_zeros_like(&shape.output())?;
    {
        // y = Q(x) · Q(W)ᵀ: rows × I by (O × I)ᵀ, both read as they lie.
        let mut acc = Storage::<f32>::try_alloc_len(&dev, rows * O)?;
        gemm_fp8(
            &dev,
            (rows, O, I),
            qx.operand(),
            qw.operand(),
            &mut acc,
            0.0,
        )?
        .map_err(refused)?;
        cuda_kernel::store::<E>(
            &dev,
            O,
            &acc,
            bias.as_ref().map(|b| b.storage()),
            y.storage_mut(),
        )?;
    }
    // What the backward products read, transposed for cuBLASLt: xᵀ (I × rows) for the weight
    // gradient, Wᵀ (I × O) for the input gradient; nothing without a tape.
    let kept = if records {
        let xt = cuda_kernel::transpose(&dev, &qx.codes, rows, I)?;
        let wt = cuda_kernel::transpose(&dev, &qw.codes, O, I)?;
        Some((Codes { codes: xt, ..qx }, Codes { codes: wt, ..qw }))
    } else {
        None
    };
    let x_ghost = x.ghost();
    // The input is kept for the backward pass as FP8 codes with their scale.
    drop(x);
    let weight_id = layer.weight().id();
    let y_id = y.id();
    // This op's backward applies ReLU's or GELU's derivative to its output gradient.
    let fused = ActivationSlot::<S::Output, E, Cuda>::new(true);
    let activation = fused.clone();
    tape.record_mixed(move |grads| {
        let _timing = typed_amp_kernels::timing::scope(typed_amp_kernels::timing::Kind::Products);
        let Some((xt, wt)) = &kept else {
            return Ok(());
        };
        // This op is the only reader of its output's gradient: it takes it and works in place.
        let Some(mut dy) = grads.store_mut::<E>().remove(y_id) else {
            return Ok(());
        };
        let relu_out = match activation.take() {
            Some(FusedActivation::Gelu(input)) => {
                GeluKernel::<E>::try_gelu_backward(&dev, input.storage(), &mut dy)?;
                None
            }
            Some(FusedActivation::Relu(out)) => Some(out),
            None => None,
        };
        {
            // The bias gradient from the unquantised dy (ReLU's mask applied in the same pass).
            let db = match &bias {
                Some(b) => grads.param_grad_mut(b.id(), O, &dev)?,
                None => None,
            };
            let relu_out = relu_out.as_ref().map(|t| t.storage());
            LinearKernel::<E>::try_linear_backward_bias(&dev, dims, relu_out, &mut dy, db)?;
        }
        let (qdy, ady) =
            quantize::<Bwd<R>, Mode<R>, E>(&dev, state.as_ref(), Role::OutputGrad, &dy)?;
        drop(dy);
        let finite = ady.is_finite();
        if let (true, Some(s)) = (finite, &state) {
            s.observe(Role::OutputGrad, ady);
        }
        if let Some((dw, fresh)) = grads.param_grad_mut(weight_id, O * I, &dev)? {
            if finite {
                // dW = Q(dy)ᵀ · Q(x): (O × rows) by (I × rows)ᵀ.
                let dyt = Codes {
                    codes: cuda_kernel::transpose(&dev, &qdy.codes, rows, O)?,
                    format: qdy.format,
                    scale: qdy.scale,
                };
                let beta = if fresh { 0.0 } else { 1.0 };
                gemm_fp8(&dev, (O, I, rows), dyt.operand(), xt.operand(), dw, beta)?
                    .map_err(refused)?;
            } else {
                // The step's check finds the NaN and skips the step.
                FillKernel::<f32>::try_fill(&dev, dw, f32::NAN)?;
            }
        }
        let store = grads.store_mut::<E>();
        if store.wants_grad(&x_ghost) {
            let dx = store.get_or_alloc_mut(&x_ghost)?;
            if finite {
                // dx += Q(dy) · Q(W): (rows × O) by (I × O)ᵀ, rounded once into dx.
                let mut acc = Storage::<f32>::try_alloc_len(&dev, rows * I)?;
                gemm_fp8(
                    &dev,
                    (rows, I, O),
                    qdy.operand(),
                    wt.operand(),
                    &mut acc,
                    0.0,
                )?
                .map_err(refused)?;
                CastKernel::<f32, E>::try_add_cast(&dev, &acc, dx)?;
            } else {
                FillKernel::<E>::try_fill(&dev, dx, f32::NAN)?;
            }
        }
        Ok(())
    });
    tape.offer_activation(y.id(), fused);
    drop(timing);
    Ok(y.put_tape(tape))
}
