//! What an op that offers to fuse the activation after it keeps for its backward: the
//! activation's output (ReLU) or input (GELU), once the activation has run on the op's output
//! in place.

use std::cell::RefCell;
use std::rc::Rc;

use dfdx::prelude::{Shape, Storage, Tensor};

/// The activation fused into the op before it, and what its derivative needs.
pub(crate) enum FusedActivation<S: Shape, E, D: Storage<E>> {
    /// ReLU, by its output (positive where its input was).
    Relu(Tensor<S, E, D>),
    /// Exact GELU, by its input: the op's own output before the activation.
    Gelu(Tensor<S, E, D>),
}

/// The offering op's slot: empty until an activation fuses into it.
pub(crate) struct ActivationSlot<S: Shape, E, D: Storage<E>> {
    /// Whether the op's backward applies GELU's derivative (ReLU's it always does).
    gelu: bool,
    fused: RefCell<Option<FusedActivation<S, E, D>>>,
}

impl<S: Shape, E, D: Storage<E>> ActivationSlot<S, E, D> {
    /// An empty slot for an op whose backward applies ReLU's derivative, and GELU's if `gelu`.
    pub(crate) fn new(gelu: bool) -> Rc<Self> {
        Rc::new(ActivationSlot {
            gelu,
            fused: RefCell::new(None),
        })
    }

    /// Whether GELU may fuse here.
    pub(crate) fn takes_gelu(&self) -> bool {
        self.gelu
    }

    /// Records the activation that fused.
    pub(crate) fn put(&self, fused: FusedActivation<S, E, D>) {
        *self.fused.borrow_mut() = Some(fused);
    }

    /// The activation that fused, if any (once: the backward runs once).
    pub(crate) fn take(&self) -> Option<FusedActivation<S, E, D>> {
        self.fused.borrow_mut().take()
    }
}
