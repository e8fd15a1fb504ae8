//! [`GradScaler`]: one loss scale and PyTorch's rule for moving it.

use crate::error::AmpError;

use super::ledger::Ledger;
use super::state::{
    ScaleMode, ScalerState, DEFAULT_BACKOFF_FACTOR, DEFAULT_FLOOR_PATIENCE, DEFAULT_GROWTH_FACTOR,
    DEFAULT_GROWTH_INTERVAL, DEFAULT_INIT_SCALE, MAX_STATIC_SCALE,
};

/// The loss scaler.
///
/// The low-level API ([`GradScaler::new`], [`GradScaler::get_scale`],
/// [`GradScaler::growth_tracker`], [`GradScaler::state`] / [`GradScaler::load_state`]) mirrors
/// PyTorch's so the two can be compared step by step; the typed training step
/// ([`GradScaler::scale`], [`GradScaler::unscale`], [`GradScaler::step`],
/// [`GradScaler::update`]) is the scaler's `step` module, over [`crate::step`]'s values.
///
/// ```rust
/// # use typed_amp::scaler::GradScaler;
/// let scaler = GradScaler::new(65536.0, 2.0, 0.5, 2).unwrap();
/// assert_eq!((scaler.get_scale(), scaler.growth_tracker()), (65536.0, 0));
/// ```
#[derive(Debug)]
pub struct GradScaler {
    state: ScalerState,
    id: ScalerId,
    /// The steps taken with gradients this scaler scaled whose outcomes its update has not
    /// counted yet.
    pub(crate) ledger: Ledger,
    /// With [`LossScalers`](crate::scaler::LossScalers): every scaler of the group, in loss order (this
    /// one included), whose losses a step must hold. Empty for a scaler of its own.
    pub(crate) group: Vec<ScalerId>,
}

/// Identifies a [`GradScaler`]: the gradients it scales carry it, so that only it unscales them
/// and only it is updated from the step they make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ScalerId(u64);

impl ScalerId {
    /// The id as a number, for what gradients record of the scaler that last scaled them.
    pub(crate) fn key(self) -> u64 {
        self.0
    }

