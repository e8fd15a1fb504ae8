//! The scaler's settings and state: PyTorch's defaults, the scale modes, and the state a
//! checkpoint saves.

/// PyTorch's default initial scale, 2^16.
///
/// Note that 65536 itself does not fit in FP16 (largest finite value 65504): the scale is kept
/// in FP32 and multiplies the FP32 loss, never an FP16 tensor.
pub const DEFAULT_INIT_SCALE: f32 = 65536.0;
/// The largest static loss scale a scaler accepts: FP16's largest finite value, 65,504. A
/// static scale never backs off, so one above it would overflow the FP16 gradients of every
/// step whose loss gradient is 1 or more, and skip each of them. Dynamic scales may start
/// higher ([`DEFAULT_INIT_SCALE`] is 2^16): they back off on the first overflow.
pub const MAX_STATIC_SCALE: f32 = 65504.0;
/// PyTorch's default growth factor.
pub const DEFAULT_GROWTH_FACTOR: f32 = 2.0;
/// PyTorch's default backoff factor.
pub const DEFAULT_BACKOFF_FACTOR: f32 = 0.5;
/// PyTorch's default number of clean steps between growths.
pub const DEFAULT_GROWTH_INTERVAL: u32 = 2000;
/// Apex's ceiling on the dynamic scale, 2^24.
pub const APEX_MAX_SCALE: f32 = 16_777_216.0;
/// Overflowing steps in a row at the floor before [`GradScaler::update`](crate::scaler::GradScaler::update) reports an error, unless
/// set with [`GradScaler::with_floor_patience`](crate::scaler::GradScaler::with_floor_patience).
pub const DEFAULT_FLOOR_PATIENCE: u32 = 10;

/// How the scale evolves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScaleMode {
    /// PyTorch's dynamic loss scaling: back off on overflow (and skip the step), grow after
    /// `growth_interval` clean steps.
    Dynamic,
    /// A fixed scale. Steps whose gradients overflow are still skipped; the scale never changes.
    Static,
    /// No scaling (scale 1) and no overflow check: every step is taken, as with PyTorch's
    /// `GradScaler(enabled=False)`. For FP32 training (O0).
    Disabled,
}

/// Everything needed to restore a [`GradScaler`](crate::scaler::GradScaler) exactly: save it in checkpoints.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScalerState {
    /// How the scale evolves.
    pub mode: ScaleMode,
    /// Current scale.
    pub scale: f32,
    /// Factor applied after `growth_interval` clean steps.
    pub growth_factor: f32,
    /// Factor applied after an overflow.
    pub backoff_factor: f32,
    /// Clean steps between growths.
    pub growth_interval: u32,
    /// Clean steps since the last growth or backoff.
    pub growth_tracker: u32,
    /// Steps skipped because of non-finite gradients, since the scaler was created.
    pub skipped_steps: u64,
    /// The lowest scale a backoff may reach (none: PyTorch's behaviour).
    pub min_scale: Option<f32>,
    /// The highest scale growth may reach (none: PyTorch's; Apex uses 2^24).
    pub max_scale: Option<f32>,
    /// Overflowing steps in a row at `min_scale` that [`GradScaler::update`](crate::scaler::GradScaler::update) tolerates.
    pub floor_patience: u32,
    /// Overflowing steps in a row taken at `min_scale` so far.
    pub floor_hits: u32,
}
