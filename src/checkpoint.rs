//! Checkpoints: master weights, optimizer state and loss-scaler state in one safetensors file,
//! written atomically, restored exactly.
//!
//! Tensors are named by parameter path: `master.<path>` (every master parameter and buffer, in
//! its own precision), `optim.<store>.<path>` (e.g. `optim.moment1.fc1.weight`). Everything
//! else is string metadata: the format, the scaler's state (`scaler.*`), the optimizer's kind
//! and scalars (`optim.*`), the precision of every master and working parameter
//! (`model.master`, `model.working`), the `#[amp]` policy where the caller gives it
//! ([`save_with_policy`]: `policy.*`), and whatever the caller adds (step, epoch, RNG state,
//! ...). Any safetensors reader can read the tensors by name.
//!
//! The file is written next to its destination and renamed over it, so a crash leaves either
//! the old checkpoint or the new one, never a torn file.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use dfdx::prelude::{HasShape, Shape, Tensor};
use safetensors::tensor::TensorView;
use safetensors::{Dtype as StDtype, SafeTensorError, SafeTensors};

use crate::amp::{AmpConfig, LossScale, OptLevel};
use crate::device::{AmpDevice, HostKernel, Kernels};
use crate::error::AmpError;
use crate::master::TrainTarget;
use crate::optim::{OptimizerState, StateMut, StateRef};
use crate::params::{ParamInfo, ParamVisitor, ParamVisitorMut, Parameters};
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
    #[error("{path} is not a safetensors checkpoint: {detail}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The file is a checkpoint of something else (another format version, policy, model or
    /// optimizer).
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

/// A safetensors dtype as a sentence names it (`f32`, `bf16`, `i64`).
fn st_dtype_name(dtype: StDtype) -> String {
    format!("{dtype:?}").to_lowercase()
}

/// Why safetensors refused `bytes`, as the end of a sentence about the file: safetensors' own
/// messages are its enum's variant names (`MetadataIncompleteBuffer`).
fn format_detail(err: &SafeTensorError, bytes: &[u8]) -> String {
    let len = bytes.len();
    // What the first 8 bytes claim the header's length is.
    let claimed = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes);
    let header_too_long = || {
        format!(
            "its header is larger than the file (the header's length field says {claimed} bytes, the file has {len}): it is truncated or not a checkpoint"
        )
    };
    match err {
        SafeTensorError::HeaderTooSmall => format!(
            "it is {len} bytes long, too short to hold even the 8 bytes that give a safetensors header's length"
        ),
        SafeTensorError::HeaderTooLarge if claimed > len as u64 => header_too_long(),
        SafeTensorError::HeaderTooLarge => format!(
            "its header's length field says {claimed} bytes, more than the 100,000,000 safetensors reads"
        ),
        SafeTensorError::InvalidHeaderLength => header_too_long(),
        SafeTensorError::InvalidHeader => "its header is not UTF-8 text".to_string(),
        SafeTensorError::InvalidHeaderStart => "its header does not start with `{`".to_string(),
        SafeTensorError::InvalidHeaderDeserialization => {
            "its header is not the JSON table of tensors a safetensors file starts with".to_string()
        }
        SafeTensorError::JsonError(e) => format!("its header is not valid JSON ({e})"),
        SafeTensorError::MetadataIncompleteBuffer => format!(
            "the tensors its header lists do not end where the file ends ({len} bytes): it is truncated or has bytes appended"
        ),
        SafeTensorError::ValidationOverflow => {
            "a tensor's shape in its header is too large to be stored".to_string()
        }
        SafeTensorError::TensorInvalidInfo => {
            "a tensor's byte range in its header does not fit its shape and precision".to_string()
        }
        SafeTensorError::InvalidOffset(name) => format!(
            "the byte range of tensor `{name}` in its header overlaps another tensor's or leaves a gap"
        ),
        SafeTensorError::TensorNotFound(name) => format!("it has no tensor `{name}`"),
        SafeTensorError::IoError(e) => format!("it could not be read ({e})"),
        SafeTensorError::InvalidTensorView(dtype, shape, bytes) => format!(
            "{bytes} bytes cannot hold a {} tensor of shape {shape:?}",
            st_dtype_name(*dtype)
        ),
    }
}

