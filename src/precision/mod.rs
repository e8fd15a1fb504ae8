//! Precision markers and the rules that tie them to roles in a training step.
//!
//! A tensor's precision is its element type (`f16`, `bf16`, `f32`); each element type names a
//! zero-sized marker ([`F16`], [`BF16`], [`F32`]) through [`AmpElem`], and the rules of
//! mixed-precision training are traits on those markers:
//!
//! | rule | trait | holds for |
//! | --- | --- | --- |
//! | an optimizer updates only FP32 master weights | [`UpdatablePrecision`] | [`F32`] |
//! | a loss is computed in FP32 | [`LossPrecision`] | [`F32`] |
//! | a working copy is 16-bit | [`LowPrecision`] | [`F16`], [`BF16`] |
//! | a step without a loss scaler needs FP32's exponent range | [`FullRange`] | [`F32`], [`BF16`] |
//! | a model computes in its weights' precision or a narrower one | [`NoWiderThan`] | [`F16`] over any, [`BF16`] over BF16 and FP32, [`F32`] over FP32 |
//! | data enters a layer (run by hand, outside an `#[amp]` forward) in the layer's precision | [`SamePrecisionAs`] | each precision as itself |
//!
//! Breaking a rule is a compile error whose message names the rule and the fix.
//!
//! # The list of precisions
//!
//! [`with_precisions!`](crate::with_precisions) is the one place that lists the precisions
//! typed-amp trains in. Everything that must name each of them (the [`DType`] enum, the
//! capability bundle [`AmpDevice`](crate::device::AmpDevice), the casts a tape records, the CUDA
//! kernels' element types) is generated from it. Adding a precision means: a marker and its
//! [`AmpElem`] impl here, a line in the list, and its kernels (a dfdx `Dtype`, and the CUDA
//! load/store helpers in `device/cuda.rs`).
//!
//! This module is a leaf: it depends on no other module of typed-amp.

use dfdx::prelude::Dtype;
use half::{bf16, f16};
// The one conversion layer (exhaustively tested there, one NaN rule): every 16-bit ↔ FP32
// conversion of typed-amp goes through it.
use typed_amp_kernels::convert;

/// Calls the macro `$m` with the list of precisions typed-amp trains in, one bracketed entry
/// per precision: `[marker, element type, DType variant, name, safetensors dtype, index]`.
///
/// This is the one list of precisions; see the [module documentation](crate::precision).
#[macro_export]
macro_rules! with_precisions {
    ($m:ident) => {
        $m! {
            [F16, ::half::f16, F16, "F16", F16, 0]
            [BF16, ::half::bf16, BF16, "BF16", BF16, 1]
            [F32, f32, F32, "F32", F32, 2]
        }
    };
}

macro_rules! define_dtype {
    ($([$marker:ident, $elem:ty, $variant:ident, $name:literal, $st:ident, $index:literal])*) => {
        /// The precisions typed-amp knows about, as a value (for messages, checkpoints and
        /// tables). Generated from [`with_precisions!`](crate::with_precisions).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum DType {
            $(
                #[doc = concat!("`", stringify!($elem), "` (marker [`", stringify!($marker), "`]).")]
                $variant,
            )*
        }

        impl DType {
            /// Every precision, in the list's order.
            pub const ALL: &'static [DType] = &[$(DType::$variant),*];

            /// The short upper-case name used in tables and checkpoints (`"F16"`, `"BF16"`,
            /// `"F32"`), which is also its safetensors dtype name.
            pub const fn name(self) -> &'static str {
                match self {
                    $(DType::$variant => $name,)*
                }
            }

            /// Bytes per element.
            pub const fn size_in_bytes(self) -> usize {
                match self {
                    $(DType::$variant => ::core::mem::size_of::<$elem>(),)*
                }
            }

            /// Whether values of this precision have FP32's exponent range (FP32 and BF16), so
            /// that gradients neither underflow nor overflow where FP32's would not, and training
            /// needs no loss scale.
            pub const fn has_full_range(self) -> bool {
                match self {
                    $(DType::$variant => <$elem as AmpElem>::FULL_RANGE,)*
                }
            }

            /// Unit roundoff: the largest relative error of rounding an FP32 value to this
            /// precision, 2^-(mantissa bits + 1) (2^-11 for FP16, 2^-8 for BF16, 2^-24 for FP32).
            pub fn unit_roundoff(self) -> f32 {
                let bits = match self {
                    $(DType::$variant => <$elem as AmpElem>::MANTISSA_BITS,)*
                };
                0.5f32.powi(bits as i32 + 1)
            }

            /// Looks a precision up by [`DType::name`].
            pub fn from_name(name: &str) -> Option<DType> {
                DType::ALL.iter().copied().find(|d| d.name() == name)
            }
        }

        /// How many precisions the list holds (the length of per-precision stores).
        pub const PRECISIONS: usize = DType::ALL.len();

        $(
            impl sealed::Sealed for $marker {}
            impl sealed::Sealed for $elem {}
            impl Precision for $marker {
                type Elem = $elem;
                const DTYPE: DType = DType::$variant;
            }
            impl Indexed for $elem {
                const INDEX: usize = $index;
            }
        )*
    };
}

