//! The main job's models, declared once per policy with `#[amp]`.

use typed_amp::amp::OptLevel;
use typed_amp::dfdx::nn::builders::{BatchNorm2D, Linear};
use typed_amp::nn::builders::{Conv2D, Flatten, MaxPool2D};
use typed_amp::prelude::*;

/// The 16-bit precision of a mixed run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LowDtype {
    /// IEEE half precision, with dynamic loss scaling.
    Fp16,
    /// bfloat16: FP32's exponent range, no loss scaling.
    Bf16,
}

impl LowDtype {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            LowDtype::Fp16 => "fp16",
            LowDtype::Bf16 => "bf16",
        }
    }

    /// The name in tables (`FP16`, `BF16`).
    pub fn upper(self) -> &'static str {
        match self {
            LowDtype::Fp16 => "FP16",
            LowDtype::Bf16 => "BF16",
        }
    }
}

impl std::fmt::Display for LowDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for LowDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fp16" => Ok(LowDtype::Fp16),
            "bf16" => Ok(LowDtype::Bf16),
            other => Err(format!("unknown dtype `{other}`: expected fp16 or bf16")),
        }
    }
}

/// The two architectures the main job trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// MLP 784-512-256-10 with ReLU.
    Mlp,
    /// conv(16) → BN → ReLU → pool, conv(32) → BN → ReLU → pool, then a linear layer.
    Cnn,
}

impl Arch {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Mlp => "mlp",
            Arch::Cnn => "cnn",
        }
    }

    /// A one-line description.
    pub fn describe(self) -> &'static str {
        match self {
            Arch::Mlp => "MLP 784-512-256-10",
            Arch::Cnn => "CNN conv16-BN-pool, conv32-BN-pool, linear",
        }
    }

    /// The short name in messages (`MLP`, `CNN`).
    pub fn upper(self) -> &'static str {
        match self {
            Arch::Mlp => "MLP",
            Arch::Cnn => "CNN",
        }
    }

    /// Bytes one example adds to a training step's peak memory (its activations, their
    /// gradients, the batch itself) under `policy`: measured, as the growth of the process's
    /// peak resident memory between batches of 10,000 and 30,000 (MLP, full data set) and of
    /// 500 and 2,000 (CNN, subset), rounded up over O0, O1 and O2 in FP16 and BF16 (MLP
    /// 8.9–13.0 KiB, CNN 321–335 KiB) and over O3 (MLP 8.4–10.4 KiB, CNN 161 KiB), whose
    /// activations are 16-bit throughout.
    pub fn step_bytes_per_example(self, policy: OptLevel) -> u64 {
        match (self, policy) {
            (Arch::Mlp, OptLevel::O3) => 11 << 10,
            (Arch::Mlp, _) => 14 << 10,
            (Arch::Cnn, OptLevel::O3) => 165 << 10,
            (Arch::Cnn, _) => 340 << 10,
        }
    }
}

impl std::str::FromStr for Arch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mlp" => Ok(Arch::Mlp),
            "cnn" => Ok(Arch::Cnn),
            other => Err(format!("unknown model `{other}`: expected mlp or cnn")),
        }
    }
}

macro_rules! mlp {
    ($name:ident, $($policy:tt)*) => {
        /// The MLP under one policy.
        #[typed_amp::amp($($policy)*, cast_model_outputs = "fp32")]
        pub struct $name {
            fc1: Linear<784, 512>,
            act1: ReLU,
            fc2: Linear<512, 256>,
            act2: ReLU,
            fc3: Linear<256, 10>,
        }
    };
}

mlp!(MlpO0, policy = "O0");
mlp!(MlpO1, policy = "O1");
mlp!(MlpO2, policy = "O2");
mlp!(MlpO3, policy = "O3", allow_fp16_updates);
mlp!(MlpO1Bf16, policy = "O1", dtype = "bf16");
mlp!(MlpO2Bf16, policy = "O2", dtype = "bf16");
mlp!(MlpO3Bf16, policy = "O3", dtype = "bf16", allow_bf16_updates);

macro_rules! cnn {
    ($name:ident, $($policy:tt)*) => {
        /// The CNN under one policy.
        #[typed_amp::amp($($policy)*, cast_model_outputs = "fp32")]
        pub struct $name {
            conv1: Conv2D<1, 16, 3, 1, 1>,
            bn1: BatchNorm2D<16>,
            act1: ReLU,
            pool1: MaxPool2D<2>,
            conv2: Conv2D<16, 32, 3, 1, 1>,
            bn2: BatchNorm2D<32>,
            act2: ReLU,
            pool2: MaxPool2D<2>,
            flat: Flatten<{ 32 * 7 * 7 }>,
            fc: Linear<{ 32 * 7 * 7 }, 10>,
        }
    };
}

cnn!(CnnO0, policy = "O0");
cnn!(CnnO1, policy = "O1");
cnn!(CnnO2, policy = "O2");
cnn!(CnnO3, policy = "O3", allow_fp16_updates);
cnn!(CnnO1Bf16, policy = "O1", dtype = "bf16");
cnn!(CnnO2Bf16, policy = "O2", dtype = "bf16");
cnn!(CnnO3Bf16, policy = "O3", dtype = "bf16", allow_bf16_updates);
