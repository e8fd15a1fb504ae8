//! [`Fp8Tensor`]: FP8 codes with the FP32 scales they were quantised with, which travel
//! together: quantise, widen (always with the scales), take apart and put back together.

use std::marker::PhantomData;

use typed_amp_kernels::convert;

use super::error::Fp8Error;
use super::format::Fp8Element;
use super::granularity::{Granularity, PerTensor, RowsKeepTheirScales, TransposesWithItsScale};
use super::scaling::{check_scale, scale_from_amax, Current, Delayed, DelayedScaling, ScalingMode};
use super::source::{amax, Fp8Source};

/// A row-major `rows × cols` matrix of FP8 codes in format `F`, with its FP32 scales (one, or
/// one per row, by `G`), chosen by scaling mode `M`.
///
/// Element `(i, j)` stands for `codes[i·cols + j] / scale[G::scale_index(i)]`. The codes are
/// never handed out without the scales: widening ([`Fp8Tensor::dequantize`],
/// [`widen`](super::widen)) and products ([`forward_product`](super::forward_product)) apply
/// them, and taking the tensor apart ([`Fp8Tensor::into_parts`]) gives both.
///
/// ```
/// use typed_amp::fp8::{Fp8Error, Fp8Tensor, E4M3, PerRow, Current};
/// # fn main() -> Result<(), Fp8Error> {
/// let x = [1.0f32, -2.0, 0.5, 100.0, 200.0, -50.0];
/// let t = Fp8Tensor::<E4M3, PerRow, Current>::quantize(&x, 2, 3)?;
/// assert_eq!(t.scales(), &[224.0, 2.24]);     // 448 / amax of each row
/// let back = t.dequantize();
/// assert_eq!(back[1], -2.0);                   // -448 / 224
/// assert!((back[4] - 200.0).abs() <= 200.0 / 16.0); // E4M3 keeps 4 significant bits
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Tensor<F: Fp8Element, G: Granularity = PerTensor, M: ScalingMode = Current> {
    codes: Vec<F>,
    scales: Vec<f32>,
    scale_invs: Vec<f32>,
    rows: usize,
    cols: usize,
    _kind: PhantomData<(G, M)>,
}

fn check_shape(what: &str, len: usize, rows: usize, cols: usize) -> Result<(), Fp8Error> {
    match rows.checked_mul(cols) {
        Some(n) if n == len => Ok(()),
        _ => Err(Fp8Error::Shape(format!(
            "{what} holds {len} values, but the shape is {rows} × {cols}"
        ))),
    }
}

impl<F: Fp8Element, G: Granularity, M: ScalingMode> Fp8Tensor<F, G, M> {
    /// Quantises with the given scales (one per `G::scale_index`): `code = F(x · scale)`,
    /// rounded to nearest even and saturating at ±`F::MAX`.
    fn with_scales<T: Fp8Source>(
        data: &[T],
        rows: usize,
        cols: usize,
        scales: Vec<f32>,
    ) -> Result<Self, Fp8Error> {
        Ok(Self::with_scales_amax(data, rows, cols, scales)?.0)
    }

    /// [`Self::with_scales`], also returning the amax of `data` (NaN if it holds a NaN), found
    /// by the same pass: `code = F(x · scale)` in FP32 ([`convert::quantize_fp8`]), one pass
    /// over a per-tensor scaled tensor, one per row otherwise.
    fn with_scales_amax<T: Fp8Source>(
        data: &[T],
        rows: usize,
        cols: usize,
        scales: Vec<f32>,
    ) -> Result<(Self, f32), Fp8Error> {
        for &s in &scales {
            check_scale(s)?;
        }
        let mut codes = vec![F::default(); data.len()];
        let mut found = 0f32;
        // A NaN must stay NaN against the later rows (`f32::max` would drop it).
        let mut add = |a: f32| {
            found = if a.is_nan() || found.is_nan() {
                f32::NAN
            } else {
                found.max(a)
            }
        };
        if scales.len() == 1 {
            add(convert::quantize_fp8(data, scales[0], &mut codes));
        } else {
            for i in 0..rows {
                let s = scales[G::scale_index(i)];
                let span = i * cols..(i + 1) * cols;
                add(convert::quantize_fp8(
                    &data[span.clone()],
                    s,
                    &mut codes[span],
                ));
            }
        }
        let scale_invs = scales.iter().map(|s| 1.0 / s).collect();
        let t = Fp8Tensor {
            codes,
            scales,
            scale_invs,
            rows,
            cols,
            _kind: PhantomData,
        };
        Ok((t, found))
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The scales (one, or one per row): an element is its code divided by its row's scale.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// The FP8 codes, as a view that cannot be widened: see [`Codes`].
    pub fn codes(&self) -> Codes<'_, F> {
        Codes(&self.codes)
    }

