//! Copies between a master and its working copy, over the [`Paired`] walk: the refresh after a
//! step (weights down, buffers up), the reload of the whole working copy, and the check that a
//! pair is a valid master and working copy.

use dfdx::prelude::{Shape, Tensor};

use super::pair::{PairVisitor, Paired};
use crate::device::{AmpDevice, CastKernel, Kernels};
use crate::error::AmpError;
use crate::precision::{AmpElem, Precision};

/// Which parameters a copy touches, and in which direction.
#[derive(Clone, Copy, PartialEq)]
enum Copy {
    /// Trainable weights master → working, buffers working → master: the refresh after a step.
    Refresh,
    /// Buffers (batch norm statistics) working → master.
    BuffersToMaster,
    /// Everything master → working.
    AllToWorking,
}

struct CopyPairs(Copy);

impl<D: AmpDevice> PairVisitor<D> for CopyPairs {
    type Error = AmpError;

    fn visit_pair<Sm: Shape, Sw: Shape, E: AmpElem>(
        &mut self,
        _path: &str,
        master: &mut Tensor<Sm, f32, D>,
        working: &mut Tensor<Sw, E, D>,
        trainable: bool,
    ) -> Result<(), AmpError>
    where
        D: Kernels<E>,
    {
        let dev = master.device().clone();
        let to_working = match self.0 {
            Copy::Refresh => trainable,
            Copy::BuffersToMaster => {
                if trainable {
                    return Ok(());
                }
                false
            }
            Copy::AllToWorking => true,
        };
        if to_working {
            CastKernel::<f32, E>::try_copy_cast(&dev, master.storage(), working.storage_mut())
        } else {
            CastKernel::<E, f32>::try_copy_cast(&dev, working.storage(), master.storage_mut())
        }
        .map_err(AmpError::device)
    }
}

/// After an update: the master's weights into the working copy, the working copy's buffers
/// (batch norm running statistics, moved by training forwards) into the master.
pub(crate) fn refresh_pair<M: Paired<W, D>, W, D: AmpDevice>(
    master: &mut M,
    working: &mut W,
) -> Result<(), AmpError> {
    master.visit_pairs(working, &mut CopyPairs(Copy::Refresh))
}

/// The working copy's buffers into the master.
pub(crate) fn buffers_to_master<M: Paired<W, D>, W, D: AmpDevice>(
    master: &mut M,
    working: &mut W,
) -> Result<(), AmpError> {
    master.visit_pairs(working, &mut CopyPairs(Copy::BuffersToMaster))
}

/// The whole master, buffers included, into the working copy.
pub(crate) fn all_to_working<M: Paired<W, D>, W, D: AmpDevice>(
    master: &mut M,
    working: &mut W,
) -> Result<(), AmpError> {
    master.visit_pairs(working, &mut CopyPairs(Copy::AllToWorking))
}

/// Checks, while setting the working copy from the master, that the two pair (the walk checks
/// names, sizes and trainability) and that no working parameter is narrower than the declared
/// working precision `P`: an FP16 parameter in a copy declared BF16 would step without a loss
/// scale.
pub(crate) fn pair_and_load<P: Precision, M: Paired<W, D>, W, D: AmpDevice>(
    master: &mut M,
    working: &mut W,
) -> Result<(), AmpError> {
    struct Check<P>(std::marker::PhantomData<P>);
    impl<P: Precision, D: AmpDevice> PairVisitor<D> for Check<P> {
        type Error = AmpError;
        fn visit_pair<Sm: Shape, Sw: Shape, E: AmpElem>(
            &mut self,
            path: &str,
            master: &mut Tensor<Sm, f32, D>,
            working: &mut Tensor<Sw, E, D>,
            trainable: bool,
        ) -> Result<(), AmpError>
        where
            D: Kernels<E>,
        {
            let declared = P::DTYPE;
            let held = crate::precision::dtype_of::<E>();
            if declared.has_full_range() && !held.has_full_range() {
                return Err(AmpError::ParamMismatch {
                    path: path.to_string(),
                    detail: format!(
                        "the working copy is declared {declared} but holds this parameter in {held}, which needs a loss scaler: declare the working precision {held}"
                    ),
                });
            }
            CopyPairs(Copy::AllToWorking).visit_pair(path, master, working, trainable)
        }
    }
    master.visit_pairs(working, &mut Check::<P>(std::marker::PhantomData))
}
