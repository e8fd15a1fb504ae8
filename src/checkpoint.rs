//! Checkpoints: master weights, optimizer state and loss-scaler state in one safetensors file,
//! written atomically, restored exactly.
//!
//! Tensors are named by parameter path: `master.<path>` (every master parameter and buffer, in
//! its own precision), `optim.<store>.<path>` (e.g. `optim.moment1.fc1.weight`). Everything
//! else is string metadata: the format, the scaler's state (`scaler.*`), the optimizer's kind
//! and scalars (`optim.*`), and whatever the caller adds (step, epoch, RNG state, ...). Any
//! safetensors reader can read the tensors by name.
//!
//! The file is written next to its destination and renamed over it, so a crash leaves either
//! the old checkpoint or the new one, never a torn file.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use dfdx::prelude::{HasShape, Shape, Tensor};
use safetensors::tensor::TensorView;
use safetensors::{Dtype as StDtype, SafeTensors};

use crate::device::{AmpDevice, HostKernel, Kernels};
use crate::error::AmpError;
use crate::master::TrainTarget;
use crate::optim::{OptimizerState, StateMut, StateRef};
use crate::params::{ParamVisitor, ParamVisitorMut, Parameters};
use crate::precision::{dtype_of, AmpElem, DType, Precision};
use crate::scaler::{GradScaler, ScaleMode, ScalerState};

/// The format tag written in every checkpoint.
pub const FORMAT: &str = "typed-amp-checkpoint/1";

