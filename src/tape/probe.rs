//! What layer probes record on the tape: each layer's output magnitude in the forward pass, and
//! after backward one report per layer (analysed by [`crate::watch`]).

/// A layer's output magnitude, recorded in the forward pass.
#[derive(Debug, Clone)]
pub struct ActivationRecord {
    pub(crate) order: u64,
    pub(crate) layer: &'static str,
    pub(crate) max_abs: f32,
}

/// One layer's magnitudes in the last pass, in forward order.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerReport {
    /// The layer (its field path in the `#[amp]` struct; `"input"` for the model's input).
    pub layer: &'static str,
    /// Largest |value| of the layer's output (inf or NaN if any output was).
    pub activation_max_abs: f32,
    /// Largest |value| of the (scaled) gradient of the layer's output, if it got one.
    pub gradient_max_abs: Option<f32>,
}

/// Joins forward records with the gradients the probes saw, in forward order.
pub(crate) fn report(
    mut activations: Vec<ActivationRecord>,
    grads: Vec<(u64, f32)>,
) -> Vec<LayerReport> {
    activations.sort_by_key(|a| a.order);
    activations
        .into_iter()
        .map(|a| LayerReport {
            layer: a.layer,
            activation_max_abs: a.max_abs,
            gradient_max_abs: grads
                .iter()
                .find(|(order, _)| *order == a.order)
                .map(|(_, g)| *g),
        })
        .collect()
}
