//! Differentiable precision casts: [`Cast::cast`] and its shorthands [`to_f16`], [`to_bf16`]
//! and [`to_f32`].
//!
//! dfdx's `to_dtype` is not recorded on any tape. These casts are: on a [`MixedTape`](crate::tape::MixedTape) the
//! backward pass converts the output's gradient into the input's precision and adds it to the
//! input's gradient. Narrowing conversions round to nearest-even and overflow to ±inf beyond the
//! target's range in both directions of the pass, exactly as a hardware cast does, so an FP32
//! gradient too large for an FP16 layer shows up as inf in that layer's gradient and the scaler
//! skips the step.

use dfdx::prelude::{HasShape, PutTape, Shape, SplitTape, Storage, Tensor};
use dfdx::tensor_ops::ToDtypeKernel;

use crate::device::{AmpDevice, Kernels};
use crate::precision::{AmpElem, Precision};
use crate::tape::AmpTape;

use crate::device::CastKernel;

/// A device that casts tensors from `Src` to `Dst` and their gradients back.
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait CastDevice<Src: AmpElem, Dst: AmpElem>:
    AmpDevice
    + Kernels<Src>
    + Kernels<Dst>
    + ToDtypeKernel<Src, Dst>
    + CastKernel<Src, Dst>
    + CastKernel<Dst, Src>
{
}

impl<Src: AmpElem, Dst: AmpElem, D> CastDevice<Src, Dst> for D where
    D: AmpDevice
        + Kernels<Src>
        + Kernels<Dst>
        + ToDtypeKernel<Src, Dst>
        + CastKernel<Src, Dst>
        + CastKernel<Dst, Src>
{
}

/// Casts `t` from `Src` to `Dst`, recording the backward cast on its tape.
fn try_cast_between<S, Src, Dst, D, T>(
    t: Tensor<S, Src, D, T>,
) -> Result<Tensor<S, Dst, D, T>, D::Err>
where
    S: Shape,
    Src: AmpElem,
    Dst: AmpElem,
    D: CastDevice<Src, Dst>,
    T: AmpTape<D>,
{
    if Src::INDEX == Dst::INDEX {
        // The same precision: nothing to convert and nothing to record. The element types are
        // equal, so the tensor is moved through unchanged.
        let any: Box<dyn std::any::Any> = Box::new(t);
        return Ok(*any
            .downcast::<Tensor<S, Dst, D, T>>()
            .unwrap_or_else(|_| unreachable!("equal indices name equal element types")));
    }
    let _timing = typed_amp_kernels::timing::scope(typed_amp_kernels::timing::Kind::Casts);
    let (inp, mut tape) = t.split_tape();
    let inp_ghost = inp.ghost();
    let inp_id = inp.id();
    let dev = inp.device().clone();
    let contiguous = inp.strides() == inp.shape().strides()
        && Storage::<Src>::len(&dev, inp.storage()) == inp.shape().num_elements();
    let out = if contiguous {
        // The one conversion layer, vectorised (dfdx's `to_dtype` converts element by element).
        let mut out: Tensor<S, Dst, D> = dev.try_zeros_like(inp.shape())?;
        CastKernel::<Src, Dst>::try_copy_cast(&dev, inp.storage(), out.storage_mut())?;
        out
    } else {
        // dfdx's `to_dtype` keeps the input's strides (a broadcast input stays one).
        inp.try_to_dtype::<Dst>()?
    };
    tape.inherit_unwanted(inp_id, out.id());
    let out_ghost = out.ghost();
    tape.record_mixed(move |grads| {
        let (out_grads, inp_grads) = grads.pair_mut::<Dst, Src>();
        let Some(grad_out) = out_grads.and_then(|g| g.get_ref_checked(&out_ghost)) else {
            // The cast's output did not reach the loss: nothing flows back.
            return Ok(());
        };
        let _timing = typed_amp_kernels::timing::scope(typed_amp_kernels::timing::Kind::Casts);
        let grad_inp = inp_grads.get_or_alloc_mut(&inp_ghost)?;
        CastKernel::<Dst, Src>::try_add_cast(&dev, grad_out, grad_inp)
    });
    Ok(out.put_tape(tape))
}