    /// The values in FP32: each code widened (exactly) and multiplied by its row's `1 / scale`
    /// (one rounding, none when the scale is a power of two).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.codes.len()];
        if self.cols == 0 {
            return out;
        }
        convert::fp8_to_f32(&self.codes, &mut out);
        for (i, row) in out.chunks_mut(self.cols).enumerate() {
            let inv = self.scale_invs[G::scale_index(i)];
            row.iter_mut().for_each(|x| *x *= inv);
        }
        out
    }

    /// `1 / scale` of row `i` (what the products multiply by).
    pub(crate) fn scale_inv(&self, row: usize) -> f32 {
        self.scale_invs[G::scale_index(row)]
    }

    /// The codes as a slice, for the products of this module (which apply the scales).
    pub(crate) fn raw_codes(&self) -> &[F] {
        &self.codes
    }

    /// Takes the tensor apart into its codes and scales, together (to store it, or to move it
    /// elsewhere); [`Fp8Tensor::from_parts`] puts it back.
    pub fn into_parts(self) -> Fp8Parts<F> {
        Fp8Parts {
            codes: self.codes,
            scales: self.scales,
            rows: self.rows,
            cols: self.cols,
        }
    }

    /// A tensor from stored parts, checked.
    ///
    /// # Errors
    /// [`Fp8Error::Shape`] if the codes are not `rows × cols` or the scales are not
    /// `G::scale_count(rows)`; [`Fp8Error::BadScale`] for a scale that is not finite and
    /// positive.
    pub fn from_parts(parts: Fp8Parts<F>) -> Result<Self, Fp8Error> {
        let Fp8Parts {
            codes,
            scales,
            rows,
            cols,
        } = parts;
        check_shape("the codes", codes.len(), rows, cols)?;
        if scales.len() != G::scale_count(rows) {
            return Err(Fp8Error::Shape(format!(
                "{} scales for {rows} rows, scaled {} ({} expected)",
                scales.len(),
                G::NAME,
                G::scale_count(rows)
            )));
        }
        for &s in &scales {
            check_scale(s)?;
        }
        let scale_invs = scales.iter().map(|s| 1.0 / s).collect();
        Ok(Fp8Tensor {
            codes,
            scales,
            scale_invs,
            rows,
            cols,
            _kind: PhantomData,
        })
    }

    /// The rows of `self` followed by those of `other`, as codes (no rounding), each row with
    /// its own scale. Only per-row scaled tensors concatenate this way (rule
    /// [`RowsKeepTheirScales`]): a per-tensor scale cannot stand for two tensors' rows.
    ///
    /// # Errors
    /// [`Fp8Error::Shape`] if the column counts differ.
    pub fn concat_rows(mut self, other: Self) -> Result<Self, Fp8Error>
    where
        G: RowsKeepTheirScales,
    {
        if self.cols != other.cols {
            return Err(Fp8Error::Shape(format!(
                "rows of {} columns cannot follow rows of {}",
                other.cols, self.cols
            )));
        }
        self.codes.extend(other.codes);
        self.scales.extend(other.scales);
        self.scale_invs.extend(other.scale_invs);
        self.rows += other.rows;
        Ok(self)
    }
}

impl<F: Fp8Element, G: Granularity, M: ScalingMode> Fp8Tensor<F, G, M> {
    /// The `cols × rows` transpose, as codes (no rounding) under the same scale. Only
    /// per-tensor scaled tensors transpose (rule [`TransposesWithItsScale`]): a per-row scale
    /// would have to become a per-column one.
    pub fn transpose(&self) -> Self
    where
        G: TransposesWithItsScale,
    {
        let (rows, cols) = (self.rows, self.cols);
        let mut codes = vec![F::default(); self.codes.len()];
        // Blocks of 32 × 32 keep both the rows read and the rows written in cache.
        const B: usize = 32;
        for i0 in (0..rows).step_by(B) {
            for j0 in (0..cols).step_by(B) {
                for i in i0..(i0 + B).min(rows) {
                    for j in j0..(j0 + B).min(cols) {
                        codes[j * rows + i] = self.codes[i * cols + j];
                    }
                }
            }
        }
        Fp8Tensor {
            codes,
            scales: self.scales.clone(),
            scale_invs: self.scale_invs.clone(),
            rows: cols,
            cols: rows,
            _kind: PhantomData,
        }
    }
}

