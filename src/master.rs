//! What an optimizer trains: FP32 master weights with a 16-bit working copy
//! ([`MasterWeights`]), a plain FP32 model ([`Fp32Weights`]), or, for O3 only, a plain 16-bit
//! model ([`Fp16Weights`]).
//!
//! Forward and backward run on the working copy; unscaled gradients are written into gradients
//! of the FP32 master; the optimizer updates the master; the working copy is refreshed from it in
//! place. Parameters are paired by walking both models with [`Parameters`] (same architecture,
//! same order, same names), checked once at construction.

use std::any::Any;

use dfdx::nn::{BuildOnDevice, DeviceBuildExt, TensorCollection, ToDtype};
use dfdx::prelude::{Shape, Storage, Tensor};

use crate::device::{AmpDevice, Kernels, StatsDevice};
use crate::error::AmpError;
use crate::ops::cast::CastKernel;
use crate::ops::unscale::UnscaleKernel;
use crate::params::{ParamInfo, ParamVisitor, ParamVisitorMut, Parameters};
use crate::precision::{dtype_of, AmpElem, DType, LowPrecision, Precision, F16};
use crate::tape::{MixedGradients, TargetId};

/// Something the typed training step can train: it holds the master module the optimizer
/// updates (FP32, except for O3), turns the working gradients into master gradients, and
/// refreshes its working copy after an update.
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no FP32 master weights for an optimizer to update",
    label = "not a `MasterWeights` or `Fp32Weights`",
    note = "optimizers update FP32 master weights only: wrap a 16-bit model as `MasterWeights::build::<Arch>(&dev)` (or `MasterWeights::from_parts`), and an FP32 model as `Fp32Weights::new(model, &dev)`"
)]
pub trait TrainTarget<D: AmpDevice> {
    /// The module the optimizer updates: FP32, except for O3's 16-bit models ([`Fp16Weights`]).
    type Master: Parameters<D>;

    /// The module forward and backward run on.
    type Working: Parameters<D>;

    /// The narrowest precision of the working copy's parameters: [`F16`] needs a loss scaler,
    /// [`BF16`](crate::BF16) and [`F32`](crate::F32) do not (rule
    /// [`FullRange`](crate::FullRange)).
    type Precision: Precision;

    /// The master module.
    fn master(&self) -> &Self::Master;

    /// The master module, mutably (for the optimizer).
    fn master_mut(&mut self) -> &mut Self::Master;

    /// The working module.
    fn working(&self) -> &Self::Working;

    /// The working module, mutably: for training forwards that update buffers (`forward_mut`
    /// of batch norm).
    fn working_mut(&mut self) -> &mut Self::Working;

    /// This target's identity: the gradients it allocates carry it, and unscaling gradients of
    /// another target is refused.
    fn id(&self) -> TargetId;

    /// Zeroed gradients for the working module's parameters, each in its own precision, marked
    /// as this target's.
    fn alloc_grads(&self) -> Result<MixedGradients<D>, AmpError> {
        let mut grads = MixedGradients::for_params(self.working())?;
        grads.owner = Some(self.id());
        Ok(grads)
    }

    /// Every parameter of the master module, in visiting order.
    fn layout(&self) -> &[ParamInfo];

    /// Writes `working / scale` into master gradients and flags non-finite values per
    /// parameter. Returns the master gradients and, per trainable parameter in
    /// [`TrainTarget::layout`] order, whether it held inf or NaN (before or after the
    /// division).
    #[doc(hidden)]
    fn unscale_into_master(
        &mut self,
        working: &mut MixedGradients<D>,
        inv_scale: f32,
    ) -> Result<(MixedGradients<D>, Vec<bool>), AmpError>;

    /// Takes back master gradients after a step, and zeroes the working gradients for the next
    /// iteration.
    #[doc(hidden)]
    fn recycle(
        &mut self,
        master_grads: MixedGradients<D>,
        working: MixedGradients<D>,
    ) -> Result<MixedGradients<D>, AmpError>;

