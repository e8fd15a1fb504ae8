//! The linear layer with FP8 products, the op of an `#[amp(fp8 = "...")]` model's linear
//! layers ([`Fp8Recipe`]): `y = Q(x) · Q(W)ᵀ (+ b)` with both operands quantised to the
//! recipe's forward format (E4M3), and a backward pass that quantises the output gradient to
//! the recipe's backward format (E5M2 in the hybrid recipe) and multiplies it by the forward
//! operands, transposed:
//!
//! - `dx = Q(dy) · Q(W)`, added into the input's gradient in the working precision;
//! - `dW = Q(dy)ᵀ · Q(x)`, written straight into the FP32 weight gradient, as the 16-bit fused
//!   linear op does ([`crate::ops::linear`]);
//! - the bias gradient (a layer with a bias) from the unquantised `dy`, in FP32.
//!
//! Every product accumulates in FP32 ([`crate::fp8::forward_product`] and
//! [`crate::fp8::gradient_product`], through the kernels' `gemm_fp8` at the bf16 GEMM's rate)
//! and is rounded once to the working precision. The input is kept for the backward pass as
//! its FP8 codes with their scale, not in 16 bits.
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

use dfdx::nn::modules::Module;
use dfdx::prelude::{
    Cpu, CpuError, HasErr, HasShape, PutTape, SplitTape, Tape, Tensor, ZerosTensor,
};

use crate::device::{AmpDevice, Kernels};
use crate::fp8::{
    amax, forward_product, gradient_product, Fp8Error, Fp8Recipe, Fp8Source, Fp8Tensor,
    LayerScaling, PerTensor, Role, ScalingMode,
};
use crate::ops::linear::{LinearInput, LinearOp, LinearParts};
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// How a device runs a linear layer with FP8 products under recipe `R`, on activations of
/// element type `E`. The CPU runs [`try_fp8_linear_cpu`]; a device without FP8 products has no
/// impl, and an FP8 model does not compile for it.
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

/// The scale of `role` for a tensor of amax `amax` in format `F`: the history's under delayed
/// scaling, else (current scaling, a fresh history, no recipe state) from `amax` itself; 1 for
/// an all-zero tensor with nothing earlier to go by.
fn scale_of<F: crate::fp8::Fp8Element, M: ScalingMode>(
    state: Option<&LayerScaling>,
    role: Role,
    amax: f32,
) -> f32 {
    if let Some(scale) = state.and_then(|s| s.scale::<F>(role, M::MARGIN)) {
        return scale;
    }
    if amax > 0.0 {
        crate::fp8::scale_from_amax(F::MAX, amax, M::MARGIN).unwrap_or(1.0)
    } else {
        1.0
    }
}

/// A CPU buffer as a slice (here, where no bound hides what the CPU's buffers are).
fn host<E: dfdx::prelude::Unit>(v: &<Cpu as dfdx::prelude::Storage<E>>::Vec) -> &[E] {
    v
}