impl<F: Fp8Element, M: ScalingMode> Fp8Tensor<F, PerTensor, M> {
    /// Quantises a row-major `rows × cols` matrix under a scale chosen elsewhere (a recipe's
    /// history, or the amax its caller computed on the way): `code = F(x · scale)`, saturating.
    ///
    /// # Errors
    /// [`Fp8Error::Shape`] if `data` is not `rows × cols`; [`Fp8Error::BadScale`] if `scale` is
    /// not finite and positive.
    pub fn quantize_with_scale<T: Fp8Source>(
        data: &[T],
        rows: usize,
        cols: usize,
        scale: f32,
    ) -> Result<Self, Fp8Error> {
        check_shape("the data", data.len(), rows, cols)?;
        Self::with_scales(data, rows, cols, vec![scale])
    }

    /// [`Self::quantize_with_scale`] that also returns the amax of `data` (NaN if it holds a
    /// NaN, inf if an inf), found in the same pass over it: what delayed scaling records, for
    /// one read of the data where the scale is known before it is read.
    ///
    /// # Errors
    /// As [`Self::quantize_with_scale`]; data holding inf or NaN is not an error here (the
    /// caller decides from the amax), its codes saturate or are NaN.
    pub(crate) fn quantize_with_scale_amax<T: Fp8Source>(
        data: &[T],
        rows: usize,
        cols: usize,
        scale: f32,
    ) -> Result<(Self, f32), Fp8Error> {
        check_shape("the data", data.len(), rows, cols)?;
        Self::with_scales_amax(data, rows, cols, vec![scale])
    }

    /// [`Self::quantize_with_scale`] of `rows × cols` data that `fill(first, block)` makes a
    /// block at a time (`block` gets the elements from `first` on), for data recomputed in the
    /// backward pass: no more than a block of it is held in 16 bits at once. Each code depends
    /// only on its element and the scale, so the codes are those of quantising the whole data
    /// at once.
    ///
    /// # Errors
    /// [`Fp8Error::BadScale`] if `scale` is not finite and positive.
    pub(crate) fn quantize_with_scale_by<T: Fp8Source + Copy + Default + Send>(
        rows: usize,
        cols: usize,
        scale: f32,
        fill: impl Fn(usize, &mut [T]) + Sync,
    ) -> Result<Self, Fp8Error>
    where
        F: Send,
    {
        use rayon::prelude::*;
        /// Elements a task makes and casts at a time (8 KiB of bf16).
        const BLOCK: usize = 4096;
        check_scale(scale)?;
        let mut codes = vec![F::default(); rows * cols];
        codes
            .par_chunks_mut(BLOCK)
            .enumerate()
            .for_each(|(i, codes)| {
                let mut block = [T::default(); BLOCK];
                let block = &mut block[..codes.len()];
                fill(i * BLOCK, block);
                convert::quantize_fp8(block, scale, codes);
            });
        Ok(Fp8Tensor {
            codes,
            scales: vec![scale],
            scale_invs: vec![1.0 / scale],
            rows,
            cols,
            _kind: PhantomData,
        })
    }
}

impl<F: Fp8Element, G: Granularity> Fp8Tensor<F, G, Current> {
    /// Quantises a row-major `rows × cols` matrix with current scaling: each scale is
    /// `F::MAX / amax` of the tensor (or of its row), 1 where that amax is 0.
    ///
    /// # Errors
    /// [`Fp8Error::Shape`] if `data` is not `rows × cols`; [`Fp8Error::NonFiniteAmax`] if it
    /// holds inf or NaN; [`Fp8Error::BadScale`] if an amax is so small (below
    /// `F::MAX / f32::MAX`) that its scale overflows.
    pub fn quantize<T: Fp8Source>(data: &[T], rows: usize, cols: usize) -> Result<Self, Fp8Error> {
        check_shape("the data", data.len(), rows, cols)?;
        let count = G::scale_count(rows);
        let mut amaxes = vec![0.0f32; count];
        for i in 0..rows {
            let a = amax(&data[i * cols..(i + 1) * cols]);
            let slot = &mut amaxes[G::scale_index(i)];
            // `f32::max` drops a NaN, so a NaN row must stay NaN against later rows.
            *slot = if a.is_nan() || slot.is_nan() {
                f32::NAN
            } else {
                slot.max(a)
            };
        }
        let scales = amaxes
            .into_iter()
            .map(|a| {
                if a == 0.0 {
                    Ok(1.0)
                } else {
                    scale_from_amax(F::MAX, a, 0)
                }
            })
            .collect::<Result<Vec<f32>, Fp8Error>>()?;
        Self::with_scales(data, rows, cols, scales)
    }
}

