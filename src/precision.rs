//! Precision markers and the rules that tie them to roles in a training step.
//!
//! A tensor's precision is its element type (`f16`, `f32`); each element type names a zero-sized
//! marker ([`F16`], [`F32`], [`BF16`]) through [`AmpElem`], and the rules of mixed-precision
//! training are traits on those markers:
//!
//! | rule | trait | holds for |
//! | --- | --- | --- |
//! | an optimizer updates only FP32 master weights | [`UpdatablePrecision`] | [`F32`] |
//! | a loss is computed in FP32 | [`LossPrecision`] | [`F32`] |
//! | a working copy is 16-bit | [`LowPrecision`] | [`F16`] ([`BF16`] once dfdx runs it) |
//!
//! Breaking a rule is a compile error whose message names the rule and the fix.

use dfdx::prelude::{Device, Dtype, Gradients, Shape, Tensor};
use half::f16;

use crate::device::AmpDevice;
use crate::tape::MixedGradients;

/// The precisions typed-amp knows about, as a value (for messages, checkpoints and tables).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE 754 binary16: 10-bit mantissa (epsilon 2^-10), largest finite value 65504.
    F16,
    /// bfloat16: FP32's exponent range with a 7-bit mantissa. Declared, not yet runnable.
    BF16,
    /// IEEE 754 binary32.
    F32,
}

impl DType {
    /// The short upper-case name used in tables and checkpoints (`"F16"`, `"BF16"`, `"F32"`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F32 => "F32",
        }
    }

    /// Bytes per element.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 => 4,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::F16 {}
    impl Sealed for super::BF16 {}
    impl Sealed for super::F32 {}
    impl Sealed for half::f16 {}
    impl Sealed for f32 {}
}

/// A precision marker: a zero-sized type naming a floating-point format and its element type.
pub trait Precision:
    sealed::Sealed + 'static + Copy + Default + std::fmt::Debug + Send + Sync
{
    /// The element type tensors of this precision hold.
    type Elem: Copy + 'static;
    /// This precision as a value.
    const DTYPE: DType;
}

/// IEEE half precision (binary16), element type [`half::f16`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct F16;

/// bfloat16, element type [`half::bf16`].
///
/// Declared so that programs can name it, but dfdx 0.13 has no bf16 kernels, so it implements
/// neither [`AmpElem`] nor [`LowPrecision`]: a model cannot be built or trained in it yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct BF16;

/// IEEE single precision (binary32), element type `f32`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct F32;

impl Precision for F16 {
    type Elem = f16;
    const DTYPE: DType = DType::F16;
}

impl Precision for BF16 {
    type Elem = half::bf16;
    const DTYPE: DType = DType::BF16;
}

impl Precision for F32 {
    type Elem = f32;
    const DTYPE: DType = DType::F32;
}

/// A tensor whose precision is given by a marker rather than an element type:
/// `AmpTensor<Rank2<4, 8>, F16, Cpu>` is `Tensor<Rank2<4, 8>, f16, Cpu>`.
pub type AmpTensor<S, P, D, T = dfdx::prelude::NoneTape> = Tensor<S, <P as Precision>::Elem, D, T>;

/// An element type typed-amp can compute in: `f16` or `f32`.
///
/// Ties the element type back to its [`Precision`] marker and converts to and from `f32`, the
/// precision every bookkeeping step (unscaling, master weights, norms) runs in.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a precision typed-amp can compute in",
    label = "not `f16` or `f32`",
    note = "tensors taking part in mixed-precision training hold `half::f16` (F16) or `f32` (F32); BF16 is declared but dfdx 0.13 has no bf16 kernels"
)]
pub trait AmpElem: Dtype + sealed::Sealed {
    /// The precision marker of this element type.
    type Precision: Precision<Elem = Self>;

    /// Converts to `f32` exactly (every FP16 value is representable in FP32).
    fn to_f32(self) -> f32;

    /// Converts from `f32`, rounding to nearest-even and overflowing to ±inf beyond the format's
    /// range, as a hardware conversion does.
    fn from_f32(value: f32) -> Self;

    /// Converts a slice to `f32` (vectorised where the CPU allows).
    fn slice_to_f32(src: &[Self], dst: &mut [f32]);

    /// Converts an `f32` slice into this precision (vectorised where the CPU allows).
    fn slice_from_f32(src: &[f32], dst: &mut [Self]);

    /// The gradients of this precision inside a [`MixedGradients`].
    fn grads<D: AmpDevice + Device<Self>>(grads: &MixedGradients<D>) -> &Gradients<Self, D>;

    /// The gradients of this precision inside a [`MixedGradients`], mutably.
    fn grads_mut<D: AmpDevice + Device<Self>>(
        grads: &mut MixedGradients<D>,
    ) -> &mut Gradients<Self, D>;