    /// Copies the updated master weights into the working copy (and the working copy's buffers,
    /// such as batch norm running statistics, back into the master).
    fn refresh(&mut self) -> Result<(), AmpError>;

    /// Copies the working copy's buffers (batch norm running statistics, updated by training
    /// forwards) into the master, so that the master is complete, e.g. before a checkpoint.
    fn sync_buffers_to_master(&mut self) -> Result<(), AmpError>;

    /// Sets the whole working copy, buffers included, from the master: after the master was
    /// loaded from a checkpoint, and after a skipped step, when the master still holds the
    /// working copy as of the last step taken. So a batch whose gradients were inf or NaN leaves
    /// no trace in batch norm's running statistics (PyTorch keeps it), and a non-finite value
    /// written into a working weight between steps costs one skipped step instead of every
    /// later one. A model that is its own master ([`SinglePrecision`]) has no earlier copy.
    fn reload_working(&mut self) -> Result<(), AmpError>;
}

/// Views a buffer of element type `E` as one of `F`, mutably: `Some` exactly when they are the
/// same type.
pub(crate) fn same_buf_mut<E: AmpElem, F: AmpElem, D: Storage<E> + Storage<F>>(
    buf: &mut <D as Storage<E>>::Vec,
) -> Option<&mut <D as Storage<F>>::Vec> {
    (buf as &mut dyn Any).downcast_mut()
}

/// A parameter collected from one model, to be copied into the matching parameter of another.
trait CollectedParam<D: AmpDevice> {
    /// The parameter itself, for a consumer that knows its shape and precision.
    fn as_any(&self) -> &dyn Any;
    /// `dst = convert(self)` for an FP32 destination.
    fn copy_into_f32(&self, dev: &D, dst: &mut <D as Storage<f32>>::Vec) -> Result<(), D::Err>;
}

impl<S: Shape, E: AmpElem, D: AmpDevice + Kernels<E>> CollectedParam<D> for Tensor<S, E, D> {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn copy_into_f32(&self, dev: &D, dst: &mut <D as Storage<f32>>::Vec) -> Result<(), D::Err> {
        CastKernel::<E, f32>::try_copy_cast(dev, self.storage(), dst)
    }
}

/// Cheap clones (shared buffers) of every parameter of a model, in visiting order, with their
/// trainability.
struct CollectParams<D: AmpDevice> {
    params: Vec<(Box<dyn CollectedParam<D>>, bool)>,
}

impl<D: AmpDevice> ParamVisitor<D> for CollectParams<D> {
    type Error = std::convert::Infallible;
    fn visit<S: Shape, E: AmpElem>(
        &mut self,
        _path: &str,
        param: &Tensor<S, E, D>,
        trainable: bool,
    ) -> Result<(), Self::Error>
    where
        D: Kernels<E>,
    {
        self.params.push((Box::new(param.clone()), trainable));
        Ok(())
    }
}

fn collect_params<D: AmpDevice, M: Parameters<D>>(
    module: &M,
) -> Vec<(Box<dyn CollectedParam<D>>, bool)> {
    let mut collect = CollectParams { params: Vec::new() };
    match module.visit_params(&mut collect) {
        Ok(()) => collect.params,
        Err(never) => match never {},
    }
}

/// Which parameters a copy between two models touches.
#[derive(Clone, Copy, PartialEq)]
enum CopyWhich {
    Trainable,
    Buffers,
    All,
}

impl CopyWhich {
    fn includes(self, trainable: bool) -> bool {
        match self {
            CopyWhich::Trainable => trainable,
            CopyWhich::Buffers => !trainable,
            CopyWhich::All => true,
        }
    }
}

/// Copies an FP32 model's parameters (collected in visiting order) into the visited ones,
/// converting to each one's precision in place.
struct CopyFromF32<'s, D: AmpDevice> {
    src: &'s [(Box<dyn CollectedParam<D>>, bool)],
    index: usize,
    which: CopyWhich,
}

