//! What an optimizer trains: FP32 master weights with a low-precision working copy
//! ([`MasterWeights`]), a plain FP32 model ([`Fp32Weights`]), or, for O3 only, a plain FP16
//! model ([`Fp16Weights`]).
//!
//! Forward and backward run on the working copy; unscaled gradients are written into gradients
//! of the FP32 master; the optimizer updates the master; the working copy is refreshed from it in
//! place. Parameters are paired by walking both models with [`Parameters`] (same architecture,
//! same order, same names), checked once at construction.

use dfdx::nn::{BuildOnDevice, DeviceBuildExt, TensorCollection, ToDtype, ZeroGrads};
use dfdx::prelude::{Device, Gradients, Shape, Tensor};
use half::f16;

use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::params::{ParamInfo, ParamVisitor, ParamVisitorMut, Parameters};
use crate::precision::{AmpElem, AnyBuf, AnyBufMut, AnyGrads};
use crate::tape::MixedGradients;

/// Something the typed training step can train: it holds the FP32 master module the optimizer
/// updates, turns the working gradients into master gradients, and refreshes its working copy
/// after an update.
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no FP32 master weights for an optimizer to update",
    label = "not a `MasterWeights` or `Fp32Weights`",
    note = "optimizers update FP32 master weights only: wrap an FP16 model as `MasterWeights::build::<Arch>(&dev)` (or `MasterWeights::from_parts`), and an FP32 model as `Fp32Weights::new(model)`"
)]
pub trait TrainTarget<D: AmpDevice> {
    /// The module the optimizer updates: FP32, except for O3's [`Fp16Weights`].
    type Master: Parameters<D>;

    /// The module forward and backward run on.
    type Working: Parameters<D>;

    /// The FP32 master module.
    fn master(&self) -> &Self::Master;

    /// The FP32 master module, mutably (for the optimizer).
    fn master_mut(&mut self) -> &mut Self::Master;

    /// The working module.
    fn working(&self) -> &Self::Working;

    /// The working module, mutably: for training forwards that update buffers (`forward_mut`
    /// of batch norm).
    fn working_mut(&mut self) -> &mut Self::Working;

    /// Zeroed gradients for the working module's parameters, each in its own precision.
    fn alloc_grads(&self) -> Result<MixedGradients<D>, AmpError> {
        MixedGradients::for_params(self.working())
    }

    /// Every parameter of the master module, in visiting order.
    fn layout(&self) -> &[ParamInfo];

    /// Writes `working / scale` into master gradients, flagging non-finite values per parameter
    /// when `check` is set. Returns the master gradients and, per trainable parameter in
    /// [`TrainTarget::layout`] order, whether it held inf or NaN.
    fn unscale_into_master(
        &mut self,
        working: &mut MixedGradients<D>,
        inv_scale: f32,
        check: bool,
    ) -> Result<(AnyGrads<D>, Vec<bool>), AmpError>;

    /// Takes back master gradients after a step, and zeroes the working gradients for the next
    /// iteration.
    fn recycle(
        &mut self,
        master_grads: AnyGrads<D>,
        working: MixedGradients<D>,
    ) -> Result<MixedGradients<D>, AmpError>;

    /// Copies the updated master weights into the working copy (and the working copy's buffers,
    /// such as batch norm running statistics, back into the master).
    fn refresh(&mut self) -> Result<(), AmpError>;

    /// Copies the working copy's buffers (batch norm running statistics, updated by training
    /// forwards) into the master, so that the master is complete, e.g. before a checkpoint.
    fn sync_buffers_to_master(&mut self) -> Result<(), AmpError>;

    /// Sets the whole working copy, buffers included, from the master, e.g. after the master
    /// was loaded from a checkpoint.
    fn reload_working(&mut self) -> Result<(), AmpError>;
}

/// Cheap clones (shared buffers) of every parameter of a model, in visiting order, with their
/// trainability. Shapes differ from parameter to parameter, so each is boxed; the visitor that
/// consumes them knows the shape and precision it expects.
struct CollectParams {
    params: Vec<(Box<dyn std::any::Any>, bool)>,
}