with_precisions!(define_dtype);

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// The position of an element type in [`with_precisions!`](crate::with_precisions): per-precision
/// stores (gradients, kernel tables) are indexed by it.
#[doc(hidden)] // machinery of the bounds above it.
pub trait Indexed {
    /// Position in the list of precisions.
    const INDEX: usize;
}

/// A precision marker: a zero-sized type naming a floating-point format and its element type.
pub trait Precision:
    sealed::Sealed + 'static + Copy + Default + std::fmt::Debug + Send + Sync
{
    /// The element type tensors of this precision hold.
    type Elem: AmpElem;
    /// This precision as a value.
    const DTYPE: DType;
}

/// IEEE half precision (binary16), element type [`half::f16`]: a 10-bit mantissa and a 5-bit
/// exponent (largest finite value 65504, smallest normal 2^-14).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct F16;

/// bfloat16, element type [`half::bf16`]: FP32's 8-bit exponent with a 7-bit mantissa, so it
/// covers FP32's range (no loss scale needed) at a coarser spacing than FP16 (2^-7 against 2^-10
/// relative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct BF16;

/// IEEE single precision (binary32), element type `f32`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct F32;

/// A tensor whose precision is given by a marker rather than an element type:
/// `AmpTensor<Rank2<4, 8>, F16, Cpu>` is `Tensor<Rank2<4, 8>, f16, Cpu>`.
pub type AmpTensor<S, P, D, T = dfdx::prelude::NoneTape> =
    dfdx::prelude::Tensor<S, <P as Precision>::Elem, D, T>;

/// An element type typed-amp can compute in: `f16`, `bf16` or `f32`.
///
/// Ties the element type back to its [`Precision`] marker and converts to and from `f32`, the
/// precision every bookkeeping step (unscaling, master weights, norms) runs in.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a precision typed-amp can compute in",
    label = "not `f16`, `bf16` or `f32`",
    note = "tensors taking part in mixed-precision training hold `half::f16` (F16), `half::bf16` (BF16) or `f32` (F32)"
)]
pub trait AmpElem: Dtype + Indexed + sealed::Sealed + Send + Sync {
    /// The precision marker of this element type.
    type Precision: Precision<Elem = Self>;

    /// Explicit mantissa bits (10 for FP16, 7 for BF16, 23 for FP32): the spacing of values
    /// is 2^-MANTISSA_BITS relative.
    const MANTISSA_BITS: u32;

    /// Whether the format has FP32's exponent range (see [`DType::has_full_range`]).
    const FULL_RANGE: bool;

    /// Converts to `f32` exactly (every FP16 and BF16 value is representable in FP32).
    fn to_f32(self) -> f32;

    /// Converts from `f32`, rounding to nearest-even and overflowing to ±inf beyond the format's
    /// range, as a hardware conversion does.
    fn from_f32(value: f32) -> Self;

    /// Converts a slice to `f32` (vectorised where the CPU allows). Both slices have the same
    /// length.
    fn slice_to_f32(src: &[Self], dst: &mut [f32]);

    /// Converts an `f32` slice into this precision (vectorised where the CPU allows). Both
    /// slices have the same length.
    fn slice_from_f32(src: &[f32], dst: &mut [Self]);

    /// The value's bytes, little-endian (how checkpoints store it).
    fn to_le_bytes(self) -> Vec<u8>;

    /// A value from its little-endian bytes (`bytes` has the element's size).
    fn from_le_bytes(bytes: &[u8]) -> Self;
}

impl AmpElem for f16 {
    type Precision = F16;
    const MANTISSA_BITS: u32 = 10;
    const FULL_RANGE: bool = false;

    #[inline]
    fn to_f32(self) -> f32 {
        convert::widen_f16(self)
    }

    #[inline]
    fn from_f32(value: f32) -> Self {
        convert::narrow_f16(value)
    }

