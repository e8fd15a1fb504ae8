//! [`WorkingCopy`]: the view of a training target's working copy that runs forward passes but
//! that no optimizer can update.

use dfdx::nn::{Module, ModuleMut, ModuleVisitor, TensorCollection};
use dfdx::prelude::{Device, Dtype};

use crate::device::AmpDevice;
use crate::fp8::Fp8Scaling;
use crate::params::{Mutable, ParamPath, ParamVisitor, Parameters};

/// The working copy of a training target (the 16-bit model of a
/// [`MasterWeights`](crate::master::MasterWeights), or the model of an
/// [`Fp32Weights`](crate::master::Fp32Weights)): forward passes run on it, an optimizer does not.
///
/// A `MasterWeights`' working copy is the FP32 masters rounded to 16 bits, refreshed after every
/// step; an optimizer that updated it directly (dfdx's own `Adam::update(model.working_mut(),
/// ..)`) would make it diverge from the masters, and the next refresh would silently undo the
/// update. So this type runs `forward` ([`Module`]) and `forward_mut` ([`ModuleMut`]) as the
/// model does and reads through to the model's fields and parameters (`Deref`), but is a dfdx
/// `TensorCollection` (which every dfdx optimizer's `update` requires) only under the rule
/// `UpdatableByAnOptimizer`, which no working copy meets: updating a working copy does not
/// compile, with that rule's message. Optimizers update `model.master()`.
///
/// ```rust
/// # use typed_amp::prelude::*;
/// type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);
/// let dev = Cpu::default();
/// let model = MasterWeights::build::<Mlp>(&dev).unwrap();
/// let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
/// let _logits = model.working().forward(x);        // forward runs
/// let _w: &Tensor<Rank2<8, 4>, f16, _> = &model.working().0.weight; // fields read through
/// ```
///
/// ```rust,compile_fail
/// # use typed_amp::prelude::*;
/// # use typed_amp::dfdx::optim::{Adam, Optimizer};
/// # type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);
/// # let dev = Cpu::default();
/// let mut model = MasterWeights::build::<Mlp>(&dev).unwrap();
/// let mut opt = Adam::new(model.working(), AdamConfig::default());
/// let grads = model.working().alloc_grads();
/// opt.update(model.working_mut(), &grads); // does not compile: rule `UpdatableByAnOptimizer`
/// ```
///
/// It also holds the state of the model's FP8 recipe, if it has one ([`Fp8Scaling`]: the amax
/// histories of its FP8 linear layers), which its forward passes read and record into.
#[derive(Debug, Clone)]
pub struct WorkingCopy<W>(W, Fp8Scaling);

impl<W> WorkingCopy<W> {
    /// Wraps a target's working model.
    pub(crate) fn new(working: W) -> Self {
        Self(working, Fp8Scaling::default())
    }

    /// The state of the model's FP8 recipe (empty for a model without FP8 linear layers):
    /// what checkpoints save and load and data-parallel steps reduce across ranks.
    pub fn fp8_scaling(&self) -> &Fp8Scaling {
        &self.1
    }

    /// The working model, mutably, for the target that owns it (refresh, reload, unscaling).
    pub(crate) fn model_mut(&mut self) -> &mut W {
        &mut self.0
    }

    /// Unwraps the working model (of a target taken apart, or of a clone of the working copy).
    pub fn into_inner(self) -> W {
        self.0
    }

    /// The working model itself, mutably, past the rule that only the master is updated:
    /// whatever is written through it makes the working copy differ from its FP32 masters until
    /// the next step refreshes it (a step taken copies the masters over every weight) or a
    /// skipped step reloads it (master → working, buffers included).
    ///
    /// For fault-injection tests, which write inf or NaN into a working weight to check that
    /// the step recovers from it, and for the rare hand edit that is meant to diverge. Training
    /// never needs it: forward passes run on the working copy itself, updates go to the master.
    pub fn diverging_from_master_mut(&mut self) -> &mut W {
        &mut self.0
    }
}

impl<W> std::ops::Deref for WorkingCopy<W> {
    type Target = W;

    /// Reads the working model: its fields, parameters and summaries.
    fn deref(&self) -> &W {
        &self.0
    }
}

impl<T, W: Module<T>> Module<T> for WorkingCopy<W> {
    type Output = W::Output;
    type Error = W::Error;

    fn try_forward(&self, input: T) -> Result<Self::Output, Self::Error> {
        let _fp8 = self.1.enter();
        self.0.try_forward(input)
    }
}

impl<T, W: ModuleMut<T>> ModuleMut<T> for WorkingCopy<W> {
    type Output = W::Output;
    type Error = W::Error;

    fn try_forward_mut(&mut self, input: T) -> Result<Self::Output, Self::Error> {
        let _fp8 = self.1.enter();
        self.0.try_forward_mut(input)
    }
}

// typed-amp's own walk (summaries, comparisons, checkpoints' layout): reading is what it is for;
// its mutable visit is typed-amp's, which no dfdx optimizer calls.
impl<D: AmpDevice, W: Parameters<D>> Parameters<D> for WorkingCopy<W> {
    fn visit_params_at<V: ParamVisitor<D>>(
        &self,
        path: &mut ParamPath,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        self.0.visit_params_at(path, visitor)
    }

    fn visit_params_mut_at<V: ParamVisitor<D, Mutable>>(
        &mut self,
        path: &mut ParamPath,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        self.0.visit_params_mut_at(path, visitor)
    }
}

mod sealed {
    /// Nothing implements it: no type outside this module can meet [`super::UpdatableByAnOptimizer`].
    pub trait Sealed {}
}

/// Rule: an optimizer updates the FP32 master weights, never a working copy. No type meets it;
/// it is the bound under which a [`WorkingCopy`] would be a dfdx `TensorCollection`, so that an
/// optimizer over a working copy fails on it, with this message.
#[doc(hidden)] // no type meets it, so no user names it: `WorkingCopy`'s documentation states the rule.
#[diagnostic::on_unimplemented(
    message = "optimizers update FP32 master weights only, never the working copy `{Self}`",
    label = "an optimizer over the working copy",
    note = "the working copy is the FP32 masters rounded to 16 bits and refreshed after every step: an update of it would make it diverge from them (and the next refresh would undo it); build the optimizer on `model.master()` and step with `scaler.step(&mut opt, grads)`"
)]
pub trait UpdatableByAnOptimizer: sealed::Sealed {}

// The one impl of dfdx's `TensorCollection` for a working copy, under a bound no type meets:
// dfdx's blanket impl for zero-sized modules would otherwise be the only candidate, and an
// optimizer over a working copy would fail on `ZeroSizedModule`, which says nothing of the rule.
// `W: TensorCollection` first, so that the working copy's dtype is inferred from the model (an
// optimizer built with `Adam::new(model.working(), ..)` names none) and the rule below is what
// fails, rather than an ambiguous `TensorCollection<_, _>`.
impl<E: Dtype, D: Device<E>, W> TensorCollection<E, D> for WorkingCopy<W>
where
    W: TensorCollection<E, D>,
    Self: UpdatableByAnOptimizer,
{
    type To<E2: Dtype, D2: Device<E2>> = WorkingCopy<W>;

    fn iter_tensors<V: ModuleVisitor<Self, E, D>>(
        _visitor: &mut V,
    ) -> Result<Option<Self::To<V::E2, V::D2>>, V::Err> {
        // Never called: no working copy meets the bound.
        Ok(None)
    }
}