impl<D: AmpDevice> ParamVisitorMut<D> for CopyFromF32<'_, D> {
    type Error = AmpError;
    fn visit_mut<S: Shape, E: AmpElem>(
        &mut self,
        path: &str,
        param: &mut Tensor<S, E, D>,
        trainable: bool,
    ) -> Result<(), AmpError>
    where
        D: Kernels<E>,
    {
        let (src, _) = &self.src[self.index];
        self.index += 1;
        if self.which.includes(trainable) {
            let src = src
                .as_any()
                .downcast_ref::<Tensor<S, f32, D>>()
                .ok_or_else(|| AmpError::ParamMismatch {
                    path: path.to_string(),
                    detail: "the two models store this parameter in different shapes".to_string(),
                })?;
            let dev = param.device().clone();
            CastKernel::<f32, E>::try_copy_cast(&dev, src.storage(), param.storage_mut())
                .map_err(AmpError::device)?;
        }
        Ok(())
    }
}

/// Copies a model's parameters (collected in visiting order) into the visited FP32 ones.
struct CopyIntoF32<'s, D: AmpDevice> {
    src: &'s [(Box<dyn CollectedParam<D>>, bool)],
    index: usize,
    which: CopyWhich,
}

impl<D: AmpDevice> ParamVisitorMut<D> for CopyIntoF32<'_, D> {
    type Error = AmpError;
    fn visit_mut<S: Shape, E: AmpElem>(
        &mut self,
        path: &str,
        param: &mut Tensor<S, E, D>,
        trainable: bool,
    ) -> Result<(), AmpError>
    where
        D: Kernels<E>,
    {
        let (src, _) = &self.src[self.index];
        self.index += 1;
        if self.which.includes(trainable) {
            let dev = param.device().clone();
            let dst = same_buf_mut::<E, f32, D>(param.storage_mut()).ok_or_else(|| {
                AmpError::ParamMismatch {
                    path: path.to_string(),
                    detail: format!("master parameters are F32, this one is {}", dtype_of::<E>()),
                }
            })?;
            src.copy_into_f32(&dev, dst).map_err(AmpError::device)?;
        }
        Ok(())
    }
}

/// `master → working` (the master is FP32).
fn copy_from_master<D: AmpDevice, M: Parameters<D>, W: Parameters<D>>(
    master: &M,
    working: &mut W,
    which: CopyWhich,
) -> Result<(), AmpError> {
    let params = collect_params(master);
    working.visit_params_mut(&mut CopyFromF32 {
        src: &params,
        index: 0,
        which,
    })
}

/// `working → master` (the master is FP32).
fn copy_into_master<D: AmpDevice, W: Parameters<D>, M: Parameters<D>>(
    working: &W,
    master: &mut M,
    which: CopyWhich,
) -> Result<(), AmpError> {
    let params = collect_params(working);
    master.visit_params_mut(&mut CopyIntoF32 {
        src: &params,
        index: 0,
        which,
    })
}

