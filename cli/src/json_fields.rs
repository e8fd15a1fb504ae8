//! Reading a child run's JSON report back: each field by name, with an error that names the
//! field that is missing or of the wrong type. Non-finite numbers were written as `null` (JSON
//! has no NaN) and read back as NaN.

use serde_json::Value;

/// The field `key` of `v`.
pub(crate) fn field<'a>(v: &'a Value, key: &str) -> Result<&'a Value, String> {
    v.get(key).ok_or_else(|| format!("no field `{key}`"))
}

/// A whole number.
pub(crate) fn u64_of(v: &Value, key: &str) -> Result<u64, String> {
    field(v, key)?
        .as_u64()
        .ok_or_else(|| format!("`{key}` is not a whole number"))
}

/// A whole number or `null`.
pub(crate) fn optional_u64(v: &Value, key: &str) -> Result<Option<u64>, String> {
    match field(v, key)? {
        Value::Null => Ok(None),
        n => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("`{key}` is not a whole number")),
    }
}

/// A number; `null` (a non-finite value) is NaN.
pub(crate) fn f64_of(v: &Value, key: &str) -> Result<f64, String> {
    match field(v, key)? {
        Value::Null => Ok(f64::NAN),
        n => n.as_f64().ok_or_else(|| format!("`{key}` is not a number")),
    }
}

/// Text.
pub(crate) fn text_of(v: &Value, key: &str) -> Result<String, String> {
    field(v, key)?
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("`{key}` is not text"))
}

/// `true` or `false`.
pub(crate) fn bool_of(v: &Value, key: &str) -> Result<bool, String> {
    field(v, key)?
        .as_bool()
        .ok_or_else(|| format!("`{key}` is not true or false"))
}

/// A process id.
pub(crate) fn pid_of(v: &Value, key: &str) -> Result<u32, String> {
    u32::try_from(u64_of(v, key)?).map_err(|_| format!("`{key}` is out of range"))
}
