//! typed-amp: mixed-precision training for [dfdx] in which precision lives in the type system.
#![warn(missing_docs)]

// Lets `#[amp]`'s generated code, which names `::typed_amp`, compile inside this crate too.
extern crate self as typed_amp;

pub use dfdx;
pub use half;

pub mod amp;
pub mod data;
pub mod device;
pub mod error;
pub mod loss;
pub mod master;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod params;
pub mod precision;
pub mod scaler;
pub mod step;
pub mod tape;

pub use device::AmpDevice;
pub use error::AmpError;
pub use loss::Loss;
pub use master::{Fp16Weights, Fp32Weights, MasterWeights, SinglePrecision, TrainTarget};
pub use ops::cast::{to_f16, to_f32, Cast};
pub use optim::{adamw_config, Fp16Updates, MasterOptimizer};
pub use params::{ParamInfo, Parameters};
pub use precision::{
    AmpElem, AmpTensor, DType, LossPrecision, LowPrecision, Precision, UpdatablePrecision, BF16,
    F16, F32,
};
pub use scaler::{GradScaler, ScaleMode, ScalerState};
pub use step::{ScaledGrads, ScaledLoss, StepOutcome, UnscaledGrads};
pub use tape::{MixedGradients, MixedTape, TraceMixed};
pub use typed_amp_macros::amp;

/// Everything a training script needs: dfdx's prelude and typed-amp's types.
pub mod prelude {
    pub use dfdx::prelude::*;
    pub use half::f16;

    pub use crate::loss::{
        binary_cross_entropy_with_logits_loss, cross_entropy_with_logits_loss, mse_loss, Loss,
    };
    pub use crate::ops::cast::{to_f16, to_f32, Cast};
    pub use crate::{
        adamw_config, AmpDevice, AmpError, Fp32Weights, GradScaler, MasterWeights, MixedGradients,
        MixedTape, Parameters, TraceMixed, TrainTarget, F16, F32,
    };
}
