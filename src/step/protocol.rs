//! One step protocol for one process or many: [`StepProtocol`], which
//! [`GradScaler`](crate::scaler::GradScaler), [`LossScalers`](crate::scaler::LossScalers) and
//! [`DataParallel`](crate::distributed::DataParallel) implement, so that one training loop runs
//! with any of them.
//!
//! ```rust
//! # use typed_amp::prelude::*;
//! use typed_amp::step::StepProtocol;
//!
//! type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);
//!
//! /// A training loop that runs with a `GradScaler`, `LossScalers` or `DataParallel`.
//! fn train<P: StepProtocol<Cpu>>(protocol: &mut P, steps: usize) -> Result<(), AmpError> {
//!     let dev = Cpu::default();
//!     let mut model = MasterWeights::build::<Mlp>(&dev)?;
//!     let mut opt = typed_amp::optim::sgd(model.master(), SgdConfig::default());
//!     protocol.sync_model(&mut model)?; // every rank starts from rank 0's model
//!     let mut grads = model.alloc_grads()?;
//!     for _ in 0..steps {
//!         grads = protocol.train_step(&mut model, &mut opt, grads, |model, _loss, grads| {
//!             let x: Tensor<Rank2<16, 4>, f16, _> = dev.zeros();
//!             let logits = model.working().forward(x.traced_mixed(grads));
//!             Ok::<_, AmpError>(mse_loss(logits.to_f32(), dev.zeros()))
//!         })?;
//!     }
//!     protocol.check_in_sync(&model)
//! }
//!
//! train(&mut GradScaler::dynamic(), 3)?;
//! train(&mut typed_amp::scaler::LossScalers::new(2, GradScaler::dynamic()), 3)?;
//! # Ok::<(), AmpError>(())
//! ```

use crate::device::AmpDevice;
use crate::error::AmpError;
use crate::master::TrainTarget;
use crate::optim::MasterOptimizer;
use crate::scaler::ScalerState;
use crate::tape::MixedGradients;

use super::short::{ForwardOutput, StepOptions};

/// The implementors of [`StepProtocol`] are the library's: the protocol's guarantees (the typed
/// stages in order, the verdict back to the scaler that scaled) are theirs to keep.
pub(crate) mod sealed {
    /// Seals [`StepProtocol`](super::StepProtocol).
    pub trait Sealed {}
}

/// One training iteration, whoever runs it: a [`GradScaler`](crate::scaler::GradScaler) in one
/// process, [`LossScalers`](crate::scaler::LossScalers) (one scaler per loss), or
/// [`DataParallel`](crate::distributed::DataParallel) across ranks. Each runs the typed stages
/// of its own (scale → backward → unscale → [all-reduce] → step → update), so a loop written
/// against this trait keeps every rule of the typed step.
///
/// Sealed: implemented by those three only.
pub trait StepProtocol<D: AmpDevice>: sealed::Sealed {
    /// The number of losses an iteration takes: one, or one per scaler of
    /// [`LossScalers`](crate::scaler::LossScalers).
    fn losses(&self) -> usize {
        1
    }

    /// One iteration, in one call: the short form of the typed step. For each loss `l` in
    /// `0..self.losses()` and each micro-batch `m` in `0..options.micro_batches()`, in that
    /// order, `forward(target, l * options.micro_batches() + m, grads)` traces a forward pass
    /// into `grads` and returns its FP32 loss (a [`Loss`](crate::loss::Loss), or a `Result` of
    /// one: [`ForwardOutput`]); each loss is
    /// weighted by `1 / micro_batches` (when accumulating), scaled by its loss's scaler and
    /// backward (a loss's micro-batches into one [`Accumulation`](super::Accumulation) window
    /// at one scale); the gradients are unscaled into `target`'s master gradients (summed over
    /// the losses, averaged across ranks) and checked for inf/NaN, clipped as `options` say
    /// ([`StepOptions::clip_grad_norm`], [`StepOptions::clip_grad_value`]), `optimizer` steps
    /// unless a gradient was inf or NaN, and the scale is updated. Returns the zeroed
    /// gradients for the next iteration.
    ///
    /// It is the stage-by-stage loop (scale → backward → unscale → [all-reduce] → clip → step
    /// → update, see [`crate::step`]) in one call, bit for bit: every bound of those stages
    /// holds for it (an FP32 loss only, an optimizer over the FP32 master weights only).
    fn train_step_with<T, O, R, F>(
        &mut self,
        target: &mut T,
        optimizer: &mut O,
        grads: MixedGradients<D>,
        options: &StepOptions,
        forward: F,
    ) -> Result<MixedGradients<D>, R::Error>
    where
        T: TrainTarget<D>,
        O: MasterOptimizer<T::Master, D>,
        R: ForwardOutput<D>,
        F: FnMut(&mut T, usize, MixedGradients<D>) -> R;

