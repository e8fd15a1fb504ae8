//! The FP8 recipes of linear layers as types ([`Fp8Recipe`]): which format each operand of a
//! linear layer's products takes, and how its scales are chosen. `#[amp(fp8 = "...")]` names
//! one; the products of every linear layer of the model then run through
//! [`crate::ops::fp8_linear`].

use super::format::{ForwardOperand, Fp8Element, E4M3, E5M2};
use super::scaling::{Current, Delayed, ScalingMode};

/// An FP8 recipe for linear layers: the forward pass multiplies `Forward` activations by
/// `Forward` weights, the backward pass multiplies `Backward` output gradients by the forward
/// operands (transposed); every product accumulates in FP32 and returns the working precision.
///
/// The forward format must be E4M3 (rule [`ForwardOperand`]): a recipe declaring E5M2 there
/// does not compile.
pub trait Fp8Recipe: Copy + Default + std::fmt::Debug + Send + Sync + 'static {
    /// The recipe's name, as `#[amp(fp8 = "...")]` spells it.
    const NAME: &'static str;
    /// The format of activations and weights (the forward pass's operands).
    type Forward: ForwardOperand;
    /// The format of output gradients (the backward pass's left operands).
    type Backward: Fp8Element;
    /// How every scale is chosen: [`Delayed`] (an amax history, state of the model's recipe)
    /// or [`Current`] (each tensor's own amax).
    type Scaling: ScalingMode;
}

/// The amax history length of [`Hybrid`]: Transformer Engine's default `DelayedScaling`
/// (`amax_history_len = 1024`, margin 0, `amax_compute_algo = "max"`).
pub const TE_HISTORY: usize = 1024;

/// Transformer Engine's default recipe (`DelayedScaling(fp8_format=Format.HYBRID)`): E4M3
/// activations and weights forward, E5M2 output gradients backward, per-tensor scales from
/// the largest amax of the last 1,024 steps, margin 0.
///
/// Why delayed scaling is the default: it is the recipe Transformer Engine ships as its
/// default, and the one whose state (the histories) is what a recipe has to keep right across
/// checkpoints and ranks; its scale is known before the tensor is read, so on a GPU the cast
/// can be fused into the op that produces the tensor. On this CPU the amax is one pass over
/// data the cast reads anyway, so [`HybridCurrent`] costs the same and is offered beside it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Hybrid;

/// The hybrid formats with current scaling (Transformer Engine's `Float8CurrentScaling`,
/// torchao's tensorwise recipe): each tensor's scale from its own amax, no history.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct HybridCurrent;

impl Fp8Recipe for Hybrid {
    const NAME: &'static str = "hybrid";
    type Forward = E4M3;
    type Backward = E5M2;
    type Scaling = Delayed<TE_HISTORY, 0>;
}

impl Fp8Recipe for HybridCurrent {
    const NAME: &'static str = "hybrid-current";
    type Forward = E4M3;
    type Backward = E5M2;
    type Scaling = Current;
}
