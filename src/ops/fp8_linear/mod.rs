//! The linear layer with FP8 products, the op of an `#[amp(fp8 = "...")]` model's linear
//! layers ([`Fp8Recipe`]): `y = act(Q(x) · Q(W)ᵀ (+ b))` with both operands quantised to the
//! recipe's forward format (E4M3), and a backward pass that quantises the output gradient to
//! the recipe's backward format (E5M2 in the hybrid recipe) and multiplies it by the forward
//! operands, transposed:
//!
//! - `dx = Q(dy) · Q(W)`, added into the input's gradient in the working precision;
//! - `dW = Q(dy)ᵀ · Q(x)`, written straight into the FP32 weight gradient, as the 16-bit fused
//!   linear op does ([`crate::ops::linear`]);
//! - the bias gradient (a layer with a bias) from the unquantised `dy`, in FP32.
//!
//! Every product runs on the kernels' FP8 GEMM ([`typed_amp_kernels::gemm_fp8_epilogue`]),
//! which reads the codes where they lie, transposed operands by their strides, and widens them
//! (exactly) while it packs them, at the bf16 GEMM's rate; it accumulates in FP32, and its
//! store multiplies by the two operands' `1 / scale`, adds the bias (forward) or the gradient
//! already there (input gradient), and rounds once, straight into the output's buffer in the
//! working precision (the weight gradient's in FP32).
//!
//! What the backward pass keeps of the input, for `dW`: its FP8 codes with their scale (one
//! byte an element), the operand the forward product multiplied, not the 16-bit input, which
//! is freed when the op returns, so the weight gradient is the product of the quantised input
//! that torchao's and Transformer Engine's recipes use. Where another holder of the 16-bit
//! input keeps it anyway (the attention op keeps its output, the input of attention's
//! `c_proj`, for its own backward), the op keeps that shared buffer and the scale instead and
//! quantises it again in the backward pass: the same one-pass cast under the same scale gives
//! the same codes, so `dW` is the same bit for bit, and the codes' byte an element is not held
//! beside two bytes that are held anyway. Where the input is the output of an exact GELU
//! fused into the op before it (the GPT's MLP: `c_fc`, GELU, `c_proj`), which keeps its own
//! input for its derivative, the op keeps neither: its backward computes the GELU again from
//! that kept input, a block at a time, and quantises it under the forward pass's scale (the
//! same formulas, so the same codes), and the GELU's output, four times the model's width, is
//! held by no one after the forward pass (`KeptInput`).
//!
//! Quantising is one vectorised pass over a tensor where the scale is known before it is read
//! (delayed scaling with a history: the cast finds the amax the history records on the way,
//! [`typed_amp_kernels::convert::quantize_fp8`]); otherwise (current scaling, a fresh history)
//! an amax pass comes first.
//!
//! A ReLU or exact GELU after the layer fuses into it as into the 16-bit op
//! ([`crate::ops::gelu`], [`crate::ops::relu`]): the backward applies its derivative to the
//! output gradient in place before quantising it.
//!
//! Scales are per tensor, from the layer's state in the model's recipe
//! ([`crate::fp8::LayerScaling`]: delayed scaling from the amax histories) or, with current
//! scaling, a fresh history, or outside a working copy's forward, from the tensor's own amax.
//! A training forward (a tape that records) records the step's amaxes; an inference forward
//! reads the scales only.
//!
//! Non-finite data: an inf or NaN in the input or weight (so a non-finite amax) runs this call
//! as the 16-bit linear op instead, which carries the inf or NaN into the output, the loss
//! and the gradients, where the step's check finds it; a non-finite output gradient makes the
//! weight and input gradients NaN. A saturating cast would otherwise turn inf into ±448 and
//! hide it. Nothing non-finite is recorded in a history.

mod call_start;
#[cfg(feature = "cuda")]
mod cuda_kernel;
#[cfg(feature = "cuda")]
mod cuda_op;

use std::any::TypeId;
use std::rc::Rc;

use dfdx::nn::modules::Module;
use dfdx::prelude::{
    Cpu, CpuError, HasErr, HasShape, PutTape, SplitTape, Tape, Tensor, ZerosTensor,
};
use half::bf16;