/// Checks that two models have the same parameters (path, element count, trainability), that
/// the master is FP32, and that no working parameter is narrower than the declared working
/// precision `P` (an FP16 parameter in a model declared BF16 would step without a loss scale).
fn check_pairing<P: Precision>(
    master: &[ParamInfo],
    working: &[ParamInfo],
) -> Result<(), AmpError> {
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
        } else if m.dtype != DType::F32 {
            Some(format!(
                "master parameters are F32, this one is {}",
                m.dtype
            ))
        } else if P::DTYPE.has_full_range() && !w.dtype.has_full_range() {
            Some(format!(
                "the working copy is declared {} but holds this parameter in {}, which needs a loss scaler: declare the working precision {}",
                P::DTYPE,
                w.dtype,
                w.dtype
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

/// The per-parameter non-finite flags of an unscale, kept on the device between steps.
struct NonFiniteFlags<D: AmpDevice> {
    device: D,
    slots: usize,
    stats: Option<<D as StatsDevice>::Stats>,
}

impl<D: AmpDevice> NonFiniteFlags<D> {
    fn new(device: &D, layout: &[ParamInfo]) -> Self {
        Self {
            device: device.clone(),
            slots: layout.iter().filter(|p| p.trainable).count(),
            stats: None,
        }
    }

    /// Runs `unscale` with the flag buffer, then reads the flags back (once).
    fn record(
        &mut self,
        unscale: impl FnOnce(&mut <D as StatsDevice>::Stats) -> Result<(), AmpError>,
    ) -> Result<Vec<bool>, AmpError> {
        let mut stats = match self.stats.take() {
            Some(stats) => stats,
            None => self
                .device
                .try_alloc_stats(self.slots)
                .map_err(AmpError::device)?,
        };
        let flags = unscale(&mut stats).and_then(|()| {
            self.device
                .try_read_stats(&stats)
                .map_err(AmpError::device)
                .map(|values| values.into_iter().map(|flag| flag != 0.0).collect())
        });
        self.stats = Some(stats);
        flags
    }
}

/// A working parameter's gradient, to be unscaled into the FP32 master gradient.
trait WorkingGrad<D: AmpDevice> {
    fn unscale_into(
        &self,
        dev: &D,
        dst: &mut <D as Storage<f32>>::Vec,
        inv_scale: f32,
        stats: &mut <D as StatsDevice>::Stats,
        slot: usize,
    ) -> Result<(), D::Err>;
}

struct WorkingBuf<'a, E: AmpElem, D: Storage<E>>(&'a <D as Storage<E>>::Vec);

impl<E: AmpElem, D: AmpDevice + Kernels<E>> WorkingGrad<D> for WorkingBuf<'_, E, D> {
    fn unscale_into(
        &self,
        dev: &D,
        dst: &mut <D as Storage<f32>>::Vec,
        inv_scale: f32,
        stats: &mut <D as StatsDevice>::Stats,
        slot: usize,
    ) -> Result<(), D::Err> {
        UnscaleKernel::<E>::try_unscale_to_f32(dev, self.0, dst, inv_scale, stats, slot)
    }
}

/// Collects, per trainable parameter of a working model, its gradient buffer (if any).
struct CollectGrads<'a, D: AmpDevice> {
    grads: &'a MixedGradients<D>,
    out: Vec<Option<Box<dyn WorkingGrad<D> + 'a>>>,
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
        D: Kernels<E>,
    {
        if trainable {
            let grads: &'a MixedGradients<D> = self.grads;
            let grad = grads.store::<E>().and_then(|g| g.get_ref_checked(param));
            self.out.push(
                grad.map(|g| Box::new(WorkingBuf::<'a, E, D>(g)) as Box<dyn WorkingGrad<D> + 'a>),
            );
        }
        Ok(())
    }
}

/// Unscales collected working gradients into FP32 master gradients, slot by slot.
struct UnscaleFromWorking<'a, 'w, D: AmpDevice> {
    working: &'a [Option<Box<dyn WorkingGrad<D> + 'w>>],
    inv_scale: f32,
    stats: &'a mut <D as StatsDevice>::Stats,
}

impl<D: AmpDevice> GradOp<D> for UnscaleFromWorking<'_, '_, D> {
    fn apply<E: AmpElem>(
        &mut self,
        dev: &D,
        slot: usize,
        grad: &mut <D as Storage<E>>::Vec,
    ) -> Result<(), D::Err>
    where
        D: Kernels<E>,
    {
        let dst = same_buf_mut::<E, f32, D>(grad)
            .expect("master gradients are FP32 (checked when the master was paired)");
        match &self.working[slot] {
            Some(src) => src.unscale_into(dev, dst, self.inv_scale, self.stats, slot),
            // A parameter the loss did not reach gets a zero gradient, as dfdx gives it, and its
            // flag is written too: the flag buffer is reused across steps.
            None => {
                crate::ops::fill::FillKernel::<f32>::try_fill(dev, dst, 0.0)?;
                UnscaleKernel::<f32>::try_unscale_in_place(dev, dst, 1.0, self.stats, slot)
            }
        }
    }
}

