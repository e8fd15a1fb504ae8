//! The shape of a sequence model's activations.

/// `(batch, tokens, W)` rows of a sequence model's activations (what attention, the embedding
/// and the language-model head take and return).
pub type Tokens<B, S, const W: usize, E, D, T = dfdx::prelude::NoneTape> =
    dfdx::prelude::Tensor<(B, S, dfdx::prelude::Const<W>), E, D, T>;