/// What can go wrong saving or loading a checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// Reading or writing the file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a readable safetensors file.
    #[error("{path}: not a safetensors checkpoint: {detail}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The file is a checkpoint of something else (another format version, model or optimizer).
    #[error("{path}: {detail}")]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What does not match.
        detail: String,
    },
    /// A tensor the model or optimizer needs is missing, or has the wrong size or precision.
    #[error("{path}: tensor `{name}`: {detail}")]
    Tensor {
        /// The file.
        path: PathBuf,
        /// The tensor's name.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// The device failed while copying tensors.
    #[error(transparent)]
    Amp(#[from] AmpError),
}

macro_rules! st_dtypes {
    ($([$marker:ident, $elem:ty, $variant:ident, $name:literal, $st:ident, $index:literal])*) => {
        /// The safetensors dtype a precision is stored as.
        fn st_dtype(dtype: DType) -> StDtype {
            match dtype {
                $(DType::$variant => StDtype::$st,)*
            }
        }

        /// The precision a safetensors dtype holds, if typed-amp trains in it.
        fn dtype_of_st(dtype: StDtype) -> Option<DType> {
            match dtype {
                $(StDtype::$st => Some(DType::$variant),)*
                _ => None,
            }
        }
    };
}

crate::with_precisions!(st_dtypes);

/// A tensor ready to serialise.
struct Entry {
    dtype: DType,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

/// The entry for `values` of a tensor shaped like `param`, in its own precision, bit for bit.
fn entry<S: Shape, E: AmpElem, D: AmpDevice + Kernels<E>>(
    param: &Tensor<S, E, D>,
    values: &[E],
) -> Entry {
    Entry {
        dtype: dtype_of::<E>(),
        shape: param.shape().concrete().into_iter().collect(),
        bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

fn state_precision_mismatch(path: &str) -> AmpError {
    AmpError::ParamMismatch {
        path: path.to_string(),
        detail: "the optimizer's state is in another precision than the parameter".to_string(),
    }
}

/// Collects `prefix.<path>` entries for every parameter of a model.
struct SaveParams<'e> {
    prefix: &'static str,
    entries: &'e mut BTreeMap<String, Entry>,
}

impl<D: AmpDevice> ParamVisitor<D> for SaveParams<'_> {
    type Error = AmpError;
    fn visit<S: Shape, E: AmpElem>(
        &mut self,
        path: &str,
        param: &Tensor<S, E, D>,
        _trainable: bool,
    ) -> Result<(), AmpError>
    where
        D: Kernels<E>,
    {
        let values =
            HostKernel::<E>::try_read(param.device(), param.storage()).map_err(AmpError::device)?;
        self.entries
            .insert(format!("{}.{path}", self.prefix), entry(param, &values));
        Ok(())
    }
}

/// Collects `optim.<store>.<path>` entries for every trainable master parameter.
struct SaveState<'s, 'e> {
    stores: &'s [(&'static str, StateRef<'s>)],
    entries: &'e mut BTreeMap<String, Entry>,
}

impl<D: AmpDevice> ParamVisitor<D> for SaveState<'_, '_> {
    type Error = AmpError;
    fn visit<S: Shape, E: AmpElem>(
        &mut self,
        path: &str,
        param: &Tensor<S, E, D>,
        trainable: bool,
    ) -> Result<(), AmpError>
    where
        D: Kernels<E>,
    {
        if !trainable {
            return Ok(());
        }
        let dev = param.device();
        for (name, store) in self.stores {
            let store = store
                .get::<E, D>()
                .ok_or_else(|| state_precision_mismatch(path))?;
            // A parameter the optimizer has not updated yet has no state.
            let Some(buf) = store.get_ref_checked(param) else {
                continue;
            };
            let values = HostKernel::<E>::try_read(dev, buf).map_err(AmpError::device)?;
            self.entries
                .insert(format!("optim.{name}.{path}"), entry(param, &values));
        }
        Ok(())
    }
}

fn scaler_metadata(state: &ScalerState, meta: &mut HashMap<String, String>) {
    let mode = match state.mode {
        ScaleMode::Dynamic => "dynamic",
        ScaleMode::Static => "static",
        ScaleMode::Disabled => "disabled",
    };
    let mut put = |k: &str, v: String| meta.insert(format!("scaler.{k}"), v);
    put("mode", mode.to_string());
    // Bit patterns keep the FP32 values exact.
    put("scale_bits", state.scale.to_bits().to_string());
    put(
        "growth_factor_bits",
        state.growth_factor.to_bits().to_string(),
    );
    put(
        "backoff_factor_bits",
        state.backoff_factor.to_bits().to_string(),
    );
    put("growth_interval", state.growth_interval.to_string());
    put("growth_tracker", state.growth_tracker.to_string());
    put("skipped_steps", state.skipped_steps.to_string());
    put(
        "min_scale_bits",
        state
            .min_scale
            .map_or(String::new(), |v| v.to_bits().to_string()),
    );
    put(
        "max_scale_bits",
        state
            .max_scale
            .map_or(String::new(), |v| v.to_bits().to_string()),
    );
    put("floor_patience", state.floor_patience.to_string());
    put("floor_hits", state.floor_hits.to_string());
}

/// Saves `target`'s master weights (buffers synced first), `optimizer`'s state, `scaler`'s
/// state and the caller's `extra` metadata to `path`, atomically. Returns the file's size.
pub fn save<D, T, O>(
    path: &Path,
    target: &mut T,
    optimizer: &O,
    scaler: &GradScaler,
    extra: &BTreeMap<String, String>,
) -> Result<u64, CheckpointError>
where
    D: AmpDevice,
    T: TrainTarget<D>,
    O: OptimizerState<D>,
{
    // Refuse to write what `load` would refuse to read.
    let refuse = |detail: String| CheckpointError::Mismatch {
        path: path.to_path_buf(),
        detail: format!("not saved: {detail}"),
    };
    GradScaler::from_state(scaler.state()).map_err(|e| refuse(e.to_string()))?;
    if let Some((name, value)) = optimizer.scalars().into_iter().find(|(_, v)| *v < 0) {
        return Err(refuse(format!("optimizer state `{name}` is {value}")));
    }
    target.sync_buffers_to_master()?;
    let mut entries = BTreeMap::new();
    target.master().visit_params(&mut SaveParams {
        prefix: "master",
        entries: &mut entries,
    })?;
    let stores = optimizer.stores();
    target.master().visit_params(&mut SaveState {
        stores: &stores,
        entries: &mut entries,
    })?;

    let mut meta: HashMap<String, String> = extra
        .iter()
        .map(|(k, v)| (format!("user.{k}"), v.clone()))
        .collect();
    meta.insert("format".into(), FORMAT.into());
    meta.insert(
        "model.precision".into(),
        <T::Precision as Precision>::DTYPE.name().into(),
    );
    meta.insert("optim.kind".into(), optimizer.kind().into());
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
                    detail: err.to_string(),
                })
        })
        .collect::<Result<_, _>>()?;
    let bytes = safetensors::tensor::serialize(views, &Some(meta)).map_err(|err| {
        CheckpointError::Format {
            path: path.to_path_buf(),
            detail: err.to_string(),
        }
    })?;
    write_atomically(path, &bytes)?;
    Ok(bytes.len() as u64)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    use std::io::Write;
    let io = |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| {
        io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a checkpoint path names a file",
        ))
    })?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    remove_stale_temporaries(dir, &name.to_string_lossy());
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

