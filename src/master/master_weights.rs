//! [`MasterWeights`]: FP32 master weights with a 16-bit working copy.

use dfdx::nn::{BuildOnDevice, DeviceBuildExt, TensorCollection, ToDtype};
use dfdx::prelude::{Shape, Tensor};

use super::copy::{all_to_working, buffers_to_master, pair_and_load, refresh_pair};
use super::flags::NonFiniteFlags;
use super::optimizer::MasterOptimizer;
use super::pair::{PairVisitor, Paired};
use super::target::sealed::Sealed;
use super::target::TrainTarget;
use super::unscale::UnscalePairs;
use super::working_copy::WorkingCopy;
use crate::device::{AmpDevice, Kernels};
use crate::error::AmpError;
use crate::params::{ParamInfo, Parameters};
use crate::precision::AmpElem;
use crate::precision::{LowPrecision, F16};
use crate::tape::{MixedGradients, TargetId};

/// Moves each trainable pair's FP32 master gradient buffer into the working gradients' spares.
struct ReturnBuffers<'a, D: AmpDevice>(&'a mut MixedGradients<D>, &'a mut MixedGradients<D>);

impl<D: AmpDevice> PairVisitor<D> for ReturnBuffers<'_, D> {
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
        if trainable {
            if let Some(buf) = self.0.store_mut::<f32>().remove(master.id()) {
                self.1.keep_spare(working.id(), buf);
            }
        }
        Ok(())
    }
}

/// FP32 master weights `M` with their working copy `W`, whose parameters are `P` (FP16 or
/// BF16) or FP32 (FP16 linear layers with FP32 batch norm, say).
///
/// `P` names the working copy's 16-bit precision: with [`F16`] the step needs a loss scaler;
/// with [`BF16`](crate::precision::BF16), whose exponent range is FP32's, it does not.
///
/// ```rust
/// # use typed_amp::prelude::*;
/// type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);
/// let dev = Cpu::default();
/// let model = MasterWeights::build::<Mlp>(&dev).unwrap();
/// // The working copy holds the master's values, rounded to FP16:
/// let master = model.master().0.weight.array()[0][0];
/// let working = model.working().0.weight.array()[0][0];
/// assert_eq!(f16::from_f32(master), working);
/// ```
pub struct MasterWeights<M, W, D: AmpDevice, P: LowPrecision = F16> {
    master: M,
    working: WorkingCopy<W>,
    layout: Vec<ParamInfo>,
    has_buffers: bool,
    master_grads: Option<MixedGradients<D>>,
    flags: NonFiniteFlags<D>,
    id: TargetId,
    /// Trained across ranks: stepped only through the data-parallel step.
    data_parallel: bool,
    precision: std::marker::PhantomData<P>,
}