    /// A store of some precision viewed as one of this precision: `Some` exactly when the two
    /// precisions are the same (the identity), `None` otherwise.
    fn downcast_grads<D: AmpDevice + Device<Self>>(
        grads: AnyGradsRef<'_, D>,
    ) -> Option<&Gradients<Self, D>>;

    /// Mutable counterpart of [`AmpElem::downcast_grads`].
    fn downcast_grads_mut<D: AmpDevice + Device<Self>>(
        grads: AnyGradsMut<'_, D>,
    ) -> Option<&mut Gradients<Self, D>>;

    /// An owned store viewed as one of this precision, if it is.
    fn same_grads<D: AmpDevice + Device<Self>>(grads: &AnyGrads<D>) -> Option<&Gradients<Self, D>> {
        Self::downcast_grads(grads.as_ref())
    }

    /// Mutable counterpart of [`AmpElem::same_grads`].
    fn same_grads_mut<D: AmpDevice + Device<Self>>(
        grads: &mut AnyGrads<D>,
    ) -> Option<&mut Gradients<Self, D>> {
        Self::downcast_grads_mut(grads.as_mut())
    }

    /// Wraps a gradient store of this precision.
    fn into_any_grads<D: AmpDevice + Device<Self>>(grads: Gradients<Self, D>) -> AnyGrads<D>;

    /// A precision-erased view of a buffer of this element type.
    fn erase<D: AmpDevice + Device<Self>>(
        buf: &<D as dfdx::prelude::Storage<Self>>::Vec,
    ) -> AnyBuf<'_, D>;

    /// A precision-erased mutable view of a buffer of this element type.
    fn erase_mut<D: AmpDevice + Device<Self>>(
        buf: &mut <D as dfdx::prelude::Storage<Self>>::Vec,
    ) -> AnyBufMut<'_, D>;
}

/// A borrowed device buffer of either precision.
pub enum AnyBuf<'a, D: AmpDevice> {
    /// An FP16 buffer.
    F16(&'a <D as dfdx::prelude::Storage<f16>>::Vec),
    /// An FP32 buffer.
    F32(&'a <D as dfdx::prelude::Storage<f32>>::Vec),
}

impl<D: AmpDevice> AnyBuf<'_, D> {
    /// A copy of this view, borrowing the same buffer.
    pub fn reborrow(&self) -> AnyBuf<'_, D> {
        match self {
            AnyBuf::F16(b) => AnyBuf::F16(*b),
            AnyBuf::F32(b) => AnyBuf::F32(*b),
        }
    }
}

/// A gradient store of either precision: the master gradients of a training step (FP32, or FP16
/// for a model trained without master weights).
pub enum AnyGrads<D: AmpDevice> {
    /// FP16 gradients.
    F16(Gradients<f16, D>),
    /// FP32 gradients.
    F32(Gradients<f32, D>),
}

impl<D: AmpDevice> std::fmt::Debug for AnyGrads<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnyGrads::F16(_) => f.write_str("AnyGrads::F16(..)"),
            AnyGrads::F32(_) => f.write_str("AnyGrads::F32(..)"),
        }
    }
}

impl<D: AmpDevice> AnyGrads<D> {
    /// The store viewed in precision `E`, or an error naming `path` if it holds another
    /// precision.
    pub fn of_mut<E: AmpElem>(
        &mut self,
        path: &str,
    ) -> Result<&mut Gradients<E, D>, crate::AmpError>
    where
        D: Device<E>,
    {
        let held = self.dtype();
        E::same_grads_mut(self).ok_or_else(|| crate::AmpError::ParamMismatch {
            path: path.to_string(),
            detail: format!(
                "its gradients are {held}, the parameter is {}",
                dtype_of::<E>()
            ),
        })
    }

    /// The precision of the gradients held.
    pub fn dtype(&self) -> DType {
        match self {
            AnyGrads::F16(_) => DType::F16,
            AnyGrads::F32(_) => DType::F32,
        }
    }
}

/// A borrowed gradient-shaped store of either precision (gradients, optimizer state).
pub enum AnyGradsRef<'a, D: AmpDevice> {
    /// FP16 store.
    F16(&'a Gradients<f16, D>),
    /// FP32 store.
    F32(&'a Gradients<f32, D>),
}

/// A mutably borrowed gradient-shaped store of either precision.
pub enum AnyGradsMut<'a, D: AmpDevice> {
    /// FP16 store.
    F16(&'a mut Gradients<f16, D>),
    /// FP32 store.
    F32(&'a mut Gradients<f32, D>),
}

impl<D: AmpDevice> AnyGrads<D> {
    /// A borrowed view.
    pub fn as_ref(&self) -> AnyGradsRef<'_, D> {
        match self {
            AnyGrads::F16(g) => AnyGradsRef::F16(g),
            AnyGrads::F32(g) => AnyGradsRef::F32(g),
        }
    }

    /// A mutably borrowed view.
    pub fn as_mut(&mut self) -> AnyGradsMut<'_, D> {
        match self {
            AnyGrads::F16(g) => AnyGradsMut::F16(g),
            AnyGrads::F32(g) => AnyGradsMut::F32(g),
        }
    }
}