/// Removes the temporary files `.NAME.tmp-PID` that writes of `NAME` killed before their rename
/// left behind: those of processes that no longer run (known on Linux, through `/proc`;
/// elsewhere nothing is removed).
fn remove_stale_temporaries(dir: &Path, name: &str) {
    let prefix = format!(".{name}.tmp-");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let running = pid == std::process::id()
            || !cfg!(target_os = "linux")
            || Path::new("/proc").join(pid.to_string()).exists();
        if !running {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Writes `prefix.<path>` tensors of a checkpoint into the visited parameters.
struct LoadParams<'a> {
    file: &'a Path,
    tensors: &'a SafeTensors<'a>,
    prefix: &'static str,
}

/// The values of tensor `name`, which must be stored in precision `E` with `param`'s shape.
fn tensor_values<S: Shape, E: AmpElem, D: AmpDevice + Kernels<E>>(
    file: &Path,
    tensors: &SafeTensors<'_>,
    name: &str,
    param: &Tensor<S, E, D>,
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
        None => return Err(err(format!("unsupported dtype {:?}", view.dtype()))),
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
    // Masters, statistics and optimizer moments are finite in any state `save` writes: a step
    // with a non-finite gradient is skipped before anything changes.
    if let Some(i) = values.iter().position(|v| !AmpElem::to_f32(*v).is_finite()) {
        return Err(err(format!(
            "holds a non-finite value ({} at element {i})",
            AmpElem::to_f32(values[i])
        )));
    }
    Ok(values)
}

/// Checks, before anything is written, that the checkpoint holds every master tensor and a
/// complete optimizer state (for each store, every trainable parameter's entry or none: none
/// means saved before the optimizer's first update), each in the right precision and shape,
/// and finite.
struct CheckTensors<'a> {
    file: &'a Path,
    tensors: &'a SafeTensors<'a>,
    /// Per optimizer store: its name, and the first trainable path with and without an entry.
    stores: Vec<(&'static str, Option<String>, Option<String>)>,
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
        tensor_values(self.file, self.tensors, &format!("master.{path}"), param)?;
        if !trainable {
            return Ok(());
        }
        for (store, with, without) in &mut self.stores {
            let name = format!("optim.{store}.{path}");
            if self.tensors.tensor(&name).is_ok() {
                tensor_values(self.file, self.tensors, &name, param)?;
                with.get_or_insert_with(|| name.clone());
            } else {
                without.get_or_insert(name);
            }
        }
        Ok(())
    }
}

impl<D: AmpDevice> ParamVisitorMut<D> for LoadParams<'_> {
    type Error = CheckpointError;
    fn visit_mut<S: Shape, E: AmpElem>(
        &mut self,
        path: &str,
        param: &mut Tensor<S, E, D>,
        _trainable: bool,
    ) -> Result<(), CheckpointError>
    where
        D: Kernels<E>,
    {
        let name = format!("{}.{path}", self.prefix);
        let values = tensor_values(self.file, self.tensors, &name, &*param)?;
        let dev = param.device().clone();
        HostKernel::<E>::try_write(&dev, param.storage_mut(), &values)
            .map_err(|e| CheckpointError::Amp(AmpError::device(e)))
    }
}

/// Writes `optim.<store>.<path>` tensors into the optimizer's stores, per trainable parameter.
struct LoadState<'s, 'a> {
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
            let values = tensor_values(self.file, self.tensors, &name, param)?;
            let store = store
                .get::<E, D>()
                .ok_or_else(|| state_precision_mismatch(path))?;
            let buf = store.get_or_alloc_mut(param).map_err(AmpError::device)?;
            HostKernel::<E>::try_write(dev, buf, &values).map_err(AmpError::device)?;
        }
        Ok(())
    }
}