use crate::device::{AmpDevice, Kernels};
use crate::fp8::{
    amax, forward_product_into, gradient_product_into, Fp8Element, Fp8Error, Fp8Recipe, Fp8Source,
    Fp8Tensor, LayerScaling, PerTensor, Role, ScalingMode,
};
use crate::ops::fused_activation::{ActivationSlot, FusedActivation, GeluOutput};
use crate::ops::gelu::{gelu_into, GeluKernel};
use crate::ops::linear::{LinearDims, LinearInput, LinearKernel, LinearOp, LinearParts};
use crate::precision::AmpElem;
use crate::tape::AmpTape;
use call_start::{contiguous_rows, layer_state};

/// How a device runs a linear layer with FP8 products under recipe `R`, on activations of
/// element type `E`. The CPU runs [`try_fp8_linear_cpu`], CUDA the same recipe on cuBLASLt
/// (`cuda_op.rs`); a device without FP8 products has no impl, and an FP8 model does not
/// compile for it.
#[doc(hidden)] // a device's machinery, behind `#[amp(fp8 = ...)]`.
pub trait Fp8LinearOp<E: AmpElem>: HasErr + Sized {
    /// `layer` on `x` with FP8 products.
    fn try_fp8_linear<R, S, const I: usize, const O: usize, T, L>(
        layer: &L,
        x: Tensor<S, E, Self, T>,
    ) -> Result<Tensor<S::Output, E, Self, T>, Self::Err>
    where
        R: Fp8Recipe,
        Self: AmpDevice + Kernels<E> + LinearOp<E>,
        S: LinearInput<I, O>,
        T: AmpTape<Self> + Tape<E, Self>,
        L: LinearParts<I, O, E, Self>
            + Module<Tensor<S, E, Self, T>, Output = Tensor<S::Output, E, Self, T>, Error = Self::Err>;
}

impl<E: AmpElem + Fp8Source> Fp8LinearOp<E> for Cpu {
    fn try_fp8_linear<R, S, const I: usize, const O: usize, T, L>(
        layer: &L,
        x: Tensor<S, E, Self, T>,
    ) -> Result<Tensor<S::Output, E, Self, T>, CpuError>
    where
        R: Fp8Recipe,
        Self: AmpDevice + Kernels<E> + LinearOp<E>,
        S: LinearInput<I, O>,
        T: AmpTape<Self> + Tape<E, Self>,
        L: LinearParts<I, O, E, Self>
            + Module<Tensor<S, E, Self, T>, Output = Tensor<S::Output, E, Self, T>, Error = CpuError>,
    {
        try_fp8_linear_cpu::<R, S, I, O, E, T, L>(layer, x)
    }
}

#[cfg(feature = "cuda")]
impl<E: crate::device::utilities::cuda::CudaElem + Fp8Source> Fp8LinearOp<E>
    for dfdx::prelude::Cuda
{
    fn try_fp8_linear<R, S, const I: usize, const O: usize, T, L>(
        layer: &L,
        x: Tensor<S, E, Self, T>,
    ) -> Result<Tensor<S::Output, E, Self, T>, Self::Err>
    where
        R: Fp8Recipe,
        Self: AmpDevice + Kernels<E> + LinearOp<E>,
        S: LinearInput<I, O>,
        T: AmpTape<Self> + Tape<E, Self>,
        L: LinearParts<I, O, E, Self>
            + Module<Tensor<S, E, Self, T>, Output = Tensor<S::Output, E, Self, T>, Error = Self::Err>,
    {
        cuda_op::try_fp8_linear_cuda::<R, S, I, O, E, T, L>(layer, x)
    }
}

/// Runs `layer` on `x` with FP8 products under recipe `R` (the device's [`Fp8LinearOp`]).
pub fn try_fp8_linear<R, S, const I: usize, const O: usize, E, D, T, L>(
    layer: &L,
    x: Tensor<S, E, D, T>,
) -> Result<Tensor<S::Output, E, D, T>, D::Err>
where
    R: Fp8Recipe,
    S: LinearInput<I, O>,
    E: AmpElem,
    D: AmpDevice + Kernels<E> + LinearOp<E> + Fp8LinearOp<E>,
    T: AmpTape<D> + Tape<E, D>,
    L: LinearParts<I, O, E, D>
        + Module<Tensor<S, E, D, T>, Output = Tensor<S::Output, E, D, T>, Error = D::Err>,
{
    D::try_fp8_linear::<R, S, I, O, T, L>(layer, x)
}

