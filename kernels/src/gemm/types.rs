//! The public face of the matrix products: element and output types, the epilogue, the
//! matrix views and the report.

use half::{bf16, f16};

/// Which element type a [`GemmElem`] or [`GemmOut`] is; lets the driver stay non-generic.
/// The two FP8 formats are only ever operands ([`crate::gemm_fp8_epilogue`]), read by the
/// packing and widened there (exactly) to the type their product runs in, bf16's; never C.
#[doc(hidden)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    F32,
    F16,
    Bf16,
    E4M3,
    E5M2,
}

/// A [`Kind`] as a const generic parameter (stable Rust has none of enum type), so that a loop
/// is compiled for one element type: the tags, and [`Kind::of_tag`] back.
pub(super) const TAG_F32: u8 = 0;
pub(super) const TAG_F16: u8 = 1;
pub(super) const TAG_BF16: u8 = 2;

impl Kind {
    /// The kind a tag names (`TAG_F32`, `TAG_F16`, anything else bf16).
    pub(super) const fn of_tag(tag: u8) -> Kind {
        match tag {
            TAG_F32 => Kind::F32,
            TAG_F16 => Kind::F16,
            _ => Kind::Bf16,
        }
    }

    /// Whether this is an FP8 format (an operand the packing widens, never C).
    pub(super) const fn is_fp8(self) -> bool {
        matches!(self, Kind::E4M3 | Kind::E5M2)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}

    /// Seals [`super::GemmOut`]: the pairs (input, output) the store paths implement.
    pub trait SealedOut<T> {}
    impl SealedOut<f32> for f32 {}
    impl SealedOut<half::f16> for half::f16 {}
    impl SealedOut<half::bf16> for half::bf16 {}
    impl SealedOut<half::f16> for f32 {}
    impl SealedOut<half::bf16> for f32 {}
}

/// An element type [`gemm()`](crate::gemm) multiplies: `f32`, [`half::f16`] or [`half::bf16`]. Products of
/// the 16-bit types are accumulated in `f32` and rounded once, to nearest even, when stored.
pub trait GemmElem: Copy + Send + Sync + 'static + sealed::Sealed {
    #[doc(hidden)]
    const KIND: Kind;
}
impl GemmElem for f32 {
    const KIND: Kind = Kind::F32;
}
impl GemmElem for f16 {
    const KIND: Kind = Kind::F16;
}
impl GemmElem for bf16 {
    const KIND: Kind = Kind::Bf16;
}

/// An element type [`gemm_epilogue`](crate::gemm_epilogue) can write the product of two `T` matrices into: `T`
/// itself, or `f32` for 16-bit `T` (the f32 accumulation is then stored without any 16-bit
/// rounding, as a mixed-precision backward wants for an FP32 gradient buffer).
pub trait GemmOut<T: GemmElem>: Copy + Send + Sync + 'static + sealed::SealedOut<T> {
    #[doc(hidden)]
    const OUT: Kind;
}
impl GemmOut<f32> for f32 {
    const OUT: Kind = Kind::F32;
}
impl GemmOut<f16> for f16 {
    const OUT: Kind = Kind::F16;
}
impl GemmOut<bf16> for bf16 {
    const OUT: Kind = Kind::Bf16;
}
impl GemmOut<f16> for f32 {
    const OUT: Kind = Kind::F32;
}
impl GemmOut<bf16> for f32 {
    const OUT: Kind = Kind::F32;
}

/// The activation an [`Epilogue`] applies, in f32, before the single rounding into C.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// The value unchanged.
    #[default]
    None,
    /// `if x < 0 { +0.0 } else { x }`: negative values become +0; NaN stays NaN (so that a
    /// non-finite product is never hidden from [`GemmReport::non_finite`]) and −0 stays −0
    /// (the `vmaxps(0, x)` convention).
    Relu,
}

/// What happens to each element of `A·B` on its way into C, for [`gemm_epilogue`](crate::gemm_epilogue):
///
/// `C[i, j] = round(act(alpha·(A·B)[i, j] + C_old[i, j] + bias[j]))`
///
/// evaluated left to right in f32, one IEEE operation at a time (no fused multiply-add), where
/// `(A·B)[i, j]` is the f32 accumulation of the products, `C_old` is C's previous value
/// widened to f32 (only with `accumulate`), `bias[j]` is added only with a bias, `alpha·` is
/// skipped when `alpha == 1` (multiplying by 1 changes no value), and `round` is the identity
/// for an f32 C and round-to-nearest-even for a 16-bit C, the only rounding to 16 bits.
#[derive(Clone, Copy, Debug)]
pub struct Epilogue<'a> {
    /// Scale of the product (`1 / loss_scale` for an unscaled weight gradient).
    pub alpha: f32,
    /// Add C's old value (widened to f32) instead of overwriting it.
    pub accumulate: bool,
    /// `bias[j]` added to every element of column `j` of C; its length must be C's column
    /// count `n`.
    pub bias: Option<&'a [f32]>,
    /// Applied last, in f32, before the rounding.
    pub activation: Activation,
    /// Look for ±inf and NaN among the stored elements ([`GemmReport::non_finite`]): a pass
    /// over each finished tile of an f32 C, cheap beside the product but not free (2.2% of a
    /// small GPT's FP32 step on an AVX-512 Xeon), so only callers that read the flag ask.
    pub report_non_finite: bool,
}

impl Epilogue<'static> {
    /// `C = A·B`.
    pub const STORE: Epilogue<'static> = Epilogue {
        alpha: 1.0,
        accumulate: false,
        bias: None,
        activation: Activation::None,
        report_non_finite: false,
    };
    /// `C += A·B`.
    pub const ACCUMULATE: Epilogue<'static> = Epilogue {
        accumulate: true,
        ..Epilogue::STORE
    };
}

impl Default for Epilogue<'_> {
    /// [`Epilogue::STORE`].
    fn default() -> Self {
        Epilogue::STORE
    }
}

/// What [`gemm_epilogue`](crate::gemm_epilogue) saw while storing C.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GemmReport {
    /// Some element stored into C is ±inf or NaN (after the rounding, so a 16-bit overflow
    /// counts), over all threads, where the epilogue asked ([`Epilogue::report_non_finite`];
    /// else `false`). A loss-scaled backward can skip its separate scan of the gradient for
    /// overflow.
    pub non_finite: bool,
}

/// A read-only strided matrix view over a slice, for [`gemm_slices`](crate::gemm_slices): element `(i, j)` is
/// `data[i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a, T> {
    /// The elements; every `(i, j)` with `i < rows`, `j < cols` must index into it.
    pub data: &'a [T],
    /// Number of rows.
    pub rows: usize,
    /// Number of columns.
    pub cols: usize,
    /// Row stride, in elements.
    pub rs: usize,
    /// Column stride, in elements.
    pub cs: usize,
}

/// A writable strided matrix view over a slice, for [`gemm_epilogue_slices`](crate::gemm_epilogue_slices): element
/// `(i, j)` is `data[i * rs + j * cs]`, and distinct elements must be distinct slots.
#[derive(Debug)]
pub struct MatMut<'a, T> {
    /// The elements; every `(i, j)` with `i < rows`, `j < cols` must index into it.
    pub data: &'a mut [T],
    /// Number of rows.
    pub rows: usize,
    /// Number of columns.
    pub cols: usize,
    /// Row stride, in elements.
    pub rs: usize,
    /// Column stride, in elements.
    pub cs: usize,
}
