//! Loading a checkpoint: every check first (format, optimizer, policy, precisions, tensors),
//! then the writes.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use dfdx::prelude::{Shape, Tensor};
use safetensors::SafeTensors;

use crate::amp::{built_policy, AmpConfig};
use crate::device::{AmpDevice, HostKernel, Kernels};
use crate::error::AmpError;
use crate::master::TrainTarget;
use crate::optim::{OptimizerState, StateMut, StoreInvariant};
use crate::params::{Mutable, ParamVisitor, Parameters};
use crate::precision::{AmpElem, Precision};
use crate::scaler::{GradScaler, ScaleMode};

use super::error::{format_detail, state_precision_mismatch, CheckpointError};
use super::format::FORMAT;
use super::policy::{layout_difference, model_policy, policy_differences, saved_policy};
use super::scaler_meta::parse_scaler;
use super::validate::{tensor_values, CheckTensors, StoreCheck};

/// Writes `prefix.<path>` tensors of a checkpoint into the visited parameters.
pub(super) struct LoadParams<'a> {
    file: &'a Path,
    tensors: &'a SafeTensors<'a>,
    prefix: &'static str,
}

impl<D: AmpDevice> ParamVisitor<D, Mutable> for LoadParams<'_> {
    type Error = CheckpointError;
    fn visit<S: Shape, E: AmpElem>(
        &mut self,
        path: &str,
        param: &mut Tensor<S, E, D>,
        _trainable: bool,
    ) -> Result<(), CheckpointError>
    where
        D: Kernels<E>,
    {
        let name = format!("{}.{path}", self.prefix);
        let values = tensor_values(
            self.file,
            self.tensors,
            &name,
            &*param,
            StoreInvariant::Finite,
        )?;
        let dev = param.device().clone();
        HostKernel::<E>::try_write(&dev, param.storage_mut(), &values)
            .map_err(|e| CheckpointError::Amp(AmpError::device(e)))
    }
}

/// Writes `optim.<store>.<path>` tensors into the optimizer's stores, per trainable parameter.
pub(super) struct LoadState<'s, 'a> {
    file: &'a Path,
    tensors: &'a SafeTensors<'a>,
    stores: &'s mut [(&'static str, StateMut<'s>)],
}

impl<D: AmpDevice> ParamVisitor<D> for LoadState<'_, '_> {
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
        for (store_name, store) in self.stores.iter_mut() {
            let name = format!("optim.{store_name}.{path}");
            if self.tensors.tensor(&name).is_err() {
                // Saved before the optimizer's first update of this parameter.
                continue;
            }
            // Checked against the store's invariant before anything was written.
            let values = tensor_values(
                self.file,
                self.tensors,
                &name,
                param,
                StoreInvariant::Finite,
            )?;
            let store = store
                .get::<E, D>()
                .ok_or_else(|| state_precision_mismatch(path))?;
            let buf = store.get_or_alloc_mut(param).map_err(AmpError::device)?;
            HostKernel::<E>::try_write(dev, buf, &values).map_err(AmpError::device)?;
        }
        Ok(())
    }
}

/// The caller's metadata of a checkpoint written by [`save`](super::save) (what `extra` held), without
/// loading anything: to check a run's settings against it before [`load`].
pub fn read_metadata(path: &Path) -> Result<BTreeMap<String, String>, CheckpointError> {
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| CheckpointError::Format {
        path: path.to_path_buf(),
        detail: format_detail(&e, &bytes),
    })?;
    Ok(user_metadata(header.metadata().clone().unwrap_or_default()))
}

pub(super) fn user_metadata(meta: HashMap<String, String>) -> BTreeMap<String, String> {
    meta.into_iter()
        .filter_map(|(k, v)| k.strip_prefix("user.").map(|k| (k.to_string(), v)))
        .collect()
}