/// Each parameter's path and precision, as `model.master` and `model.working` store them:
/// `path:DTYPE` joined by commas.
fn layout_metadata(layout: &[ParamInfo]) -> String {
    layout
        .iter()
        .map(|p| format!("{}:{}", p.path, p.dtype.name()))
        .collect::<Vec<_>>()
        .join(",")
}

/// The first parameter both layouts hold in different precisions: its path, the checkpoint's
/// precision and the model's. Parameters only one side has are left to the tensor checks,
/// which name them.
fn layout_difference(saved: &str, model: &[ParamInfo]) -> Option<(String, String, DType)> {
    let saved: HashMap<&str, &str> = saved
        .split(',')
        .filter_map(|entry| entry.rsplit_once(':'))
        .collect();
    model.iter().find_map(|p| match saved.get(p.path.as_str()) {
        Some(dtype) if *dtype != p.dtype.name() => {
            Some((p.path.clone(), (*dtype).to_string(), p.dtype))
        }
        _ => None,
    })
}

fn dtype_setting(dtype: Option<DType>) -> &'static str {
    dtype.map_or("none", DType::name)
}

fn loss_scale_setting(scale: LossScale) -> String {
    match scale {
        LossScale::None => "none".to_string(),
        LossScale::Dynamic => "dynamic".to_string(),
        // The bit pattern keeps the FP32 value exact; `static N` says it for people.
        LossScale::Static(s) => format!("static {s} bits {}", s.to_bits()),
    }
}

/// Every setting of a policy, by name, as checkpoints store them (`policy.<name>`).
fn policy_settings(config: &AmpConfig) -> [(&'static str, String); 7] {
    [
        ("opt_level", config.opt_level.to_string()),
        ("dtype", dtype_setting(config.dtype).to_string()),
        ("master_weights", config.master_weights.to_string()),
        (
            "keep_batchnorm_fp32",
            config.keep_batchnorm_fp32.to_string(),
        ),
        ("loss_scale", loss_scale_setting(config.loss_scale)),
        (
            "cast_model_outputs",
            dtype_setting(config.cast_model_outputs).to_string(),
        ),
        (
            "low_precision_updates",
            config.low_precision_updates.to_string(),
        ),
    ]
}

/// The policy a checkpoint was saved under: `None` for a checkpoint saved without one
/// ([`save`], or before checkpoints recorded it).
fn saved_policy(
    path: &Path,
    meta: &HashMap<String, String>,
) -> Result<Option<AmpConfig>, CheckpointError> {
    if !meta.keys().any(|k| k.starts_with("policy.")) {
        return Ok(None);
    }
    let bad = |key: &str| CheckpointError::Mismatch {
        path: path.to_path_buf(),
        detail: format!("policy setting `{key}` is missing or malformed"),
    };
    let get = |key: &str| {
        meta.get(&format!("policy.{key}"))
            .cloned()
            .ok_or_else(|| bad(key))
    };
    let dtype = |key: &str| -> Result<Option<DType>, CheckpointError> {
        match get(key)?.as_str() {
            "none" => Ok(None),
            name => DType::from_name(name).map(Some).ok_or_else(|| bad(key)),
        }
    };
    let flag =
        |key: &str| -> Result<bool, CheckpointError> { get(key)?.parse().map_err(|_| bad(key)) };
    let loss_scale = match get("loss_scale")?.as_str() {
        "none" => LossScale::None,
        "dynamic" => LossScale::Dynamic,
        text => text
            .rsplit_once(" bits ")
            .and_then(|(_, bits)| bits.parse().ok())
            .map(|bits| LossScale::Static(f32::from_bits(bits)))
            .ok_or_else(|| bad("loss_scale"))?,
    };
    let config = AmpConfig {
        opt_level: get("opt_level")?
            .parse::<OptLevel>()
            .map_err(|_| bad("opt_level"))?,
        dtype: dtype("dtype")?,
        master_weights: flag("master_weights")?,
        keep_batchnorm_fp32: flag("keep_batchnorm_fp32")?,
        loss_scale,
        cast_model_outputs: dtype("cast_model_outputs")?,
        low_precision_updates: flag("low_precision_updates")?,
    };
    Ok(Some(config))
}

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
///
/// The file records the precision of every master and working parameter, which [`load`]
/// checks; for an `#[amp]` model, [`save_with_policy`] records its whole policy too.
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
    save_checkpoint(path, target, optimizer, scaler, None, extra)
}

