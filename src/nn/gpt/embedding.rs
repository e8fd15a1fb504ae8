//! A GPT's input embedding: the token table (tied to the language-model head) and the learned
//! positions.

use dfdx::nn::{
    BuildModule, BuildOnDevice, Module, ModuleVisitor, NonMutableModule, TensorCollection,
    TensorOptions,
};
use dfdx::prelude::*;
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::ops::cast::CastDevice;
use crate::ops::embedding::{try_embed, EmbeddingOp};
use crate::precision::AmpElem;
use crate::tape::AmpTape;

/// Architecture type for [`TokenEmbedding`].
pub mod builder {
    /// `V` token rows and `P` position rows of width `C`.
    #[derive(Debug, Clone, Copy, Default)]
    pub struct TokenEmbedding<const VOCAB: usize, const CTX: usize, const C: usize>;
}

impl<const VOCAB: usize, const CTX: usize, const C: usize, E: Dtype, D: Device<E>>
    BuildOnDevice<D, E> for builder::TokenEmbedding<VOCAB, CTX, C>
where
    TokenEmbedding<VOCAB, CTX, C, E, D>: BuildModule<D, E>,
{
    type Built = TokenEmbedding<VOCAB, CTX, C, E, D>;
}

/// A normal distribution with mean 0 and standard deviation `std`, sampled in f64 and rounded
/// once to the element type: GPT-2's initialisation of every matrix (`std` 0.02, scaled down
/// for the residual projections).
#[derive(Debug, Clone, Copy)]
pub struct ScaledNormal {
    /// The standard deviation.
    pub std: f64,
}

impl<E: Dtype> Distribution<E> for ScaledNormal {
    fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> E {
        let x: f64 = rng.sample(StandardNormal);
        E::from_f64(x * self.std).unwrap_or_default()
    }
}

/// GPT-2's standard deviation for embeddings and matrices.
pub const INIT_STD: f64 = 0.02;

/// `x[b, t] = wte[token[b, t]] + wpe[t]`: `(batch, tokens)` ids below `VOCAB` (at most `CTX`
/// tokens)
/// into `(batch, tokens, C)` rows, both tables initialised `N(0, 0.02)` as GPT-2's are.
///
/// Its row of the policy table is `Elementwise` (the tables in FP32 under O0 and O1, 16-bit under
/// O2 and O3), and `wte` doubles as the language-model head's weight
/// ([`crate::ops::lm_head::try_lm_head_loss`]): one tensor, so the master copy, the optimizer
/// state, the checkpoint and the gradient (the embedding's and the head's, summed in FP32) are
/// one each.
#[derive(Debug, Clone)]
pub struct TokenEmbedding<
    const VOCAB: usize,
    const CTX: usize,
    const C: usize,
    E: Dtype,
    D: Storage<E>,
> {
    /// The token table, `(VOCAB, C)`; the head's weight.
    pub wte: Tensor<Rank2<VOCAB, C>, E, D>,
    /// The position table, `(CTX, C)`.
    pub wpe: Tensor<Rank2<CTX, C>, E, D>,
}

impl<const VOCAB: usize, const CTX: usize, const C: usize, E: Dtype, D: Device<E>>
    TensorCollection<E, D> for TokenEmbedding<VOCAB, CTX, C, E, D>
{
    type To<E2: Dtype, D2: Device<E2>> = TokenEmbedding<VOCAB, CTX, C, E2, D2>;

    fn iter_tensors<Vis: ModuleVisitor<Self, E, D>>(
        visitor: &mut Vis,
    ) -> Result<Option<Self::To<Vis::E2, Vis::D2>>, Vis::Err> {
        visitor.visit_fields(
            (
                Self::tensor(
                    "wte",
                    |s| &s.wte,
                    |s| &mut s.wte,
                    TensorOptions::reset_with(|t| {
                        t.try_fill_with_distr(ScaledNormal { std: INIT_STD })
                    }),
                ),
                Self::tensor(
                    "wpe",
                    |s| &s.wpe,
                    |s| &mut s.wpe,
                    TensorOptions::reset_with(|t| {
                        t.try_fill_with_distr(ScaledNormal { std: INIT_STD })
                    }),
                ),
            ),
            |(wte, wpe)| TokenEmbedding { wte, wpe },
        )
    }
}

impl<const VOCAB: usize, const CTX: usize, const C: usize, E: Dtype, D: Storage<E>> NonMutableModule
    for TokenEmbedding<VOCAB, CTX, C, E, D>
{
}

impl<const VOCAB: usize, const CTX: usize, const C: usize, B, S, E, D, T>
    Module<Tensor<(B, S), usize, D, T>> for TokenEmbedding<VOCAB, CTX, C, E, D>
where
    B: Dim,
    S: Dim,
    E: AmpElem,
    D: CastDevice<E, f32> + CastDevice<f32, E> + EmbeddingOp<E>,
    T: AmpTape<D> + Tape<E, D>,
{
    type Output = Tensor<(B, S, Const<C>), E, D, T>;
    type Error = D::Err;

    fn try_forward(&self, tokens: Tensor<(B, S), usize, D, T>) -> Result<Self::Output, D::Err> {
        try_embed(tokens, &self.wte, &self.wpe)
    }
}

crate::params::collection_params!([const VOCAB: usize, const CTX: usize, const C: usize,] TokenEmbedding<VOCAB, CTX, C, E, D>;);
