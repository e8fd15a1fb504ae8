//! Differentiable precision casts: [`to_f16`], [`to_f32`] and [`Cast::cast`].
//!
//! dfdx's `to_dtype` is not recorded on any tape. These casts are: on a [`MixedTape`] the
//! backward pass converts the output's gradient into the input's precision and adds it to the
//! input's gradient. FP32→FP16 conversion rounds to nearest-even and overflows to ±inf beyond
//! 65504 in both directions of the pass, exactly as a hardware cast does, so an FP32 gradient too
//! large for an FP16 layer shows up as inf in that layer's gradient and the scaler skips the step.

use dfdx::prelude::{Device, Gradients, NoneTape, PutTape, Shape, SplitTape, Tape, Tensor};
use half::f16;

use crate::device::AmpDevice;
use crate::precision::{AmpElem, Precision};
use crate::tape::{MixedGradients, MixedTape};

/// A tape that a cast can record onto: [`MixedTape`] records, [`NoneTape`] (inference) does not.
#[diagnostic::on_unimplemented(
    message = "precision casts record onto a `MixedTape` (or nothing), not onto `{Self}`",
    note = "trace mixed-precision graphs with `x.traced_mixed(grads)`: dfdx's `OwnedTape` holds a single precision"
)]
pub trait AmpTape<D: AmpDevice>: Tape<f32, D> + Tape<f16, D> {
    /// Records an op that reads and writes gradients of both precisions.
    fn record_mixed<F>(&mut self, op: F)
    where
        F: 'static + FnOnce(&mut MixedGradients<D>) -> Result<(), D::Err>;

    /// Whether layer probes record on this tape (see [`MixedGradients::watch_layers`]).
    fn watching(&self) -> bool;

    /// Records a layer's activation magnitude.
    fn record_activation(&mut self, record: crate::watch::ActivationRecord);
}

impl<D: AmpDevice> AmpTape<D> for NoneTape {
    fn record_mixed<F>(&mut self, _op: F)
    where
        F: 'static + FnOnce(&mut MixedGradients<D>) -> Result<(), D::Err>,
    {
    }

    fn watching(&self) -> bool {
        false
    }

    fn record_activation(&mut self, _record: crate::watch::ActivationRecord) {}
}

impl<D: AmpDevice> AmpTape<D> for MixedTape<D> {
    fn record_mixed<F>(&mut self, op: F)
    where
        F: 'static + FnOnce(&mut MixedGradients<D>) -> Result<(), D::Err>,
    {
        self.add_mixed_backward_op(op);
    }

    fn watching(&self) -> bool {
        MixedTape::watching(self)
    }

    fn record_activation(&mut self, record: crate::watch::ActivationRecord) {
        MixedTape::record_activation(self, record);
    }
}

/// An element type that tensors of element type `Src` can be cast to.
#[diagnostic::on_unimplemented(
    message = "cannot cast `{Src}` tensors to `{Self}`",
    label = "no cast to `{Self}`",
    note = "typed-amp casts between `f16` (F16) and `f32` (F32); BF16 is declared but dfdx 0.13 has no bf16 kernels, so nothing can be cast to it yet"
)]
pub trait CastFrom<Src: AmpElem>: AmpElem {
    /// Casts `t` to `Self`, recording the backward cast on `t`'s tape.
    fn try_cast_from<S: Shape, D: AmpDevice + Device<Src> + Device<Self>, T: AmpTape<D>>(
        t: Tensor<S, Src, D, T>,
    ) -> Result<Tensor<S, Self, D, T>, D::Err>;
}

impl<E: AmpElem> CastFrom<E> for E {
    fn try_cast_from<S: Shape, D: AmpDevice + Device<E>, T: AmpTape<D>>(
        t: Tensor<S, E, D, T>,
    ) -> Result<Tensor<S, E, D, T>, D::Err> {
        Ok(t)
    }
}

/// The gradient stores a cast from `Src` to `Dst` reads (`Dst`, the output's) and writes
/// (`Src`, the input's): always the two different stores of a [`MixedGradients`].
type SplitGrads<D, Src, Dst> =
    for<'g> fn(&'g mut MixedGradients<D>) -> (&'g Gradients<Dst, D>, &'g mut Gradients<Src, D>);

/// For an FP16→FP32 cast: read the FP32 output gradient, write the FP16 input gradient.
fn split_f32_into_f16<D: AmpDevice>(
    g: &mut MixedGradients<D>,
) -> (&Gradients<f32, D>, &mut Gradients<f16, D>) {
    (&g.f32, &mut g.f16)
}

