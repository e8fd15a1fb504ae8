//! How many scales an FP8 tensor carries: one for the whole tensor ([`PerTensor`]) or one per
//! row ([`PerRow`]), and the rule that codes under different scales never share one tensor.

mod sealed {
    pub trait Sealed {}
}

/// The granularity of an FP8 tensor's scales: [`PerTensor`] or [`PerRow`].
#[doc(hidden)] // a sealed kind of the FP8 types' parameters: users name `PerTensor` or `PerRow`.
pub trait Granularity:
    sealed::Sealed + Copy + Default + std::fmt::Debug + Send + Sync + 'static
{
    /// The granularity's name (`"per tensor"`, `"per row"`).
    const NAME: &'static str;

    /// How many scales a tensor of `rows` rows carries.
    fn scale_count(rows: usize) -> usize;

    /// The index of the scale that row `row` is quantised with.
    fn scale_index(row: usize) -> usize;
}

/// One FP32 scale for the whole tensor (Transformer Engine's delayed and current scaling,
/// torchao's tensorwise recipe).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PerTensor;

/// One FP32 scale per row (torchao's rowwise recipe): an outlier in one row costs only that
/// row its precision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PerRow;

impl sealed::Sealed for PerTensor {}
impl sealed::Sealed for PerRow {}

impl Granularity for PerTensor {
    const NAME: &'static str = "per tensor";

    fn scale_count(_rows: usize) -> usize {
        1
    }

    fn scale_index(_row: usize) -> usize {
        0
    }
}

impl Granularity for PerRow {
    const NAME: &'static str = "per row";

    fn scale_count(rows: usize) -> usize {
        rows
    }

    fn scale_index(row: usize) -> usize {
        row
    }
}

/// Rule: codes quantised with different scales never share one tensor.
///
/// An FP8 code means `code / scale`; a tensor has one scale per row at most. Two per-tensor
/// scaled tensors each have their own scale (from their own amax), so putting the codes of one
/// under the other's scale, or the rows of both under one scale, changes their values: with
/// scales 448 and 4.48, the code for 1.0 of the first reads as 100.0 under the second. Rows of
/// per-row scaled tensors carry their scales with them, so only they concatenate as codes.
#[diagnostic::on_unimplemented(
    message = "FP8 codes quantised with different scales cannot share one tensor: `{Self}` tensors have one scale each",
    label = "the codes of two tensors with a scale each, mixed",
    note = "rows keep their own scales only per row (rule `typed_amp::fp8::RowsKeepTheirScales`): quantise both as `Fp8Tensor<_, PerRow, _>`, or widen both with their scales (`a.dequantize()`), concatenate in FP32 and quantise the result once, under one new scale"
)]
pub trait RowsKeepTheirScales: Granularity {}

impl RowsKeepTheirScales for PerRow {}

/// Rule: an FP8 tensor is transposed only where its scales survive the transposition.
///
/// A per-tensor scale stands for every element, so the transposed codes keep it. A per-row
/// scale stands for one row: after a transposition that row is a column, and a column of
/// codes quantised under as many scales as there are rows has no one scale left to carry (the
/// backward pass's products, which read the forward operands transposed, need one per row of
/// the transposed tensor).
#[diagnostic::on_unimplemented(
    message = "a `{Self}` scaled FP8 tensor cannot be transposed: its rows' scales would become columns' scales",
    label = "a transposition that would separate codes from their scales",
    note = "transpose only per-tensor scaled FP8 tensors (rule `typed_amp::fp8::TransposesWithItsScale`): quantise the operand as `Fp8Tensor<_, PerTensor, _>`, or widen it with its scales (`t.dequantize()`), transpose in FP32 and quantise the transposed matrix per row"
)]
pub trait TransposesWithItsScale: Granularity {}

impl TransposesWithItsScale for PerTensor {}