impl<M, W, D, P> MasterWeights<M, W, D, P>
where
    D: AmpDevice,
    M: Parameters<D> + Paired<W, D>,
    W: Parameters<D>,
    P: LowPrecision,
{
    /// Pairs an FP32 master module with a working copy of the same architecture whose 16-bit
    /// parameters are `P`, and sets the working copy to the master's values (rounded to the
    /// working precisions).
    ///
    /// The two are paired by type ([`Paired`]): tuples, `Repeated`, `Residual` and `#[amp]`
    /// structs part by part, and each layer with its working copy. Errors if a layer's pair
    /// differs in any parameter's path, size or trainability, or if a working parameter is
    /// narrower than `P` allows (FP16 in a copy declared BF16).
    pub fn pair(mut master: M, mut working: W, device: &D) -> Result<Self, AmpError> {
        let layout = master.param_summary();
        pair_and_load::<P, M, W, D>(&mut master, &mut working)?;
        let has_buffers = layout.iter().any(|p| !p.trainable);
        Ok(Self {
            master,
            working: WorkingCopy::new(working),
            flags: NonFiniteFlags::new(device, &layout),
            layout,
            has_buffers,
            master_grads: None,
            id: TargetId::fresh(),
            data_parallel: false,
            precision: std::marker::PhantomData,
        })
    }

    /// The FP32 master module.
    pub fn master(&self) -> &M {
        &self.master
    }

    /// The working copy, on which forward and backward run: a [`WorkingCopy`], which runs
    /// `forward` and reads through to the model's fields, but which no optimizer updates (build
    /// optimizers on [`MasterWeights::master`]).
    pub fn working(&self) -> &WorkingCopy<W> {
        &self.working
    }

    /// The working copy, mutably: for training forwards that update buffers (`forward_mut` of
    /// batch norm). Still a [`WorkingCopy`]: no optimizer updates it.
    pub fn working_mut(&mut self) -> &mut WorkingCopy<W> {
        &mut self.working
    }

    /// Zeroed gradients for the working copy's parameters, each in its own precision.
    pub fn alloc_grads(&self) -> Result<MixedGradients<D>, AmpError> {
        TrainTarget::alloc_grads(self)
    }

    /// Splits into the master module and the working copy.
    pub fn into_parts(self) -> (M, W) {
        (self.master, self.working.into_inner())
    }

    /// Bytes held by master and working parameters together.
    pub fn size_in_bytes(&self) -> usize {
        self.layout
            .iter()
            .map(ParamInfo::size_in_bytes)
            .sum::<usize>()
            + self
                .working
                .param_summary()
                .iter()
                .map(ParamInfo::size_in_bytes)
                .sum::<usize>()
    }
}

impl<M, W, D> MasterWeights<M, W, D, F16>
where
    D: AmpDevice,
    M: Parameters<D> + Paired<W, D>,
    W: Parameters<D>,
{
    /// [`MasterWeights::pair`] with an FP16 working copy.
    pub fn from_parts(master: M, working: W, device: &D) -> Result<Self, AmpError> {
        Self::pair(master, working, device)
    }
}

impl<M, D, P> MasterWeights<M, M::To<P::Elem, D>, D, P>
where
    D: AmpDevice + Kernels<P::Elem>,
    P: LowPrecision,
    M: Parameters<D> + TensorCollection<f32, D> + ToDtype<f32, D> + Paired<M::To<P::Elem, D>, D>,
    M::To<P::Elem, D>: Parameters<D>,
{
    /// Wraps an FP32 module as the master of a new working copy in `P`.
    pub fn convert(master: M, device: &D) -> Result<Self, AmpError> {
        let working = master.try_to_dtype::<P::Elem>().map_err(AmpError::device)?;
        Self::pair(master, working, device)
    }
}

impl<M, D> MasterWeights<M, M::To<half::f16, D>, D, F16>
where
    D: AmpDevice,
    M: Parameters<D> + TensorCollection<f32, D> + ToDtype<f32, D> + Paired<M::To<half::f16, D>, D>,
    M::To<half::f16, D>: Parameters<D>,
{
    /// Builds an architecture `A` (a dfdx builder type such as `(Linear<784, 512>, ReLU, ...)`)
    /// with FP32 master weights and an FP16 working copy.
    pub fn build<A>(device: &D) -> Result<Self, AmpError>
    where
        A: BuildOnDevice<D, f32, Built = M>,
        D: DeviceBuildExt,
    {
        let master = device
            .try_build_module::<A, f32>()
            .map_err(AmpError::device)?;
        Self::convert(master, device)
    }

    /// Wraps an FP32 module as the master of a new FP16 working copy.
    pub fn fp16(master: M, device: &D) -> Result<Self, AmpError> {
        Self::convert(master, device)
    }
}

impl<M, W, D: AmpDevice, P: LowPrecision> Sealed for MasterWeights<M, W, D, P> {}