    fn slice_to_f32(src: &[Self], dst: &mut [f32]) {
        convert::f16_to_f32(src, dst);
    }

    fn slice_from_f32(src: &[f32], dst: &mut [Self]) {
        convert::f32_to_f16(src, dst);
    }

    fn to_le_bytes(self) -> Vec<u8> {
        f16::to_le_bytes(self).to_vec()
    }

    fn from_le_bytes(bytes: &[u8]) -> Self {
        f16::from_le_bytes([bytes[0], bytes[1]])
    }
}

impl AmpElem for bf16 {
    type Precision = BF16;
    const MANTISSA_BITS: u32 = 7;
    const FULL_RANGE: bool = true;

    #[inline]
    fn to_f32(self) -> f32 {
        convert::widen_bf16(self)
    }

    #[inline]
    fn from_f32(value: f32) -> Self {
        convert::narrow_bf16(value)
    }

    fn slice_to_f32(src: &[Self], dst: &mut [f32]) {
        convert::bf16_to_f32(src, dst);
    }

    fn slice_from_f32(src: &[f32], dst: &mut [Self]) {
        convert::f32_to_bf16(src, dst);
    }

    fn to_le_bytes(self) -> Vec<u8> {
        bf16::to_le_bytes(self).to_vec()
    }

    fn from_le_bytes(bytes: &[u8]) -> Self {
        bf16::from_le_bytes([bytes[0], bytes[1]])
    }
}

impl AmpElem for f32 {
    type Precision = F32;
    const MANTISSA_BITS: u32 = 23;
    const FULL_RANGE: bool = true;

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

    fn to_le_bytes(self) -> Vec<u8> {
        f32::to_le_bytes(self).to_vec()
    }

    fn from_le_bytes(bytes: &[u8]) -> Self {
        f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }
}

/// The precision of an [`AmpElem`] as a value.
pub fn dtype_of<E: AmpElem>() -> DType {
    <E::Precision as Precision>::DTYPE
}

/// Rule: an optimizer updates only FP32 master weights.
///
/// FP16 cannot represent most small updates (`w + lr * g` rounds back to `w` once
/// `|lr * g| < |w| * 2^-11`), and BF16 even fewer (`2^-8`), so training in them stalls; mixed
/// precision keeps an FP32 master copy that the optimizer updates, and copies it into the 16-bit
/// working weights after each step.
#[diagnostic::on_unimplemented(
    message = "optimizers update FP32 master weights only, but these weights are `{Self}`",
    label = "an optimizer over {Self} weights",
    note = "keep the 16-bit weights as the working copy of a `MasterWeights` and build the optimizer on `model.master()`, which is FP32"
)]
pub trait UpdatablePrecision: Precision {}

impl UpdatablePrecision for F32 {}

/// Rule: losses are computed in FP32.
///
/// Softmax, log and the large reductions inside a loss lose accuracy or overflow in 16 bits
/// (`exp(11.1)` already exceeds FP16's maximum of 65504; BF16 keeps 8 significant bits, so a
/// mean over a batch of 256 losses the last 8 of them).
#[diagnostic::on_unimplemented(
    message = "losses are computed in FP32, but these values are `{Self}`",
    label = "a loss over {Self} values",
    note = "cast the model's output with `.to_f32()` before the loss (or let an `#[amp]` policy cast model outputs)"
)]
pub trait LossPrecision: Precision {
    /// Views a tensor of this precision as an FP32 tensor (the identity: only FP32 qualifies).
    fn into_f32<S, D, T>(
        t: dfdx::prelude::Tensor<S, Self::Elem, D, T>,
    ) -> dfdx::prelude::Tensor<S, f32, D, T>
    where
        S: dfdx::prelude::Shape,
        D: dfdx::prelude::Storage<Self::Elem> + dfdx::prelude::Storage<f32>;
}

impl LossPrecision for F32 {
    fn into_f32<S, D, T>(
        t: dfdx::prelude::Tensor<S, f32, D, T>,
    ) -> dfdx::prelude::Tensor<S, f32, D, T>
    where
        S: dfdx::prelude::Shape,
        D: dfdx::prelude::Storage<f32>,
    {
        t
    }
}

/// Rule: a working copy is in a 16-bit precision (FP16 or BF16); an FP32 model needs no master
/// copy.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a 16-bit working precision",
    label = "not a low precision",
    note = "working copies are F16 or BF16; FP32 models need no master copy: train them with `Fp32Weights` (O0)"
)]
pub trait LowPrecision: Precision {}

impl LowPrecision for F16 {}
impl LowPrecision for BF16 {}

