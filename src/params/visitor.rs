//! What a walk over parameters calls ([`ParamVisitor`], [`ParamVisitorMut`]) and the dotted
//! path it keeps ([`ParamPath`]).

use dfdx::prelude::{Shape, Tensor};

use crate::device::{AmpDevice, Kernels};
use crate::precision::AmpElem;

/// Visits parameters by shared reference.
pub trait ParamVisitor<D: AmpDevice> {
    /// The error a visit can return.
    type Error;

    /// Called once per parameter or buffer. `trainable` is false for buffers such as batch
    /// norm's running statistics, which no optimizer updates.
    fn visit<S: Shape, E: AmpElem>(
        &mut self,
        path: &str,
        param: &Tensor<S, E, D>,
        trainable: bool,
    ) -> Result<(), Self::Error>
    where
        D: Kernels<E>;
}

/// Visits parameters by mutable reference.
pub trait ParamVisitorMut<D: AmpDevice> {
    /// The error a visit can return.
    type Error;

    /// Called once per parameter or buffer; see [`ParamVisitor::visit`].
    fn visit_mut<S: Shape, E: AmpElem>(
        &mut self,
        path: &str,
        param: &mut Tensor<S, E, D>,
        trainable: bool,
    ) -> Result<(), Self::Error>
    where
        D: Kernels<E>;
}

/// A dotted parameter path under construction (`"block.0.weight"`).
#[derive(Debug, Default, Clone)]
pub struct ParamPath {
    path: String,
    marks: Vec<usize>,
}

impl ParamPath {
    /// Descends into `segment`.
    pub fn push(&mut self, segment: &str) {
        self.marks.push(self.path.len());
        if !self.path.is_empty() && !segment.is_empty() {
            self.path.push('.');
        }
        self.path.push_str(segment);
    }

    /// Returns to the parent of the last [`ParamPath::push`].
    pub fn pop(&mut self) {
        if let Some(mark) = self.marks.pop() {
            self.path.truncate(mark);
        }
    }

    /// The path so far.
    pub fn as_str(&self) -> &str {
        &self.path
    }

    /// Runs `f` one segment further down.
    pub fn within<R>(&mut self, segment: &str, f: impl FnOnce(&mut Self) -> R) -> R {
        self.push(segment);
        let result = f(self);
        self.pop();
        result
    }
}
