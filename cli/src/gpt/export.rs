//! `typed-amp export`: a GPT checkpoint's weights alone, in 16 bits, as a safetensors file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use typed_amp::half::{bf16, f16};

use super::source::{export_dtype_name, inspect, raw_metadata, Kind, EXPORT_FORMAT};
use crate::config::RunError;
use crate::models::LowDtype;

/// What an export wrote.
#[derive(Debug, Clone)]
pub struct ExportReport {
    /// The checkpoint exported.
    pub checkpoint: PathBuf,
    /// Its size.
    pub checkpoint_bytes: u64,
    /// Bytes of its master weights (FP32).
    pub master_bytes: u64,
    /// The export written.
    pub export: PathBuf,
    /// Its size.
    pub export_bytes: u64,
    /// Tensors written.
    pub tensors: usize,
}

/// Writes the master weights of the GPT checkpoint `checkpoint` to `out` in `dtype`, each
/// rounded once (to nearest, ties to even) from FP32, under their parameter names (`embed.wte`,
/// the table the head shares, once), with metadata: `format` = `typed-amp export`, `model` =
/// `gpt`, `gpt_size`, `vocab`, `dtype` (`f16` or `bf16`), and where it came from.
pub fn export(checkpoint: &Path, dtype: LowDtype, out: &Path) -> Result<ExportReport, RunError> {
    let file = inspect(checkpoint)?;
    if file.kind != Kind::Checkpoint {
        return Err(RunError::Usage(format!(
            "{} is an export already: export a training checkpoint",
            checkpoint.display()
        )));
    }
    let (bytes, _) = raw_metadata(checkpoint)?;
    let tensors = SafeTensors::deserialize(&bytes).map_err(|e| {
        RunError::File(format!(
            "{}: not a safetensors file ({e})",
            checkpoint.display()
        ))
    })?;
    let mut names: Vec<String> = tensors
        .names()
        .into_iter()
        .filter(|n| n.starts_with("master."))
        .cloned()
        .collect();
    names.sort();
    if names.is_empty() {
        return Err(RunError::File(format!(
            "{} holds no master weights",
            checkpoint.display()
        )));
    }
    let mut master_bytes = 0u64;
    let mut converted: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::with_capacity(names.len());
    for name in &names {
        let view = tensors
            .tensor(name)
            .map_err(|e| RunError::File(format!("{}: `{name}`: {e}", checkpoint.display())))?;
        if view.dtype() != Dtype::F32 {
            return Err(RunError::File(format!(
                "{}: `{name}` is {:?}, not F32 master weights",
                checkpoint.display(),
                view.dtype()
            )));
        }
        master_bytes += view.data().len() as u64;
        let values = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let data: Vec<u8> = match dtype {
            LowDtype::Fp16 => values
                .flat_map(|v| f16::from_f32(v).to_le_bytes())
                .collect(),
            LowDtype::Bf16 => values
                .flat_map(|v| bf16::from_f32(v).to_le_bytes())
                .collect(),
        };
        let stripped = name["master.".len()..].to_string();
        converted.push((stripped, view.shape().to_vec(), data));
    }
    let st_dtype = match dtype {
        LowDtype::Fp16 => Dtype::F16,
        LowDtype::Bf16 => Dtype::BF16,
    };
    let views = converted
        .iter()
        .map(|(name, shape, data)| {
            TensorView::new(st_dtype, shape.clone(), data)
                .map(|view| (name.clone(), view))
                .map_err(|e| RunError::File(format!("`{name}`: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let source = checkpoint
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let mut meta = HashMap::from([
        ("format".to_string(), EXPORT_FORMAT.to_string()),
        ("model".to_string(), "gpt".to_string()),
        ("gpt_size".to_string(), file.size.name().to_string()),
        ("vocab".to_string(), file.vocab.iter().collect()),
        ("dtype".to_string(), export_dtype_name(dtype).to_string()),
        ("exported_from".to_string(), source),
    ]);
    for key in ["policy", "dtype", "iteration", "iters", "seed"] {
        if let Some(value) = file.meta.get(key) {
            meta.insert(format!("trained.{key}"), value.clone());
        }
    }
    let write_err =
        |e: &dyn std::fmt::Display| RunError::File(format!("{}: cannot write: {e}", out.display()));
    let serialized = safetensors::serialize(views, &Some(meta)).map_err(|e| write_err(&e))?;
    // Written beside `out` and renamed over it: a failed write leaves no torn file.
    let name = out
        .file_name()
        .ok_or_else(|| RunError::Usage(format!("{}: not a file name", out.display())))?;
    let tmp = out.with_file_name(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&tmp, &serialized)
        .and_then(|()| std::fs::rename(&tmp, out))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            write_err(&e)
        })?;
    Ok(ExportReport {
        checkpoint: checkpoint.to_path_buf(),
        checkpoint_bytes: bytes.len() as u64,
        master_bytes,
        export: out.to_path_buf(),
        export_bytes: serialized.len() as u64,
        tensors: converted.len(),
    })
}