/// A mutably borrowed device buffer of either precision.
pub enum AnyBufMut<'a, D: AmpDevice> {
    /// An FP16 buffer.
    F16(&'a mut <D as dfdx::prelude::Storage<f16>>::Vec),
    /// An FP32 buffer.
    F32(&'a mut <D as dfdx::prelude::Storage<f32>>::Vec),
}

impl<D: AmpDevice> AnyBufMut<'_, D> {
    /// A shared view of the same buffer.
    pub fn as_buf(&self) -> AnyBuf<'_, D> {
        match self {
            AnyBufMut::F16(b) => AnyBuf::F16(&**b),
            AnyBufMut::F32(b) => AnyBuf::F32(&**b),
        }
    }

    /// A mutable view of the same buffer, for a shorter borrow.
    pub fn reborrow(&mut self) -> AnyBufMut<'_, D> {
        match self {
            AnyBufMut::F16(b) => AnyBufMut::F16(&mut **b),
            AnyBufMut::F32(b) => AnyBufMut::F32(&mut **b),
        }
    }
}

impl AmpElem for f16 {
    type Precision = F16;

    #[inline]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }

    #[inline]
    fn from_f32(value: f32) -> Self {
        f16::from_f32(value)
    }

    fn slice_to_f32(src: &[Self], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }

    fn slice_from_f32(src: &[f32], dst: &mut [Self]) {
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src);
    }

    fn grads<D: AmpDevice + Device<Self>>(grads: &MixedGradients<D>) -> &Gradients<Self, D> {
        &grads.f16
    }

    fn grads_mut<D: AmpDevice + Device<Self>>(
        grads: &mut MixedGradients<D>,
    ) -> &mut Gradients<Self, D> {
        &mut grads.f16
    }

    fn downcast_grads<D: AmpDevice + Device<Self>>(
        grads: AnyGradsRef<'_, D>,
    ) -> Option<&Gradients<Self, D>> {
        match grads {
            AnyGradsRef::F16(g) => Some(g),
            AnyGradsRef::F32(_) => None,
        }
    }

    fn downcast_grads_mut<D: AmpDevice + Device<Self>>(
        grads: AnyGradsMut<'_, D>,
    ) -> Option<&mut Gradients<Self, D>> {
        match grads {
            AnyGradsMut::F16(g) => Some(g),
            AnyGradsMut::F32(_) => None,
        }
    }

    fn into_any_grads<D: AmpDevice + Device<Self>>(grads: Gradients<Self, D>) -> AnyGrads<D> {
        AnyGrads::F16(grads)
    }

    fn erase<D: AmpDevice + Device<Self>>(
        buf: &<D as dfdx::prelude::Storage<Self>>::Vec,
    ) -> AnyBuf<'_, D> {
        AnyBuf::F16(buf)
    }

    fn erase_mut<D: AmpDevice + Device<Self>>(
        buf: &mut <D as dfdx::prelude::Storage<Self>>::Vec,
    ) -> AnyBufMut<'_, D> {
        AnyBufMut::F16(buf)
    }
}

impl AmpElem for f32 {
    type Precision = F32;

    #[inline]
    fn to_f32(self) -> f32 {
        self
    }

    #[inline]
    fn from_f32(value: f32) -> Self {
        value
    }

    fn slice_to_f32(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }

    fn slice_from_f32(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src);
    }

    fn grads<D: AmpDevice + Device<Self>>(grads: &MixedGradients<D>) -> &Gradients<Self, D> {
        &grads.f32
    }

    fn grads_mut<D: AmpDevice + Device<Self>>(
        grads: &mut MixedGradients<D>,
    ) -> &mut Gradients<Self, D> {
        &mut grads.f32
    }

    fn downcast_grads<D: AmpDevice + Device<Self>>(
        grads: AnyGradsRef<'_, D>,
    ) -> Option<&Gradients<Self, D>> {
        match grads {
            AnyGradsRef::F32(g) => Some(g),
            AnyGradsRef::F16(_) => None,
        }
    }

    fn downcast_grads_mut<D: AmpDevice + Device<Self>>(
        grads: AnyGradsMut<'_, D>,
    ) -> Option<&mut Gradients<Self, D>> {
        match grads {
            AnyGradsMut::F32(g) => Some(g),
            AnyGradsMut::F16(_) => None,
        }
    }

    fn into_any_grads<D: AmpDevice + Device<Self>>(grads: Gradients<Self, D>) -> AnyGrads<D> {
        AnyGrads::F32(grads)
    }

    fn erase<D: AmpDevice + Device<Self>>(
        buf: &<D as dfdx::prelude::Storage<Self>>::Vec,
    ) -> AnyBuf<'_, D> {
        AnyBuf::F32(buf)
    }

    fn erase_mut<D: AmpDevice + Device<Self>>(
        buf: &mut <D as dfdx::prelude::Storage<Self>>::Vec,
    ) -> AnyBufMut<'_, D> {
        AnyBufMut::F32(buf)
    }
}

