//! Saving a checkpoint: master weights, optimizer state, scaler state and metadata.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use dfdx::prelude::{HasShape, Shape, Tensor};
use safetensors::tensor::TensorView;

use crate::amp::{built_policy, AmpConfig};
use crate::device::{AmpDevice, HostKernel, Kernels};
use crate::error::AmpError;
use crate::master::TrainTarget;
use crate::optim::{OptimizerState, StateRef, StoreInvariant};
use crate::params::{ParamVisitor, Parameters};
use crate::precision::{dtype_of, AmpElem, DType, Precision};
use crate::scaler::GradScaler;
use crate::step::ScaleState;

use super::atomic::write_atomically;
use super::error::{format_detail, state_precision_mismatch, CheckpointError};
use super::format::st_dtype;
use super::format::FORMAT;
use super::policy::{layout_metadata, model_policy, policy_settings};
use super::scaler_meta::scaler_metadata;
use super::validate::invariant_violation;

/// The name of the FP8 recipe's state in a checkpoint: `layers × 3 × (history + 1)` FP32
/// amaxes ([`crate::fp8::Fp8ScalingState`]).
pub(super) const FP8_STATE: &str = "fp8.amax_history";

/// A tensor ready to serialise.
pub(super) struct Entry {
    dtype: DType,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

/// The entry for `values` of a tensor shaped like `param`, in its own precision, bit for bit.
pub(super) fn entry<S: Shape, E: AmpElem, D: AmpDevice + Kernels<E>>(
    param: &Tensor<S, E, D>,
    values: &[E],
) -> Entry {
    Entry {
        dtype: dtype_of::<E>(),
        shape: param.shape().concrete().into_iter().collect(),
        bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// Errors (naming the file and the tensor) if `values` break `invariant`: `load` would refuse
/// the file, so it is not written (an earlier checkpoint at `file` stays as it was).
fn check_before_saving<E: AmpElem>(
    file: &Path,
    name: &str,
    values: &[E],
    invariant: StoreInvariant,
) -> Result<(), CheckpointError> {
    match invariant_violation(values, invariant) {
        None => Ok(()),
        Some(detail) => Err(CheckpointError::NotSaved {
            path: file.to_path_buf(),
            name: name.to_string(),
            detail,
        }),
    }
}

/// Collects `prefix.<path>` entries for every parameter of a model, each finite.
pub(super) struct SaveParams<'e> {
    file: &'e Path,
    /// Whether values are checked (not when only measuring).
    check: bool,
    prefix: &'static str,
    entries: &'e mut BTreeMap<String, Entry>,
}

impl<D: AmpDevice> ParamVisitor<D> for SaveParams<'_> {
    type Error = CheckpointError;
    fn visit<S: Shape, E: AmpElem>(
        &mut self,
        path: &str,
        param: &Tensor<S, E, D>,
        _trainable: bool,
    ) -> Result<(), CheckpointError>
    where
        D: Kernels<E>,
    {
        let values =
            HostKernel::<E>::try_read(param.device(), param.storage()).map_err(AmpError::device)?;
        let name = format!("{}.{path}", self.prefix);
        if self.check {
            check_before_saving(self.file, &name, &values, StoreInvariant::Finite)?;
        }
        self.entries.insert(name, entry(param, &values));
        Ok(())
    }
}

/// Collects `optim.<store>.<path>` entries for every trainable master parameter, each meeting
/// its store's invariant.
pub(super) struct SaveState<'s, 'e> {
    file: &'e Path,
    /// Whether values are checked (not when only measuring).
    check: bool,
    stores: &'s [(&'static str, StateRef<'s>)],
    invariants: &'s [StoreInvariant],
    entries: &'e mut BTreeMap<String, Entry>,
}

impl<D: AmpDevice> ParamVisitor<D> for SaveState<'_, '_> {
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
        if !trainable {
            return Ok(());
        }
        let dev = param.device();
        for ((name, store), invariant) in self.stores.iter().zip(self.invariants) {
            let store = store
                .get::<E, D>()
                .ok_or_else(|| state_precision_mismatch(path))?;
            // A parameter the optimizer has not updated yet has no state.
            let Some(buf) = store.get_ref_checked(param) else {
                continue;
            };
            let values = HostKernel::<E>::try_read(dev, buf).map_err(AmpError::device)?;
            let name = format!("optim.{name}.{path}");
            if self.check {
                check_before_saving(self.file, &name, &values, *invariant)?;
            }
            self.entries.insert(name, entry(param, &values));
        }
        Ok(())
    }
}

/// Saves `target`'s master weights (buffers synced first), `optimizer`'s state, `scaler`'s
/// state (a [`GradScaler`], or a `DataParallel` as it is: any [`ScaleState`]) and the caller's
/// `extra` metadata to `path`, atomically. Returns the file's size.
///
/// The file records the precision of every master and working parameter, which [`load`](super::load)
/// checks; for an `#[amp]` model, [`save_with_policy`] records its whole policy too.
pub fn save<D, T, O, S>(
    path: &Path,
    target: &mut T,
    optimizer: &O,
    scaler: &S,
    extra: &BTreeMap<String, String>,
) -> Result<u64, CheckpointError>
where
    D: AmpDevice,
    T: TrainTarget<D>,
    O: OptimizerState<D>,
    S: ScaleState + ?Sized,
{
    save_checkpoint(path, target, optimizer, scaler, None, extra, true)
}

