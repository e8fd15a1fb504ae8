//! The character-level GPT of the Shakespeare job: nanoGPT's `model.py` with `bias=False`
//! (tied token embedding and head, pre-norm blocks, causal attention, an MLP 4× wide with
//! exact GELU), in nanoGPT's two character-level sizes ([`GptSize`]), each declared under O0,
//! O2-FP16, O2-BF16 and O2-BF16 with FP8 linear layers (`fp8 = "hybrid"`).
//!
//! Layer norms keep dfdx's `LayerNorm1D`, whose bias (β) nanoGPT's `bias=False` drops: 2·C
//! parameters a norm (0.6% of the small GPT's), initialised to zero and trained.

use typed_amp::amp::{AmpModel, WorkingOf};
use typed_amp::device::AmpDevice;
use typed_amp::dfdx::nn::builders::{
    AccurateGeLU, DropoutOneIn, LayerNorm1D, Repeated, Residual, UnbiasedLinear,
};
use typed_amp::loss::Loss;
use typed_amp::master::{TrainTarget, WorkingCopy};
use typed_amp::nn::builders::{CausalSelfAttention, TokenEmbedding};
use typed_amp::nn::modules::{ScaledNormal, INIT_STD};
use typed_amp::ops::lm_head::{try_lm_head_loss, try_lm_logits, LmHeadOp};
use typed_amp::params::{Mutable, ParamVisitor, Parameters};
use typed_amp::precision::AmpElem;
use typed_amp::prelude::*;
use typed_amp::tape::MixedTape;

/// The vocabulary the models hold: the full Shakespeare corpus's 84 characters. A text with
/// fewer characters leaves rows unused; one with more does not fit.
pub const VOCAB: usize = 84;

/// nanoGPT's two character-level configurations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GptSize {
    /// nanoGPT's CPU configuration: 4 layers, 4 heads, width 128, context 64, batch 12,
    /// 2,000 iterations, no dropout.
    Small,
    /// `train_shakespeare_char.py`: 6 layers, 6 heads, width 384, context 256, batch 64,
    /// 5,000 iterations, dropout 0.2.
    Baby,
}

impl GptSize {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            GptSize::Small => "small",
            GptSize::Baby => "baby",
        }
    }

    /// Transformer blocks.
    pub fn layers(self) -> usize {
        match self {
            GptSize::Small => 4,
            GptSize::Baby => 6,
        }
    }

    /// Attention heads.
    pub fn heads(self) -> usize {
        match self {
            GptSize::Small => 4,
            GptSize::Baby => 6,
        }
    }

    /// The model's width.
    pub fn width(self) -> usize {
        match self {
            GptSize::Small => 128,
            GptSize::Baby => 384,
        }
    }

    /// Tokens per window.
    pub fn context(self) -> usize {
        match self {
            GptSize::Small => 64,
            GptSize::Baby => 256,
        }
    }

    /// Windows per step.
    pub fn batch(self) -> usize {
        match self {
            GptSize::Small => 12,
            GptSize::Baby => 64,
        }
    }

    /// Training iterations.
    pub fn iterations(self) -> usize {
        match self {
            GptSize::Small => 2_000,
            GptSize::Baby => 5_000,
        }
    }

    /// Dropout probability after the embedding and on each residual branch.
    pub fn dropout(self) -> f64 {
        match self {
            GptSize::Small => 0.0,
            GptSize::Baby => 0.2,
        }
    }

    /// A one-line description.
    pub fn describe(self) -> String {
        format!(
            "GPT {}: {} layers, {} heads, width {}, context {}, vocabulary {VOCAB}, dropout {}",
            self.name(),
            self.layers(),
            self.heads(),
            self.width(),
            self.context(),
            self.dropout()
        )
    }

    /// Parameters, the tied table counted once.
    pub fn parameters(self) -> usize {
        let (c, l) = (self.width(), self.layers());
        // wte, wpe; per block: two norms (γ, β), c_attn, c_proj, c_fc, c_proj; the final norm.
        VOCAB * c + self.context() * c + l * (4 * c + 3 * c * c + c * c + 8 * c * c) + 2 * c
    }

    /// Multiply-adds of one training step's matrix products, ×6 for FLOPs of forward and
    /// backward: `tokens × (12·L·C² + V·C)` for the projections and the tied head, and the
    /// causal attention's `QKᵀ` and `PV`, `tokens × L × T·C/2` each (half the scores masked).
    pub fn step_product_flops(self, batch: usize) -> f64 {
        let (c, l, t) = (
            self.width() as f64,
            self.layers() as f64,
            self.context() as f64,
        );
        let tokens = (batch * self.context()) as f64;
        6.0 * tokens * (12.0 * l * c * c + VOCAB as f64 * c + l * t * c)
    }
}

