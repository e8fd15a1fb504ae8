//! [`SinglePrecision`]: a model trained in one precision, its own master ([`Fp32Weights`] for
//! O0 and O1, [`Fp16Weights`] and [`Bf16Weights`] for O3).

use dfdx::nn::{BuildOnDevice, DeviceBuildExt};

use super::flags::NonFiniteFlags;
use super::target::sealed::Sealed;
use super::target::TrainTarget;
use super::unscale::{release_grads, unscale_in_place};
use super::working_copy::WorkingCopy;
use crate::device::{AmpDevice, Kernels};
use crate::error::AmpError;
use crate::params::{ParamInfo, Parameters};
use crate::precision::{AmpElem, NoWiderThan, Precision};
use crate::tape::{MixedGradients, TargetId};

/// A model trained in a single precision, with no separate master copy: the module is its own
/// master and its gradients are unscaled in place. Use the aliases [`Fp32Weights`] (O0, and
/// O1's FP32 weights) and [`Fp16Weights`] (O3).
///
/// `P` is the precision the model computes in, which decides whether a step needs a loss
/// scaler: the weights' own precision, except under O1, whose FP32 weights are cast to FP16
/// (or BF16) for every matrix product ([`SinglePrecision::with_compute`]).
pub struct SinglePrecision<M, E: AmpElem, D: AmpDevice, P: Precision = <E as AmpElem>::Precision> {
    module: WorkingCopy<M>,
    layout: Vec<ParamInfo>,
    flags: NonFiniteFlags<D>,
    id: TargetId,
    /// Trained across ranks: stepped only through the data-parallel step.
    data_parallel: bool,
    elem: std::marker::PhantomData<(E, P)>,
}

/// A plain FP32 model (O0): the module is its own master.
///
/// ```rust
/// # use typed_amp::prelude::*;
/// use typed_amp::master::Fp32Weights;
/// let dev = Cpu::default();
/// let model = Fp32Weights::new(dev.build_module::<Linear<4, 2>, f32>(), &dev);
/// assert_eq!(model.working().weight.shape(), &(Const::<2>, Const::<4>));
/// ```
///
/// `P` is the precision it computes in: FP32 (O0), or the 16-bit precision O1 casts its matrix
/// products to.
pub type Fp32Weights<M, D, P = crate::precision::F32> = SinglePrecision<M, f32, D, P>;

/// A plain FP16 model with no FP32 master weights (Apex's O3).
///
/// This breaks the rule that optimizers update only FP32 weights: small updates round away in
/// FP16. An optimizer over it must be wrapped in [`LowPrecisionUpdates`](crate::optim::LowPrecisionUpdates) to
/// say so explicitly.
pub type Fp16Weights<M, D> = SinglePrecision<M, half::f16, D>;

/// A plain BF16 model with no FP32 master weights (O3 in BF16); as [`Fp16Weights`], its
/// optimizer must be wrapped in [`LowPrecisionUpdates`](crate::optim::LowPrecisionUpdates).
pub type Bf16Weights<M, D> = SinglePrecision<M, half::bf16, D>;

impl<M, E, D> SinglePrecision<M, E, D>
where
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
    M: Parameters<D>,
{
    /// Wraps a module whose parameters are all of precision `E`, computing in `E`.
    pub fn new(module: M, device: &D) -> Self {
        Self::wrap(module, device)
    }

    /// Builds an architecture `A` in precision `E`.
    pub fn build<A>(device: &D) -> Result<Self, AmpError>
    where
        A: BuildOnDevice<D, E, Built = M>,
        D: DeviceBuildExt,
    {
        let module = device
            .try_build_module::<A, E>()
            .map_err(AmpError::device)?;
        Ok(Self::new(module, device))
    }
}

