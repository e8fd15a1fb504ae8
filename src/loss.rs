//! FP32 losses and the [`Loss`] value they produce, the only thing
//! [`GradScaler::scale`](crate::scaler::GradScaler::scale) accepts.
//!
//! Every loss takes its inputs in FP32 (rule [`LossPrecision`]): log-softmax, the log inside
//! binary cross-entropy and the mean over a batch lose accuracy or overflow in FP16. Cast a
//! model's FP16 output with `.to_f32()` first.

use dfdx::prelude::{Device, HasAxes, HasShape, Rank0, ReduceShape, Shape, Tensor};

use crate::device::AmpDevice;
use crate::precision::{AmpElem, LossPrecision};
use crate::tape::MixedTape;

/// A scalar FP32 loss recorded on a [`MixedTape`], ready to be scaled and differentiated.
///
/// Losses add (`a + b`) and weigh (`loss * 0.5`), so several objectives share one backward pass.
#[derive(Debug)]
pub struct Loss<D: AmpDevice> {
    tensor: Tensor<Rank0, f32, D, MixedTape<D>>,
}

impl<D: AmpDevice> Loss<D> {
    /// Wraps a scalar computed by the caller, e.g. a custom objective. Only FP32 qualifies.
    ///
    /// What is checked is the scalar's precision (rule [`LossPrecision`]), not how it was
    /// computed: the tape records the ops that lead to it, not which of them reduced into it, so
    /// a sum or mean computed in FP16 and cast to FP32 (`x16.sum().to_f32()`) passes as an FP32
    /// loss. Compute custom losses from FP32 values (`.to_f32()` before the reduction), as the
    /// losses of this module do. (An FP16 op anywhere on the tape still makes the step require
    /// an enabled loss scaler: [`AmpError::Fp16GradientsNeedALossScale`](crate::error::AmpError::Fp16GradientsNeedALossScale).)
    pub fn new<E: AmpElem>(tensor: Tensor<Rank0, E, D, MixedTape<D>>) -> Self
    where
        E::Precision: LossPrecision,
        D: Device<E>,
    {
        Self {
            tensor: <E::Precision as LossPrecision>::into_f32(tensor),
        }
    }

    /// The loss's value (copied to the host).
    pub fn value(&self) -> f32 {
        self.tensor.as_vec()[0]
    }

    /// Weighs this loss by `weight`, e.g. to average over gradient-accumulation micro-batches.
    pub fn try_weighted(self, weight: f32) -> Result<Self, D::Err> {
        Ok(Self {
            tensor: self.tensor.try_mul(weight)?,
        })
    }

    /// Adds another loss, e.g. a regulariser or a second head.
    pub fn try_add(self, other: Self) -> Result<Self, D::Err> {
        Ok(Self {
            tensor: self.tensor.try_add(other.tensor)?,
        })
    }

    pub(crate) fn into_tensor(self) -> Tensor<Rank0, f32, D, MixedTape<D>> {
        self.tensor
    }
}

impl<D: AmpDevice> std::ops::Add for Loss<D> {
    type Output = Self;
    fn add(self, rhs: Self) -> Self {
        self.try_add(rhs).unwrap()
    }
}

impl<D: AmpDevice> std::ops::Mul<f32> for Loss<D> {
    type Output = Self;
    fn mul(self, weight: f32) -> Self {
        self.try_weighted(weight).unwrap()
    }
}

use dfdx::tensor_ops::{MeanTo, TryAdd, TryMul, TrySub};

/// Cross-entropy between `target_probs` (probability vectors along the last axis, e.g. one-hot)
/// and `softmax(logits)`, averaged over all other axes. Matches PyTorch's `cross_entropy` with
/// probability targets.
///
/// ```rust
/// # use typed_amp::prelude::*;
/// let dev = Cpu::default();
/// let logits: Tensor<Rank2<1, 2>, f32, _> = dev.tensor([[0.0, 0.0]]);
/// let target = dev.tensor([[1.0, 0.0]]);
/// let loss = cross_entropy_with_logits_loss(logits.leaky_traced_mixed(), target);
/// assert!((loss.value() - std::f32::consts::LN_2).abs() < 1e-6);
/// ```
pub fn cross_entropy_with_logits_loss<S, E, D>(
    logits: Tensor<S, E, D, MixedTape<D>>,
    target_probs: Tensor<S, E, D>,
) -> Loss<D>
where
    S: Shape + ReduceShape<S::LastAxis>,
    E: AmpElem,
    E::Precision: LossPrecision,
    D: AmpDevice + Device<E>,
{
    try_cross_entropy_with_logits_loss(logits, target_probs).unwrap()
}