/// [`save`] for a model declared with `#[amp]`, recording its `policy` (`Model::AMP_CONFIG`):
/// opt level, dtype, master weights, FP32 batch norm, loss scale, output cast and low-precision
/// updates, which [`load_with_policy`](super::load_with_policy) compares with the loading model's.
/// A `policy` other than the one `#[amp]` built `target` under (another model's
/// `AMP_CONFIG`) is refused with [`CheckpointError::Mismatch`] before anything is written.
pub fn save_with_policy<D, T, O, S>(
    path: &Path,
    target: &mut T,
    optimizer: &O,
    scaler: &S,
    policy: &AmpConfig,
    extra: &BTreeMap<String, String>,
) -> Result<u64, CheckpointError>
where
    D: AmpDevice,
    T: TrainTarget<D>,
    O: OptimizerState<D>,
    S: ScaleState + ?Sized,
{
    save_checkpoint(path, target, optimizer, scaler, Some(policy), extra, true)
}

/// The size in bytes of the file [`save_with_policy`] would write with empty `extra` metadata,
/// without writing anything and whatever the state holds (a diverged run's NaN weights
/// included, which `save` refuses).
pub fn serialized_size<D, T, O, S>(
    target: &mut T,
    optimizer: &O,
    scaler: &S,
    policy: &AmpConfig,
) -> Result<u64, CheckpointError>
where
    D: AmpDevice,
    T: TrainTarget<D>,
    O: OptimizerState<D>,
    S: ScaleState + ?Sized,
{
    save_checkpoint(
        Path::new("(measured)"),
        target,
        optimizer,
        scaler,
        Some(policy),
        &BTreeMap::new(),
        false,
    )
}

