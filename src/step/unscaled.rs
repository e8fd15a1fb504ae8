//! Unscaled gradients: master gradients divided by the scale, checked for inf and NaN, borrowing
//! the model they belong to.

use std::marker::PhantomData;

use dfdx::prelude::{Shape, Storage, Tensor};

use crate::device::HostKernel;
use crate::device::{AmpDevice, Kernels};
use crate::error::AmpError;
use crate::master::{for_each_trainable_grad, GradOp, TrainTarget};
use crate::precision::AmpElem;
use crate::scaler::{ScalerId, ScalerTag};
use crate::tape::MixedGradients;

use super::kind::{FromScaler, StepKind};
use super::loss_scale::check_loss_scale;

/// Divides `grads` by the scale they carry into `target`'s master gradients, after checking
/// that they belong to it.
pub(crate) fn into_master<T, D, K>(
    target: &mut T,
    mut grads: MixedGradients<D>,
    inv_scale: f32,
    scalers: Vec<ScalerTag>,
) -> Result<UnscaledGrads<'_, T, D, K>, AmpError>
where
    D: AmpDevice,
    T: TrainTarget<D>,
    K: StepKind,
{
    check_owner(target, &grads)?;
    check_loss_scale::<T, D>(&grads, scalers.iter().any(|tag| tag.scaling))?;
    grads.computed.clear();
    let timing = typed_amp_kernels::timing::scope(typed_amp_kernels::timing::Kind::UnscaleCheck);
    let (master, flags) = target.unscale_into_master(&mut grads, inv_scale)?;
    drop(timing);
    let non_finite: Vec<String> = target
        .layout()
        .iter()
        .filter(|p| p.trainable)
        .zip(&flags)
        .filter(|(_, flag)| **flag)
        .map(|(p, _)| p.path.clone())
        .collect();
    let found_inf = !non_finite.is_empty();
    let scalers = scalers.into_iter().map(|tag| (tag, found_inf)).collect();
    let layers = std::mem::take(&mut grads.layer_report);
    Ok(UnscaledGrads {
        target,
        master,
        working: grads,
        found_inf,
        non_finite,
        layers,
        scalers,
        kind: PhantomData,
    })
}

pub(crate) fn check_owner<T: TrainTarget<D>, D: AmpDevice>(
    target: &T,
    grads: &MixedGradients<D>,
) -> Result<(), AmpError> {
    if grads.owner == Some(target.id()) {
        Ok(())
    } else {
        Err(AmpError::ForeignGradients(match grads.owner {
            Some(_) => "they were allocated by another model",
            None => "they were not allocated by a model (use `model.alloc_grads()`, or reuse what the step returned)",
        }))
    }
}

/// Master gradients (FP32, or 16-bit for O3), divided by the scale, checked for inf and NaN,
/// and borrowing the model they belong to.
///
/// `K` says where they came from ([`FromScaler`] or [`ScaleFree`](crate::step::ScaleFree)).
#[must_use = "unscaled gradients do nothing until stepped"]
pub struct UnscaledGrads<'t, T: TrainTarget<D>, D: AmpDevice, K: StepKind = FromScaler> {
    pub(crate) target: &'t mut T,
    pub(crate) master: MixedGradients<D>,
    pub(crate) working: MixedGradients<D>,
    pub(crate) found_inf: bool,
    pub(crate) non_finite: Vec<String>,
    pub(crate) layers: Vec<crate::watch::LayerReport>,
    /// The scalers whose losses these gradients hold, with whether that loss's gradients held
    /// inf or NaN (one entry, or one per loss after [`UnscaledGrads::merge`]).
    pub(crate) scalers: Vec<(ScalerTag, bool)>,
    pub(crate) kind: PhantomData<K>,
}

impl<T: TrainTarget<D>, D: AmpDevice, K: StepKind> std::fmt::Debug for UnscaledGrads<'_, T, D, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnscaledGrads")
            .field("found_inf", &self.found_inf)
            .field("non_finite", &self.non_finite)
            .finish_non_exhaustive()
    }
}

