//! A file holding a trained GPT: a checkpoint of `typed-amp train --model gpt`, or an export of
//! one (`typed-amp export`); what it says of its model, and loading its weights into one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use typed_amp::amp::OptLevel;
use typed_amp::checkpoint;
use typed_amp::device::{AmpDevice, HostKernel, Kernels};
use typed_amp::error::AmpError;
use typed_amp::master::TrainTarget;
use typed_amp::params::{Mutable, ParamVisitor, Parameters};
use typed_amp::precision::AmpElem;
use typed_amp::prelude::*;
use typed_amp_models::gpt::{GptModel, GptSize, VOCAB};

use super::train::adamw_recipe;
use crate::config::RunError;
use crate::models::LowDtype;

/// The `format` an export's metadata names.
pub const EXPORT_FORMAT: &str = "typed-amp export";

/// What kind of file holds the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A training checkpoint: FP32 master weights, optimizer and scaler state.
    Checkpoint,
    /// An export: the weights alone, in 16 bits.
    Export,
}

/// A file holding a GPT, and what its metadata says of it.
#[derive(Debug, Clone)]
pub(crate) struct GptFile {
    pub path: PathBuf,
    pub kind: Kind,
    pub size: GptSize,
    /// The policy to build the model under: the checkpoint's, or O2 for an export.
    pub policy: OptLevel,
    /// The 16-bit precision (a checkpoint's under O2, an export's).
    pub dtype: LowDtype,
    /// The vocabulary, in id order.
    pub vocab: Vec<char>,
    /// The checkpoint's caller metadata, or the export's metadata.
    pub meta: BTreeMap<String, String>,
}

/// The raw metadata of the safetensors file at `path` (the file read whole).
pub(crate) fn raw_metadata(path: &Path) -> Result<(Vec<u8>, BTreeMap<String, String>), RunError> {
    let bytes = std::fs::read(path)
        .map_err(|e| RunError::File(format!("{}: cannot read the file: {e}", path.display())))?;
    let (_, header) = SafeTensors::read_metadata(&bytes)
        .map_err(|e| RunError::File(format!("{}: not a safetensors file ({e})", path.display())))?;
    let meta = header
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    Ok((bytes, meta))
}

/// Reads what `path` says of its GPT. A file that is neither a GPT's checkpoint nor an export
/// is an error naming it.
pub(crate) fn inspect(path: &Path) -> Result<GptFile, RunError> {
    let (_, raw) = raw_metadata(path)?;
    let foreign = |what: String| {
        RunError::File(format!(
            "{} is not a checkpoint of `typed-amp train --model gpt` nor a `typed-amp export` of one: {what}",
            path.display()
        ))
    };
    let (kind, meta) = if raw.get("format").map(String::as_str) == Some(EXPORT_FORMAT) {
        (Kind::Export, raw)
    } else {
        let user: BTreeMap<String, String> = raw
            .into_iter()
            .filter_map(|(k, v)| k.strip_prefix("user.").map(|k| (k.to_string(), v)))
            .collect();
        (Kind::Checkpoint, user)
    };
    match meta.get("model") {
        Some(model) if model == "gpt" => {}
        Some(model) => return Err(foreign(format!("it holds a model `{model}`"))),
        None => return Err(foreign("its metadata names no model".to_string())),
    }
    let get = |key: &str| {
        meta.get(key)
            .ok_or_else(|| foreign(format!("its metadata has no `{key}`")))
    };
    let size: GptSize = get("gpt_size")?.parse().map_err(foreign)?;
    let vocab: Vec<char> = get("vocab")?.chars().collect();
    if vocab.is_empty() || vocab.len() > VOCAB || !vocab.windows(2).all(|w| w[0] < w[1]) {
        return Err(foreign(format!(
            "its vocabulary is not 1 to {VOCAB} distinct characters in order"
        )));
    }
    let (policy, dtype) = match kind {
        Kind::Export => (
            OptLevel::O2,
            parse_export_dtype(get("dtype")?).map_err(foreign)?,
        ),
        Kind::Checkpoint => {
            let policy: OptLevel = get("policy")?
                .parse()
                .map_err(|e: AmpError| foreign(e.to_string()))?;
            super::config::check_policy(policy).map_err(|e| foreign(e.to_string()))?;
            let dtype = match get("dtype")?.as_str() {
                "fp32" => LowDtype::Fp16,
                other => other.parse().map_err(foreign)?,
            };
            (policy, dtype)
        }
    };
    Ok(GptFile {
        path: path.to_path_buf(),
        kind,
        size,
        policy,
        dtype,
        vocab,
        meta,
    })
}