    /// [`StepProtocol::train_step_with`] with the default [`StepOptions`] (one forward pass per
    /// loss, no clipping): for each loss `i` in `0..self.losses()`, `forward(target, i, grads)`
    /// traces a forward pass into `grads` (the first loss into the `grads` given here, each
    /// further loss into freshly allocated ones) and returns its FP32 loss; each loss is
    /// scaled by its scaler and backward, the gradients are unscaled into `target`'s master
    /// gradients (summed over the losses, averaged across ranks), `optimizer` steps unless a
    /// gradient was inf or NaN, and the scale is updated. Returns the zeroed gradients for the
    /// next iteration. `forward` returns the loss itself or a `Result` of it ([`ForwardOutput`]).
    fn train_step<T, O, R, F>(
        &mut self,
        target: &mut T,
        optimizer: &mut O,
        grads: MixedGradients<D>,
        forward: F,
    ) -> Result<MixedGradients<D>, R::Error>
    where
        T: TrainTarget<D>,
        O: MasterOptimizer<T::Master, D>,
        R: ForwardOutput<D>,
        F: FnMut(&mut T, usize, MixedGradients<D>) -> R,
    {
        self.train_step_with(target, optimizer, grads, &StepOptions::new(), forward)
    }

    /// Makes every rank's model rank 0's (master weights and buffers), before training. One
    /// process: nothing to do.
    fn sync_model<T: TrainTarget<D>>(&self, target: &mut T) -> Result<(), AmpError> {
        let _ = target;
        Ok(())
    }

    /// Gives every rank rank 0's buffers (batch norm statistics, which follow each rank's
    /// shard), before evaluating or saving. One process: nothing to do.
    fn sync_buffers<T: TrainTarget<D>>(&self, target: &mut T) -> Result<(), AmpError> {
        let _ = target;
        Ok(())
    }

    /// Checks that every rank holds the same weights and scale, bit for bit. One process:
    /// trivially true.
    fn check_in_sync<T: TrainTarget<D>>(&self, target: &T) -> Result<(), AmpError> {
        let _ = target;
        Ok(())
    }
}

/// The scale state of a step protocol with one loss scaler: a
/// [`GradScaler`](crate::scaler::GradScaler), or a
/// [`DataParallel`](crate::distributed::DataParallel) (whose scaler is the same on every rank).
/// What a training loop written against [`StepProtocol`] reads and restores of its scaler:
/// progress (the scale, skipped steps), checkpoints ([`crate::checkpoint::save`] takes any
/// `ScaleState`, so a `DataParallel` is saved as it is). [`LossScalers`](crate::scaler::LossScalers) has one scaler per loss, each read with
/// [`LossScalers::get`](crate::scaler::LossScalers::get).
///
/// Sealed: implemented by those two only.
///
/// ```rust
/// # use typed_amp::prelude::*;
/// use typed_amp::distributed::{DataParallel, SingleProcess};
///
/// fn describe<P: StepProtocol<Cpu> + ScaleState>(protocol: &P) -> String {
///     format!("scale {}, {} skipped", protocol.get_scale(), protocol.skipped_steps())
/// }
///
/// assert_eq!(describe(&GradScaler::dynamic()), "scale 65536, 0 skipped");
/// let dist = DataParallel::new(GradScaler::dynamic(), SingleProcess)?;
/// assert_eq!(describe(&dist), "scale 65536, 0 skipped");
/// # Ok::<(), AmpError>(())
/// ```
pub trait ScaleState: sealed::Sealed {
    /// Whether the protocol trains across ranks: a checkpoint of it records the number of
    /// ranks, and only rank 0's figures are its own.
    const DATA_PARALLEL: bool = false;

    /// The scaler's complete state, as a checkpoint saves it.
    fn state(&self) -> ScalerState;

    /// Restores saved scaler state (e.g. from a checkpoint); on error nothing changes. A
    /// `DataParallel`: collective, every rank loads the same state (checked).
    fn load_state(&mut self, state: ScalerState) -> Result<(), AmpError>;

    /// Errors with [`AmpError::OutcomeNotUpdated`] if a step taken with this scaler has an
    /// outcome that has not reached its update: the state does not count that step yet.
    fn check_no_step_in_flight(&self) -> Result<(), AmpError>;

    /// The current loss scale (PyTorch's `get_scale()`).
    fn get_scale(&self) -> f32 {
        self.state().scale
    }

    /// Clean steps since the last growth or backoff.
    fn growth_tracker(&self) -> u32 {
        self.state().growth_tracker
    }

    /// Steps skipped so far because a gradient (on some rank) was inf or NaN.
    fn skipped_steps(&self) -> u64 {
        self.state().skipped_steps
    }
}