impl<M, E, D, P> SinglePrecision<M, E, D, P>
where
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
    M: Parameters<D>,
    P: Precision,
{
    /// Wraps a module whose parameters are all of precision `E` and that computes in `P`: O1's
    /// FP32 weights cast to FP16 or BF16 for every matrix product, whose step needs a loss
    /// scaler if `P` is FP16.
    ///
    /// `P` is the weights' precision or a narrower one (rule [`NoWiderThan`]): BF16 or FP32 over
    /// FP16 weights does not compile. (A module that computes in FP16 below a wider declaration,
    /// through casts inside it, is caught at run time: its gradients record that they were
    /// computed in FP16, and a step without a loss scale refuses them with
    /// [`AmpError::Fp16GradientsNeedALossScale`].)
    pub fn with_compute(module: M, device: &D) -> Self
    where
        P: NoWiderThan<E::Precision>,
    {
        Self::wrap(module, device)
    }

    fn wrap(module: M, device: &D) -> Self {
        let layout = module.param_summary();
        Self {
            module: WorkingCopy::new(module),
            flags: NonFiniteFlags::new(device, &layout),
            layout,
            id: TargetId::fresh(),
            data_parallel: false,
            elem: std::marker::PhantomData,
        }
    }

    /// The module (forward and backward run on it), as a [`WorkingCopy`]: an optimizer updates
    /// [`SinglePrecision::master`], the same module.
    pub fn working(&self) -> &WorkingCopy<M> {
        &self.module
    }

    /// The module, mutably: for training forwards that update buffers.
    pub fn working_mut(&mut self) -> &mut WorkingCopy<M> {
        &mut self.module
    }

    /// The module, which is its own master.
    pub fn master(&self) -> &M {
        &self.module
    }

    /// Zeroed gradients for the module's parameters.
    pub fn alloc_grads(&self) -> Result<MixedGradients<D>, AmpError> {
        TrainTarget::alloc_grads(self)
    }

    /// Unwraps the module.
    pub fn into_inner(self) -> M {
        self.module.into_inner()
    }

    /// Bytes held by the parameters.
    pub fn size_in_bytes(&self) -> usize {
        self.layout.iter().map(ParamInfo::size_in_bytes).sum()
    }
}

impl<M, E: AmpElem, D: AmpDevice, P: Precision> Sealed for SinglePrecision<M, E, D, P> {}

impl<M, E, D, P> TrainTarget<D> for SinglePrecision<M, E, D, P>
where
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
    M: Parameters<D>,
    P: Precision,
{
    type Master = M;
    type Working = M;
    type Precision = P;

    fn master(&self) -> &M {
        &self.module
    }

    fn master_mut(&mut self) -> &mut M {
        self.module.model_mut()
    }

    fn working(&self) -> &WorkingCopy<M> {
        &self.module
    }

    fn working_mut(&mut self) -> &mut WorkingCopy<M> {
        &mut self.module
    }

    fn id(&self) -> TargetId {
        self.id
    }

    fn layout(&self) -> &[ParamInfo] {
        &self.layout
    }

    fn unscale_into_master(
        &mut self,
        working: &mut MixedGradients<D>,
        inv_scale: f32,
    ) -> Result<(MixedGradients<D>, Vec<bool>), AmpError> {
        // The module is its own master: its gradients move over and are unscaled in place.
        let mut grads = MixedGradients::leaky();
        *grads.store_mut::<E>() = working.take_store::<E>();
        let module = &self.module;
        let flags = self
            .flags
            .record(|stats| unscale_in_place(module, working, &mut grads, inv_scale, stats))?;
        Ok((grads, flags))
    }

    fn recycle(
        &mut self,
        mut master_grads: MixedGradients<D>,
        mut working: MixedGradients<D>,
    ) -> Result<MixedGradients<D>, AmpError> {
        *working.store_mut::<E>() = master_grads.take_store::<E>();
        release_grads(&self.module, &mut working)?;
        Ok(working)
    }

    fn mark_data_parallel(&mut self) {
        self.data_parallel = true;
    }

    fn is_data_parallel(&self) -> bool {
        self.data_parallel
    }

    fn refresh(&mut self) -> Result<(), AmpError> {
        Ok(())
    }

    fn sync_buffers_to_master(&mut self) -> Result<(), AmpError> {
        Ok(())
    }

    fn reload_working(&mut self) -> Result<(), AmpError> {
        Ok(())
    }
}
