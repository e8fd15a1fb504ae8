//! FP8 as a precision: the two formats ([`E4M3`], [`E5M2`]), tensors that carry their scales
//! ([`Fp8Tensor`]), the scaling recipes as type parameters, and the rules of the FP8 recipes as
//! trait bounds.
//!
//! An FP8 tensor is `Fp8Tensor<F, G, M>`: format `F` ([`E4M3`] or [`E5M2`]), scale granularity
//! `G` ([`PerTensor`] or [`PerRow`]) and scaling mode `M` ([`Current`], or [`Delayed`] with an
//! amax history of `H` entries and a margin, kept in a [`DelayedScaling`] state). Its scales are
//! FP32, Transformer Engine's `scale = (fp8_max / amax) / 2^margin`: the data is cast as
//! `fp8(x · scale)` (rounded to nearest even, saturating at ±max, see
//! [`typed_amp_kernels::convert::fp8`]) and means `code / scale`.
//!
//! | rule | trait | holds for |
//! | --- | --- | --- |
//! | the operands of a forward-pass product are E4M3 | [`ForwardOperand`] | [`E4M3`] |
//! | FP8 codes are widened with their scale, never without | [`CarriesItsScale`] | [`Fp8Tensor`] (not its [`Codes`]) |
//! | codes quantised with different scales never share one tensor | [`RowsKeepTheirScales`] | [`PerRow`] |
//! | a tensor is transposed only where its scale survives it | [`TransposesWithItsScale`] | [`PerTensor`] |
//! | a recipe's forward format is E4M3 | [`ForwardOperand`] on [`Fp8Recipe::Forward`] | [`Hybrid`], [`HybridCurrent`] |
//!
//! Breaking a rule is a compile error whose message names the rule and the fix (the cases in
//! `tests/precision_rules/fail/fp8_*.rs`). Bad run-time input (inf or NaN data, so a non-finite
//! amax; a scale that is not finite and positive; delayed scaling before any amax is recorded;
//! shapes that do not fit) is an [`Fp8Error`], never a panic.
//!
//! # Why FP8 is not in `with_precisions!`
//!
//! [`with_precisions!`](crate::with_precisions) lists the precisions a dfdx tensor computes in:
//! each entry becomes a [`DType`](crate::precision::DType), an [`AmpElem`](crate::precision::AmpElem)
//! (which is a dfdx `Dtype`: arithmetic, reductions, a gradient store on the tape, CUDA kernels)
//! and a slot in every per-precision table. An FP8 element is none of these: FP8 values are not
//! closed under arithmetic (no recipe adds or reduces in FP8), gradients are never stored in it,
//! and, above all, an FP8 code means nothing without its scale, so an
//! `AmpTensor<S, E4M3, D>` (a dfdx tensor of bare codes) would be exactly the unscaled FP8 tensor
//! the rules here forbid. FP8 therefore has its own list (`with_fp8_formats!`, which generates
//! [`Fp8Kind`]) and its own tensor type, which holds the codes and their scales together; an
//! FP8 product reads two such tensors and returns FP32.
//!
//! This module is a leaf: it imports nothing of typed-amp's (only the kernels crate).

mod error;
mod format;
mod granularity;
mod product;
mod recipe;
mod scaling;
mod source;
mod state;
mod tensor;

pub use error::Fp8Error;
pub use format::{ForwardOperand, Fp8Element, Fp8Format, Fp8Kind, E4M3, E5M2};
pub use granularity::{
    Granularity, PerRow, PerTensor, RowsKeepTheirScales, TransposesWithItsScale,
};
pub use product::{forward_product, gradient_product};
pub(crate) use product::{forward_product_into, gradient_product_into};
pub use recipe::{Fp8Recipe, Hybrid, HybridCurrent, TE_HISTORY};
pub use scaling::{scale_from_amax, Current, Delayed, DelayedScaling, ScalingMode};
pub(crate) use source::amax;
pub use source::Fp8Source;
pub use state::{ForwardScope, Fp8Scaling, Fp8ScalingState, LayerScaling, Role};
pub use tensor::{widen, CarriesItsScale, Codes, Fp8Parts, Fp8Tensor};
