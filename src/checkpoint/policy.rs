//! The policy metadata of a checkpoint: each parameter's precision (`model.master`,
//! `model.working`) and the `#[amp]` policy's settings (`policy.*`), written and read back.

use std::collections::HashMap;
use std::path::Path;

use crate::amp::{AmpConfig, LossScale, OptLevel};
use crate::params::ParamInfo;
use crate::precision::DType;

use super::error::CheckpointError;

/// Each parameter's path and precision, as `model.master` and `model.working` store them:
/// `path:DTYPE` joined by commas.
pub(super) fn layout_metadata(layout: &[ParamInfo]) -> String {
    layout
        .iter()
        .map(|p| format!("{}:{}", p.path, p.dtype.name()))
        .collect::<Vec<_>>()
        .join(",")
}

/// The first parameter both layouts hold in different precisions: its path, the checkpoint's
/// precision and the model's. Parameters only one side has are left to the tensor checks,
/// which name them.
pub(super) fn layout_difference(
    saved: &str,
    model: &[ParamInfo],
) -> Option<(String, String, DType)> {
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

pub(super) fn dtype_setting(dtype: Option<DType>) -> &'static str {
    dtype.map_or("none", DType::name)
}

pub(super) fn loss_scale_setting(scale: LossScale) -> String {
    match scale {
        LossScale::None => "none".to_string(),
        LossScale::Dynamic => "dynamic".to_string(),
        // The bit pattern keeps the FP32 value exact; `static N` says it for people.
        LossScale::Static(s) => format!("static {s} bits {}", s.to_bits()),
    }
}

/// Every setting of a policy, by name, as checkpoints store them (`policy.<name>`).
pub(super) fn policy_settings(config: &AmpConfig) -> [(&'static str, String); 8] {
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
        ("fp8", config.fp8.map_or("none", |r| r.name()).to_string()),
    ]
}

/// Each setting in which `theirs` (named `theirs_are`) and `ours` (named `ours_are`) differ,
/// as `key is A in the checkpoint, B here`.
pub(super) fn policy_differences(
    theirs: &AmpConfig,
    ours: &AmpConfig,
    theirs_are: &str,
    ours_are: &str,
) -> Vec<String> {
    policy_settings(theirs)
        .iter()
        .zip(policy_settings(ours))
        .filter(|((_, a), (_, b))| *a != *b)
        .map(|((key, a), (_, b))| {
            // A static scale's bit pattern is for exactness, not for people.
            let shown = |v: &str| v.split(" bits ").next().unwrap_or_default().to_string();
            format!(
                "{key} is {} {theirs_are}, {} {ours_are}",
                shown(a),
                shown(&b)
            )
        })
        .collect()
}

/// The policy a model is checked against: the one `#[amp]` built it under (`built`), else the
/// one its caller passed (`given`). Errors, before anything is read or written, if both are
/// known and differ: the caller passed another model's policy.
pub(super) fn model_policy(
    path: &Path,
    built: Option<AmpConfig>,
    given: Option<&AmpConfig>,
) -> Result<Option<AmpConfig>, CheckpointError> {
    match (built, given) {
        (Some(built), Some(given)) => {
            let differences =
                policy_differences(given, &built, "in the policy passed", "in the model");
            if differences.is_empty() {
                Ok(Some(built))
            } else {
                Err(CheckpointError::Mismatch {
                    path: path.to_path_buf(),
                    detail: format!(
                        "the policy passed ({given}) is not this model's: it was built under {built} ({}); pass the model's own `AMP_CONFIG`",
                        differences.join("; ")
                    ),
                })
            }
        }
        (built, given) => Ok(built.or(given.copied())),
    }
}

/// The policy a checkpoint was saved under: `None` for a checkpoint saved without one
/// ([`save`], or before checkpoints recorded it).
pub(super) fn saved_policy(
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
        // Written before FP8 recipes existed: none.
        fp8: match meta.get("policy.fp8").map(String::as_str) {
            None | Some("none") => None,
            Some("hybrid") => Some(crate::amp::Fp8Linear::Hybrid),
            Some("hybrid-current") => Some(crate::amp::Fp8Linear::HybridCurrent),
            Some(_) => return Err(bad("fp8")),
        },
    };
    Ok(Some(config))
}