/// [`save`] for a model declared with `#[amp]`, recording its `policy` (`Model::AMP_CONFIG`):
/// opt level, dtype, master weights, FP32 batch norm, loss scale, output cast and low-precision
/// updates, which [`load_with_policy`] compares with the loading model's.
pub fn save_with_policy<D, T, O>(
    path: &Path,
    target: &mut T,
    optimizer: &O,
    scaler: &GradScaler,
    policy: &AmpConfig,
    extra: &BTreeMap<String, String>,
) -> Result<u64, CheckpointError>
where
    D: AmpDevice,
    T: TrainTarget<D>,
    O: OptimizerState<D>,
{
    save_checkpoint(path, target, optimizer, scaler, Some(policy), extra)
}

fn save_checkpoint<D, T, O>(
    path: &Path,
    target: &mut T,
    optimizer: &O,
    scaler: &GradScaler,
    policy: Option<&AmpConfig>,
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
    for (store, _) in &stores {
        let prefix = format!("optim.{store}.");
        let count = entries.keys().filter(|k| k.starts_with(&prefix)).count();
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
    let bytes = safetensors::tensor::serialize(views, &Some(meta))
        .map_err(|err| refuse(format_detail(&err, &[])))?;
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
/// complete optimizer state (for each store, every trainable parameter's entry, or none where
/// it was saved before the optimizer's first update: its `optim.entries.<store>` says 0), each
/// in the right precision and shape, and finite.
struct CheckTensors<'a> {
    file: &'a Path,
    tensors: &'a SafeTensors<'a>,
    /// Per optimizer store: its name, the first trainable path with and without an entry, and
    /// how many have one.
    stores: Vec<(&'static str, Option<String>, Option<String>, usize)>,
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
        for (store, with, without, present) in &mut self.stores {
            let name = format!("optim.{store}.{path}");
            if self.tensors.tensor(&name).is_ok() {
                tensor_values(self.file, self.tensors, &name, param)?;
                with.get_or_insert_with(|| name.clone());
                *present += 1;
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
        detail: format_detail(&e, &bytes),
    })?;
    Ok(user_metadata(header.metadata().clone().unwrap_or_default()))
}

fn user_metadata(meta: HashMap<String, String>) -> BTreeMap<String, String> {
    meta.into_iter()
        .filter_map(|(k, v)| k.strip_prefix("user.").map(|k| (k.to_string(), v)))
        .collect()
}

/// Restores a checkpoint written by [`save`] into `target`, `optimizer` and `scaler`, and
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
/// checkpoint saved with [`save_with_policy`] under another policy is refused, naming each
/// setting that differs with both values. (One saved without a policy is checked as [`load`]
/// checks it.)
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

fn load_checkpoint<D, T, O>(
    path: &Path,
    target: &mut T,
    optimizer: &mut O,
    scaler: &mut GradScaler,
    policy: Option<&AmpConfig>,
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
    if let (Some(saved), Some(policy)) = (&saved, policy) {
        let differences: Vec<String> = policy_settings(saved)
            .iter()
            .zip(policy_settings(policy))
            .filter(|((_, a), (_, b))| *a != *b)
            .map(|((key, a), (_, b))| {
                // A static scale's bit pattern is for exactness, not for people.
                let shown = |v: &str| v.split(" bits ").next().unwrap_or_default().to_string();
                format!(
                    "{key} is {} in the checkpoint, {} here",
                    shown(a),
                    shown(&b)
                )
            })
            .collect();
        if !differences.is_empty() {
            return Err(mismatch(format!(
                "saved under {saved}, this model is {policy}: {}",
                differences.join("; ")
            )));
        }
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
            .map(|(name, _)| (name, None, None, 0))
            .collect(),
    };
    target.master().visit_params(&mut check)?;
    for (store, with, without, present) in check.stores {
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
