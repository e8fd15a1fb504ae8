//! Where unscaled gradients came from, as a type: the step kinds and the rule of which kinds
//! may be clipped and stepped.

/// Where unscaled gradients came from: a [`GradScaler`](crate::scaler::GradScaler) ([`FromScaler`]) or a backward pass
/// without one ([`ScaleFree`]). It decides how the step's outcome is consumed.
#[doc(hidden)] // a sealed kind of the gradients' parameter: users meet `FromScaler`, `ScaleFree`, ...
pub trait StepKind: sealed::Sealed + 'static {}

/// Gradients unscaled by a [`GradScaler`](crate::scaler::GradScaler): the step's outcome goes to [`GradScaler::update`](crate::scaler::GradScaler::update).
#[derive(Debug)]
pub struct FromScaler;

/// Gradients of a backward pass without a loss scale (BF16 and FP32 models): the step's outcome
/// gives the next gradients itself.
#[derive(Debug)]
pub struct ScaleFree;

/// Gradients of a data-parallel run unscaled by one rank, from its shard of the batch alone
/// ([`DataParallel::unscale`](crate::distributed::DataParallel::unscale)): unscaled, but neither
/// clipping (rule `ReadyForStep`) nor a step (rule `ReducedAcrossRanks`) takes them until
/// [`DataParallel::all_reduce`](crate::distributed::DataParallel::all_reduce) has averaged them
/// across ranks.
#[derive(Debug)]
pub struct Unreduced;

/// Gradients of a data-parallel run averaged across ranks, with the overflow flag reduced across
/// ranks ([`DataParallel::all_reduce`](crate::distributed::DataParallel::all_reduce)): the step's
/// outcome goes to [`DataParallel::update`](crate::distributed::DataParallel::update).
#[derive(Debug)]
pub struct AllReduced;

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::FromScaler {}
    impl Sealed for super::ScaleFree {}
    impl Sealed for super::Unreduced {}
    impl Sealed for super::AllReduced {}
}

impl StepKind for FromScaler {}
impl StepKind for ScaleFree {}
impl StepKind for Unreduced {}
impl StepKind for AllReduced {}

/// Gradients of these kinds may be clipped and stepped: all but [`Unreduced`], a data-parallel
/// rank's gradients before they are averaged across ranks.
#[doc(hidden)] // a rule on the sealed kinds (as `StepKind` is): users meet `Unreduced` and its message.
#[diagnostic::on_unimplemented(
    message = "gradients of kind `{Self}` are one rank's alone: in a data-parallel run, gradients are all-reduced across ranks before they are clipped or stepped",
    label = "not all-reduced across ranks",
    note = "pass what `dist.unscale(..)` returned to `dist.all_reduce(..)?`, then clip or `dist.step(..)` the averaged gradients it returns"
)]
pub trait ReadyForStep: StepKind {}
impl ReadyForStep for FromScaler {}
impl ReadyForStep for ScaleFree {}
impl ReadyForStep for AllReduced {}