/// Restores a checkpoint written by [`save`](super::save) into `target`, `optimizer` and `scaler`, and
/// returns the caller's metadata. Everything is checked before anything is written: format,
/// optimizer kind, the model's precision, the precision of every master and working parameter
/// (a checkpoint of another policy, say O2 into O1 or another `keep_batchnorm_fp32`, is refused
/// by name), the scaler's mode (and scale, if static), the optimizer's scalars, that its state
/// is complete (every trainable parameter's, or none where the file records that the optimizer
/// had none yet), and every tensor's precision, shape and finiteness.
pub fn load<D, T, O>(
    path: &Path,
    target: &mut T,
    optimizer: &mut O,
    scaler: &mut GradScaler,
) -> Result<BTreeMap<String, String>, CheckpointError>
where
    D: AmpDevice,
    T: TrainTarget<D>,
    O: OptimizerState<D>,
{
    load_checkpoint(path, target, optimizer, scaler, None)
}

/// [`load`] into a model declared with `#[amp]` under `policy` (`Model::AMP_CONFIG`): a
/// checkpoint saved with [`save_with_policy`](super::save_with_policy) under another policy is refused, naming each
/// setting that differs with both values. (One saved without a policy is checked as [`load`]
/// checks it.) A `policy` other than the one `#[amp]` built `target` under (another model's
/// `AMP_CONFIG`) is refused too, before the file is read.
pub fn load_with_policy<D, T, O>(
    path: &Path,
    target: &mut T,
    optimizer: &mut O,
    scaler: &mut GradScaler,
    policy: &AmpConfig,
) -> Result<BTreeMap<String, String>, CheckpointError>
where
    D: AmpDevice,
    T: TrainTarget<D>,
    O: OptimizerState<D>,
{
    load_checkpoint(path, target, optimizer, scaler, Some(policy))
}