/// A shape error of the FP8 products as the CPU's error (the shapes are the layer's own, so
/// this means a buffer does not match its tensor).
fn cpu_err(_: Fp8Error) -> CpuError {
    CpuError::WrongNumElements
}

/// `data` (`rows × cols`) quantised to format `F` for `role`, with its amax (NaN if it holds a
/// NaN, inf if an inf and no NaN). Under delayed scaling whose history holds an amax the scale
/// is the history's, known before the data is read, and one pass casts and finds the amax;
/// otherwise (current scaling, a fresh history, no recipe state) the amax is found first and
/// the scale comes from it, 1 for an all-zero or non-finite tensor (which the caller then does
/// not use).
fn quantize<F: Fp8Element, M: ScalingMode, E: Fp8Source>(
    state: Option<&LayerScaling>,
    role: Role,
    data: &[E],
    rows: usize,
    cols: usize,
) -> Result<(Fp8Tensor<F, PerTensor, M>, f32), CpuError> {
    if let Some(scale) = state.and_then(|s| s.scale::<F>(role, M::MARGIN)) {
        return Fp8Tensor::quantize_with_scale_amax(data, rows, cols, scale).map_err(cpu_err);
    }
    let a = amax(data);
    let scale = if a > 0.0 {
        crate::fp8::scale_from_amax(F::MAX, a, M::MARGIN).unwrap_or(1.0)
    } else {
        1.0
    };
    let q = Fp8Tensor::quantize_with_scale(data, rows, cols, scale).map_err(cpu_err)?;
    Ok((q, a))
}

/// A CPU buffer as a slice (here, where no bound hides what the CPU's buffers are).
fn host<E: dfdx::prelude::Unit>(v: &<Cpu as dfdx::prelude::Storage<E>>::Vec) -> &[E] {
    v
}

/// A CPU buffer as a mutable slice.
fn host_mut<E: dfdx::prelude::Unit>(v: &mut <Cpu as dfdx::prelude::Storage<E>>::Vec) -> &mut [E] {
    v
}

/// What the backward pass keeps of the input for the weight gradient (see the
/// [module](self) documentation).
enum KeptInput<F: Fp8Element, M: ScalingMode, S: dfdx::prelude::Shape, E: AmpElem> {
    /// The codes the forward product multiplied, with their scale; the 16-bit input is freed.
    Codes(Fp8Tensor<F, PerTensor, M>),
    /// The 16-bit input, which something else (the op that made it) also holds, and the scale
    /// the forward pass quantised it with.
    Shared(Tensor<S, E, Cpu>, f32),
    /// The input is `gelu(h)` of the `h` this slot keeps for the op the GELU fused into (whose
    /// backward runs after this op's), and the scale the forward pass quantised it with.
    Gelu(Rc<ActivationSlot<S, E, Cpu>>, f32),
}

impl<F: Fp8Element, M: ScalingMode, S: dfdx::prelude::Shape, E: AmpElem + Fp8Source>
    KeptInput<F, M, S, E>
{
    /// The input's codes: those kept, or the shared input quantised again under the forward
    /// pass's scale (the same one-pass cast, so the same codes).
    fn into_codes(self, rows: usize, cols: usize) -> Result<Fp8Tensor<F, PerTensor, M>, CpuError> {
        match self {
            KeptInput::Codes(q) => Ok(q),
            KeptInput::Shared(x, scale) => {
                Fp8Tensor::quantize_with_scale(host::<E>(x.storage()), rows, cols, scale)
                    .map_err(cpu_err)
            }
            KeptInput::Gelu(slot, scale) => slot
                .with_gelu_input(|h| {
                    let h = host::<E>(h.storage());
                    Fp8Tensor::quantize_with_scale_by(rows, cols, scale, |first, block| {
                        gelu_into(&h[first..first + block.len()], block)
                    })
                    .map_err(cpu_err)
                })
                // The slot's op runs its backward after this one, so the input is still there.
                .unwrap_or(Err(CpuError::WrongNumElements)),
        }
    }
}