/// Unscales gradients in place.
struct UnscaleInPlace<'a, D: AmpDevice> {
    inv_scale: f32,
    stats: &'a mut <D as StatsDevice>::Stats,
}

impl<D: AmpDevice> GradOp<D> for UnscaleInPlace<'_, D> {
    fn apply<E: AmpElem>(
        &mut self,
        dev: &D,
        slot: usize,
        grad: &mut <D as Storage<E>>::Vec,
    ) -> Result<(), D::Err>
    where
        D: Kernels<E>,
    {
        UnscaleKernel::<E>::try_unscale_in_place(dev, grad, self.inv_scale, self.stats, slot)
    }
}

/// FP32 master weights `M` with their working copy `W`, whose parameters are `P` (FP16 or
/// BF16) or FP32 (FP16 linear layers with FP32 batch norm, say).
///
/// `P` names the working copy's 16-bit precision: with [`F16`] the step needs a loss scaler;
/// with [`BF16`](crate::BF16), whose exponent range is FP32's, it does not.
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
    working: W,
    layout: Vec<ParamInfo>,
    has_buffers: bool,
    master_grads: Option<MixedGradients<D>>,
    flags: NonFiniteFlags<D>,
    id: TargetId,
    precision: std::marker::PhantomData<P>,
}

impl<M, W, D, P> MasterWeights<M, W, D, P>
where
    D: AmpDevice,
    M: Parameters<D> + TensorCollection<f32, D>,
    W: Parameters<D>,
    P: LowPrecision,
{
    /// Pairs an FP32 master module with a working copy of the same architecture whose 16-bit
    /// parameters are `P`, and sets the working copy to the master's values (rounded to the
    /// working precisions).
    ///
    /// Errors if the two differ in any parameter's path, size or trainability, if the master
    /// is not entirely FP32, or if a working parameter is narrower than `P` allows (FP16 in a
    /// copy declared BF16).
    pub fn pair(master: M, mut working: W, device: &D) -> Result<Self, AmpError> {
        let layout = master.param_summary();
        check_pairing::<P>(&layout, &working.param_summary())?;
        copy_from_master(&master, &mut working, CopyWhich::All)?;
        let has_buffers = layout.iter().any(|p| !p.trainable);
        Ok(Self {
            master,
            working,
            flags: NonFiniteFlags::new(device, &layout),
            layout,
            has_buffers,
            master_grads: None,
            id: TargetId::fresh(),
            precision: std::marker::PhantomData,
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
        TrainTarget::alloc_grads(self)
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

impl<M, W, D> MasterWeights<M, W, D, F16>
where
    D: AmpDevice,
    M: Parameters<D> + TensorCollection<f32, D>,
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
    M: Parameters<D> + TensorCollection<f32, D> + ToDtype<f32, D>,
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
    M: Parameters<D> + TensorCollection<f32, D> + ToDtype<f32, D>,
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

impl<M, W, D, P> TrainTarget<D> for MasterWeights<M, W, D, P>
where
    D: AmpDevice,
    M: Parameters<D> + TensorCollection<f32, D>,
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

    fn working(&self) -> &W {
        &self.working
    }

    fn working_mut(&mut self) -> &mut W {
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
        let flags = self.flags.record(|stats| {
            let mut op = UnscaleFromWorking {
                working,
                inv_scale,
                stats,
            };
            for_each_trainable_grad(master, &mut master_grads, &mut op).map(drop)
        })?;
        Ok((master_grads, flags))
    }

    fn recycle(
        &mut self,
        master_grads: MixedGradients<D>,
        mut working: MixedGradients<D>,
    ) -> Result<MixedGradients<D>, AmpError> {
        self.master_grads = Some(master_grads);
        working.zero_params(&self.working)?;
        Ok(working)
    }

    fn refresh(&mut self) -> Result<(), AmpError> {
        copy_from_master(&self.master, &mut self.working, CopyWhich::Trainable)?;
        self.sync_buffers_to_master()
    }

    fn sync_buffers_to_master(&mut self) -> Result<(), AmpError> {
        if self.has_buffers {
            copy_into_master(&self.working, &mut self.master, CopyWhich::Buffers)?;
        }
        Ok(())
    }

    fn reload_working(&mut self) -> Result<(), AmpError> {
        copy_from_master(&self.master, &mut self.working, CopyWhich::All)
    }
}

/// A model trained in a single precision, with no separate master copy: the module is its own
/// master and its gradients are unscaled in place. Use the aliases [`Fp32Weights`] (O0, and
/// O1's FP32 weights) and [`Fp16Weights`] (O3).
///
/// `P` is the precision the model computes in, which decides whether a step needs a loss
/// scaler: the weights' own precision, except under O1, whose FP32 weights are cast to FP16
/// (or BF16) for every matrix product ([`SinglePrecision::with_compute`]).
pub struct SinglePrecision<M, E: AmpElem, D: AmpDevice, P: Precision = <E as AmpElem>::Precision> {
    module: M,
    layout: Vec<ParamInfo>,
    flags: NonFiniteFlags<D>,
    id: TargetId,
    elem: std::marker::PhantomData<(E, P)>,
}

/// A plain FP32 model (O0): the module is its own master.
///
/// ```rust
/// # use typed_amp::prelude::*;
/// let dev = Cpu::default();
/// let model = Fp32Weights::new(dev.build_module::<Linear<4, 2>, f32>(), &dev);
/// assert_eq!(model.working().weight.shape(), &(Const::<2>, Const::<4>));
/// ```
///
/// `P` is the precision it computes in: FP32 (O0), or the 16-bit precision O1 casts its matrix
/// products to.
pub type Fp32Weights<M, D, P = crate::F32> = SinglePrecision<M, f32, D, P>;

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
        Self::with_compute(module, device)
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
    pub fn with_compute(module: M, device: &D) -> Self {
        let layout = module.param_summary();
        Self {
            module,
            flags: NonFiniteFlags::new(device, &layout),
            layout,
            id: TargetId::fresh(),
            elem: std::marker::PhantomData,
        }
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
        TrainTarget::alloc_grads(self)
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
        &mut self.module
    }

    fn working(&self) -> &M {
        &self.module
    }

    fn working_mut(&mut self) -> &mut M {
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
        let flags = self.flags.record(|stats| {
            let mut op = UnscaleInPlace { inv_scale, stats };
            for_each_trainable_grad(module, &mut grads, &mut op).map(drop)
        })?;
        Ok((grads, flags))
    }

    fn recycle(
        &mut self,
        mut master_grads: MixedGradients<D>,
        mut working: MixedGradients<D>,
    ) -> Result<MixedGradients<D>, AmpError> {
        *working.store_mut::<E>() = master_grads.take_store::<E>();
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
    fn pairing_rejects_an_fp16_master() {
        let dev = Cpu::default();
        let master = dev.build_module::<Linear<3, 4>, f16>();
        let working = dev.build_module::<Linear<3, 4>, f16>();
        // An FP16 "master" is not even a `TensorCollection<f32>`: this does not compile.
        // Mixed masters (FP32 tuple with an FP16 element) compile and are refused here.
        let master = (dev.build_module::<Linear<2, 3>, f32>(), master);
        let working = (dev.build_module::<Linear<2, 3>, f16>(), working);
        let err = check_pairing::<F16>(
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
