//! What PersistentVolumes and claims share: access modes, volume modes and class names as kube
//! checks them, and the semantic comparison (apiequality.Semantic) their updates are judged by.

use serde_json::Value;

use super::field::{BadValue, FieldError};
use super::names::is_dns1123_subdomain;

/// kube's supported access modes, volume modes and reclaim policies (`sets.List`, sorted).
pub const ACCESS_MODES: &[&str] = &[
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];
pub(super) const VOLUME_MODES: &[&str] = &["Block", "Filesystem"];
/// The access modes of a claim or volume spec: required, each supported, ReadWriteOncePod alone.
pub(super) fn access_modes(spec: &Value, path: &str, required: &str, out: &mut Vec<FieldError>) {
    let at = format!("{path}.accessModes");
    let modes: Vec<&str> = spec["accessModes"]
        .as_array()
        .map(|a| a.iter().map(|m| m.as_str().unwrap_or("")).collect())
        .unwrap_or_default();
    if modes.is_empty() {
        out.push(FieldError::required(&at, required));
    }
    let (mut rwop, mut other) = (false, false);
    for mode in modes {
        if !ACCESS_MODES.contains(&mode) {
            out.push(FieldError::not_supported(
                &at,
                BadValue::Str(mode.into()),
                ACCESS_MODES,
            ));
        } else if mode == "ReadWriteOncePod" {
            rwop = true;
        } else {
            other = true;
        }
    }
    if rwop && other {
        out.push(FieldError::forbidden(
            &at,
            "may not use ReadWriteOncePod with other access modes",
        ));
    }
}

pub(super) fn volume_mode(spec: &Value, path: &str, out: &mut Vec<FieldError>) {
    if let Some(mode) = spec["volumeMode"].as_str()
        && !VOLUME_MODES.contains(&mode)
    {
        out.push(FieldError::not_supported(
            &format!("{path}.volumeMode"),
            BadValue::Str(mode.into()),
            VOLUME_MODES,
        ));
    }
}

/// ValidateClassName (a storage or volume attributes class name): a DNS subdomain.
pub(super) fn class_name(name: &str, path: &str, out: &mut Vec<FieldError>) {
    for msg in is_dns1123_subdomain(name) {
        out.push(FieldError::invalid(path, name, &msg));
    }
}

/// A spec as apiequality.Semantic compares it: nulls, empty lists and empty maps dropped,
/// quantities under `resources` reduced to their values.
pub(super) fn semantic(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !is_empty_value(v))
                .map(|(k, v)| (k.clone(), semantic(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(semantic).collect()),
        other => other.clone(),
    }
}

fn is_empty_value(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.is_empty(),
        _ => false,
    }
}