/// A CPU buffer as a mutable slice.
fn host_mut<E: dfdx::prelude::Unit>(v: &mut <Cpu as dfdx::prelude::Storage<E>>::Vec) -> &mut [E] {
    v
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
    // Taken first, whatever path this call runs, so that each layer keeps its index in the
    // forward order.
    let state = if <Mode<R> as ScalingMode>::HISTORY > 0 {
        LayerScaling::next_in_forward(<Mode<R> as ScalingMode>::HISTORY)
    } else {
        None
    };
    let records = <T as Tape<E, Cpu>>::OWNS_TAPE;
    let shape = *x.shape();
    // Rows that are not contiguous: the 16-bit op (which has its own fallback for them).
    if shape.row_stride(x.strides()) != Some(I) {
        return crate::ops::linear::try_linear(layer, x);
    }
    let rows = shape.num_elements() / I.max(1);
    let (ax, aw) = (
        amax(host::<E>(x.storage())),
        amax(host::<E>(layer.weight().storage())),
    );
    if !(ax.is_finite() && aw.is_finite()) {
        return crate::ops::linear::try_linear(layer, x);
    }
    let _timing = typed_amp_kernels::timing::scope(typed_amp_kernels::timing::Kind::Products);
    let sx = scale_of::<Fwd<R>, Mode<R>>(state.as_ref(), Role::Input, ax);
    let sw = scale_of::<Fwd<R>, Mode<R>>(state.as_ref(), Role::Weight, aw);
    let qx = Fp8Tensor::<Fwd<R>, PerTensor, Mode<R>>::quantize_with_scale(
        host::<E>(x.storage()),
        rows,
        I,
        sx,
    )
    .map_err(cpu_err)?;
    let qw = Fp8Tensor::<Fwd<R>, PerTensor, Mode<R>>::quantize_with_scale(
        host::<E>(layer.weight().storage()),
        O,
        I,
        sw,
    )
    .map_err(cpu_err)?;
    let mut y32 = forward_product(&qx, &qw).map_err(cpu_err)?;
    let bias = layer.bias().cloned();
    if let Some(b) = &bias {
        let mut b32 = vec![0f32; O];
        E::slice_to_f32(host::<E>(b.storage()), &mut b32);
        for row in y32.chunks_mut(O.max(1)) {
            row.iter_mut().zip(&b32).for_each(|(y, b)| *y += b);
        }
    }
    if let (true, Some(s)) = (records, &state) {
        s.observe(Role::Input, ax);
        s.observe(Role::Weight, aw);
    }
    let (x, mut tape) = x.split_tape();
    let dev = x.device().clone();
    let mut y: Tensor<S::Output, E, Cpu> = dev.try_zeros_like(&shape.output())?;
    E::slice_from_f32(&y32, host_mut::<E>(y.storage_mut()));
    drop(y32);
    let x_ghost = x.ghost();
    // The input is kept for the backward pass as FP8 codes with their scale.
    drop(x);
    let weight_id = layer.weight().id();
    let y_id = y.id();
    tape.record_mixed(move |grads| {
        let _timing = typed_amp_kernels::timing::scope(typed_amp_kernels::timing::Kind::Products);
        // This op is the only reader of its output's gradient.
        let Some(dy) = grads.store_mut::<E>().remove(y_id) else {
            return Ok(());
        };
        let dy = host::<E>(&dy);
        let ady = amax(dy);
        let finite = ady.is_finite();
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
        let (dw32, dx32) = if finite {
            let sdy = scale_of::<Bwd<R>, Mode<R>>(state.as_ref(), Role::OutputGrad, ady);
            if let Some(s) = &state {
                s.observe(Role::OutputGrad, ady);
            }
            let qdy =
                Fp8Tensor::<Bwd<R>, PerTensor, Mode<R>>::quantize_with_scale(dy, rows, O, sdy)
                    .map_err(cpu_err)?;
            // dW = Q(dy)ᵀ · Q(x): (O × rows) · (I × rows)ᵀ.
            let dw = gradient_product(&qdy.transpose(), &qx.transpose()).map_err(cpu_err)?;
            // dx = Q(dy) · Q(W): (rows × O) · (I × O)ᵀ.
            let dx = gradient_product(&qdy, &qw.transpose()).map_err(cpu_err)?;
            (dw, dx)
        } else {
            // The step's check finds the NaN and skips the step.
            (vec![f32::NAN; O * I], vec![f32::NAN; rows * I])
        };
        if let Some((dw, fresh)) = grads.param_grad_mut(weight_id, O * I, &dev)? {
            if fresh {
                dw.copy_from_slice(&dw32);
            } else {
                dw.iter_mut().zip(&dw32).for_each(|(d, v)| *d += v);
            }
        }
        let store = grads.store_mut::<E>();
        if store.wants_grad(&x_ghost) {
            let dx = host_mut::<E>(store.get_or_alloc_mut(&x_ghost)?);
            let mut acc = vec![0f32; dx.len()];
            E::slice_to_f32(dx, &mut acc);
            acc.iter_mut().zip(&dx32).for_each(|(a, v)| *a += v);
            E::slice_from_f32(&acc, dx);
        }
        Ok(())
    });
    Ok(y.put_tape(tape))
}