/// Where an FP8 product stores: the kernels' FP8 GEMM writes bf16 or FP32.
enum Out<'a> {
    Bf16(&'a mut [bf16]),
    F32(&'a mut [f32]),
}

/// Runs `product` (which stores into an [`Out`], adding to what is there with `accumulate`)
/// into `out`: the buffer itself where the working precision is bf16 or FP32; otherwise (f16)
/// an FP32 copy, stored back with one rounding, the arithmetic of a 16-bit C.
fn into_working<E: AmpElem>(
    out: &mut [E],
    accumulate: bool,
    product: impl FnOnce(Out<'_>) -> Result<bool, Fp8Error>,
) -> Result<(), CpuError> {
    let (ptr, len) = (out.as_mut_ptr(), out.len());
    if TypeId::of::<E>() == TypeId::of::<bf16>() {
        // SAFETY: `E` is `bf16`: the same slice, borrowed uniquely for as long as `out`.
        let c = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<bf16>(), len) };
        return product(Out::Bf16(c)).map(drop).map_err(cpu_err);
    }
    if TypeId::of::<E>() == TypeId::of::<f32>() {
        // SAFETY: `E` is `f32`, as above.
        let c = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<f32>(), len) };
        return product(Out::F32(c)).map(drop).map_err(cpu_err);
    }
    let mut acc = vec![0f32; len];
    if accumulate {
        E::slice_to_f32(out, &mut acc);
    }
    product(Out::F32(&mut acc)).map_err(cpu_err)?;
    E::slice_from_f32(&acc, out);
    Ok(())
}

