//! Several losses, one step: another loss's gradients, scaled by its own scaler, added into
//! unscaled gradients (Apex's one scaler per loss).

use dfdx::prelude::{Shape, Tensor};

use crate::device::CastKernel;
use crate::device::{AmpDevice, Kernels};
use crate::error::AmpError;
use crate::master::TrainTarget;
use crate::params::{ParamVisitor, Parameters};
use crate::precision::AmpElem;
use crate::scaler::{inverse, GradScaler};
use crate::tape::MixedGradients;

use super::backward::{check_fresh, ScaledGrads};
use super::kind::FromScaler;
use super::loss_scale::check_loss_scale;
use super::unscaled::{check_owner, UnscaledGrads};

impl<'t, T: TrainTarget<D>, D: AmpDevice> UnscaledGrads<'t, T, D, FromScaler> {
    /// Adds another loss's gradients of the same model, scaled by its own scaler, into these
    /// (Apex's one scaler per loss: each loss is scaled and backward with its own scaler, then
    /// the gradients are unscaled into one sum for one step). The step is skipped if either
    /// held inf or NaN; [`LossScalers::update`](crate::scaler::LossScalers::update) backs off only the
    /// scalers whose loss overflowed.
    pub fn merge(&mut self, scaler: &GradScaler, other: ScaledGrads<D>) -> Result<(), AmpError> {
        let ScaledGrads {
            mut grads,
            scale,
            scaler: tag,
        } = other;
        scaler.check_tag(tag.id)?;
        if self.scalers.iter().any(|(s, _)| s.id == tag.id) {
            return Err(AmpError::ScalerMismatch(
                "these gradients already hold a loss of this scaler: accumulate one scaler's losses in one backward (or an accumulation window)",
            ));
        }
        check_owner(&*self.target, &grads)?;
        tag.ledger.check_target(self.target.id().key())?;
        check_loss_scale::<T, D>(&grads, tag.scaling)?;
        check_fresh(&tag, &grads)?;
        let (other_master, flags) = self
            .target
            .unscale_into_master(&mut grads, inverse(scale))?;
        add_master_grads(&*self.target, &mut self.master, &other_master)?;
        let found: Vec<String> = self
            .target
            .layout()
            .iter()
            .filter(|p| p.trainable)
            .zip(&flags)
            .filter(|(_, flag)| **flag)
            .map(|(p, _)| p.path.clone())
            .collect();
        let other_inf = !found.is_empty();
        self.found_inf |= other_inf;
        for path in found {
            if !self.non_finite.contains(&path) {
                self.non_finite.push(path);
            }
        }
        self.scalers.push((tag, other_inf));
        Ok(())
    }
}

/// `into += from`, parameter by parameter, for master gradients of one model.
fn add_master_grads<T: TrainTarget<D>, D: AmpDevice>(
    target: &T,
    into: &mut MixedGradients<D>,
    from: &MixedGradients<D>,
) -> Result<(), AmpError> {
    struct AddVisit<'g, D: AmpDevice> {
        into: &'g mut MixedGradients<D>,
        from: &'g MixedGradients<D>,
    }
    impl<D: AmpDevice> ParamVisitor<D> for AddVisit<'_, D> {
        type Error = AmpError;
        fn visit<S: Shape, E: AmpElem>(
            &mut self,
            _path: &str,
            param: &Tensor<S, E, D>,
            trainable: bool,
        ) -> Result<(), AmpError>
        where
            D: Kernels<E>,
        {
            if !trainable {
                return Ok(());
            }
            let Some(src) = self
                .from
                .store::<E>()
                .and_then(|g| g.get_ref_checked(param))
            else {
                return Ok(());
            };
            let dst = self
                .into
                .store_mut::<E>()
                .get_or_alloc_mut(param)
                .map_err(AmpError::device)?;
            CastKernel::<E, E>::try_add_cast(param.device(), src, dst).map_err(AmpError::device)
        }
    }
    target.master().visit_params(&mut AddVisit { into, from })
}