/// Rule: only gradients with FP32's exponent range may skip loss scaling.
///
/// FP16's smallest subnormal is 2^-24: gradients below it flush to zero unless the loss is
/// scaled up first, and the dynamic scaler also catches overflow above 65504. BF16 and FP32
/// share an 8-bit exponent (down to 2^-133, up to 3.4e38), so a model whose working copy is
/// BF16 or FP32 steps on its raw gradients, still checked for inf and NaN.
#[diagnostic::on_unimplemented(
    message = "`{Self}` gradients need a loss scaler: FP16's exponent range is too narrow to step on raw gradients",
    label = "a step without a loss scaler on {Self} gradients",
    note = "scale the loss with `scaler.scale(loss)` and unscale with `scaler.unscale(&mut model, grads)`, or train in BF16 (`dtype = \"bf16\"`), whose exponent range is FP32's"
)]
pub trait FullRange: Precision {}

impl FullRange for F32 {}
impl FullRange for BF16 {}

/// Rule: a model computes in its weights' precision or a narrower one, never a wider one.
///
/// Whether a step needs a loss scaler is decided by the precision its gradients are computed
/// in (rule [`FullRange`]). A model declares that precision
/// ([`SinglePrecision::with_compute`](crate::master::SinglePrecision::with_compute): O1's FP32
/// weights computing in FP16 or BF16); declaring one wider than the weights (BF16 or FP32 over
/// FP16 weights) would let FP16 gradients skip the scaler. `Self` is the declared compute
/// precision, `W` the weights'. (FP16 is the narrowest: its exponent range is the smallest.)
#[diagnostic::on_unimplemented(
    message = "a model with `{W}` weights cannot declare that it computes in `{Self}`: the gradients of `{W}` weights are computed in `{W}` or narrower",
    label = "a compute precision wider than the weights'",
    note = "the scaler a step needs is decided by the precision the gradients are computed in: declare the weights' own precision (`SinglePrecision::new`, `Fp16Weights::new`) or a narrower one (O1: FP32 weights computing in `F16`, with a loss scaler, or `BF16`)"
)]
pub trait NoWiderThan<W: Precision>: Precision {}

impl NoWiderThan<F16> for F16 {}
impl NoWiderThan<BF16> for F16 {}
impl NoWiderThan<F32> for F16 {}
impl NoWiderThan<BF16> for BF16 {}
impl NoWiderThan<F32> for BF16 {}
impl NoWiderThan<F32> for F32 {}

/// Rule: data enters a layer in the layer's own precision; where precisions meet, it is cast.
///
/// A layer computes in its weights' precision `W`: a matrix product's operands have one
/// precision, so FP32 (or FP16) data into an FP16 (or BF16) layer has to be cast first, as
/// Apex's and PyTorch's "Input type FloatTensor and weight type HalfTensor" says at run time.
/// An `#[amp]` model's own forward casts at every layer by the policy table; a layer of a working
/// copy run by hand (`model.working().attn.forward(x)`) does not. `Self` is the data's
/// precision.
#[diagnostic::on_unimplemented(
    message = "`{Self}` data cannot enter a layer whose weights are `{W}` without a cast",
    label = "data of another precision than the layer's",
    note = "a layer takes data of its own precision (rule `typed_amp::precision::SamePrecisionAs`): cast data entering a layer to the layer's precision with typed-amp's `.to_f16()` (FP16 layer), `.to_bf16()` (BF16 layer) or `.to_f32()` (FP32 layer); an `#[amp]` model's own forward (`model.working().forward(x)`) casts at every layer by its policy"
)]
pub trait SamePrecisionAs<W: Precision>: Precision {
    /// Views a tensor of this precision as one of `W` (the identity: only `W` itself
    /// qualifies).
    fn into_same<S, D, T>(
        t: dfdx::prelude::Tensor<S, Self::Elem, D, T>,
    ) -> dfdx::prelude::Tensor<S, W::Elem, D, T>
    where
        S: dfdx::prelude::Shape,
        D: dfdx::prelude::Storage<Self::Elem> + dfdx::prelude::Storage<W::Elem>;
}

impl<P: Precision> SamePrecisionAs<P> for P {
    fn into_same<S, D, T>(
        t: dfdx::prelude::Tensor<S, P::Elem, D, T>,
    ) -> dfdx::prelude::Tensor<S, P::Elem, D, T>
    where
        S: dfdx::prelude::Shape,
        D: dfdx::prelude::Storage<P::Elem>,
    {
        t
    }
}

#[cfg(test)]
mod tests;