pub(super) fn load_checkpoint<D, T, O>(
    path: &Path,
    target: &mut T,
    optimizer: &mut O,
    scaler: &mut GradScaler,
    given: Option<&AmpConfig>,
) -> Result<BTreeMap<String, String>, CheckpointError>
where
    D: AmpDevice,
    T: TrainTarget<D>,
    O: OptimizerState<D>,
{
    let policy = model_policy(path, built_policy(target.id()), given)?;
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let format_err = |detail: String| CheckpointError::Format {
        path: path.to_path_buf(),
        detail,
    };
    let (_, header) =
        SafeTensors::read_metadata(&bytes).map_err(|e| format_err(format_detail(&e, &bytes)))?;
    let tensors =
        SafeTensors::deserialize(&bytes).map_err(|e| format_err(format_detail(&e, &bytes)))?;
    let meta = header.metadata().clone().unwrap_or_default();
    let mismatch = |detail: String| CheckpointError::Mismatch {
        path: path.to_path_buf(),
        detail,
    };
    match meta.get("format") {
        Some(f) if f == FORMAT => {}
        Some(f) => {
            return Err(mismatch(format!(
                "checkpoint format `{f}`, expected `{FORMAT}`"
            )))
        }
        None => {
            return Err(mismatch(
                "not a typed-amp checkpoint (no format tag)".to_string(),
            ))
        }
    }
    match meta.get("optim.kind") {
        Some(kind) if kind == optimizer.kind() => {}
        other => {
            return Err(mismatch(format!(
                "saved with optimizer `{}`, loading into `{}`",
                other.map_or("?", String::as_str),
                optimizer.kind()
            )))
        }
    }
    let precision = <T::Precision as Precision>::DTYPE;
    match meta.get("model.precision").map(String::as_str) {
        Some(saved) if saved == precision.name() => {}
        Some(saved) => {
            return Err(mismatch(format!(
                "a checkpoint of a {saved} model cannot be loaded into a {precision} model"
            )))
        }
        None => {
            return Err(mismatch(
                "the checkpoint does not say which precision its model trains in".to_string(),
            ))
        }
    }
    let saved = saved_policy(path, &meta)?;
    let differences = |policy: &AmpConfig| match &saved {
        Some(saved) => {
            let differences = policy_differences(saved, policy, "in the checkpoint", "here");
            if differences.is_empty() {
                Ok(())
            } else {
                Err(mismatch(format!(
                    "saved under {saved}, this model is {policy}: {}",
                    differences.join("; ")
                )))
            }
        }
        None => Ok(()),
    };
    if let Some(given) = given {
        differences(given)?;
    }
    // What the policy decides about storage, checked even when neither side names a policy.
    let saved_under = saved.as_ref().map_or(
        "another policy (opt level, dtype, master weights or keep_batchnorm_fp32)".to_string(),
        AmpConfig::to_string,
    );
    for (key, copy, layout) in [
        ("model.master", "master weights", target.layout().to_vec()),
        (
            "model.working",
            "working copy",
            target.working().param_summary(),
        ),
    ] {
        let Some(stored) = meta.get(key) else {
            // Written before checkpoints recorded it.
            continue;
        };
        if let Some((param, theirs, ours)) = layout_difference(stored, &layout) {
            return Err(mismatch(format!(
                "`{param}` is {theirs} in the checkpoint's {copy}, {ours} in this model's: it was saved under {saved_under}"
            )));
        }
    }
    // A model `#[amp]` built is its policy's whatever the caller names: loaded without one,
    // every setting is compared too, after the stored precisions (whose messages name the
    // parameter).
    if let (None, Some(policy)) = (given, &policy) {
        differences(policy)?;
    }
    let scaler_state = parse_scaler(path, &meta)?;
    match GradScaler::from_state(scaler_state) {
        Ok(_) => {}
        // The static-scale rule keeps its own error, as at every other way to a static scale.
        Err(rule @ AmpError::StaticScaleOverflowsFp16 { .. }) => {
            return Err(CheckpointError::Rule {
                path: path.to_path_buf(),
                source: rule,
            })
        }
        Err(e) => return Err(mismatch(e.to_string())),
    }
    if scaler_state.mode != scaler.mode() {
        // An O0 checkpoint would otherwise switch an O2 run's dynamic scaling off.
        return Err(mismatch(format!(
            "the checkpoint's loss scaler is {:?}, this run's is {:?}",
            scaler_state.mode,
            scaler.mode()
        )));
    }
    let current = scaler.state();
    if current.mode == ScaleMode::Static && current.scale != scaler_state.scale {
        // A static scale is the policy's; loading would replace it.
        return Err(mismatch(format!(
            "the checkpoint's static loss scale is {}, this run's is {}",
            scaler_state.scale, current.scale
        )));
    }
    let mut scalars = Vec::new();
    for (name, _) in optimizer.scalars() {
        let key = format!("optim.scalar.{name}");
        let value: i64 = meta
            .get(&key)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| mismatch(format!("optimizer state `{key}` is missing or malformed")))?;
        if value < 0 {
            return Err(mismatch(format!(
                "optimizer state `{key}` is {value}; it counts steps and cannot be negative"
            )));
        }
        scalars.push((name, value));
    }
    let mut check = CheckTensors {
        file: path,
        tensors: &tensors,
        stores: optimizer
            .stores()
            .into_iter()
            .map(|(name, _)| StoreCheck {
                name,
                invariant: optimizer.store_invariant(name),
                with: None,
                without: None,
                present: 0,
            })
            .collect(),
        trainable: 0,
    };
    target.master().visit_params(&mut check)?;
    let trainable = check.trainable;
    let entries: Vec<(&'static str, usize)> = check
        .stores
        .iter()
        .map(|store| (store.name, store.present))
        .collect();
    for StoreCheck {
        name: store,
        with,
        without,
        present,
        ..
    } in check.stores
    {
        if let (Some(other), Some(missing)) = (&with, &without) {
            return Err(CheckpointError::Tensor {
                path: path.to_path_buf(),
                name: missing.clone(),
                detail: format!(
                    "missing from the checkpoint, which has the optimizer's state for other parameters (`{other}`)"
                ),
            });
        }
        // How many entries `save` wrote (absent in files written before it said): state that
        // is all missing was removed, not saved before the optimizer's first update.
        let key = format!("optim.entries.{store}");
        let Some(recorded) = meta.get(&key) else {
            continue;
        };
        let recorded: usize = recorded
            .parse()
            .map_err(|_| mismatch(format!("optimizer state `{key}` is malformed")))?;
        if recorded != present {
            let kind = optimizer.kind();
            return Err(match without {
                Some(missing) if present < recorded => CheckpointError::Tensor {
                    path: path.to_path_buf(),
                    name: missing,
                    detail: format!(
                        "missing from the checkpoint, whose metadata records the `{kind}` optimizer's `{store}` state for {recorded} parameters (it holds {present})"
                    ),
                },
                _ => mismatch(format!(
                    "the checkpoint holds the `{kind}` optimizer's `{store}` state for {present} parameters, its metadata records {recorded}"
                )),
            });
        }
    }

    // The state as a whole (Adam's step count against its moments), once each store is known
    // to be complete.
    optimizer
        .check_state(&scalars, &entries, trainable)
        .map_err(|detail| mismatch(format!("the optimizer's state is inconsistent: {detail}")))?;

    // The FP8 recipe's state: required of a model with FP8 linear layers, checked whole before
    // anything is loaded.
    let fp8 = read_fp8_state(path, &tensors)?;
    if fp8.is_none() && policy.is_some_and(|p| p.fp8.is_some()) {
        return Err(CheckpointError::Fp8State {
            path: path.to_path_buf(),
            detail: "is missing: this model's linear layers run the FP8 recipe, whose scales come from it".into(),
        });
    }
    if let Some(state) = &fp8 {
        // Checked here, put in place below with the rest.
        crate::fp8::Fp8Scaling::default()
            .restore(state)
            .map_err(|e| CheckpointError::Fp8State {
                path: path.to_path_buf(),
                detail: format!("is damaged: {e}"),
            })?;
    }
    target.master_mut().visit_params_mut(&mut LoadParams {
        file: path,
        tensors: &tensors,
        prefix: "master",
    })?;
    target.reload_working()?;
    {
        let mut stores = optimizer.stores_mut();
        target.master().visit_params(&mut LoadState {
            file: path,
            tensors: &tensors,
            stores: &mut stores,
        })?;
    }
    for (name, value) in scalars {
        optimizer.set_scalar(name, value)?;
    }
    scaler
        .load_state(scaler_state)
        .map_err(|e| mismatch(e.to_string()))?;
    if let Some(state) = &fp8 {
        target
            .working()
            .fp8_scaling()
            .restore(state)
            .map_err(|e| CheckpointError::Fp8State {
                path: path.to_path_buf(),
                detail: format!("is damaged: {e}"),
            })?;
    }
    Ok(user_metadata(meta))
}

/// The FP8 recipe's state stored in a checkpoint, if it holds one: shape and dtype checked
/// (the values are checked by [`crate::fp8::Fp8Scaling::restore`]).
fn read_fp8_state(
    path: &Path,
    tensors: &SafeTensors<'_>,
) -> Result<Option<crate::fp8::Fp8ScalingState>, CheckpointError> {
    let Ok(view) = tensors.tensor(super::save::FP8_STATE) else {
        return Ok(None);
    };
    let bad = |detail: String| CheckpointError::Fp8State {
        path: path.to_path_buf(),
        detail,
    };
    let shape = view.shape();
    if view.dtype() != safetensors::Dtype::F32 || shape.len() != 3 || shape[1] != 3 || shape[2] == 0
    {
        return Err(bad(format!(
            "is {:?} of shape {shape:?}: FP32 of layers × 3 × (history + 1) expected",
            view.dtype()
        )));
    }
    let values: Vec<f32> = view
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Ok(Some(crate::fp8::Fp8ScalingState {
        history_len: shape[2] - 1,
        layers: shape[0],
        values,
    }))
}
