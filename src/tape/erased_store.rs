//! A gradient store of one precision with its element type erased, so that [`MixedGradients`]'s
//! stores of every precision fit one array.
//!
//! [`MixedGradients`]: super::MixedGradients

use std::any::Any;

use dfdx::prelude::{Device, Gradients};
use dfdx::tensor::UniqueId;

use crate::device::AmpDevice;
use crate::precision::AmpElem;

/// A gradient store of one precision, with its element type erased so that stores of every
/// precision fit one array.
pub(super) trait ErasedStore: Any {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn clone_box(&self) -> Box<dyn ErasedStore>;
    fn retain_leafs(&mut self, ids: &[UniqueId]);
    fn mark_unwanted(&mut self, ids: &[UniqueId]);
    fn clear_unwanted(&mut self);
    fn drop_non_leafs(&mut self);
    fn take_leaf_written(&mut self) -> bool;
}

impl<E: AmpElem, D: AmpDevice + Device<E>> ErasedStore for Gradients<E, D> {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn clone_box(&self) -> Box<dyn ErasedStore> {
        Box::new(self.clone())
    }
    fn retain_leafs(&mut self, ids: &[UniqueId]) {
        Gradients::retain_leafs(self, ids);
    }
    fn mark_unwanted(&mut self, ids: &[UniqueId]) {
        Gradients::mark_unwanted(self, ids);
    }
    fn clear_unwanted(&mut self) {
        Gradients::clear_unwanted(self);
    }
    fn drop_non_leafs(&mut self) {
        Gradients::drop_non_leafs(self);
    }
    fn take_leaf_written(&mut self) -> bool {
        Gradients::take_leaf_written(self)
    }
}
