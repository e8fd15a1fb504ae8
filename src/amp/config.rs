//! A model's recipe: Apex's optimisation level and the options `#[amp]` was given
//! ([`AmpConfig`]), and the loss scaler it implies.

use crate::error::AmpError;
use crate::precision::DType;
use crate::scaler::GradScaler;

/// Apex's optimisation levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OptLevel {
    /// Pure FP32: the baseline.
    O0,
    /// FP32 weights; matmul-like layers cast their inputs and weights to FP16 (or BF16) for
    /// compute.
    O1,
    /// FP16 (or BF16) model with FP32 batch norm and FP32 master weights.
    O2,
    /// Pure FP16 (or BF16), no master weights (opt-in only).
    O3,
}

impl OptLevel {
    /// `"O0"`, `"O1"`, `"O2"` or `"O3"`.
    pub const fn name(self) -> &'static str {
        match self {
            OptLevel::O0 => "O0",
            OptLevel::O1 => "O1",
            OptLevel::O2 => "O2",
            OptLevel::O3 => "O3",
        }
    }
}

impl std::fmt::Display for OptLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for OptLevel {
    type Err = AmpError;
    fn from_str(s: &str) -> Result<Self, AmpError> {
        match s {
            "O0" => Ok(OptLevel::O0),
            "O1" => Ok(OptLevel::O1),
            "O2" => Ok(OptLevel::O2),
            "O3" => Ok(OptLevel::O3),
            other => Err(AmpError::InvalidPolicy(format!(
                "unknown opt level `{other}`: expected O0, O1, O2 or O3"
            ))),
        }
    }
}

/// How a model's loss is scaled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossScale {
    /// No scaling (O0).
    None,
    /// PyTorch's dynamic scaler with its defaults.
    Dynamic,
    /// A fixed scale.
    Static(f32),
}

/// The FP8 recipe of a model's linear layers (`#[amp(fp8 = "...")]`): the type
/// [`crate::fp8::Hybrid`] or [`crate::fp8::HybridCurrent`] as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Linear {
    /// `fp8 = "hybrid"`: E4M3 forward, E5M2 backward, delayed scaling (history 1,024, margin 0).
    Hybrid,
    /// `fp8 = "hybrid-current"`: E4M3 forward, E5M2 backward, current scaling.
    HybridCurrent,
}

impl Fp8Linear {
    /// The name `#[amp(fp8 = ...)]` spells it by.
    pub const fn name(self) -> &'static str {
        match self {
            Fp8Linear::Hybrid => "hybrid",
            Fp8Linear::HybridCurrent => "hybrid-current",
        }
    }
}

/// The mixed-precision recipe a `#[amp]` model was compiled with: its policy with any
/// properties that override it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AmpConfig {
    /// The opt level.
    pub opt_level: OptLevel,
    /// The 16-bit precision of O1 (compute), O2 and O3 (storage and compute): `F16` or
    /// `BF16`; `None` under O0.
    pub dtype: Option<DType>,
    /// Whether an FP32 master copy of the weights is kept for the optimizer.
    pub master_weights: bool,
    /// Whether batch norm and layer norm keep FP32 parameters (and compute in FP32).
    pub keep_batchnorm_fp32: bool,
    /// How the loss is scaled.
    pub loss_scale: LossScale,
    /// The precision model outputs are cast to, if any.
    pub cast_model_outputs: Option<DType>,
    /// Whether 16-bit weights are updated directly (O3's explicit opt-in).
    pub low_precision_updates: bool,
    /// The FP8 recipe of the linear layers' products, if any (on top of O2-BF16).
    pub fp8: Option<Fp8Linear>,
}

impl AmpConfig {
    /// A loss scaler for this recipe; errors on a static scale that is not finite and positive,
    /// or is above 65,504 ([`AmpError::StaticScaleOverflowsFp16`]).
    pub fn try_scaler(&self) -> Result<GradScaler, AmpError> {
        match self.loss_scale {
            LossScale::None => Ok(GradScaler::disabled()),
            LossScale::Dynamic => Ok(GradScaler::dynamic()),
            LossScale::Static(scale) => GradScaler::with_static_scale(scale),
        }
    }
}

impl std::fmt::Display for AmpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.opt_level)?;
        match self.dtype {
            Some(DType::F16) => write!(f, "-FP16")?,
            Some(dtype) => write!(f, "-{dtype}")?,
            None => {}
        }
        if let Some(fp8) = self.fp8 {
            write!(f, "+FP8 ({})", fp8.name())?;
        }
        write!(
            f,
            " (master weights: {}, norms: {}, loss scale: ",
            if self.master_weights { "FP32" } else { "none" },
            if self.keep_batchnorm_fp32 {
                "FP32"
            } else {
                "as the model"
            },
        )?;
        match self.loss_scale {
            LossScale::None => write!(f, "none")?,
            LossScale::Dynamic => write!(f, "dynamic")?,
            LossScale::Static(s) => write!(f, "{s}")?,
        }
        write!(f, ")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opt_levels_parse() {
        assert_eq!("O2".parse::<OptLevel>().unwrap(), OptLevel::O2);
        assert!("O4".parse::<OptLevel>().is_err());
    }
}
