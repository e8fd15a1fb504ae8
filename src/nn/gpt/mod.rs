//! A GPT's layers (nanoGPT's `model.py` with `bias=False`): the token and position embedding
//! whose token table is also the language-model head ([`TokenEmbedding`]), and causal
//! self-attention over one packed projection ([`Attention`] with the [`Causal`] mask; with
//! [`Full`], an encoder's). A GPT block is composed of typed-amp's and dfdx's layers:
//! `Residual<(LayerNorm1D, CausalSelfAttention)>` then `Residual<(LayerNorm1D, UnbiasedLinear,
//! AccurateGeLU, UnbiasedLinear)>`; its head and loss are one op,
//! [`crate::ops::lm_head::try_lm_head_loss`], over the final norm's output and the embedding's
//! `wte`.

mod attention;
mod embedding;

pub use attention::{builder as attention_builder, Attention, Causal, Full, Mask, ScoresUnder};
pub use embedding::{builder as embedding_builder, ScaledNormal, TokenEmbedding, INIT_STD};