fn parse_scaler(
    path: &Path,
    meta: &HashMap<String, String>,
) -> Result<ScalerState, CheckpointError> {
    let bad = |key: &str| CheckpointError::Mismatch {
        path: path.to_path_buf(),
        detail: format!("scaler state `{key}` is missing or malformed"),
    };
    let get = |key: &str| meta.get(&format!("scaler.{key}")).ok_or_else(|| bad(key));
    let num =
        |key: &str| -> Result<u64, CheckpointError> { get(key)?.parse().map_err(|_| bad(key)) };
    let bits = |key: &str| -> Result<f32, CheckpointError> {
        Ok(f32::from_bits(
            u32::try_from(num(key)?).map_err(|_| bad(key))?,
        ))
    };
    let optional_bits = |key: &str| -> Result<Option<f32>, CheckpointError> {
        match get(key)?.as_str() {
            "" => Ok(None),
            text => Ok(Some(f32::from_bits(text.parse().map_err(|_| bad(key))?))),
        }
    };
    let mode = match get("mode")?.as_str() {
        "dynamic" => ScaleMode::Dynamic,
        "static" => ScaleMode::Static,
        "disabled" => ScaleMode::Disabled,
        _ => return Err(bad("mode")),
    };
    Ok(ScalerState {
        mode,
        scale: bits("scale_bits")?,
        growth_factor: bits("growth_factor_bits")?,
        backoff_factor: bits("backoff_factor_bits")?,
        growth_interval: u32::try_from(num("growth_interval")?)
            .map_err(|_| bad("growth_interval"))?,
        growth_tracker: u32::try_from(num("growth_tracker")?).map_err(|_| bad("growth_tracker"))?,
        skipped_steps: num("skipped_steps")?,
        min_scale: optional_bits("min_scale_bits")?,
        max_scale: optional_bits("max_scale_bits")?,
        floor_patience: u32::try_from(num("floor_patience")?).map_err(|_| bad("floor_patience"))?,
        floor_hits: u32::try_from(num("floor_hits")?).map_err(|_| bad("floor_hits"))?,
    })
}

/// The caller's metadata of a checkpoint written by [`save`] (what `extra` held), without
/// loading anything: to check a run's settings against it before [`load`].
pub fn read_metadata(path: &Path) -> Result<BTreeMap<String, String>, CheckpointError> {
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| CheckpointError::Format {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })?;
    Ok(user_metadata(header.metadata().clone().unwrap_or_default()))
}

fn user_metadata(meta: HashMap<String, String>) -> BTreeMap<String, String> {
    meta.into_iter()
        .filter_map(|(k, v)| k.strip_prefix("user.").map(|k| (k.to_string(), v)))
        .collect()
}

/// Restores a checkpoint written by [`save`] into `target`, `optimizer` and `scaler`, and
/// returns the caller's metadata. Everything is checked before anything is changed except the
/// tensors themselves: on a tensor error the model may be partly loaded, so load into a freshly
/// built model.
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
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let format_err = |detail: String| CheckpointError::Format {
        path: path.to_path_buf(),
        detail,
    };
    let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| format_err(e.to_string()))?;
    let tensors = SafeTensors::deserialize(&bytes).map_err(|e| format_err(e.to_string()))?;
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
    let scaler_state = parse_scaler(path, &meta)?;
    GradScaler::from_state(scaler_state).map_err(|e| mismatch(e.to_string()))?;
    if scaler_state.mode != scaler.mode() {
        // An O0 checkpoint would otherwise switch an O2 run's dynamic scaling off.
        return Err(mismatch(format!(
            "the checkpoint's loss scaler is {:?}, this run's is {:?}",
            scaler_state.mode,
            scaler.mode()
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
            .map(|(name, _)| (name, None, None))
            .collect(),
    };
    target.master().visit_params(&mut check)?;
    for (_, with, without) in check.stores {
        if let (Some(present), Some(missing)) = (with, without) {
            return Err(CheckpointError::Tensor {
                path: path.to_path_buf(),
                name: missing,
                detail: format!(
                    "missing from the checkpoint, which has the optimizer's state for other parameters (`{present}`)"
                ),
            });
        }
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
    Ok(user_metadata(meta))
}
