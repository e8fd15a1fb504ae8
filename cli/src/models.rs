//! The main job's models, declared once per policy with `#[amp]`.

use typed_amp::amp::OptLevel;
use typed_amp::dfdx::nn::builders::{
    AccurateGeLU, BatchNorm2D, LayerNorm1D, Linear, Repeated, Residual,
};
use typed_amp::nn::builders::{
    ClassPool, ClassToken, Conv2D, Flatten, MaxPool2D, Patches, SelfAttention,
};
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

/// The architectures the main job trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// MLP 784-512-256-10 with ReLU.
    Mlp,
    /// conv(16) → BN → ReLU → pool, conv(32) → BN → ReLU → pool, then a linear layer.
    Cnn,
    /// A vision transformer: 7×7 patches (16 tokens and a class token), width 64, 4 heads,
    /// 4 pre-norm blocks with MLP ratio 2, GELU.
    Vit,
}

impl Arch {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Mlp => "mlp",
            Arch::Cnn => "cnn",
            Arch::Vit => "vit",
        }
    }

    /// A one-line description.
    pub fn describe(self) -> &'static str {
        match self {
            Arch::Mlp => "MLP 784-512-256-10",
            Arch::Cnn => "CNN conv16-BN-pool, conv32-BN-pool, linear",
            Arch::Vit => "ViT 7x7 patches, width 64, 4 heads, 4 pre-norm blocks, MLP 128, GELU",
        }
    }

    /// The short name in messages (`MLP`, `CNN`).
    pub fn upper(self) -> &'static str {
        match self {
            Arch::Mlp => "MLP",
            Arch::Cnn => "CNN",
            Arch::Vit => "ViT",
        }
    }

    /// Bytes one example adds to a training step's peak memory (its activations, their
    /// gradients, the batch itself) under `policy`: measured, as the growth of the process's
    /// peak resident memory between batches of 10,000 and 30,000 (MLP, full data set) and of
    /// 500 and 2,000 (CNN, subset), rounded up over O0, O1 and O2 in FP16 and BF16 (MLP
    /// 8.9–13.0 KiB, CNN 321–335 KiB) and over O3 (MLP 8.4–10.4 KiB, CNN 161 KiB), whose
    /// activations are 16-bit throughout. ViT: between batches of 40 and 400 (subset), O0
    /// 406 KiB, O2 385 (FP16) and 389 (BF16) KiB (its layer norms and softmaxes keep FP32
    /// copies), O1 547 KiB (an FP32 residual stream and 16-bit copies for the products), O3
    /// 199–205 KiB.
    pub fn step_bytes_per_example(self, policy: OptLevel) -> u64 {
        match (self, policy) {
            (Arch::Mlp, OptLevel::O3) => 11 << 10,
            (Arch::Mlp, _) => 14 << 10,
            (Arch::Cnn, OptLevel::O3) => 165 << 10,
            (Arch::Cnn, _) => 340 << 10,
            (Arch::Vit, OptLevel::O3) => 220 << 10,
            (Arch::Vit, OptLevel::O1) => 560 << 10,
            (Arch::Vit, _) => 420 << 10,
        }
    }
}

impl std::str::FromStr for Arch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mlp" => Ok(Arch::Mlp),
            "cnn" => Ok(Arch::Cnn),
            "vit" => Ok(Arch::Vit),
            other => Err(format!("unknown model `{other}`: expected mlp, cnn or vit")),
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

/// One pre-norm transformer block of the ViT: `x + attention(norm(x))`, then
/// `x + fc2(gelu(fc1(norm(x))))`.
pub type VitBlock = (
    Residual<(LayerNorm1D<64>, SelfAttention<64, 4>)>,
    Residual<(
        LayerNorm1D<64>,
        Linear<64, 128>,
        AccurateGeLU,
        Linear<128, 64>,
    )>,
);

macro_rules! vit {
    ($name:ident, $($policy:tt)*) => {
        /// The ViT under one policy.
        #[typed_amp::amp($($policy)*, cast_model_outputs = "fp32")]
        pub struct $name {
            patches: Patches<16, 49>,
            embed: Linear<49, 64>,
            tokens: ClassToken<16, 64>,
            blocks: Repeated<VitBlock, 4>,
            pool: ClassPool,
            norm: LayerNorm1D<64>,
            head: Linear<64, 10>,
        }
    };
}

vit!(VitO0, policy = "O0");
vit!(VitO1, policy = "O1");
vit!(VitO2, policy = "O2");
vit!(VitO3, policy = "O3", allow_fp16_updates);
vit!(VitO1Bf16, policy = "O1", dtype = "bf16");
vit!(VitO2Bf16, policy = "O2", dtype = "bf16");
vit!(VitO3Bf16, policy = "O3", dtype = "bf16", allow_bf16_updates);