pub(super) fn save_checkpoint<D, T, O, S>(
    path: &Path,
    target: &mut T,
    optimizer: &O,
    scaler: &S,
    policy: Option<&AmpConfig>,
    extra: &BTreeMap<String, String>,
    write: bool,
) -> Result<u64, CheckpointError>
where
    D: AmpDevice,
    T: TrainTarget<D>,
    O: OptimizerState<D>,
    S: ScaleState + ?Sized,
{
    // Another model's policy value would be recorded as this model's.
    let built = model_policy(path, built_policy(target.id()), policy)?;
    // Refuse to write what `load` would refuse to read.
    let refuse = |detail: String| CheckpointError::Mismatch {
        path: path.to_path_buf(),
        detail: format!("not saved: {detail}"),
    };
    GradScaler::from_state(scaler.state()).map_err(|e| refuse(e.to_string()))?;
    // A step whose outcome never reached the scaler's update (dropped in the last iteration):
    // the scaler's state would not count it.
    if write {
        scaler
            .check_no_step_in_flight()
            .map_err(|source| CheckpointError::Rule {
                path: path.to_path_buf(),
                source,
            })?;
    }
    if let Some((name, value)) = optimizer.scalars().into_iter().find(|(_, v)| *v < 0) {
        return Err(refuse(format!("optimizer state `{name}` is {value}")));
    }
    target.sync_buffers_to_master()?;
    let mut entries = BTreeMap::new();
    target.master().visit_params(&mut SaveParams {
        file: path,
        check: write,
        prefix: "master",
        entries: &mut entries,
    })?;
    let stores = optimizer.stores();
    let invariants: Vec<StoreInvariant> = stores
        .iter()
        .map(|(name, _)| optimizer.store_invariant(name))
        .collect();
    target.master().visit_params(&mut SaveState {
        file: path,
        check: write,
        stores: &stores,
        invariants: &invariants,
        entries: &mut entries,
    })?;
    // The state as a whole, as `load` checks it.
    let counts: Vec<(&'static str, usize)> = stores
        .iter()
        .map(|(store, _)| {
            let prefix = format!("optim.{store}.");
            let count = entries.keys().filter(|k| k.starts_with(&prefix)).count();
            (*store, count)
        })
        .collect();
    let trainable = target.layout().iter().filter(|p| p.trainable).count();
    // The FP8 recipe's amax histories, bit for bit: the scales of every later step come from them.
    let fp8 = target.working().fp8_scaling().state();
    let has_fp8 = built.is_some_and(|p| p.fp8.is_some()) || fp8.layers > 0;
    if has_fp8 {
        if let Some(v) = fp8.values.iter().find(|v| !(v.is_finite() && **v >= 0.0)) {
            return Err(CheckpointError::Fp8State {
                path: path.to_path_buf(),
                detail: format!("holds {v}: not saved"),
            });
        }
        entries.insert(
            FP8_STATE.to_string(),
            Entry {
                dtype: DType::F32,
                shape: vec![fp8.layers, 3, fp8.history_len + 1],
                bytes: fp8.values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            },
        );
    }
    if write {
        optimizer
            .check_state(&optimizer.scalars(), &counts, trainable)
            .map_err(|detail| refuse(format!("the optimizer's state is inconsistent: {detail}")))?;
    }

    let mut meta: HashMap<String, String> = extra
        .iter()
        .map(|(k, v)| (format!("user.{k}"), v.clone()))
        .collect();
    meta.insert("format".into(), FORMAT.into());
    meta.insert(
        "model.precision".into(),
        <T::Precision as Precision>::DTYPE.name().into(),
    );
    meta.insert("model.master".into(), layout_metadata(target.layout()));
    meta.insert(
        "model.working".into(),
        layout_metadata(&target.working().param_summary()),
    );
    if let Some(policy) = policy {
        for (key, value) in policy_settings(policy) {
            meta.insert(format!("policy.{key}"), value);
        }
    }
    meta.insert("optim.kind".into(), optimizer.kind().into());
    // How many parameters each store holds state for (0 before the optimizer's first update):
    // `load` then tells state that was never there from state that was removed.
    for (store, count) in &counts {
        meta.insert(format!("optim.entries.{store}"), count.to_string());
    }
    for (name, value) in optimizer.scalars() {
        meta.insert(format!("optim.scalar.{name}"), value.to_string());
    }
    scaler_metadata(&scaler.state(), &mut meta);

    let views: Vec<(String, TensorView<'_>)> = entries
        .iter()
        .map(|(name, e)| {
            TensorView::new(st_dtype(e.dtype), e.shape.clone(), &e.bytes)
                .map(|view| (name.clone(), view))
                .map_err(|err| CheckpointError::Tensor {
                    path: path.to_path_buf(),
                    name: name.clone(),
                    detail: format!("not saved: {}", format_detail(&err, &[])),
                })
        })
        .collect::<Result<_, _>>()?;
    let mut bytes = safetensors::tensor::serialize(views, &Some(meta))
        .map_err(|err| refuse(format_detail(&err, &[])))?;
    sort_metadata(&mut bytes);
    if write {
        write_atomically(path, &bytes)?;
    }
    Ok(bytes.len() as u64)
}

/// Puts the metadata of a serialised safetensors file in order, in place, so that the same
/// state always gives the same bytes: safetensors writes the metadata from a `HashMap`, in an
/// order that changes from process to process. Each `"key":"value"` pair keeps its bytes and
/// only the pairs' order changes, so the header keeps its length. A header that does not start
/// as safetensors' own does is left alone.
fn sort_metadata(bytes: &mut [u8]) {
    const START: &[u8] = b"{\"__metadata__\":{";
    /// The index after the JSON string that starts at `start`, if one does.
    fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
        if bytes.get(start) != Some(&b'"') {
            return None;
        }
        let mut i = start + 1;
        while let Some(&b) = bytes.get(i) {
            match b {
                b'\\' => i += 2,
                b'"' => return Some(i + 1),
                _ => i += 1,
            }
        }
        None
    }
    if bytes.get(8..8 + START.len()) != Some(START) {
        return;
    }
    let begin = 8 + START.len();
    let mut pairs: Vec<Vec<u8>> = Vec::new();
    let mut at = begin;
    let end = loop {
        if bytes.get(at) == Some(&b'}') && pairs.is_empty() {
            return;
        }
        let Some(key_end) = string_end(bytes, at) else {
            return;
        };
        if bytes.get(key_end) != Some(&b':') {
            return;
        }
        let Some(value_end) = string_end(bytes, key_end + 1) else {
            return;
        };
        pairs.push(bytes[at..value_end].to_vec());
        match bytes.get(value_end) {
            Some(b',') => at = value_end + 1,
            Some(b'}') => break value_end,
            _ => return,
        }
    };
    pairs.sort();
    bytes[begin..end].copy_from_slice(&pairs.join(&b',')[..]);
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    /// The same metadata, inserted in another order, gives the same bytes.
    #[test]
    fn metadata_is_written_in_order() {
        let serialise = |keys: &[&str]| {
            let meta: HashMap<String, String> = keys
                .iter()
                .map(|k| (k.to_string(), format!("v\"{k}\\")))
                .collect();
            let data = [1u8, 2, 3, 4];
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1], &data)
                    .unwrap();
            let mut bytes = safetensors::tensor::serialize([("t", view)], &Some(meta)).unwrap();
            super::sort_metadata(&mut bytes);
            bytes
        };
        let keys: Vec<String> = (0..40).map(|i| format!("key{i}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let reversed: Vec<&str> = keys.iter().rev().copied().collect();
        let a = serialise(&keys);
        for _ in 0..5 {
            assert_eq!(serialise(&reversed), a);
        }
        // Still a valid file, with every pair.
        let (_, header) = safetensors::SafeTensors::read_metadata(&a).unwrap();
        let meta = header.metadata().clone().unwrap();
        assert_eq!(meta.len(), 40);
        assert_eq!(meta["key7"], "v\"key7\\");
        let header_text = std::str::from_utf8(&a[8..]).unwrap();
        assert!(header_text.find("key0").unwrap() < header_text.find("key1\"").unwrap());
    }
}
