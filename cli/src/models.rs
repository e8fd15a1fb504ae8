//! The main job's choices of model and 16-bit precision; the models themselves are
//! `typed-amp-models`' (re-exported here).

use typed_amp::amp::OptLevel;
pub use typed_amp_models::*;

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
