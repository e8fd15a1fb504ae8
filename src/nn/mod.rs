//! Layers typed-amp adds to dfdx's.
//!
//! - [`modules::Conv2D`], [`modules::MaxPool2D`] and [`modules::Flatten`]: dfdx 0.13's own
//!   convolution, 2-D pooling and flatten layers need nightly Rust (`generic_const_exprs`); these
//!   run on stable, with image sizes as run-time `usize` dimensions.
//! - [`modules::ToF16`] and [`modules::ToF32`]: differentiable casts as layers, to place inside
//!   tuples at the boundary between FP16 and FP32 layers.
//! - [`modules::SelfAttention`], [`modules::Patches`], [`modules::ClassToken`] and
//!   [`modules::ClassPool`]: a vision transformer's parts; attention follows the policy table,
//!   its softmax in FP32 except under O3.
//! - [`modules::TokenEmbedding`] and [`modules::Attention`] (built as
//!   [`builders::CausalSelfAttention`] or [`builders::PackedSelfAttention`]): a GPT's parts, the
//!   embedding's token table tied to the language-model head, attention as one fused op.
//!
//! Build them like dfdx layers, from the types in [`builders`]:
//!
//! ```rust
//! # use typed_amp::prelude::*;
//! use typed_amp::nn::builders::{Conv2D, Flatten, MaxPool2D};
//! type Cnn = (Conv2D<1, 4, 3, 1, 1>, ReLU, MaxPool2D<2>, Flatten<{ 4 * 14 * 14 }>, Linear<784, 10>);
//! let dev = Cpu::default();
//! let cnn = dev.build_module::<Cnn, f32>();
//! let x: Tensor<Rank4<2, 1, 28, 28>, f32, _> = dev.sample_normal();
//! let y: Tensor<Rank2<2, 10>, f32, _> = cnn.forward(x);
//! ```

mod attention;
mod cast;
mod class_token;
mod conv2d;
mod flatten;
mod gpt;
mod patches;
mod pool;

/// The layers, generic over dtype and device (what [`builders`] build).
pub mod modules {
    pub use super::attention::{try_attend, SelfAttention};
    pub use super::cast::{CastLayer, ToBf16, ToF16, ToF32};
    pub use super::class_token::{ClassPool, ClassToken};
    pub use super::conv2d::Conv2D;
    pub use super::flatten::Flatten;
    pub use super::gpt::{
        Attention, Causal, Full, Mask, ScaledNormal, ScoresUnder, TokenEmbedding, INIT_STD,
    };
    pub use super::patches::Patches;
    pub use super::pool::MaxPool2D;
}

/// Architecture types to build with `dev.build_module::<Arch, E>()`.
pub mod builders {
    pub use super::attention::builder::SelfAttention;
    pub use super::cast::{ToBf16, ToF16, ToF32};
    pub use super::class_token::builder::ClassToken;
    pub use super::class_token::ClassPool;
    pub use super::conv2d::builder::Conv2D;
    pub use super::flatten::Flatten;
    pub use super::gpt::attention_builder::{CausalSelfAttention, PackedSelfAttention};
    pub use super::gpt::embedding_builder::TokenEmbedding;
    pub use super::patches::Patches;
    pub use super::pool::MaxPool2D;
}

crate::amp::amp_layers! {
    crate::amp::kind::Matmul =>
        [
            const I: usize, const O: usize, const K: usize, const S: usize, const P: usize,
            E: dfdx::prelude::Dtype, D: dfdx::prelude::Storage<E>
        ] modules::Conv2D<I, O, K, S, P, E, D>;
    crate::amp::kind::Neutral =>
        [const K: usize, const S: usize] modules::MaxPool2D<K, S>,
        [const N: usize] modules::Flatten<N>,
        [const T: usize, const P: usize] modules::Patches<T, P>,
        [] modules::ClassPool;
    crate::amp::kind::Elementwise =>
        [const N: usize, const M: usize, E: dfdx::prelude::Dtype, D: dfdx::prelude::Storage<E>]
            modules::ClassToken<N, M, E, D>,
        [const VOCAB: usize, const CTX: usize, const C: usize, E: dfdx::prelude::Dtype, D: dfdx::prelude::Storage<E>]
            modules::TokenEmbedding<VOCAB, CTX, C, E, D>;
    crate::amp::kind::Cast<crate::precision::F16> => [] modules::ToF16;
    crate::amp::kind::Cast<crate::precision::BF16> => [] modules::ToBf16;
    crate::amp::kind::Cast<crate::precision::F32> => [] modules::ToF32;
}