impl std::str::FromStr for GptSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "small" => Ok(GptSize::Small),
            "baby" => Ok(GptSize::Baby),
            other => Err(format!(
                "unknown GPT size `{other}`: expected small or baby"
            )),
        }
    }
}

/// The small GPT's block: attention and MLP, each pre-norm on a residual branch.
pub type SmallBlock = (
    Residual<(LayerNorm1D<128>, CausalSelfAttention<128, 4, 384>)>,
    Residual<(
        LayerNorm1D<128>,
        UnbiasedLinear<128, 512>,
        AccurateGeLU,
        UnbiasedLinear<512, 128>,
    )>,
);

/// The baby GPT's block: as the small one's, with dropout 0.2 (`DropoutOneIn<5>`) at the end
/// of each residual branch.
pub type BabyBlock = (
    Residual<(
        LayerNorm1D<384>,
        CausalSelfAttention<384, 6, 1152>,
        DropoutOneIn<5>,
    )>,
    Residual<(
        LayerNorm1D<384>,
        UnbiasedLinear<384, 1536>,
        AccurateGeLU,
        UnbiasedLinear<1536, 384>,
        DropoutOneIn<5>,
    )>,
);

/// FP32 logits over the vocabulary at every position, `(batch, tokens, VOCAB)`.
pub type Logits<D> = Tensor<(usize, usize, Const<VOCAB>), f32, D>;

/// What training and sampling need of a GPT beyond [`AmpModel`]: the head and loss (the
/// token table tied to the head), and its initialisation.
pub trait GptModel<D: AmpDevice>: AmpModel<D> {
    /// The model's size.
    const SIZE: GptSize;

    /// The mean cross-entropy of the next characters `targets` after `tokens` (a training
    /// forward, dropout on, on `tokens`' tape), in FP32.
    fn try_loss(
        working: &mut WorkingCopy<WorkingOf<Self, D>>,
        tokens: Tensor<(usize, usize), usize, D, MixedTape<D>>,
        targets: &Tensor<(usize, usize), usize, D>,
    ) -> Result<Loss<D>, D::Err>;

    /// The FP32 logits of every position (inference: no dropout, no tape).
    fn try_logits(
        working: &WorkingCopy<WorkingOf<Self, D>>,
        tokens: Tensor<(usize, usize), usize, D>,
    ) -> Result<Logits<D>, D::Err>;
}

/// GPT-2's initialisation of a built model: every matrix `N(0, 0.02)`, the residual branches'
/// output projections (`c_proj` of attention, the MLP's second layer) `N(0, 0.02/√(2·L))` so
/// that the residual stream's variance does not grow with depth; norms' γ = 1, β = 0 (as
/// built). The working copy is refreshed from the masters.
pub fn init_gpt<T: TrainTarget<D>, D: AmpDevice>(
    model: &mut T,
    size: GptSize,
) -> Result<(), AmpError> {
    struct Init {
        layers: usize,
    }
    impl<D: AmpDevice> ParamVisitor<D, Mutable> for Init {
        type Error = D::Err;
        fn visit<S: Shape, E: AmpElem>(
            &mut self,
            path: &str,
            param: &mut Tensor<S, E, D>,
            _trainable: bool,
        ) -> Result<(), D::Err>
        where
            D: typed_amp::device::Kernels<E>,
        {
            if S::NUM_DIMS < 2 || !path.starts_with("blocks.") {
                // The tables (already N(0, 0.02)) and the norms.
                return Ok(());
            }
            // `blocks.N.0.0.1.c_proj.weight` (attention's output) and `blocks.N.1.0.3.weight`
            // (the MLP's second layer) write into the residual stream.
            let residual = path.ends_with(".c_proj.weight") || path.ends_with(".1.0.3.weight");
            let std = if residual {
                INIT_STD / (2.0 * self.layers as f64).sqrt()
            } else {
                INIT_STD
            };
            param.try_fill_with_distr(ScaledNormal { std })
        }
    }
    model
        .master_mut()
        .visit_params_mut(&mut Init {
            layers: size.layers(),
        })
        .map_err(AmpError::device)?;
    model.refresh()
}