impl<M, W, D, P> TrainTarget<D> for MasterWeights<M, W, D, P>
where
    D: AmpDevice,
    M: Parameters<D> + Paired<W, D>,
    W: Parameters<D>,
    P: LowPrecision,
{
    type Master = M;
    type Working = W;
    type Precision = P;

    fn master(&self) -> &M {
        &self.master
    }

    fn master_mut(&mut self) -> &mut M {
        &mut self.master
    }

    fn working(&self) -> &WorkingCopy<W> {
        &self.working
    }

    fn working_mut(&mut self) -> &mut WorkingCopy<W> {
        &mut self.working
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
        let mut master_grads = match self.master_grads.take() {
            Some(grads) => grads,
            None => MixedGradients::for_params(&self.master)?,
        };
        let (master, working_model) = (&mut self.master, self.working.model_mut());
        let flags = self.flags.record(|stats| {
            let mut unscale = UnscalePairs::new(working, &mut master_grads, inv_scale, stats);
            master.visit_pairs(working_model, &mut unscale)?;
            unscale.finish()
        })?;
        Ok((master_grads, flags))
    }

    fn recycle(
        &mut self,
        master_grads: MixedGradients<D>,
        mut working: MixedGradients<D>,
    ) -> Result<MixedGradients<D>, AmpError> {
        // Unscaling moved every parameter's gradient out: the next backward starts from nothing.
        working.clear_param_grads();
        // The master gradients' FP32 buffers go back to the working gradients, where the next
        // backward's fused ops overwrite them and unscaling moves them in again: one FP32
        // gradient buffer per parameter, not one here and one there.
        let mut master_grads = master_grads;
        self.master.visit_pairs(
            self.working.model_mut(),
            &mut ReturnBuffers(&mut master_grads, &mut working),
        )?;
        self.master_grads = Some(master_grads);
        Ok(working)
    }

    fn update_with<O: MasterOptimizer<M, D>>(
        &mut self,
        optimizer: &mut O,
        grads: &MixedGradients<D>,
    ) -> Result<(), AmpError> {
        optimizer.try_update_paired(&mut self.master, self.working.model_mut(), grads)
    }

    fn mark_data_parallel(&mut self) {
        self.data_parallel = true;
    }

    fn is_data_parallel(&self) -> bool {
        self.data_parallel
    }

    fn refresh(&mut self) -> Result<(), AmpError> {
        refresh_pair(&mut self.master, self.working.model_mut())
    }

    fn sync_buffers_to_master(&mut self) -> Result<(), AmpError> {
        if self.has_buffers {
            buffers_to_master(&mut self.master, self.working.model_mut())?;
        }
        Ok(())
    }

    fn reload_working(&mut self) -> Result<(), AmpError> {
        all_to_working(&mut self.master, self.working.model_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dfdx::nn::builders::{BatchNorm1D, Linear};
    use dfdx::prelude::*;
    use half::f16;

    #[test]
    fn pairing_rejects_a_different_architecture() {
        let dev = Cpu::default();
        let master = dev.build_module::<(Linear<3, 4>, Linear<4, 2>), f32>();
        let working = dev.build_module::<(Linear<3, 4>, Linear<4, 3>), f16>();
        let err = MasterWeights::from_parts(master, working, &dev)
            .err()
            .unwrap();
        assert!(
            matches!(&err, AmpError::ParamMismatch { path, .. } if path == "1.weight"),
            "{err}"
        );
    }

    #[test]
    fn refresh_copies_weights_down_and_buffers_up() {
        let dev = Cpu::default();
        type Net = (Linear<3, 4>, BatchNorm1D<4>);
        let master = dev.build_module::<Net, f32>();
        let working = (
            dev.build_module::<Linear<3, 4>, f16>(),
            dev.build_module::<BatchNorm1D<4>, f32>(),
        );
        let mut model = MasterWeights::from_parts(master, working, &dev).unwrap();
        model.master.0.weight = model.master.0.weight.clone() + 1.0;
        model.working.model_mut().1.running_mean = dev.tensor([1.0, 2.0, 3.0, 4.0]);
        model.refresh().unwrap();
        let expected = model
            .master
            .0
            .weight
            .array()
            .map(|row| row.map(f16::from_f32));
        assert_eq!(model.working.0.weight.array(), expected);
        assert_eq!(model.master.1.running_mean.array(), [1.0, 2.0, 3.0, 4.0]);
    }
}