impl<D: AmpDevice> ParamVisitor<D> for CollectParams {
    type Error = std::convert::Infallible;
    fn visit<S: Shape, E: AmpElem>(
        &mut self,
        _path: &str,
        param: &Tensor<S, E, D>,
        trainable: bool,
    ) -> Result<(), Self::Error>
    where
        D: Device<E>,
    {
        self.params.push((Box::new(param.clone()), trainable));
        Ok(())
    }
}

fn collect_params<D: AmpDevice, M: Parameters<D>>(
    module: &M,
) -> Vec<(Box<dyn std::any::Any>, bool)> {
    let mut collect = CollectParams { params: Vec::new() };
    match module.visit_params(&mut collect) {
        Ok(()) => collect.params,
        Err(never) => match never {},
    }
}

/// The buffer of a collected parameter of shape `S`, whichever its precision.
fn collected_buf<S: Shape, D: AmpDevice>(param: &dyn std::any::Any) -> Option<AnyBuf<'_, D>> {
    if let Some(t) = param.downcast_ref::<Tensor<S, f32, D>>() {
        Some(AnyBuf::F32(t.storage()))
    } else {
        param
            .downcast_ref::<Tensor<S, f16, D>>()
            .map(|t| AnyBuf::F16(t.storage()))
    }
}

/// Which parameters a copy between two models touches.
#[derive(Clone, Copy, PartialEq)]
enum CopyWhich {
    Trainable,
    Buffers,
    All,
}

/// Copies parameters collected from a source model (in visiting order) into the visited ones,
/// converting precision in place.
struct CopyInto<'s> {
    src: &'s [(Box<dyn std::any::Any>, bool)],
    index: usize,
    which: CopyWhich,
}

impl<D: AmpDevice> ParamVisitorMut<D> for CopyInto<'_> {
    type Error = AmpError;
    fn visit_mut<S: Shape, E: AmpElem>(
        &mut self,
        path: &str,
        param: &mut Tensor<S, E, D>,
        trainable: bool,
    ) -> Result<(), AmpError>
    where
        D: Device<E>,
    {
        let (src, _) = &self.src[self.index];
        self.index += 1;
        let copy = match self.which {
            CopyWhich::Trainable => trainable,
            CopyWhich::Buffers => !trainable,
            CopyWhich::All => true,
        };
        if copy {
            let src =
                collected_buf::<S, D>(src.as_ref()).ok_or_else(|| AmpError::ParamMismatch {
                    path: path.to_string(),
                    detail: "the two models store this parameter in different shapes".to_string(),
                })?;
            let dev = param.device().clone();
            dev.try_copy_cast(src, E::erase_mut::<D>(param.storage_mut()))
                .map_err(AmpError::device)?;
        }
        Ok(())
    }
}

fn copy_params<D: AmpDevice, S: Parameters<D>, T: Parameters<D>>(
    src: &S,
    dst: &mut T,
    which: CopyWhich,
) -> Result<(), AmpError> {
    let params = collect_params(src);
    let mut copy = CopyInto {
        src: &params,
        index: 0,
        which,
    };
    dst.visit_params_mut(&mut copy)
}

/// Checks that two models have the same parameters (path, element count, trainability).
fn check_pairing(master: &[ParamInfo], working: &[ParamInfo]) -> Result<(), AmpError> {
    for (m, w) in master.iter().zip(working) {
        let detail = if m.path != w.path {
            Some(format!("the working copy has `{}` here", w.path))
        } else if m.numel != w.numel {
            Some(format!(
                "{} elements in the master, {} in the working copy",
                m.numel, w.numel
            ))
        } else if m.trainable != w.trainable {
            Some("trainable in one model, a buffer in the other".to_string())
        } else if m.dtype != crate::precision::DType::F32 {
            Some(format!(
                "master parameters are F32, this one is {}",
                m.dtype
            ))
        } else {
            None
        };
        if let Some(detail) = detail {
            return Err(AmpError::ParamMismatch {
                path: m.path.clone(),
                detail,
            });
        }
    }
    if master.len() != working.len() {
        let (longer, which) = if master.len() > working.len() {
            (&master[working.len()], "master")
        } else {
            (&working[master.len()], "working copy")
        };
        return Err(AmpError::ParamMismatch {
            path: longer.path.clone(),
            detail: format!("only the {which} has this parameter"),
        });
    }
    Ok(())
}

