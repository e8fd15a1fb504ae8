//! Naming the layer that overflowed.
//!
//! A skipped step says which parameters' gradients were inf or NaN, but an overflow spreads:
//! a layer whose activations explode makes the next layer's weight gradient overflow, and a
//! layer that amplifies gradients makes every earlier layer's overflow. With
//! [`MixedGradients::watch_layers`](crate::tape::MixedGradients::watch_layers) on, `#[amp]` models
//! probe each layer's output: its largest magnitude in the forward pass, and the largest
//! magnitude of its gradient in the backward pass. [`overflowing_layer`] reads the probes in
//! order and names the layer where values first stop being finite: the first layer whose
//! output is inf or NaN going forward, or, going backward from the loss, the first layer whose
//! output gradient is finite while the gradient it passes back is not.

use dfdx::prelude::{PutTape, Shape, SplitTape, Tensor};

use crate::device::ReduceKernel;
use crate::device::{AmpDevice, Kernels};
use crate::precision::AmpElem;
pub use crate::tape::LayerReport;
use crate::tape::{next_op_order, ActivationRecord, AmpTape};

/// Where values first stopped being finite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Overflow {
    /// The layer's output was inf or NaN though its input was finite.
    Forward(&'static str),
    /// The gradient of the layer's output was finite but the gradient it passed back was not.
    Backward(&'static str),
    /// The gradient coming from the loss itself was already inf or NaN.
    Loss,
}

impl std::fmt::Display for Overflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Overflow::Forward(layer) => write!(f, "`{layer}` overflowed in the forward pass (its output is inf or NaN)"),
            Overflow::Backward(layer) => write!(
                f,
                "`{layer}` overflowed in the backward pass (its output's gradient is finite, the gradient it passes back is not)"
            ),
            Overflow::Loss => write!(f, "the loss's gradient is already inf or NaN"),
        }
    }
}

/// Names the layer where values first stopped being finite, if any did.
pub fn overflowing_layer(report: &[LayerReport]) -> Option<Overflow> {
    if let Some(first) = report
        .iter()
        .position(|r| !r.activation_max_abs.is_finite())
    {
        return Some(Overflow::Forward(report[first].layer));
    }
    let finite = |r: &LayerReport| r.gradient_max_abs.is_none_or(f32::is_finite);
    // From the loss backwards: the last probe is the model's output.
    let last = report.len().checked_sub(1)?;
    if !finite(&report[last]) {
        return Some(Overflow::Loss);
    }
    (0..last)
        .rev()
        .find(|&k| !finite(&report[k]))
        .map(|k| Overflow::Backward(report[k + 1].layer))
}

/// A layer probe: records the magnitude of a layer's output (and, in backward, of its gradient)
/// when watching; the identity otherwise. `#[amp]` inserts one after every layer.
#[doc(hidden)] // `#[amp]`'s generated code and typed-amp's own machinery: see `typed_amp::__private`.
pub trait Watch: Sized {
    /// The error a probe can return.
    type Error: std::fmt::Debug;
    /// Probes `self` as the output of `layer`.
    fn try_watch(self, layer: &'static str) -> Result<Self, Self::Error>;
}

impl<S: Shape, E: AmpElem, D: AmpDevice + Kernels<E>, T: AmpTape<D>> Watch for Tensor<S, E, D, T> {
    type Error = D::Err;

    fn try_watch(self, layer: &'static str) -> Result<Self, D::Err> {
        let (x, mut tape) = self.split_tape();
        if !tape.watching() {
            return Ok(x.put_tape(tape));
        }
        let dev = x.device().clone();
        let activation = max_abs::<E, D>(&dev, x.storage())?;
        let order = next_op_order();
        tape.record_activation(ActivationRecord {
            order,
            layer,
            max_abs: activation,
        });
        let ghost = x.ghost();
        tape.record_mixed(move |grads| {
            let Some(grad) = grads.store::<E>().and_then(|g| g.get_ref_checked(&ghost)) else {
                return Ok(());
            };
            let value = max_abs::<E, D>(&dev, grad)?;
            grads.probe_grads.push((order, value));
            Ok(())
        });
        Ok(x.put_tape(tape))
    }
}

// Token ids have no magnitude worth watching.
impl<S: Shape, D: AmpDevice + dfdx::prelude::Storage<usize>, T> Watch for Tensor<S, usize, D, T> {
    type Error = D::Err;

    fn try_watch(self, _layer: &'static str) -> Result<Self, D::Err> {
        Ok(self)
    }
}

fn max_abs<E: AmpElem, D: AmpDevice + Kernels<E>>(
    dev: &D,
    buf: &<D as dfdx::prelude::Storage<E>>::Vec,
) -> Result<f32, D::Err> {
    let mut stats = dev.try_alloc_stats(1)?;
    ReduceKernel::<E>::try_max_abs(dev, buf, &mut stats, 0)?;
    Ok(dev.try_read_stats(&stats)?.first().copied().unwrap_or(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(name: &'static str, act: f32, grad: Option<f32>) -> LayerReport {
        LayerReport {
            layer: name,
            activation_max_abs: act,
            gradient_max_abs: grad,
        }
    }

    #[test]
    fn the_first_non_finite_value_names_the_layer() {
        let fine = vec![
            layer("input", 1.0, None),
            layer("fc1", 2.0, Some(3.0)),
            layer("fc2", 4.0, Some(5.0)),
        ];
        assert_eq!(overflowing_layer(&fine), None);
        let forward = vec![
            layer("input", 1.0, None),
            layer("fc1", f32::INFINITY, Some(f32::NAN)),
            layer("fc2", f32::NAN, None),
        ];
        assert_eq!(overflowing_layer(&forward), Some(Overflow::Forward("fc1")));
        let backward = vec![
            layer("input", 1.0, None),
            layer("fc1", 2.0, Some(f32::INFINITY)),
            layer("act", 2.0, Some(f32::INFINITY)),
            layer("fc2", 9000.0, Some(3.0)),
            layer("fc3", 1.0, Some(1.0)),
        ];
        assert_eq!(
            overflowing_layer(&backward),
            Some(Overflow::Backward("fc2"))
        );
        let loss = vec![
            layer("fc1", 1.0, Some(f32::NAN)),
            layer("fc2", 1.0, Some(f32::NAN)),
        ];
        assert_eq!(overflowing_layer(&loss), Some(Overflow::Loss));
        assert!(Overflow::Backward("fc2")
            .to_string()
            .contains("`fc2` overflowed in the backward pass"));
    }
}
