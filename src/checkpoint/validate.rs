//! Validation of a checkpoint's tensors before anything is loaded: present, in the right
//! precision and shape, and finite.

use std::path::Path;

use dfdx::prelude::{HasShape, Shape, Tensor};
use safetensors::SafeTensors;

use crate::device::{AmpDevice, Kernels};
use crate::optim::StoreInvariant;
use crate::params::ParamVisitor;
use crate::precision::{dtype_of, AmpElem};

use super::error::CheckpointError;
use super::format::{dtype_of_st, st_dtype_name};

/// Why `values` break `invariant`, if they do: the first value that does, as the end of a
/// sentence about the tensor (`holds a negative value (-1 at element 3): …`).
pub(super) fn invariant_violation<E: AmpElem>(
    values: &[E],
    invariant: StoreInvariant,
) -> Option<String> {
    values.iter().enumerate().find_map(|(i, v)| {
        let value = AmpElem::to_f32(*v);
        invariant.violation(value).map(|kind| {
            let why = if kind == "negative" {
                ": this optimizer state is an average of squares, never negative"
            } else {
                ""
            };
            format!("holds a {kind} value ({value} at element {i}){why}")
        })
    })
}

/// The values of tensor `name`, which must be stored in precision `E` with `param`'s shape,
/// and meet `invariant`.
pub(super) fn tensor_values<S: Shape, E: AmpElem, D: AmpDevice + Kernels<E>>(
    file: &Path,
    tensors: &SafeTensors<'_>,
    name: &str,
    param: &Tensor<S, E, D>,
    invariant: StoreInvariant,
) -> Result<Vec<E>, CheckpointError> {
    let err = |detail: String| CheckpointError::Tensor {
        path: file.to_path_buf(),
        name: name.to_string(),
        detail,
    };
    let view = tensors
        .tensor(name)
        .map_err(|_| err("missing from the checkpoint".to_string()))?;
    let want = dtype_of::<E>();
    match dtype_of_st(view.dtype()) {
        Some(stored) if stored == want => {}
        Some(stored) => {
            return Err(err(format!(
                "stored in {stored}, the model's parameter is {want}"
            )))
        }
        None => {
            return Err(err(format!(
                "stored in {}, which typed-amp does not train in",
                st_dtype_name(view.dtype())
            )))
        }
    }
    let shape: Vec<usize> = param.shape().concrete().into_iter().collect();
    if view.shape() != shape.as_slice() {
        return Err(err(format!(
            "has shape {:?}, the model's parameter has shape {shape:?}",
            view.shape()
        )));
    }
    let size = want.size_in_bytes();
    let values: Vec<E> = view
        .data()
        .chunks_exact(size)
        .map(E::from_le_bytes)
        .collect();
    // Masters, statistics and optimizer state meet their invariants in any state `save`
    // writes: it checks them, and a step with a gradient that overflows (inf, NaN, or above
    // `GRADIENT_LIMIT`) is skipped before anything changes.
    if let Some(detail) = invariant_violation(&values, invariant) {
        return Err(err(detail));
    }
    Ok(values)
}

/// What [`CheckTensors`] found of one optimizer store.
pub(super) struct StoreCheck {
    /// The store's name.
    pub(super) name: &'static str,
    /// What its values must satisfy.
    pub(super) invariant: StoreInvariant,
    /// The first trainable parameter's entry found, by tensor name.
    pub(super) with: Option<String>,
    /// The first trainable parameter's entry missing, by tensor name.
    pub(super) without: Option<String>,
    /// How many trainable parameters have an entry.
    pub(super) present: usize,
}

/// Checks, before anything is written, that the checkpoint holds every master tensor and a
/// complete optimizer state (for each store, every trainable parameter's entry, or none where
/// it was saved before the optimizer's first update: its `optim.entries.<store>` says 0), each
/// in the right precision and shape, finite, and meeting its store's invariant (Adam's second
/// moment is not negative).
pub(super) struct CheckTensors<'a> {
    pub(super) file: &'a Path,
    pub(super) tensors: &'a SafeTensors<'a>,
    /// Per optimizer store, what was found.
    pub(super) stores: Vec<StoreCheck>,
    /// How many trainable parameters the model has.
    pub(super) trainable: usize,
}

impl<D: AmpDevice> ParamVisitor<D> for CheckTensors<'_> {
    type Error = CheckpointError;
    fn visit<S: Shape, E: AmpElem>(
        &mut self,
        path: &str,
        param: &Tensor<S, E, D>,
        trainable: bool,
    ) -> Result<(), CheckpointError>
    where
        D: Kernels<E>,
    {
        let finite = StoreInvariant::Finite;
        tensor_values(
            self.file,
            self.tensors,
            &format!("master.{path}"),
            param,
            finite,
        )?;
        if !trainable {
            return Ok(());
        }
        self.trainable += 1;
        for store in &mut self.stores {
            let name = format!("optim.{}.{path}", store.name);
            if self.tensors.tensor(&name).is_ok() {
                tensor_values(self.file, self.tensors, &name, param, store.invariant)?;
                store.with.get_or_insert_with(|| name.clone());
                store.present += 1;
            } else {
                store.without.get_or_insert(name);
            }
        }
        Ok(())
    }
}