/// Precision casts on tensors, differentiable on a [`MixedTape`](crate::tape::MixedTape): the one cast abstraction.
///
/// `x.cast::<BF16>()` casts to a precision named by its marker; `to_f16`, `to_bf16` and
/// `to_f32` are shorthands. Casting to the precision a tensor already has is free and records
/// nothing.
pub trait Cast<S: Shape, E: AmpElem, D: AmpDevice, T: AmpTape<D>>: Sized {
    /// Casts to precision `P`.
    fn try_cast<P: Precision>(self) -> Result<Tensor<S, P::Elem, D, T>, D::Err>
    where
        D: CastDevice<E, P::Elem>;

    /// See [`Cast::try_cast`].
    fn cast<P: Precision>(self) -> Tensor<S, P::Elem, D, T>
    where
        D: CastDevice<E, P::Elem>,
    {
        self.try_cast::<P>().unwrap()
    }

    /// Casts to FP16. See [`to_f16`].
    fn try_to_f16(self) -> Result<Tensor<S, half::f16, D, T>, D::Err>
    where
        D: CastDevice<E, half::f16>,
    {
        self.try_cast::<crate::precision::F16>()
    }

    /// Casts to FP16. See [`to_f16`].
    fn to_f16(self) -> Tensor<S, half::f16, D, T>
    where
        D: CastDevice<E, half::f16>,
    {
        self.cast::<crate::precision::F16>()
    }

    /// Casts to BF16. See [`to_bf16`].
    fn try_to_bf16(self) -> Result<Tensor<S, half::bf16, D, T>, D::Err>
    where
        D: CastDevice<E, half::bf16>,
    {
        self.try_cast::<crate::precision::BF16>()
    }

    /// Casts to BF16. See [`to_bf16`].
    fn to_bf16(self) -> Tensor<S, half::bf16, D, T>
    where
        D: CastDevice<E, half::bf16>,
    {
        self.cast::<crate::precision::BF16>()
    }

    /// Casts to FP32. See [`to_f32`].
    fn try_to_f32(self) -> Result<Tensor<S, f32, D, T>, D::Err>
    where
        D: CastDevice<E, f32>,
    {
        self.try_cast::<crate::precision::F32>()
    }

    /// Casts to FP32. See [`to_f32`].
    fn to_f32(self) -> Tensor<S, f32, D, T>
    where
        D: CastDevice<E, f32>,
    {
        self.cast::<crate::precision::F32>()
    }
}

impl<S: Shape, E: AmpElem, D: AmpDevice + Kernels<E>, T: AmpTape<D>> Cast<S, E, D, T>
    for Tensor<S, E, D, T>
{
    fn try_cast<P: Precision>(self) -> Result<Tensor<S, P::Elem, D, T>, D::Err>
    where
        D: CastDevice<E, P::Elem>,
    {
        try_cast_between::<S, E, P::Elem, D, T>(self)
    }
}

/// Casts a tensor to FP16; on a [`MixedTape`](crate::tape::MixedTape) its gradient flows back converted to the input's
/// precision.
///
/// ```rust
/// # use typed_amp::prelude::*;
/// use typed_amp::ops::cast::to_f16;
/// let dev = Cpu::default();
/// let x: Tensor<Rank1<3>, f32, _> = dev.tensor([1.0, 1.0e-8, 70000.0]);
/// let h = to_f16(x);
/// // 1e-8 is below FP16's smallest subnormal (2^-24) and 70000 above its largest value:
/// assert_eq!(h.array().map(f32::from), [1.0, 0.0, f32::INFINITY]);
/// ```
pub fn to_f16<S: Shape, E: AmpElem, D: AmpDevice + CastDevice<E, half::f16>, T: AmpTape<D>>(
    t: Tensor<S, E, D, T>,
) -> Tensor<S, half::f16, D, T> {
    t.to_f16()
}