macro_rules! gpt {
    ($name:ident, $size:ident, $elem:ty, $block:ty, [$($drop:tt)*], $($policy:tt)*) => {
        /// The GPT under one policy (see [`GptSize`]).
        #[typed_amp::amp($($policy)*)]
        pub struct $name {
            embed: TokenEmbedding<VOCAB, { GptSize::$size.const_context() }, { GptSize::$size.const_width() }>,
            $($drop)*
            blocks: Repeated<$block, { GptSize::$size.const_layers() }>,
            norm: LayerNorm1D<{ GptSize::$size.const_width() }>,
        }

        impl<D: AmpDevice + LmHeadOp<$elem>> GptModel<D> for $name
        where
            WorkingCopy<WorkingOf<$name, D>>: ModuleMut<
                    Tensor<(usize, usize), usize, D, MixedTape<D>>,
                    Output = Tensor<(usize, usize, Const<{ GptSize::$size.const_width() }>), $elem, D, MixedTape<D>>,
                    Error = D::Err,
                > + Module<
                    Tensor<(usize, usize), usize, D>,
                    Output = Tensor<(usize, usize, Const<{ GptSize::$size.const_width() }>), $elem, D>,
                    Error = D::Err,
                >,
        {
            const SIZE: GptSize = GptSize::$size;

            fn try_loss(
                working: &mut WorkingCopy<WorkingOf<Self, D>>,
                tokens: Tensor<(usize, usize), usize, D, MixedTape<D>>,
                targets: &Tensor<(usize, usize), usize, D>,
            ) -> Result<Loss<D>, D::Err> {
                let h = working.try_forward_mut(tokens)?;
                try_lm_head_loss(h, &working.embed.wte, targets)
            }

            fn try_logits(
                working: &WorkingCopy<WorkingOf<Self, D>>,
                tokens: Tensor<(usize, usize), usize, D>,
            ) -> Result<Logits<D>, D::Err> {
                let h = working.try_forward(tokens)?;
                try_lm_logits(&h, &working.embed.wte)
            }
        }
    };
}

impl GptSize {
    const fn const_context(self) -> usize {
        match self {
            GptSize::Small => 64,
            GptSize::Baby => 256,
        }
    }
    const fn const_width(self) -> usize {
        match self {
            GptSize::Small => 128,
            GptSize::Baby => 384,
        }
    }
    const fn const_layers(self) -> usize {
        match self {
            GptSize::Small => 4,
            GptSize::Baby => 6,
        }
    }
}

gpt!(GptSmallO0, Small, f32, SmallBlock, [], policy = "O0");
gpt!(GptSmallO2, Small, f16, SmallBlock, [], policy = "O2");
gpt!(
    GptSmallO2Bf16,
    Small,
    bf16,
    SmallBlock,
    [],
    policy = "O2",
    dtype = "bf16"
);
gpt!(
    GptSmallO2Bf16Fp8,
    Small,
    bf16,
    SmallBlock,
    [],
    policy = "O2",
    dtype = "bf16",
    fp8 = "hybrid"
);
gpt!(GptBabyO0, Baby, f32, BabyBlock, [drop: DropoutOneIn<5>,], policy = "O0");
gpt!(GptBabyO2, Baby, f16, BabyBlock, [drop: DropoutOneIn<5>,], policy = "O2");
gpt!(GptBabyO2Bf16, Baby, bf16, BabyBlock, [drop: DropoutOneIn<5>,], policy = "O2", dtype = "bf16");
gpt!(GptBabyO2Bf16Fp8, Baby, bf16, BabyBlock, [drop: DropoutOneIn<5>,], policy = "O2", dtype = "bf16", fp8 = "hybrid");