impl<'t, T: TrainTarget<D>, D: AmpDevice, K: StepKind> UnscaledGrads<'t, T, D, K> {
    /// Whether any gradient (of any precision) held inf or NaN, or a value larger in magnitude
    /// than [`GRADIENT_LIMIT`](crate::step::GRADIENT_LIMIT) (whose square overflows what Adam
    /// and gradient norms compute). The step will be skipped.
    pub fn found_inf(&self) -> bool {
        self.found_inf
    }

    /// Paths of the parameters whose gradients held inf, NaN or a value above
    /// [`GRADIENT_LIMIT`](crate::step::GRADIENT_LIMIT), in model order (empty unless
    /// [`UnscaledGrads::found_inf`]).
    pub fn non_finite_params(&self) -> &[String] {
        &self.non_finite
    }

    /// Per-layer magnitudes of the pass, when watching
    /// ([`MixedGradients::watch_layers`]).
    pub fn layer_report(&self) -> &[crate::watch::LayerReport] {
        &self.layers
    }

    /// The layer where values first stopped being finite, when watching.
    pub fn overflowing_layer(&self) -> Option<crate::watch::Overflow> {
        crate::watch::overflowing_layer(&self.layers)
    }

    /// The model these gradients belong to.
    pub fn target(&self) -> &T {
        self.target
    }

    /// The master gradients.
    pub fn master_grads(&self) -> &MixedGradients<D> {
        &self.master
    }

    /// A copy of one master parameter's gradient (`param` is a parameter of
    /// `self.target().master()`).
    pub fn get<S: Shape, E: AmpElem>(&self, param: &Tensor<S, E, D>) -> Option<Tensor<S, E, D>>
    where
        D: Kernels<E>,
    {
        self.master.get(param)
    }

    /// Every trainable master parameter's gradient, copied to the host and widened to FP32,
    /// with its path.
    pub fn to_host(&mut self) -> Result<Vec<(String, Vec<f32>)>, AmpError> {
        struct Read(Vec<Vec<f32>>);
        impl<D: AmpDevice> GradOp<D> for Read {
            fn apply<E: AmpElem>(
                &mut self,
                dev: &D,
                _slot: usize,
                grad: &mut <D as Storage<E>>::Vec,
            ) -> Result<(), D::Err>
            where
                D: Kernels<E>,
            {
                let values = HostKernel::<E>::try_read(dev, grad)?;
                self.0
                    .push(values.into_iter().map(AmpElem::to_f32).collect());
                Ok(())
            }
        }
        let mut read = Read(Vec::new());
        for_each_trainable_grad(self.target.master(), &mut self.master, &mut read)?;
        let paths = self
            .target
            .layout()
            .iter()
            .filter(|p| p.trainable)
            .map(|p| p.path.clone());
        Ok(paths.zip(read.0).collect())
    }
}

/// What [`crate::distributed`] needs of the step's values: it builds the data-parallel stages
/// out of the same gradients and outcomes.
impl<'t, T: TrainTarget<D>, D: AmpDevice, K: StepKind> UnscaledGrads<'t, T, D, K> {
    /// The model and the master gradients, for a reduction across ranks.
    pub(crate) fn target_and_master(&mut self) -> (&T, &mut MixedGradients<D>) {
        (&*self.target, &mut self.master)
    }

    /// The scalers these gradients hold losses of.
    pub(crate) fn scaler_ids(&self) -> impl Iterator<Item = ScalerId> + '_ {
        self.scalers.iter().map(|(tag, _)| tag.id)
    }

    /// The same gradients as kind `K2`, with `found_inf` as the overflow flag of the step (and of
    /// every loss they hold).
    pub(crate) fn into_kind<K2: StepKind>(self, found_inf: bool) -> UnscaledGrads<'t, T, D, K2> {
        let UnscaledGrads {
            target,
            master,
            working,
            non_finite,
            layers,
            scalers,
            ..
        } = self;
        UnscaledGrads {
            target,
            master,
            working,
            found_inf,
            non_finite,
            layers,
            scalers: scalers
                .into_iter()
                .map(|(tag, _)| (tag, found_inf))
                .collect(),
            kind: PhantomData,
        }
    }
}