/// An export's dtype on the command line and in its metadata: `f16` (or `fp16`), `bf16`.
pub fn parse_export_dtype(text: &str) -> Result<LowDtype, String> {
    match text {
        "f16" | "fp16" => Ok(LowDtype::Fp16),
        "bf16" => Ok(LowDtype::Bf16),
        other => Err(format!("unknown dtype `{other}`: expected f16 or bf16")),
    }
}

/// The name an export's metadata gives `dtype`.
pub(crate) fn export_dtype_name(dtype: LowDtype) -> &'static str {
    match dtype {
        LowDtype::Fp16 => "f16",
        LowDtype::Bf16 => "bf16",
    }
}

/// Loads `file`'s weights into `model`, built as `M` from what `file` says: a checkpoint
/// through the library's checked load (every setting, precision and tensor checked), an
/// export into the master weights by name, then the working copy refreshed from them.
pub(crate) fn load_weights<M, D>(file: &GptFile, model: &mut M::Weights) -> Result<(), RunError>
where
    D: AmpDevice,
    M: GptModel<D>,
{
    match file.kind {
        Kind::Checkpoint => {
            let mut opt = typed_amp::optim::adam(model.master(), adamw_recipe(1e-3));
            let mut scaler = M::scaler();
            checkpoint::load_with_policy(&file.path, model, &mut opt, &mut scaler, &M::CONFIG)?;
        }
        Kind::Export => {
            let (bytes, _) = raw_metadata(&file.path)?;
            let tensors = SafeTensors::deserialize(&bytes).map_err(|e| {
                RunError::File(format!(
                    "{}: not a safetensors file ({e})",
                    file.path.display()
                ))
            })?;
            let mut load = LoadExport {
                file: &file.path,
                tensors: &tensors,
                loaded: 0,
            };
            model.master_mut().visit_params_mut(&mut load)?;
            if load.loaded != tensors.len() {
                let known: Vec<String> = model.layout().iter().map(|p| p.path.clone()).collect();
                let extra = tensors
                    .names()
                    .into_iter()
                    .find(|n| !known.contains(n))
                    .map_or_else(String::new, |n| format!(" (such as `{n}`)"));
                return Err(RunError::File(format!(
                    "{} holds {} tensors, the {} GPT has {} parameters{extra}",
                    file.path.display(),
                    tensors.len(),
                    file.size.name(),
                    load.loaded
                )));
            }
            model.refresh()?;
        }
    }
    Ok(())
}

/// Writes an export's 16-bit tensors, widened exactly, into the master's parameters of the
/// same names.
struct LoadExport<'a> {
    file: &'a Path,
    tensors: &'a SafeTensors<'a>,
    loaded: usize,
}

impl<D: AmpDevice> ParamVisitor<D, Mutable> for LoadExport<'_> {
    type Error = RunError;
    fn visit<S: Shape, E: AmpElem>(
        &mut self,
        path: &str,
        param: &mut Tensor<S, E, D>,
        _trainable: bool,
    ) -> Result<(), RunError>
    where
        D: Kernels<E>,
    {
        let bad = |detail: String| {
            RunError::File(format!(
                "{}: tensor `{path}`: {detail}",
                self.file.display()
            ))
        };
        let view = self
            .tensors
            .tensor(path)
            .map_err(|_| bad("missing from the export".to_string()))?;
        let shape: Vec<usize> = param.shape().concrete().into_iter().collect();
        if view.shape() != shape.as_slice() {
            return Err(bad(format!(
                "shape {:?} in the export, {shape:?} in the model",
                view.shape()
            )));
        }
        let widen: fn([u8; 2]) -> f32 = match view.dtype() {
            Dtype::F16 => |b| f16::from_le_bytes(b).to_f32(),
            Dtype::BF16 => |b| bf16::from_le_bytes(b).to_f32(),
            other => return Err(bad(format!("{other:?}, not F16 or BF16"))),
        };
        let values: Vec<E> = view
            .data()
            .chunks_exact(2)
            .map(|b| <E as AmpElem>::from_f32(widen([b[0], b[1]])))
            .collect();
        let dev = param.device().clone();
        HostKernel::<E>::try_write(&dev, param.storage_mut(), &values)
            .map_err(|e| RunError::Amp(AmpError::device(e)))?;
        self.loaded += 1;
        Ok(())
    }
}