/// For an FP32→FP16 cast: read the FP16 output gradient, write the FP32 input gradient.
fn split_f16_into_f32<D: AmpDevice>(
    g: &mut MixedGradients<D>,
) -> (&Gradients<f16, D>, &mut Gradients<f32, D>) {
    (&g.f16, &mut g.f32)
}

fn try_cross_cast<S, Src, Dst, D, T>(
    t: Tensor<S, Src, D, T>,
    split: SplitGrads<D, Src, Dst>,
) -> Result<Tensor<S, Dst, D, T>, D::Err>
where
    S: Shape,
    Src: AmpElem,
    Dst: AmpElem,
    D: AmpDevice + dfdx::prelude::Device<Src> + dfdx::prelude::Device<Dst>,
    T: AmpTape<D>,
    Tensor<S, Src, D>: CrossCastForward<S, Dst, D>,
{
    let (inp, mut tape) = t.split_tape();
    let inp_ghost = inp.ghost();
    let out = inp.try_cast_forward()?;
    let out_ghost = out.ghost();
    let dev = out.device().clone();
    tape.record_mixed(move |grads| {
        let (out_grads, inp_grads) = split(grads);
        let Some(grad_out) = out_grads.get_ref_checked(&out_ghost) else {
            // The cast's output did not reach the loss: nothing flows back.
            return Ok(());
        };
        let grad_inp = inp_grads.get_or_alloc_mut(&inp_ghost)?;
        dev.try_add_cast(Dst::erase::<D>(grad_out), Src::erase_mut::<D>(grad_inp))
    });
    Ok(out.put_tape(tape))
}

/// The forward conversion of a cast: dfdx's `to_dtype` kernel, which keeps the input's strides.
trait CrossCastForward<S: Shape, Dst: AmpElem, D: AmpDevice + Device<Dst>> {
    fn try_cast_forward(self) -> Result<Tensor<S, Dst, D>, D::Err>;
}

impl<S: Shape, D: AmpDevice> CrossCastForward<S, f16, D> for Tensor<S, f32, D> {
    fn try_cast_forward(self) -> Result<Tensor<S, f16, D>, D::Err> {
        self.try_to_dtype::<f16>()
    }
}

impl<S: Shape, D: AmpDevice> CrossCastForward<S, f32, D> for Tensor<S, f16, D> {
    fn try_cast_forward(self) -> Result<Tensor<S, f32, D>, D::Err> {
        self.try_to_dtype::<f32>()
    }
}

impl CastFrom<f32> for f16 {
    fn try_cast_from<S: Shape, D: AmpDevice + Device<f32> + Device<f16>, T: AmpTape<D>>(
        t: Tensor<S, f32, D, T>,
    ) -> Result<Tensor<S, f16, D, T>, D::Err> {
        try_cross_cast(t, split_f16_into_f32::<D>)
    }
}

impl CastFrom<f16> for f32 {
    fn try_cast_from<S: Shape, D: AmpDevice + Device<f16> + Device<f32>, T: AmpTape<D>>(
        t: Tensor<S, f16, D, T>,
    ) -> Result<Tensor<S, f32, D, T>, D::Err> {
        try_cross_cast(t, split_f32_into_f16::<D>)
    }
}

/// Precision casts on tensors, differentiable on a [`MixedTape`].
pub trait Cast<S: Shape, E: AmpElem, D: AmpDevice + Device<E>, T: AmpTape<D>>: Sized {
    /// Casts to precision `P` (a no-op when already in `P`).
    fn try_cast<P: Precision>(self) -> Result<Tensor<S, P::Elem, D, T>, D::Err>
    where
        P::Elem: CastFrom<E>,
        D: Device<P::Elem>;

    /// See [`Cast::try_cast`].
    fn cast<P: Precision>(self) -> Tensor<S, P::Elem, D, T>
    where
        P::Elem: CastFrom<E>,
        D: Device<P::Elem>,
    {
        self.try_cast::<P>().unwrap()
    }

    /// Casts to FP16. See [`to_f16`].
    fn try_to_f16(self) -> Result<Tensor<S, f16, D, T>, D::Err>
    where
        f16: CastFrom<E>,
    {
        self.try_cast::<crate::F16>()
    }

    /// Casts to FP16. See [`to_f16`].
    fn to_f16(self) -> Tensor<S, f16, D, T>
    where
        f16: CastFrom<E>,
    {
        self.cast::<crate::F16>()
    }