    fn fresh() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        ScalerId(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

impl Clone for GradScaler {
    /// A new scaler in the same state: gradients scaled by one are not the other's to unscale.
    fn clone(&self) -> Self {
        Self::with_state(self.state)
    }
}

impl Drop for GradScaler {
    /// In debug builds, warns once on stderr when the scaler goes with a step in flight: a step
    /// taken with gradients it scaled whose outcome never reached its update (dropped, forgotten,
    /// or the run ended between `step` and `update`). Nothing later would notice an outcome lost
    /// in the last iteration (no next backward or update checks the ledger), and the scaler's
    /// state does not count that step. A warning, not a panic: the weights were stepped or the
    /// step was skipped correctly; only the scale did not move. Silent while a panic unwinds,
    /// and in release builds (call [`GradScaler::check_no_step_in_flight`] for a typed error).
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        if !std::thread::panicking() {
            let pending = self.ledger.pending_steps();
            if !pending.is_empty() {
                eprintln!("{}", dropped_in_flight_warning(&pending));
            }
        }
    }
}

/// The warning a scaler dropped with the steps `pending` in flight (not empty, oldest first)
/// prints in debug builds: one line.
#[cfg(debug_assertions)]
fn dropped_in_flight_warning(pending: &[u64]) -> String {
    let (steps, whose, it) = match pending {
        [one] => (format!("step {one}"), "whose outcome", "it"),
        many => (
            format!(
                "steps {}",
                many.iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "whose outcomes",
            "them",
        ),
    };
    format!(
        "typed-amp warning: a GradScaler was dropped holding {steps} (counted from 1 since it was \
         built), {whose} never reached `scaler.update(outcome)`: its scale and growth tracker \
         never counted {it} (pass every step's outcome to `update`, in the last iteration too)"
    )
}

impl PartialEq for GradScaler {
    /// Scalers are equal when their states are.
    fn eq(&self, other: &Self) -> bool {
        self.state == other.state
    }
}

impl Default for GradScaler {
    /// A dynamic scaler with PyTorch's defaults.
    fn default() -> Self {
        Self::dynamic()
    }
}

/// The smallest loss scale a dynamic scaler backs off to, and the smallest any scaler accepts:
/// FP32's smallest normal number, 2^-126. Below 2^-127 the unscale factor `1/scale` overflows
/// to inf in FP32 and `0 · inf` makes NaN of every zero gradient; PyTorch's scaler goes there
/// after about 144 overflowing steps in a row and puts NaN into the master weights. Backoffs stop
/// here instead (a floor set with [`GradScaler::with_min_scale`] stops them earlier), and the
/// non-finite check also runs on the unscaled gradients, so no scale lets inf or NaN through.
pub const SMALLEST_SCALE: f32 = f32::MIN_POSITIVE;

/// PyTorch computes the reciprocal of the scale in double precision, then rounds to float.
pub(crate) fn inverse(scale: f32) -> f32 {
    (1.0f64 / f64::from(scale)) as f32
}

fn check_scale(scale: f32) -> Result<(), AmpError> {
    if scale.is_finite() && scale >= SMALLEST_SCALE {
        Ok(())
    } else {
        Err(AmpError::InvalidScalerConfig(format!(
            "the scale must be finite and at least 2^-126 (so that 1/scale is finite in FP32), got {scale}"
        )))
    }
}

/// The static-scale rule: at most FP16's largest finite value ([`MAX_STATIC_SCALE`]).
fn check_static_scale(scale: f32) -> Result<(), AmpError> {
    if scale > MAX_STATIC_SCALE {
        Err(AmpError::StaticScaleOverflowsFp16 { scale })
    } else {
        Ok(())
    }
}

impl GradScaler {
    /// A new scaler (a fresh identity, nothing in flight, no group) in `state`.
    fn with_state(state: ScalerState) -> Self {
        Self {
            state,
            id: ScalerId::fresh(),
            ledger: Ledger::default(),
            group: Vec::new(),
        }
    }

    /// A dynamic scaler with PyTorch's defaults: scale 2^16, growth ×2 every 2000 clean steps,
    /// backoff ×0.5.
    pub fn dynamic() -> Self {
        Self::with_state(ScalerState {
            mode: ScaleMode::Dynamic,
            scale: DEFAULT_INIT_SCALE,
            growth_factor: DEFAULT_GROWTH_FACTOR,
            backoff_factor: DEFAULT_BACKOFF_FACTOR,
            growth_interval: DEFAULT_GROWTH_INTERVAL,
            growth_tracker: 0,
            skipped_steps: 0,
            min_scale: None,
            max_scale: None,
            floor_patience: DEFAULT_FLOOR_PATIENCE,
            floor_hits: 0,
        })
    }

    /// A dynamic scaler with the given settings, as PyTorch's
    /// `GradScaler(init_scale, growth_factor, backoff_factor, growth_interval)`.
    ///
    /// Errors unless `init_scale` is finite and positive, `growth_factor > 1`,
    /// `0 < backoff_factor < 1` and `growth_interval >= 1`.
    pub fn new(
        init_scale: f32,
        growth_factor: f32,
        backoff_factor: f32,
        growth_interval: u32,
    ) -> Result<Self, AmpError> {
        check_scale(init_scale)?;
        if !(growth_factor.is_finite() && growth_factor > 1.0) {
            return Err(AmpError::InvalidScalerConfig(format!(
                "growth_factor must be finite and greater than 1, got {growth_factor}"
            )));
        }
        if !(backoff_factor > 0.0 && backoff_factor < 1.0) {
            return Err(AmpError::InvalidScalerConfig(format!(
                "backoff_factor must lie strictly between 0 and 1, got {backoff_factor}"
            )));
        }
        if growth_interval == 0 {
            return Err(AmpError::InvalidScalerConfig(
                "growth_interval must be at least 1".to_string(),
            ));
        }
        let mut scaler = Self::dynamic();
        scaler.state.scale = init_scale;
        scaler.state.growth_factor = growth_factor;
        scaler.state.backoff_factor = backoff_factor;
        scaler.state.growth_interval = growth_interval;
        Ok(scaler)
    }

    /// Sets a floor under the dynamic scale: backoffs stop at `min_scale`, and once the scale
    /// sits there, [`GradScaler::update`] reports [`AmpError::ScaleFloor`] after
    /// [`floor_patience`](GradScaler::with_floor_patience) overflowing steps in a row, rather than
    /// skipping steps forever. A scale collapsing towards 0 usually means the model itself
    /// produces inf or NaN.
    pub fn with_min_scale(mut self, min_scale: f32) -> Result<Self, AmpError> {
        check_scale(min_scale)?;
        if let Some(max) = self.state.max_scale {
            if min_scale > max {
                return Err(AmpError::InvalidScalerConfig(format!(
                    "min_scale {min_scale} is above max_scale {max}"
                )));
            }
        }
        let scale = self.state.scale.max(min_scale);
        if self.state.mode == ScaleMode::Static {
            // A floor above a static scale raises it: the raised scale obeys the static rule.
            check_static_scale(scale)?;
        }
        self.state.min_scale = Some(min_scale);
        self.state.scale = scale;
        Ok(self)
    }

    /// Sets a ceiling over the dynamic scale (Apex caps it at [`APEX_MAX_SCALE`](crate::scaler::APEX_MAX_SCALE)).
    pub fn with_max_scale(mut self, max_scale: f32) -> Result<Self, AmpError> {
        check_scale(max_scale)?;
        if let Some(min) = self.state.min_scale {
            if max_scale < min {
                return Err(AmpError::InvalidScalerConfig(format!(
                    "max_scale {max_scale} is below min_scale {min}"
                )));
            }
        }
        self.state.max_scale = Some(max_scale);
        self.state.scale = self.state.scale.min(max_scale);
        Ok(self)
    }

    /// How many overflowing steps in a row at the floor [`GradScaler::update`] tolerates before
    /// reporting an error (default [`DEFAULT_FLOOR_PATIENCE`]).
    pub fn with_floor_patience(mut self, steps: u32) -> Result<Self, AmpError> {
        if steps == 0 {
            return Err(AmpError::InvalidScalerConfig(
                "floor_patience must be at least 1".to_string(),
            ));
        }
        self.state.floor_patience = steps;
        Ok(self)
    }

    /// A scaler with a fixed scale (Apex's `loss_scale=<number>`).
    ///
    /// Errors unless `scale` is finite and at least 2^-126, and with
    /// [`AmpError::StaticScaleOverflowsFp16`] if it is above FP16's largest finite value,
    /// [`MAX_STATIC_SCALE`] (65,504): a static scale never backs off, so one above it would
    /// skip every step whose FP16 gradients it overflows.
    ///
    /// ```rust
    /// # use typed_amp::{error::AmpError, scaler::GradScaler};
    /// assert!(GradScaler::with_static_scale(65504.0).is_ok());
    /// assert!(matches!(
    ///     GradScaler::with_static_scale(70000.0),
    ///     Err(AmpError::StaticScaleOverflowsFp16 { .. })
    /// ));
    /// ```
    pub fn with_static_scale(scale: f32) -> Result<Self, AmpError> {
        check_scale(scale)?;
        check_static_scale(scale)?;
        let mut scaler = Self::dynamic();
        scaler.state.mode = ScaleMode::Static;
        scaler.state.scale = scale;
        Ok(scaler)
    }

    /// A scaler that does nothing: scale 1, no overflow check, no skipped steps.
    pub fn disabled() -> Self {
        let mut scaler = Self::dynamic();
        scaler.state.mode = ScaleMode::Disabled;
        scaler.state.scale = 1.0;
        scaler
    }

    /// How the scale evolves.
    pub fn mode(&self) -> ScaleMode {
        self.state.mode
    }

    /// Whether scaling is enabled (not [`ScaleMode::Disabled`]).
    pub fn is_enabled(&self) -> bool {
        self.state.mode != ScaleMode::Disabled
    }

    /// Errors with [`AmpError::OutcomeNotUpdated`] if a step taken with gradients this scaler
    /// scaled has an outcome that has not reached its update (dropped, forgotten, or not given
    /// yet): the scaler's state does not count that step. `checkpoint::save` checks it, so an
    /// outcome dropped in a run's last iteration is found when the run saves.
    pub fn check_no_step_in_flight(&self) -> Result<(), AmpError> {
        self.ledger.check_none_pending()
    }

    /// The current scale (PyTorch's `get_scale()`; `scale` is the method that scales a loss).
    pub fn get_scale(&self) -> f32 {
        self.state.scale
    }

    /// Clean steps since the last growth or backoff.
    pub fn growth_tracker(&self) -> u32 {
        self.state.growth_tracker
    }

    /// Steps skipped so far because a gradient was inf or NaN.
    pub fn skipped_steps(&self) -> u64 {
        self.state.skipped_steps
    }

    /// This scaler's identity.
    pub fn id(&self) -> ScalerId {
        self.id
    }

    /// Ends an iteration: `found_inf` says whether any gradient of this iteration was non-finite
    /// (with several optimizers, whether any of them found one). The typed step calls it from
    /// [`GradScaler::update`], which takes the step outcomes rather than a flag.
    ///
    /// Dynamic mode: on `found_inf` the scale is multiplied by the backoff factor (not below the
    /// floor, if set) and the growth tracker reset; otherwise the tracker advances and, on
    /// reaching the growth interval, the scale is multiplied by the growth factor (unless that
    /// would overflow FP32; not above the ceiling, if set) and the tracker reset. Static mode
    /// counts skipped steps only; disabled mode does nothing.
    ///
    /// Errors with [`AmpError::ScaleFloor`] when the scale has sat at its floor for
    /// `floor_patience` overflowing steps in a row; the state is updated all the same.
    pub(crate) fn record(&mut self, found_inf: bool) -> Result<(), AmpError> {
        let s = &mut self.state;
        match s.mode {
            ScaleMode::Disabled => {}
            ScaleMode::Static => s.skipped_steps += u64::from(found_inf),
            ScaleMode::Dynamic => {
                if found_inf {
                    s.skipped_steps += 1;
                    let at_floor = s.min_scale.is_some_and(|min| s.scale <= min);
                    s.scale =
                        (s.scale * s.backoff_factor).max(s.min_scale.unwrap_or(SMALLEST_SCALE));
                    s.growth_tracker = 0;
                    if at_floor {
                        s.floor_hits += 1;
                        if s.floor_hits >= s.floor_patience {
                            return Err(AmpError::ScaleFloor {
                                scale: s.scale,
                                steps: s.floor_hits,
                            });
                        }
                    }
                } else {
                    s.floor_hits = 0;
                    let successful = s.growth_tracker + 1;
                    if successful == s.growth_interval {
                        let mut grown = s.scale * s.growth_factor;
                        if let Some(max) = s.max_scale {
                            grown = grown.min(max);
                        }
                        if grown.is_finite() {
                            s.scale = grown;
                        }
                        s.growth_tracker = 0;
                    } else {
                        s.growth_tracker = successful;
                    }
                }
            }
        }
        Ok(())
    }

    /// The scaler's complete state.
    pub fn state(&self) -> ScalerState {
        self.state
    }

    /// A scaler restored from saved state, after checking it: a static scale above
    /// [`MAX_STATIC_SCALE`] is [`AmpError::StaticScaleOverflowsFp16`], as in
    /// [`GradScaler::with_static_scale`]; any other inconsistency is
    /// [`AmpError::InvalidScalerState`].
    pub fn from_state(state: ScalerState) -> Result<Self, AmpError> {
        let invalid = |what: String| Err(AmpError::InvalidScalerState(what));
        if state.mode == ScaleMode::Static {
            check_static_scale(state.scale)?;
        }
        if state.mode == ScaleMode::Disabled {
            if state.scale != 1.0 {
                return invalid(format!(
                    "a disabled scaler has scale 1, not {}",
                    state.scale
                ));
            }
        } else if let Err(e) = check_scale(state.scale) {
            return invalid(e.to_string());
        }
        if state.mode == ScaleMode::Dynamic {
            let probe = Self::new(
                state.scale,
                state.growth_factor,
                state.backoff_factor,
                state.growth_interval,
            );
            if let Err(e) = probe {
                return invalid(e.to_string());
            }
            for (name, bound) in [
                ("min_scale", state.min_scale),
                ("max_scale", state.max_scale),
            ] {
                if let Some(Err(e)) = bound.map(check_scale) {
                    return invalid(format!("{name}: {e}"));
                }
            }
            if let (Some(min), Some(max)) = (state.min_scale, state.max_scale) {
                if min > max {
                    return invalid(format!("min_scale {min} is above max_scale {max}"));
                }
            }
            if state.floor_patience == 0 {
                return invalid("floor_patience must be at least 1".to_string());
            }
            if state.growth_tracker >= state.growth_interval {
                return invalid(format!(
                    "growth_tracker {} must be below growth_interval {}",
                    state.growth_tracker, state.growth_interval
                ));
            }
        }
        Ok(Self::with_state(state))
    }

    /// Restores saved state into this scaler (which keeps its identity); on error the scaler is
    /// unchanged.
    pub fn load_state(&mut self, state: ScalerState) -> Result<(), AmpError> {
        self.state = Self::from_state(state)?.state;
        Ok(())
    }
}
