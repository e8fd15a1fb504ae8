//! What an op that offers to fuse the activation after it keeps for its backward: the
//! activation's output (ReLU) or input (GELU), once the activation has run on the op's output
//! in place; and what a fused GELU offers the op after it ([`GeluOutput`]).

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

    /// `f` of the input of the GELU that fused here, while it is still kept (until this op's
    /// backward takes it); `None` if no GELU fused or it was taken.
    pub(crate) fn with_gelu_input<R>(&self, f: impl FnOnce(&Tensor<S, E, D>) -> R) -> Option<R> {
        match &*self.fused.borrow() {
            Some(FusedActivation::Gelu(input)) => Some(f(input)),
            _ => None,
        }
    }
}

/// What a fused GELU offers the op after it: its output is `gelu(input)` of the input the slot
/// keeps for the op that GELU fused into. An FP8 linear op that would keep its input's codes
/// for its weight gradient keeps this instead and computes the codes again in its backward
/// pass (which runs before the slot's op takes the input), so the GELU's output, four times
/// a GPT's width, is held by no one ([`crate::ops::fp8_linear`]). A type of its own, so that
/// another activation does not fuse into the slot through it.
pub(crate) struct GeluOutput<S: Shape, E, D: Storage<E>>(pub(crate) Rc<ActivationSlot<S, E, D>>);
