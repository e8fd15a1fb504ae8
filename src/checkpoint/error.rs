//! What can go wrong saving or loading a checkpoint, and how safetensors' refusals are told.

use std::path::PathBuf;

use safetensors::SafeTensorError;

use crate::error::AmpError;

use super::format::st_dtype_name;

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
    /// `save` refused to write a state that `load` would refuse: a non-finite master or
    /// optimizer value, or one that breaks its store's invariant. Nothing was written: an
    /// earlier checkpoint at `path` is as it was.
    #[error("{path}: tensor `{name}`: not saved: it {detail}")]
    NotSaved {
        /// The file that was not written.
        path: PathBuf,
        /// The tensor's name.
        name: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The state breaks one of typed-amp's rules: a checkpoint's static loss scale above FP16's
    /// largest value (load), or a step whose outcome never reached the scaler's update (save):
    /// the rule's own error, with the file.
    #[error("{path}: {source}")]
    Rule {
        /// The file.
        path: PathBuf,
        /// The rule's error.
        source: AmpError,
    },
    /// The state of the model's FP8 recipe (its amax histories) is missing from a checkpoint
    /// of an FP8 model, or damaged (a value that is not a finite magnitude, a shape that does
    /// not fit): its scales cannot be resumed. Refused on load, and on save before anything is
    /// written.
    #[error("{path}: the FP8 recipe's state (`fp8.amax_history`) {detail}")]
    Fp8State {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The device failed while copying tensors.
    #[error(transparent)]
    Amp(#[from] AmpError),
}

/// Why safetensors refused `bytes`, as the end of a sentence about the file: safetensors' own
/// messages are its enum's variant names (`MetadataIncompleteBuffer`).
pub(super) fn format_detail(err: &SafeTensorError, bytes: &[u8]) -> String {
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

pub(super) fn state_precision_mismatch(path: &str) -> AmpError {
    AmpError::ParamMismatch {
        path: path.to_string(),
        detail: "the optimizer's state is in another precision than the parameter".to_string(),
    }
}
