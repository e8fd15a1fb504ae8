//! Operations on the gradient of every trainable parameter of a module (clipping, norms, reading
//! them back), generic over each parameter's precision.

use dfdx::prelude::{Shape, Storage, Tensor};

use crate::device::{AmpDevice, Kernels};
use crate::error::AmpError;
use crate::params::{ParamVisitor, Parameters};
use crate::precision::AmpElem;
use crate::tape::MixedGradients;

/// An operation on the gradient of each trainable parameter of a module, generic over the
/// parameter's precision.
pub(crate) trait GradOp<D: AmpDevice> {
    /// Applies the operation to the gradient buffer of the trainable parameter number `slot`.
    fn apply<E: AmpElem>(
        &mut self,
        dev: &D,
        slot: usize,
        grad: &mut <D as Storage<E>>::Vec,
    ) -> Result<(), D::Err>
    where
        D: Kernels<E>;
}

/// Applies `op` to the gradient in `grads` of every trainable parameter of `module` (allocating
/// any that is missing), in model order, with its slot (its index among trainable parameters).
/// Returns the device, if there was a parameter.
pub(crate) fn for_each_trainable_grad<D, M, O>(
    module: &M,
    grads: &mut MixedGradients<D>,
    op: &mut O,
) -> Result<Option<D>, AmpError>
where
    D: AmpDevice,
    M: Parameters<D>,
    O: GradOp<D>,
{
    struct Visit<'g, D: AmpDevice, O> {
        grads: &'g mut MixedGradients<D>,
        op: &'g mut O,
        slot: usize,
        device: Option<D>,
    }
    impl<D: AmpDevice, O: GradOp<D>> ParamVisitor<D> for Visit<'_, D, O> {
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
            let slot = self.slot;
            self.slot += 1;
            let grad = self
                .grads
                .store_mut::<E>()
                .get_or_alloc_mut(param)
                .map_err(AmpError::device)?;
            let dev = param.device();
            self.op
                .apply::<E>(dev, slot, grad)
                .map_err(AmpError::device)?;
            if self.device.is_none() {
                self.device = Some(dev.clone());
            }
            Ok(())
        }
    }
    let mut visit = Visit {
        grads,
        op,
        slot: 0,
        device: None,
    };
    module.visit_params(&mut visit)?;
    Ok(visit.device)
}