/// The CPU's FP8 linear op (see the [module](self) documentation).
pub fn try_fp8_linear_cpu<R, S, const I: usize, const O: usize, E, T, L>(
    layer: &L,
    x: Tensor<S, E, Cpu, T>,
) -> Result<Tensor<S::Output, E, Cpu, T>, CpuError>
where
    R: Fp8Recipe,
    S: LinearInput<I, O>,
    E: AmpElem + Fp8Source,
    Cpu: AmpDevice + Kernels<E> + LinearOp<E>,
    T: AmpTape<Cpu> + Tape<E, Cpu>,
    L: LinearParts<I, O, E, Cpu>
        + Module<Tensor<S, E, Cpu, T>, Output = Tensor<S::Output, E, Cpu, T>, Error = CpuError>,
{
    type Fwd<R> = <R as Fp8Recipe>::Forward;
    type Bwd<R> = <R as Fp8Recipe>::Backward;
    type Mode<R> = <R as Fp8Recipe>::Scaling;
    let state = layer_state::<R>();
    let records = <T as Tape<E, Cpu>>::OWNS_TAPE;
    let shape = *x.shape();
    let Some(rows) = contiguous_rows(&shape, x.strides()) else {
        return crate::ops::linear::try_linear(layer, x);
    };
    let timing = typed_amp_kernels::timing::scope(typed_amp_kernels::timing::Kind::Products);
    let (qx, ax) = quantize::<Fwd<R>, Mode<R>, E>(
        state.as_ref(),
        Role::Input,
        host::<E>(x.storage()),
        rows,
        I,
    )?;
    let (qw, aw) = quantize::<Fwd<R>, Mode<R>, E>(
        state.as_ref(),
        Role::Weight,
        host::<E>(layer.weight().storage()),
        O,
        I,
    )?;
    if !(ax.is_finite() && aw.is_finite()) {
        drop(timing);
        return crate::ops::linear::try_linear(layer, x);
    }
    let bias = layer.bias().cloned();
    let bias32 = bias.as_ref().map(|b| {
        let mut b32 = vec![0f32; O];
        E::slice_to_f32(host::<E>(b.storage()), &mut b32);
        b32
    });
    if let (true, Some(s)) = (records, &state) {
        s.observe(Role::Input, ax);
        s.observe(Role::Weight, aw);
    }
    let (mut x, mut tape) = x.split_tape();
    let dev = x.device().clone();
    let mut y: Tensor<S::Output, E, Cpu> = dev.try_zeros_like(&shape.output())?;
    into_working(host_mut::<E>(y.storage_mut()), false, |out| match out {
        Out::Bf16(c) => forward_product_into(&qx, &qw, c, bias32.as_deref()),
        Out::F32(c) => forward_product_into(&qx, &qw, c, bias32.as_deref()),
    })?;
    drop(bias32);
    let x_ghost = x.ghost();
    // Only a recording tape has a backward pass to keep anything for. Where nothing else holds
    // the 16-bit input, the codes are kept and the input is freed when this op returns; where
    // something does, keeping the input costs nothing and the codes are freed instead.
    let shared = x.storage_mut_if_unique().is_none();
    let gelu = tape
        .take_activation(x.id())
        .and_then(|offer| offer.downcast::<GeluOutput<S, E, Cpu>>().ok());
    let kept = match (records, shared, gelu) {
        (false, _, _) => None,
        (true, true, _) => Some(KeptInput::Shared(x, qx.scales()[0])),
        (true, false, Some(gelu)) => Some(KeptInput::Gelu(gelu.0.clone(), qx.scales()[0])),
        (true, false, None) => Some(KeptInput::Codes(qx)),
    };
    let weight_id = layer.weight().id();
    let y_id = y.id();
    let dims = LinearDims {
        rows,
        inputs: I,
        outputs: O,
    };
    // This op's backward applies ReLU's or GELU's derivative to its output gradient.
    let fused = ActivationSlot::<S::Output, E, Cpu>::new(true);
    let activation = fused.clone();
    tape.record_mixed(move |grads| {
        let _timing = typed_amp_kernels::timing::scope(typed_amp_kernels::timing::Kind::Products);
        // This op is the only reader of its output's gradient: it takes it and works in place.
        let Some(mut dy) = grads.store_mut::<E>().remove(y_id) else {
            return Ok(());
        };
        match activation.take() {
            Some(FusedActivation::Gelu(input)) => {
                GeluKernel::<E>::try_gelu_backward(&dev, input.storage(), &mut dy)?
            }
            Some(FusedActivation::Relu(out)) => LinearKernel::<E>::try_linear_backward_bias(
                &dev,
                dims,
                Some(out.storage()),
                &mut dy,
                None,
            )?,
            None => {}
        }
        let dy = host::<E>(&dy);
        if let Some(b) = &bias {
            if let Some((db, fresh)) = grads.param_grad_mut(b.id(), O, &dev)? {
                let mut sums = vec![0f64; O];
                let mut row = vec![0f32; O];
                for r in dy.chunks(O.max(1)) {
                    E::slice_to_f32(r, &mut row);
                    sums.iter_mut().zip(&row).for_each(|(s, v)| *s += *v as f64);
                }
                for (d, s) in db.iter_mut().zip(&sums) {
                    *d = if fresh { *s as f32 } else { *d + *s as f32 };
                }
            }
        }
        let (qdy, ady) =
            quantize::<Bwd<R>, Mode<R>, E>(state.as_ref(), Role::OutputGrad, dy, rows, O)?;
        let finite = ady.is_finite();
        if let (true, Some(s)) = (finite, &state) {
            s.observe(Role::OutputGrad, ady);
        }
        if let Some((dw, fresh)) = grads.param_grad_mut(weight_id, O * I, &dev)? {
            let dw = host_mut::<f32>(dw);
            // `kept` is `None` only on a tape that does not record, whose backward never runs.
            let qx = match kept {
                Some(kept) if finite => Some(kept.into_codes(rows, I)?),
                _ => None,
            };
            if let Some(qx) = qx {
                // dW = Q(dy)ᵀ · Q(x): (O × rows) · (rows × I), x's codes read transposed.
                gradient_product_into((&qdy, true), (&qx, true), dw, !fresh).map_err(cpu_err)?;
            } else {
                // The step's check finds the NaN and skips the step.
                dw.fill(f32::NAN);
            }
        }
        let store = grads.store_mut::<E>();
        if store.wants_grad(&x_ghost) {
            let dx = host_mut::<E>(store.get_or_alloc_mut(&x_ghost)?);
            if finite {
                // dx += Q(dy) · Q(W): (rows × O) · (O × I), W's codes read transposed.
                into_working(dx, true, |out| match out {
                    Out::Bf16(c) => gradient_product_into((&qdy, false), (&qw, true), c, true),
                    Out::F32(c) => gradient_product_into((&qdy, false), (&qw, true), c, true),
                })?;
            } else {
                let nan = vec![f32::NAN; dx.len()];
                E::slice_from_f32(&nan, dx);
            }
        }
        Ok(())
    });
    tape.offer_activation(y.id(), fused);
    drop(timing);
    Ok(y.put_tape(tape))
}