/// Collects, per trainable parameter of a working model, its gradient buffer (if any).
struct CollectGrads<'a, D: AmpDevice> {
    grads: &'a MixedGradients<D>,
    out: Vec<Option<AnyBuf<'a, D>>>,
}

impl<'a, D: AmpDevice> ParamVisitor<D> for CollectGrads<'a, D> {
    type Error = std::convert::Infallible;
    fn visit<S: Shape, E: AmpElem>(
        &mut self,
        _path: &str,
        param: &Tensor<S, E, D>,
        trainable: bool,
    ) -> Result<(), Self::Error>
    where
        D: Device<E>,
    {
        if trainable {
            let grad = E::grads(self.grads).get_ref_checked(param);
            self.out.push(grad.map(|g| E::erase::<D>(g)));
        }
        Ok(())
    }
}

/// Visits the gradient buffer in `grads` of every trainable parameter of `module` (allocating
/// any that is missing), in model order, with its slot (its index among trainable parameters).
/// Returns the device, if there was a parameter.
pub(crate) fn for_each_trainable_grad<D: AmpDevice, M: Parameters<D>>(
    module: &M,
    grads: &mut AnyGrads<D>,
    f: impl FnMut(&D, usize, AnyBufMut<'_, D>) -> Result<(), D::Err>,
) -> Result<Option<D>, AmpError> {
    struct Visit<'g, D: AmpDevice, F> {
        grads: &'g mut AnyGrads<D>,
        f: F,
        slot: usize,
        device: Option<D>,
    }
    impl<D, F> ParamVisitor<D> for Visit<'_, D, F>
    where
        D: AmpDevice,
        F: FnMut(&D, usize, AnyBufMut<'_, D>) -> Result<(), D::Err>,
    {
        type Error = AmpError;
        fn visit<S: Shape, E: AmpElem>(
            &mut self,
            path: &str,
            param: &Tensor<S, E, D>,
            trainable: bool,
        ) -> Result<(), AmpError>
        where
            D: Device<E>,
        {
            if !trainable {
                return Ok(());
            }
            let slot = self.slot;
            self.slot += 1;
            let grad = self
                .grads
                .of_mut::<E>(path)?
                .get_or_alloc_mut(param)
                .map_err(AmpError::device)?;
            let dev = param.device();
            (self.f)(dev, slot, E::erase_mut::<D>(grad)).map_err(AmpError::device)?;
            if self.device.is_none() {
                self.device = Some(dev.clone());
            }
            Ok(())
        }
    }
    let mut visit = Visit {
        grads,
        f,
        slot: 0,
        device: None,
    };
    module.visit_params(&mut visit)?;
    Ok(visit.device)
}

/// The per-parameter non-finite flags of an unscale, kept on the device between steps.
struct NonFiniteFlags<D: AmpDevice> {
    device: D,
    slots: usize,
    stats: Option<D::Stats>,
}

impl<D: AmpDevice> NonFiniteFlags<D> {
    fn new(device: &D, layout: &[ParamInfo]) -> Self {
        Self {
            device: device.clone(),
            slots: layout.iter().filter(|p| p.trainable).count(),
            stats: None,
        }
    }

    /// Runs `unscale` with the flag buffer, then reads the flags back (once) if `check`.
    fn record(
        &mut self,
        check: bool,
        unscale: impl FnOnce(&mut D::Stats) -> Result<(), AmpError>,
    ) -> Result<Vec<bool>, AmpError> {
        let mut stats = match self.stats.take() {
            Some(stats) => stats,
            None => self
                .device
                .try_alloc_stats(self.slots)
                .map_err(AmpError::device)?,
        };
        let unscaled = unscale(&mut stats);
        let flags = match unscaled {
            Ok(()) if check => self
                .device
                .try_read_stats(&stats)
                .map_err(AmpError::device)
                .map(|values| values.into_iter().map(|flag| flag != 0.0).collect()),
            Ok(()) => Ok(vec![false; self.slots]),
            Err(e) => Err(e),
        };
        self.stats = Some(stats);
        flags
    }
}

/// An FP32 master module `M` and its working copy `W`, whose parameters may be FP16 or FP32
/// (FP16 linear layers with FP32 batch norm, say).
///
/// ```rust
/// # use typed_amp::prelude::*;
/// type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);
/// let dev = Cpu::default();
/// let model = MasterWeights::<_, _, Cpu>::build::<Mlp>(&dev).unwrap();
/// // The working copy holds the master's values, rounded to FP16:
/// let master = model.master().0.weight.array()[0][0];
/// let working = model.working().0.weight.array()[0][0];
/// assert_eq!(f16::from_f32(master), working);
/// ```
pub struct MasterWeights<M, W, D: AmpDevice> {
    master: M,
    working: W,
    layout: Vec<ParamInfo>,
    has_buffers: bool,
    master_grads: Option<Gradients<f32, D>>,
    flags: NonFiniteFlags<D>,
}

impl<M, W, D> MasterWeights<M, W, D>
where
    D: AmpDevice,
    M: Parameters<D> + TensorCollection<f32, D>,
    W: Parameters<D>,
{
    /// Pairs an FP32 master module with a working copy of the same architecture, and sets the
    /// working copy to the master's values (rounded to the working precision).
    ///
    /// Errors if the two differ in any parameter's path, size or trainability, or if the master
    /// is not entirely FP32.
    pub fn from_parts(master: M, mut working: W, device: &D) -> Result<Self, AmpError> {
        let layout = master.param_summary();
        check_pairing(&layout, &working.param_summary())?;
        copy_params(&master, &mut working, CopyWhich::All)?;
        let has_buffers = layout.iter().any(|p| !p.trainable);
        Ok(Self {
            master,
            working,
            flags: NonFiniteFlags::new(device, &layout),
            layout,
            has_buffers,
            master_grads: None,
        })
    }

    /// The FP32 master module.
    pub fn master(&self) -> &M {
        &self.master
    }

    /// The working copy, on which forward and backward run.
    pub fn working(&self) -> &W {
        &self.working
    }

    /// The working copy, mutably: for training forwards that update buffers (`forward_mut` of
    /// batch norm).
    pub fn working_mut(&mut self) -> &mut W {
        &mut self.working
    }

    /// Zeroed gradients for the working copy's parameters, each in its own precision.
    pub fn alloc_grads(&self) -> Result<MixedGradients<D>, AmpError> {
        MixedGradients::for_params(&self.working)
    }

    /// Splits into the master module and the working copy.
    pub fn into_parts(self) -> (M, W) {
        (self.master, self.working)
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

impl<M, D> MasterWeights<M, M::To<f16, D>, D>
where
    D: AmpDevice,
    M: Parameters<D> + TensorCollection<f32, D> + ToDtype<f32, D>,
    M::To<f16, D>: Parameters<D>,
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
        Self::fp16(master, device)
    }

    /// Wraps an FP32 module as the master of a new FP16 working copy.
    pub fn fp16(master: M, device: &D) -> Result<Self, AmpError> {
        let working = master.try_to_dtype::<f16>().map_err(AmpError::device)?;
        Self::from_parts(master, working, device)
    }
}

impl<M, W, D> TrainTarget<D> for MasterWeights<M, W, D>
where
    D: AmpDevice,
    M: Parameters<D> + TensorCollection<f32, D>,
    W: Parameters<D>,
{
    type Master = M;
    type Working = W;

    fn master(&self) -> &M {
        &self.master
    }

    fn master_mut(&mut self) -> &mut M {
        &mut self.master
    }

    fn working(&self) -> &W {
        &self.working
    }

    fn working_mut(&mut self) -> &mut W {
        &mut self.working
    }

    fn layout(&self) -> &[ParamInfo] {
        &self.layout
    }

    fn unscale_into_master(
        &mut self,
        working: &mut MixedGradients<D>,
        inv_scale: f32,
        check: bool,
    ) -> Result<(AnyGrads<D>, Vec<bool>), AmpError> {
        let mut master_grads = AnyGrads::F32(match self.master_grads.take() {
            Some(grads) => grads,
            None => self.master.try_alloc_grads().map_err(AmpError::device)?,
        });
        let mut collect = CollectGrads {
            grads: working,
            out: Vec::with_capacity(self.layout.len()),
        };
        match self.working.visit_params(&mut collect) {
            Ok(()) => {}
            Err(never) => match never {},
        }
        let working = &collect.out;
        let master = &self.master;
        let flags = self.flags.record(check, |stats| {
            for_each_trainable_grad(master, &mut master_grads, |dev, slot, mut dst| {
                match &working[slot] {
                    Some(src) => dev.try_unscale(src.reborrow(), dst, inv_scale, stats, slot),
                    // A parameter the loss did not reach gets a zero gradient, as dfdx gives it,
                    // and its flag is written too: the flag buffer is reused across steps.
                    None => {
                        dev.try_fill(dst.reborrow(), 0.0)?;
                        dev.try_unscale_in_place(dst, 1.0, stats, slot)
                    }
                }
            })
            .map(drop)
        })?;
        Ok((master_grads, flags))
    }

    fn recycle(
        &mut self,
        master_grads: AnyGrads<D>,
        mut working: MixedGradients<D>,
    ) -> Result<MixedGradients<D>, AmpError> {
        if let AnyGrads::F32(grads) = master_grads {
            self.master_grads = Some(grads);
        }
        working.zero_params(&self.working)?;
        Ok(working)
    }

    fn refresh(&mut self) -> Result<(), AmpError> {
        copy_params(&self.master, &mut self.working, CopyWhich::Trainable)?;
        self.sync_buffers_to_master()
    }

    fn sync_buffers_to_master(&mut self) -> Result<(), AmpError> {
        if self.has_buffers {
            copy_params(&self.working, &mut self.master, CopyWhich::Buffers)?;
        }
        Ok(())
    }

    fn reload_working(&mut self) -> Result<(), AmpError> {
        copy_params(&self.master, &mut self.working, CopyWhich::All)
    }
}

/// A model trained in a single precision, with no separate master copy: the module is its own
/// master and its gradients are unscaled in place. Use the aliases [`Fp32Weights`] (O0) and
/// [`Fp16Weights`] (O3).
pub struct SinglePrecision<M, E, D: AmpDevice> {
    module: M,
    layout: Vec<ParamInfo>,
    flags: NonFiniteFlags<D>,
    elem: std::marker::PhantomData<E>,
}

/// A plain FP32 model (O0): the module is its own master.
///
/// ```rust
/// # use typed_amp::prelude::*;
/// let dev = Cpu::default();
/// let model = Fp32Weights::new(dev.build_module::<Linear<4, 2>, f32>(), &dev);
/// assert_eq!(model.working().weight.shape(), &(Const::<2>, Const::<4>));
/// ```
pub type Fp32Weights<M, D> = SinglePrecision<M, f32, D>;

/// A plain FP16 model with no FP32 master weights (Apex's O3).
///
/// This breaks the rule that optimizers update only FP32 weights: small updates round away in
/// FP16. An optimizer over it must be wrapped in [`Fp16Updates`](crate::optim::Fp16Updates) to
/// say so explicitly.
pub type Fp16Weights<M, D> = SinglePrecision<M, f16, D>;

impl<M, E, D> SinglePrecision<M, E, D>
where
    E: AmpElem,
    D: AmpDevice + Device<E>,
    M: Parameters<D>,
{
    /// Wraps a module whose parameters are all of precision `E`.
    pub fn new(module: M, device: &D) -> Self {
        let layout = module.param_summary();
        Self {
            module,
            flags: NonFiniteFlags::new(device, &layout),
            layout,
            elem: std::marker::PhantomData,
        }
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

    /// The module (forward and backward run on it).
    pub fn working(&self) -> &M {
        &self.module
    }

    /// The module, mutably: for training forwards that update buffers.
    pub fn working_mut(&mut self) -> &mut M {
        &mut self.module
    }

    /// The module, which is its own master.
    pub fn master(&self) -> &M {
        &self.module
    }

    /// Zeroed gradients for the module's parameters.
    pub fn alloc_grads(&self) -> Result<MixedGradients<D>, AmpError> {
        MixedGradients::for_params(&self.module)
    }

    /// Unwraps the module.
    pub fn into_inner(self) -> M {
        self.module
    }

    /// Bytes held by the parameters.
    pub fn size_in_bytes(&self) -> usize {
        self.layout.iter().map(ParamInfo::size_in_bytes).sum()
    }
}

impl<M, E, D> TrainTarget<D> for SinglePrecision<M, E, D>
where
    E: AmpElem,
    D: AmpDevice + Device<E>,
    M: Parameters<D>,
{
    type Master = M;
    type Working = M;

    fn master(&self) -> &M {
        &self.module
    }

    fn master_mut(&mut self) -> &mut M {
        &mut self.module
    }

    fn working(&self) -> &M {
        &self.module
    }

    fn working_mut(&mut self) -> &mut M {
        &mut self.module
    }

    fn layout(&self) -> &[ParamInfo] {
        &self.layout
    }

    fn unscale_into_master(
        &mut self,
        working: &mut MixedGradients<D>,
        inv_scale: f32,
        check: bool,
    ) -> Result<(AnyGrads<D>, Vec<bool>), AmpError> {
        let grads = std::mem::replace(E::grads_mut(working), Gradients::leaky());
        let mut grads = E::into_any_grads(grads);
        if !check && inv_scale == 1.0 {
            // Scaling disabled: the gradients already are the master gradients.
            return Ok((grads, vec![false; self.flags.slots]));
        }
        let module = &self.module;
        let flags = self.flags.record(check, |stats| {
            for_each_trainable_grad(module, &mut grads, |dev, slot, grad| {
                dev.try_unscale_in_place(grad, inv_scale, stats, slot)
            })
            .map(drop)
        })?;
        Ok((grads, flags))
    }

    fn recycle(
        &mut self,
        master_grads: AnyGrads<D>,
        mut working: MixedGradients<D>,
    ) -> Result<MixedGradients<D>, AmpError> {
        let mut master_grads = master_grads;
        let grads = master_grads.of_mut::<E>("")?;
        std::mem::swap(E::grads_mut(&mut working), grads);
        working.zero_params(&self.module)?;
        Ok(working)
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

#[cfg(test)]
mod tests {
    use super::*;
    use dfdx::nn::builders::{BatchNorm1D, Linear};
    use dfdx::prelude::*;

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
    fn pairing_rejects_an_fp16_master() {
        let dev = Cpu::default();
        let master = dev.build_module::<Linear<3, 4>, f16>();
        let working = dev.build_module::<Linear<3, 4>, f16>();
        // An FP16 "master" is not even a `TensorCollection<f32>`: this does not compile.
        // Mixed masters (FP32 tuple with an FP16 element) compile and are refused here.
        let master = (dev.build_module::<Linear<2, 3>, f32>(), master);
        let working = (dev.build_module::<Linear<2, 3>, f16>(), working);
        let err = check_pairing(
            &Parameters::<Cpu>::param_summary(&master),
            &Parameters::<Cpu>::param_summary(&working),
        )
        .err()
        .unwrap();
        assert!(
            err.to_string().contains("master parameters are F32"),
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
        model.working.1.running_mean = dev.tensor([1.0, 2.0, 3.0, 4.0]);
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
