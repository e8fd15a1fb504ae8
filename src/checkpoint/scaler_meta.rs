//! The loss scaler's state as checkpoint metadata (`scaler.*`), written and parsed back.

use std::collections::HashMap;
use std::path::Path;

use crate::scaler::{ScaleMode, ScalerState};

use super::error::CheckpointError;

pub(super) fn scaler_metadata(state: &ScalerState, meta: &mut HashMap<String, String>) {
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

pub(super) fn parse_scaler(
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