    /// Casts to FP32. See [`to_f32`].
    fn try_to_f32(self) -> Result<Tensor<S, f32, D, T>, D::Err>
    where
        f32: CastFrom<E>,
    {
        self.try_cast::<crate::F32>()
    }

    /// Casts to FP32. See [`to_f32`].
    fn to_f32(self) -> Tensor<S, f32, D, T>
    where
        f32: CastFrom<E>,
    {
        self.cast::<crate::F32>()
    }
}

impl<S: Shape, E: AmpElem, D: AmpDevice + Device<E>, T: AmpTape<D>> Cast<S, E, D, T>
    for Tensor<S, E, D, T>
{
    fn try_cast<P: Precision>(self) -> Result<Tensor<S, P::Elem, D, T>, D::Err>
    where
        P::Elem: CastFrom<E>,
        D: Device<P::Elem>,
    {
        <P::Elem as CastFrom<E>>::try_cast_from(self)
    }
}

/// Casts a tensor to FP16; on a [`MixedTape`] its gradient flows back converted to the input's
/// precision.
///
/// ```rust
/// # use typed_amp::prelude::*;
/// let dev = Cpu::default();
/// let x: Tensor<Rank1<3>, f32, _> = dev.tensor([1.0, 1.0e-8, 70000.0]);
/// let h = to_f16(x);
/// // 1e-8 is below FP16's smallest subnormal (2^-24) and 70000 above its largest value:
/// assert_eq!(h.array().map(f32::from), [1.0, 0.0, f32::INFINITY]);
/// ```
pub fn to_f16<S: Shape, E: AmpElem, D: AmpDevice + Device<E>, T: AmpTape<D>>(
    t: Tensor<S, E, D, T>,
) -> Tensor<S, f16, D, T>
where
    f16: CastFrom<E>,
{
    t.to_f16()
}

/// Casts a tensor to FP32 (exact from FP16); on a [`MixedTape`] its gradient flows back
/// converted to the input's precision.
///
/// ```rust
/// # use typed_amp::prelude::*;
/// let dev = Cpu::default();
/// let x: Tensor<Rank1<2>, f16, _> = dev.tensor([f16::from_f32(0.1), f16::MAX]);
/// assert_eq!(to_f32(x).array(), [0.099975586, 65504.0]);
/// ```
pub fn to_f32<S: Shape, E: AmpElem, D: AmpDevice + Device<E>, T: AmpTape<D>>(
    t: Tensor<S, E, D, T>,
) -> Tensor<S, f32, D, T>
where
    f32: CastFrom<E>,
{
    t.to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tape::TraceMixed;
    use dfdx::prelude::*;

    fn run_backward(loss: Tensor<Rank0, f32, Cpu, MixedTape<Cpu>>) -> MixedGradients<Cpu> {
        let (loss, tape) = loss.split_tape();
        tape.execute(|g| {
            let buf = g.f32.get_or_alloc_mut(&loss)?;
            loss.device()
                .try_fill(crate::precision::AnyBufMut::F32(buf), 1.0)
        })
        .unwrap()
    }

    #[test]
    fn gradient_flows_back_through_casts_in_the_input_precision() {
        let dev = Cpu::default();
        let x: Tensor<Rank1<3>, f32, Cpu> = dev.tensor([1.0, 2.0, 3.0]);
        let y = x.leaky_trace_mixed().to_f16() * dev.tensor([2.0, 3.0, 4.0]).to_dtype::<f16>();
        let loss = y.to_f32().sum();
        let grads = run_backward(loss);
        let g = grads.get(&x).expect("x has a gradient");
        assert_eq!(g.array(), [2.0, 3.0, 4.0]);
    }

    #[test]
    fn backward_cast_into_fp16_overflows_to_inf() {
        let dev = Cpu::default();
        let x: Tensor<Rank1<2>, f16, Cpu> = dev.tensor([f16::ONE, f16::ONE]);
        let y = x.leaky_trace_mixed().to_f32() * dev.tensor([1.0e5f32, 1.0]);
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

    trait LeakyTraceMixed: Sized {
        type Out;
        fn leaky_trace_mixed(&self) -> Self::Out;
    }
    impl<S: Shape, E: AmpElem> LeakyTraceMixed for Tensor<S, E, Cpu>
    where
        Cpu: Device<E>,
    {
        type Out = Tensor<S, E, Cpu, MixedTape<Cpu>>;
        fn leaky_trace_mixed(&self) -> Self::Out {
            self.clone().leaky_traced_mixed()
        }
    }
}
