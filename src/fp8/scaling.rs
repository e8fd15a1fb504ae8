//! Where an FP8 tensor's scale comes from: [`Current`] scaling (this tensor's amax) or
//! [`Delayed`] scaling (the largest amax of a history of `H` earlier steps, with a margin), and
//! the state of delayed scaling, [`DelayedScaling`].
//!
//! Both compute Transformer Engine's scale from an amax: `scale = (fp8_max / amax) / 2^margin`,
//! so that the amax lands at or below the format's largest value (`2^-margin` of it), and the
//! data is cast as `code = fp8(x · scale)` and read back as `x ≈ code / scale`.

use super::error::Fp8Error;

mod sealed {
    pub trait Sealed {}
}

/// How an FP8 tensor's scale was chosen: [`Current`] or [`Delayed`].
#[doc(hidden)] // a sealed kind of the FP8 types' parameters: users name `Current` or `Delayed`.
pub trait ScalingMode:
    sealed::Sealed + Copy + Default + std::fmt::Debug + Send + Sync + 'static
{
    /// The mode's name.
    const NAME: &'static str;
    /// The length of the amax history a scale comes from: 0 for [`Current`] scaling (each
    /// tensor's own amax), `H` for [`Delayed`].
    const HISTORY: usize;
    /// The margin: the amax is put at `fp8_max / 2^MARGIN`.
    const MARGIN: u32;
}

/// Current scaling: the scale is computed from the amax of the tensor being quantised, just
/// before it is cast (Transformer Engine's `Float8CurrentScaling`, torchao's dynamic scaling).
/// Its margin is 0. An all-zero tensor (or row) has amax 0 and gets scale 1.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Current;

/// Delayed scaling: the scale comes from the largest amax of the last `H` tensors quantised
/// through one [`DelayedScaling`] state (Transformer Engine's `DelayedScaling` with
/// `amax_compute_algo = "max"`, history length `H`, margin `MARGIN`); the tensor's own amax is
/// recorded for the later ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Delayed<const H: usize, const MARGIN: u32 = 0>;

impl sealed::Sealed for Current {}
impl<const H: usize, const MARGIN: u32> sealed::Sealed for Delayed<H, MARGIN> {}

impl ScalingMode for Current {
    const NAME: &'static str = "current";
    const HISTORY: usize = 0;
    const MARGIN: u32 = 0;
}

impl<const H: usize, const MARGIN: u32> ScalingMode for Delayed<H, MARGIN> {
    const NAME: &'static str = "delayed";
    const HISTORY: usize = H;
    const MARGIN: u32 = MARGIN;
}

/// The scale that puts `amax` at `fp8_max / 2^margin`: `(fp8_max / amax) / 2^margin`.
///
/// # Errors
/// [`Fp8Error::NonFiniteAmax`] for an inf or NaN amax; [`Fp8Error::BadScale`] when the scale is
/// not a finite positive number (an amax of zero, or one so small that the quotient overflows).
pub fn scale_from_amax(fp8_max: f32, amax: f32, margin: u32) -> Result<f32, Fp8Error> {
    if !amax.is_finite() {
        return Err(Fp8Error::NonFiniteAmax { amax });
    }
    let scale = (fp8_max / amax.abs()) / 2f32.powi(margin.min(127) as i32);
    check_scale(scale).map_err(|_| Fp8Error::BadScale {
        scale,
        context: format!(" (computed from amax {amax:e} and margin {margin})"),
    })
}

/// `Ok(scale)` if it is a finite positive number.
pub(crate) fn check_scale(scale: f32) -> Result<f32, Fp8Error> {
    if scale.is_finite() && scale > 0.0 {
        Ok(scale)
    } else {
        Err(Fp8Error::BadScale {
            scale,
            context: String::new(),
        })
    }
}

/// The state of [`Delayed`] scaling for one tensor role (one layer's activations, weights or
/// output gradients): the amaxes of the last `H` tensors quantised through it.
///
/// The scale of the next tensor is `(fp8_max / max(history)) / 2^MARGIN`; quantising a tensor
/// records its amax (a ring of `H` entries, oldest dropped).
///
/// ```
/// use typed_amp::fp8::{DelayedScaling, Fp8Error, Fp8Tensor, E4M3, PerTensor, Delayed};
/// # fn main() -> Result<(), Fp8Error> {
/// let mut state = DelayedScaling::<16>::new();
/// // A fresh history has no amax yet: the scale is a typed error, not a guess.
/// assert!(matches!(state.scale::<E4M3>(), Err(Fp8Error::EmptyHistory { len: 16 })));
/// state.record_amax(2.0)?;
/// assert_eq!(state.scale::<E4M3>()?, 224.0); // 448 / 2
/// let x = [0.5f32, -1.0, 1.5, 3.0];
/// let t: Fp8Tensor<E4M3, PerTensor, Delayed<16>> = Fp8Tensor::quantize_delayed(&x, 2, 2, &mut state)?;
/// assert_eq!(t.scales(), &[224.0]);     // from the history, not from this tensor's amax (3)
/// assert_eq!(state.scale::<E4M3>()?, 448.0 / 3.0); // its amax is recorded for the next one
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct DelayedScaling<const H: usize, const MARGIN: u32 = 0> {
    history: [f32; H],
    next: usize,
}

impl<const H: usize, const MARGIN: u32> Default for DelayedScaling<H, MARGIN> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const H: usize, const MARGIN: u32> DelayedScaling<H, MARGIN> {
    /// A history of `H` zeros: no scale until an amax is recorded.
    pub fn new() -> Self {
        const { assert!(H > 0, "an amax history holds at least one entry") };
        DelayedScaling {
            history: [0.0; H],
            next: 0,
        }
    }

    /// A history holding the amax of `first` (the first tensor's, to quantise it and the next
    /// ones with).
    ///
    /// # Errors
    /// [`Fp8Error::NonFiniteAmax`] if `first` holds inf or NaN.
    pub fn from_first(first: &[f32]) -> Result<Self, Fp8Error> {
        let mut s = Self::new();
        s.record_amax(super::source::amax(first))?;
        Ok(s)
    }

    /// Records an amax (the oldest entry is dropped).
    ///
    /// # Errors
    /// [`Fp8Error::NonFiniteAmax`] for inf or NaN (nothing is recorded, so one overflowing step
    /// does not poison the next `H` scales).
    pub fn record_amax(&mut self, amax: f32) -> Result<(), Fp8Error> {
        if !amax.is_finite() {
            return Err(Fp8Error::NonFiniteAmax { amax });
        }
        self.history[self.next] = amax.abs();
        self.next = (self.next + 1) % H;
        Ok(())
    }

    /// The history, oldest entry first.
    pub fn history(&self) -> Vec<f32> {
        (0..H).map(|i| self.history[(self.next + i) % H]).collect()
    }

    /// The largest amax of the history.
    pub fn amax(&self) -> f32 {
        self.history.iter().fold(0.0f32, |m, &a| m.max(a))
    }

    /// The scale of the next tensor in format `F`: `(F::MAX / max(history)) / 2^MARGIN`.
    ///
    /// # Errors
    /// [`Fp8Error::EmptyHistory`] while no amax above zero is recorded; [`Fp8Error::BadScale`]
    /// if the scale overflows FP32.
    pub fn scale<F: super::Fp8Element>(&self) -> Result<f32, Fp8Error> {
        let amax = self.amax();
        if amax == 0.0 {
            return Err(Fp8Error::EmptyHistory { len: H });
        }
        scale_from_amax(F::MAX, amax, MARGIN)
    }
}
