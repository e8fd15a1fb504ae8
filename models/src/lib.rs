//! The models typed-amp trains in its main job (`typed-amp train|compare`), its benchmarks and
//! its tests, each declared once per policy with `#[amp]`: the MLP, the CNN and the ViT of the
//! Fashion-MNIST job, and the character-level GPT of the Shakespeare job ([`gpt`]).

pub mod gpt;

use typed_amp::dfdx::nn::builders::{
    AccurateGeLU, BatchNorm2D, LayerNorm1D, Linear, Repeated, Residual,
};
use typed_amp::nn::builders::{
    ClassPool, ClassToken, Conv2D, Flatten, MaxPool2D, PackedSelfAttention, Patches,
};
use typed_amp::prelude::*;

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
/// `x + fc2(gelu(fc1(norm(x))))`. The attention projects queries, keys and values with one
/// packed `64 → 192` layer (PyTorch's `nn.MultiheadAttention` layout) and runs as one fused op
/// ([`typed_amp::ops::attention`]).
pub type VitBlock = (
    Residual<(LayerNorm1D<64>, PackedSelfAttention<64, 4, 192>)>,
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