/// The precision of an [`AmpElem`] as a value.
pub fn dtype_of<E: AmpElem>() -> DType {
    <E::Precision as Precision>::DTYPE
}

/// Rule: an optimizer updates only FP32 master weights.
///
/// FP16 cannot represent most small updates (`w + lr * g` rounds back to `w` once
/// `|lr * g| < |w| * 2^-11`), so training in FP16 stalls; mixed precision keeps an FP32 master copy
/// that the optimizer updates, and copies it into the FP16 working weights after each step.
#[diagnostic::on_unimplemented(
    message = "optimizers update FP32 master weights only, but these weights are `{Self}`",
    label = "an optimizer over {Self} weights",
    note = "keep the FP16 weights as the working copy of a `MasterWeights` and build the optimizer on `model.master()`, which is FP32"
)]
pub trait UpdatablePrecision: Precision {}

impl UpdatablePrecision for F32 {}

/// Rule: losses are computed in FP32.
///
/// Softmax, log and the large reductions inside a loss lose accuracy or overflow in FP16
/// (`exp(11.1)` already exceeds FP16's maximum of 65504).
#[diagnostic::on_unimplemented(
    message = "losses are computed in FP32, but these values are `{Self}`",
    label = "a loss over {Self} values",
    note = "cast the model's output with `.to_f32()` before the loss (or let an `#[amp]` policy cast model outputs)"
)]
pub trait LossPrecision: Precision {
    /// Views a tensor of this precision as an FP32 tensor (the identity: only FP32 qualifies).
    fn into_f32<S: Shape, D: AmpDevice + dfdx::prelude::Storage<Self::Elem>, T>(
        t: Tensor<S, Self::Elem, D, T>,
    ) -> Tensor<S, f32, D, T>;
}

impl LossPrecision for F32 {
    fn into_f32<S: Shape, D: AmpDevice, T>(t: Tensor<S, f32, D, T>) -> Tensor<S, f32, D, T> {
        t
    }
}

/// Rule: a working copy is in a 16-bit precision.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a 16-bit working precision",
    label = "not a low precision",
    note = "working copies are F16; FP32 models need no master copy: train them with `Fp32Weights` (O0)"
)]
pub trait LowPrecision: Precision
where
    Self::Elem: AmpElem,
{
}

impl LowPrecision for F16 {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_name_their_element_types() {
        assert_eq!(F16::DTYPE, DType::F16);
        assert_eq!(F32::DTYPE, DType::F32);
        assert_eq!(BF16::DTYPE, DType::BF16);
        assert_eq!(dtype_of::<f16>(), DType::F16);
        assert_eq!(dtype_of::<f32>(), DType::F32);
        assert_eq!(DType::F16.size_in_bytes(), 2);
    }

    #[test]
    fn fp16_conversion_rounds_and_overflows_like_hardware() {
        // 65504 is FP16's largest finite value; 65520 is the first value that rounds to inf.
        assert_eq!(<f16 as AmpElem>::from_f32(65504.0).to_f32(), 65504.0);
        assert_eq!(<f16 as AmpElem>::from_f32(65519.0).to_f32(), 65504.0);
        assert!(<f16 as AmpElem>::from_f32(65520.0).to_f32().is_infinite());
        // 1 + 2^-11 is a tie between 1 and 1 + 2^-10 and rounds to even (1).
        assert_eq!(
            <f16 as AmpElem>::from_f32(1.0 + 2f32.powi(-11)).to_f32(),
            1.0
        );
        let src = [1.5f32, -2.0, 65520.0, f32::NAN];
        let mut half = [f16::ZERO; 4];
        f16::slice_from_f32(&src, &mut half);
        let mut back = [0f32; 4];
        f16::slice_to_f32(&half, &mut back);
        assert_eq!(&back[..2], &[1.5, -2.0]);
        assert!(back[2].is_infinite() && back[3].is_nan());
    }
}