/// Fallible [`cross_entropy_with_logits_loss`].
pub fn try_cross_entropy_with_logits_loss<S, E, D>(
    logits: Tensor<S, E, D, MixedTape<D>>,
    target_probs: Tensor<S, E, D>,
) -> Result<Loss<D>, D::Err>
where
    S: Shape + ReduceShape<S::LastAxis>,
    E: AmpElem,
    E::Precision: LossPrecision,
    D: AmpDevice + Device<E>,
{
    let logits = <E::Precision as LossPrecision>::into_f32(logits);
    let target_probs = <E::Precision as LossPrecision>::into_f32(target_probs);
    let classes = <S as HasAxes<S::LastAxis>>::size(logits.shape()) as f32;
    let log_probs = logits.try_log_softmax::<S::LastAxis>()?;
    let tensor = log_probs
        .try_mul(target_probs)?
        .try_mean()?
        .try_negate()?
        .try_mul(classes)?;
    Ok(Loss { tensor })
}

/// Mean squared error between `pred` and `target`.
///
/// ```rust
/// # use typed_amp::prelude::*;
/// let dev = Cpu::default();
/// let pred: Tensor<Rank1<2>, f32, _> = dev.tensor([1.0, 3.0]);
/// let loss = mse_loss(pred.leaky_traced_mixed(), dev.tensor([0.0, 0.0]));
/// assert_eq!(loss.value(), 5.0);
/// ```
pub fn mse_loss<S, E, D>(pred: Tensor<S, E, D, MixedTape<D>>, target: Tensor<S, E, D>) -> Loss<D>
where
    S: Shape,
    E: AmpElem,
    E::Precision: LossPrecision,
    D: AmpDevice + Device<E>,
{
    try_mse_loss(pred, target).unwrap()
}

/// Fallible [`mse_loss`].
pub fn try_mse_loss<S, E, D>(
    pred: Tensor<S, E, D, MixedTape<D>>,
    target: Tensor<S, E, D>,
) -> Result<Loss<D>, D::Err>
where
    S: Shape,
    E: AmpElem,
    E::Precision: LossPrecision,
    D: AmpDevice + Device<E>,
{
    let pred = <E::Precision as LossPrecision>::into_f32(pred);
    let target = <E::Precision as LossPrecision>::into_f32(target);
    let tensor = pred.try_sub(target)?.try_square()?.try_mean()?;
    Ok(Loss { tensor })
}

/// Binary cross-entropy between `target_probs` (values in `[0, 1]`) and `sigmoid(logits)`,
/// computed in the numerically stable form and averaged.
///
/// ```rust
/// # use typed_amp::prelude::*;
/// let dev = Cpu::default();
/// let logits: Tensor<Rank1<1>, f32, _> = dev.tensor([0.0]);
/// let loss = binary_cross_entropy_with_logits_loss(logits.leaky_traced_mixed(), dev.tensor([1.0]));
/// assert!((loss.value() - std::f32::consts::LN_2).abs() < 1e-6);
/// ```
pub fn binary_cross_entropy_with_logits_loss<S, E, D>(
    logits: Tensor<S, E, D, MixedTape<D>>,
    target_probs: Tensor<S, E, D>,
) -> Loss<D>
where
    S: Shape,
    E: AmpElem,
    E::Precision: LossPrecision,
    D: AmpDevice + Device<E>,
{
    try_binary_cross_entropy_with_logits_loss(logits, target_probs).unwrap()
}

/// Fallible [`binary_cross_entropy_with_logits_loss`].
pub fn try_binary_cross_entropy_with_logits_loss<S, E, D>(
    logits: Tensor<S, E, D, MixedTape<D>>,
    target_probs: Tensor<S, E, D>,
) -> Result<Loss<D>, D::Err>
where
    S: Shape,
    E: AmpElem,
    E::Precision: LossPrecision,
    D: AmpDevice + Device<E>,
{
    let logits = <E::Precision as LossPrecision>::into_f32(logits);
    let target_probs = <E::Precision as LossPrecision>::into_f32(target_probs);
    let tensor = logits.try_bce_with_logits(target_probs)?.try_mean()?;
    Ok(Loss { tensor })
}