/// Casts a tensor to BF16 (FP32's exponent range, 8 significant bits); on a [`MixedTape`](crate::tape::MixedTape) its
/// gradient flows back converted to the input's precision.
///
/// ```rust
/// # use typed_amp::prelude::*;
/// use typed_amp::ops::cast::to_bf16;
/// let dev = Cpu::default();
/// let x: Tensor<Rank1<3>, f32, _> = dev.tensor([1.0, 1.0e-8, 70000.0]);
/// let b = to_bf16(x);
/// // BF16 keeps FP16's lost ends (1e-8 and 70000), at 2^-8 relative precision:
/// assert_eq!(b.array().map(f32::from), [1.0, 1.0e-8, 70144.0].map(|v| half::bf16::from_f32(v).to_f32()));
/// ```
pub fn to_bf16<S: Shape, E: AmpElem, D: AmpDevice + CastDevice<E, half::bf16>, T: AmpTape<D>>(
    t: Tensor<S, E, D, T>,
) -> Tensor<S, half::bf16, D, T> {
    t.to_bf16()
}

/// Casts a tensor to FP32 (exact from FP16 and BF16); on a [`MixedTape`](crate::tape::MixedTape) its gradient flows
/// back converted to the input's precision.
///
/// ```rust
/// # use typed_amp::prelude::*;
/// use typed_amp::ops::cast::to_f32;
/// let dev = Cpu::default();
/// let x: Tensor<Rank1<2>, f16, _> = dev.tensor([f16::from_f32(0.1), f16::MAX]);
/// assert_eq!(to_f32(x).array(), [0.099975586, 65504.0]);
/// ```
pub fn to_f32<S: Shape, E: AmpElem, D: AmpDevice + CastDevice<E, f32>, T: AmpTape<D>>(
    t: Tensor<S, E, D, T>,
) -> Tensor<S, f32, D, T> {
    t.to_f32()
}

/// The differentiable forward cast of a layer: what `#[amp]` inserts at precision boundaries,
/// and what the cast layers ([`ToF16`](crate::nn::modules::ToF16),
/// [`ToBf16`](crate::nn::modules::ToBf16), [`ToF32`](crate::nn::modules::ToF32)) run.
#[doc(hidden)]
pub fn try_cast_to<P: Precision, S: Shape, E: AmpElem, D, T: AmpTape<D>>(
    t: Tensor<S, E, D, T>,
) -> Result<Tensor<S, P::Elem, D, T>, D::Err>
where
    D: AmpDevice + CastDevice<E, P::Elem>,
{
    t.try_cast::<P>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tape::{MixedGradients, MixedTape, TraceMixed};
    use dfdx::prelude::*;
    use half::f16;

    fn run_backward(loss: Tensor<Rank0, f32, Cpu, MixedTape<Cpu>>) -> MixedGradients<Cpu> {
        let (loss, tape) = loss.split_tape();
        tape.execute(|g| {
            let buf = g.store_mut::<f32>().get_or_alloc_mut(&loss)?;
            crate::device::FillKernel::<f32>::try_fill(loss.device(), buf, 1.0)
        })
        .unwrap()
    }

    #[test]
    fn gradient_flows_back_through_casts_in_the_input_precision() {
        let dev = Cpu::default();
        let x: Tensor<Rank1<3>, f32, Cpu> = dev.tensor([1.0, 2.0, 3.0]);
        let y =
            x.clone().leaky_traced_mixed().to_f16() * dev.tensor([2.0, 3.0, 4.0]).to_dtype::<f16>();
        let loss = y.to_f32().sum();
        let grads = run_backward(loss);
        let g = grads.get(&x).expect("x has a gradient");
        assert_eq!(g.array(), [2.0, 3.0, 4.0]);
    }

    #[test]
    fn backward_cast_into_fp16_overflows_to_inf() {
        let dev = Cpu::default();
        let x: Tensor<Rank1<2>, f16, Cpu> = dev.tensor([f16::ONE, f16::ONE]);
        let y = x.clone().leaky_traced_mixed().to_f32() * dev.tensor([1.0e5f32, 1.0]);
        let grads = run_backward(y.sum());
        let g = grads.get(&x).unwrap().array();
        assert!(g[0].is_infinite());
        assert_eq!(g[1], f16::ONE);
    }

    #[test]
    fn casting_to_the_same_precision_records_nothing() {
        let dev = Cpu::default();
        let x: Tensor<Rank1<2>, f32, Cpu> = dev.ones();
        let y = x.leaky_traced_mixed().to_f32();
        assert_eq!(y.split_tape().1.num_ops(), 0);
    }
}