impl<F: Fp8Element, const H: usize, const MARGIN: u32> Fp8Tensor<F, PerTensor, Delayed<H, MARGIN>> {
    /// Quantises a row-major `rows × cols` matrix with delayed scaling: the scale is `state`'s
    /// ([`DelayedScaling::scale`], from the amaxes of earlier tensors), and this tensor's amax is
    /// then recorded in `state` for the next ones. Values above the scaled range saturate at
    /// ±`F::MAX` (the recipe's behaviour when the amax grows between steps).
    ///
    /// # Errors
    /// [`Fp8Error::Shape`] if `data` is not `rows × cols`; [`Fp8Error::EmptyHistory`] while the
    /// history holds no amax; [`Fp8Error::NonFiniteAmax`] if `data` holds inf or NaN (then
    /// nothing is recorded and nothing is quantised).
    pub fn quantize_delayed<T: Fp8Source>(
        data: &[T],
        rows: usize,
        cols: usize,
        state: &mut DelayedScaling<H, MARGIN>,
    ) -> Result<Self, Fp8Error> {
        check_shape("the data", data.len(), rows, cols)?;
        let scale = state.scale::<F>()?;
        // One pass: the scale is known before the data is read.
        let (t, a) = Self::with_scales_amax(data, rows, cols, vec![scale])?;
        if !a.is_finite() {
            return Err(Fp8Error::NonFiniteAmax { amax: a });
        }
        state.record_amax(a)?;
        Ok(t)
    }
}

/// The codes and scales of an [`Fp8Tensor`], taken apart together ([`Fp8Tensor::into_parts`]):
/// what a checkpoint stores. [`Fp8Tensor::from_parts`] checks them on the way back.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Parts<F> {
    /// The codes, row-major.
    pub codes: Vec<F>,
    /// The scales (one, or one per row).
    pub scales: Vec<f32>,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
}

/// A view of an FP8 tensor's codes without its scales: they can be counted, compared and read
/// as bits (to store, beside [`Fp8Tensor::scales`]), but not widened to values, since a code
/// means nothing without its scale (rule [`CarriesItsScale`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Codes<'a, F>(&'a [F]);

impl<F: Fp8Element> Codes<'_, F> {
    /// How many codes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The codes' bits, row-major. These are not values: value `i` is
    /// `F::from_bits(bits[i]).to_f32() / scale`.
    pub fn bits(&self) -> Vec<u8> {
        self.0.iter().map(|c| c.to_bits()).collect()
    }
}

/// Rule: FP8 codes are widened with their scale, never without.
///
/// A code is the value times its scale (`448 / amax`, or 57,344 / amax): widening the code
/// alone gives values off by that factor, silently (a scale of 224 turns 2.0 into 448.0).
/// Everything that widens an FP8 tensor therefore takes the [`Fp8Tensor`], which carries its
/// scales; its codes alone ([`Codes`]) do not qualify.
#[diagnostic::on_unimplemented(
    message = "`{Self}` holds FP8 codes without their scales: widening it would give values × scale",
    label = "an unscaled FP8 widening",
    note = "widen the tensor itself, which carries its scales (rule `typed_amp::fp8::CarriesItsScale`): `fp8::widen(&tensor)` or `tensor.dequantize()` divide each code by its scale"
)]
pub trait CarriesItsScale {
    /// The values in FP32, each code divided by its scale.
    fn widen_scaled(&self) -> Vec<f32>;
}

impl<F: Fp8Element, G: Granularity, M: ScalingMode> CarriesItsScale for Fp8Tensor<F, G, M> {
    fn widen_scaled(&self) -> Vec<f32> {
        self.dequantize()
    }
}

/// Widens an FP8 tensor to FP32 with its scales (see [`Fp8Tensor::dequantize`]); only what
/// carries its scales qualifies (rule [`CarriesItsScale`]).
pub fn widen<T: CarriesItsScale + ?Sized>(t: &T) -> Vec<f32> {
    t.widen_scaled()
}
