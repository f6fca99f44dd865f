//! ConfigMaps and Secrets: their keys, and their data within 1 MiB.

use serde_json::Value;

use super::field::FieldError;
use super::names::is_config_map_key;

/// core.MaxSecretSize, the limit of a ConfigMap's or Secret's data.
pub const DATA_MAX: usize = 1 << 20;

/// A Secret's `data` value: base64 (its decoded size counts).
fn decoded_len(v: &Value) -> usize {
    use base64::Engine;
    let s = v.as_str().unwrap_or_default();
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map(|d| d.len())
        .unwrap_or(s.len())
}

/// ValidateConfigMap: keys, keys in both `data` and `binaryData`, and 1 MiB of data at most.
pub fn config_map(obj: &Value) -> Vec<FieldError> {
    let mut out = Vec::new();
    let data = obj["data"].as_object();
    let binary = obj["binaryData"].as_object();
    let mut total = 0;
    for (k, v) in data.into_iter().flatten() {
        let at = format!("data[{k}]");
        for m in is_config_map_key(k) {
            out.push(FieldError::invalid(&at, k, &m));
        }
        if binary.is_some_and(|b| b.contains_key(k)) {
            out.push(FieldError::invalid(
                &at,
                k,
                "duplicate of key present in binaryData",
            ));
        }
        total += v.as_str().map(str::len).unwrap_or_default();
    }
    for (k, v) in binary.into_iter().flatten() {
        for m in is_config_map_key(k) {
            out.push(FieldError::invalid(&format!("binaryData[{k}]"), k, &m));
        }
        total += decoded_len(v);
    }
    if total > DATA_MAX {
        // kube passes an empty path: the whole object is too large.
        out.push(FieldError::too_long("[]", DATA_MAX));
    }
    out
}

/// ValidateSecret: keys and 1 MiB of (decoded) data at most.
pub fn secret(obj: &Value) -> Vec<FieldError> {
    let mut out = Vec::new();
    let mut total = 0;
    for (k, v) in obj["data"].as_object().into_iter().flatten() {
        for m in is_config_map_key(k) {
            out.push(FieldError::invalid(&format!("data[{k}]"), k, &m));
        }
        total += decoded_len(v);
    }
    if total > DATA_MAX {
        out.push(FieldError::too_long("data", DATA_MAX));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::validation::testing::{bodies, def};
    use crate::apiserver::validation::validate;
    use serde_json::json;

    #[test]
    fn config_maps_and_secrets_are_bounded() {
        use base64::Engine;
        let cm = def("", "configmaps");
        let big = json!({"metadata": {"name": "x"}, "data": {"k": "v".repeat(DATA_MAX + 1)}});
        assert_eq!(
            bodies(&validate(&cm, &big, true)),
            ["[]: Too long: must have at most 1048576 bytes"]
        );
        let edge = json!({"metadata": {"name": "x"}, "data": {"k": "v".repeat(DATA_MAX)}});
        assert!(validate(&cm, &edge, true).is_empty());
        let keys = json!({"metadata": {"name": "x"}, "data": {"a b": "", "..x": "", "d": ""},
            "binaryData": {"d": ""}});
        assert_eq!(
            bodies(&validate(&cm, &keys, true)),
            [
                "data[..x]: Invalid value: \"..x\": must not start with '..'",
                "data[a b]: Invalid value: \"a b\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')",
                "data[d]: Invalid value: \"d\": duplicate of key present in binaryData",
            ]
        );
        let secrets = def("", "secrets");
        let payload = base64::engine::general_purpose::STANDARD.encode(vec![0u8; DATA_MAX + 1]);
        let big = json!({"metadata": {"name": "x"}, "data": {"k": payload}});
        assert_eq!(
            bodies(&validate(&secrets, &big, true)),
            ["data: Too long: must have at most 1048576 bytes"]
        );
    }
}
