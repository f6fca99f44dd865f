//! storage.k8s.io: a StorageClass's provisioner, parameters, reclaim policy, binding mode and
//! allowed topologies, its defaults, and what an update may change.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::field::{BadValue, FieldError};
use super::names::is_qualified_name;
use super::selectors::{label_name, strings};

const CLASS_RECLAIM_POLICIES: &[&str] = &["Delete", "Retain"];
const BINDING_MODES: &[&str] = &["Immediate", "WaitForFirstConsumer"];

const MAX_PARAMETERS: usize = 512;
const MAX_PARAMETERS_SIZE: usize = 256 * (1 << 10);

/// ValidateStorageClass: provisioner, parameters, reclaim policy and binding mode (after
/// SetDefaults_StorageClass, so an absent policy or mode is Delete or Immediate).
pub fn storage_class(obj: &Value) -> Vec<FieldError> {
    let mut out = Vec::new();
    let provisioner = obj["provisioner"].as_str().unwrap_or("");
    if provisioner.is_empty() {
        out.push(FieldError::required("provisioner", ""));
    } else {
        let lower = provisioner.to_lowercase();
        for msg in is_qualified_name(&lower) {
            out.push(FieldError::invalid("provisioner", &lower, &msg));
        }
    }
    if let Some(params) = obj["parameters"].as_object() {
        if params.len() > MAX_PARAMETERS {
            out.push(FieldError::too_long("parameters", MAX_PARAMETERS));
        } else {
            let mut total = 0;
            for (k, v) in params {
                if k.is_empty() {
                    out.push(FieldError::invalid(
                        "parameters",
                        k,
                        "field can not be empty.",
                    ));
                }
                total += k.len() + v.as_str().map_or(0, str::len);
            }
            if total > MAX_PARAMETERS_SIZE {
                out.push(FieldError::too_long("parameters", MAX_PARAMETERS_SIZE));
            }
        }
    }
    if let Some(policy) = obj["reclaimPolicy"].as_str()
        && !policy.is_empty()
        && !CLASS_RECLAIM_POLICIES.contains(&policy)
    {
        out.push(FieldError::not_supported(
            "reclaimPolicy",
            BadValue::Str(policy.into()),
            CLASS_RECLAIM_POLICIES,
        ));
    }
    match obj["volumeBindingMode"].as_str() {
        None => out.push(FieldError::required("volumeBindingMode", "")),
        Some(mode) if !BINDING_MODES.contains(&mode) => out.push(FieldError::not_supported(
            "volumeBindingMode",
            BadValue::Str(mode.into()),
            BINDING_MODES,
        )),
        Some(_) => {}
    }
    allowed_topologies(&obj["allowedTopologies"], "allowedTopologies", &mut out);
    out
}

/// validateAllowedTopologies: each term's matchLabelExpressions need a qualified-name key, at
/// least one value and no value twice; no key twice in a term, and no term twice (compared as
/// key → set of values).
fn allowed_topologies(terms: &Value, path: &str, out: &mut Vec<FieldError>) {
    let Some(terms) = terms.as_array().filter(|t| !t.is_empty()) else {
        return;
    };
    // kube's list starts with one empty entry per term (a `make` with a length), so a term with
    // no expressions is reported as a duplicate too.
    let mut seen: Vec<BTreeMap<String, BTreeSet<String>>> = vec![BTreeMap::new(); terms.len()];
    for (i, term) in terms.iter().enumerate() {
        let exprs_at = format!("{path}[{i}].matchLabelExpressions");
        let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let exprs = term["matchLabelExpressions"].as_array();
        for (j, req) in exprs.into_iter().flatten().enumerate() {
            let at = format!("{exprs_at}[{j}]");
            let values = strings(&req["values"]);
            if values.is_empty() {
                out.push(FieldError::required(&format!("{at}.values"), ""));
            }
            let mut set = BTreeSet::new();
            for (k, value) in values.iter().enumerate() {
                if !set.insert(value.to_string()) {
                    out.push(FieldError::duplicate(&format!("{at}.values[{k}]"), value));
                }
            }
            let key = req["key"].as_str().unwrap_or("");
            label_name(key, &format!("{at}.key"), out);
            if map.contains_key(key) {
                out.push(FieldError::duplicate(&format!("{at}.key"), key));
            }
            map.insert(key.to_string(), set);
        }
        if seen.contains(&map) {
            out.push(FieldError::duplicate(&exprs_at, ""));
        }
        seen.push(map);
    }
}

/// SetDefaults_StorageClass: reclaimPolicy Delete, volumeBindingMode Immediate.
pub fn default_storage_class(obj: &mut Value) {
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    for (key, value) in [
        ("reclaimPolicy", "Delete"),
        ("volumeBindingMode", "Immediate"),
    ] {
        if map.get(key).is_none_or(Value::is_null) {
            map.insert(key.into(), Value::String(value.into()));
        }
    }
}

/// ValidateStorageClassUpdate: provisioner, parameters and reclaimPolicy may not change;
/// volumeBindingMode is immutable.
pub fn storage_class_update(old: &Value, new: &Value) -> Vec<FieldError> {
    let mut out = Vec::new();
    let params = |v: &Value| match &v["parameters"] {
        Value::Object(m) if !m.is_empty() => Some(m.clone()),
        _ => None,
    };
    if params(old) != params(new) {
        out.push(FieldError::forbidden(
            "parameters",
            "updates to parameters are forbidden.",
        ));
    }
    if old["provisioner"].as_str().unwrap_or("") != new["provisioner"].as_str().unwrap_or("") {
        out.push(FieldError::forbidden(
            "provisioner",
            "updates to provisioner are forbidden.",
        ));
    }
    if old["reclaimPolicy"].as_str().unwrap_or("") != new["reclaimPolicy"].as_str().unwrap_or("") {
        out.push(FieldError::forbidden(
            "reclaimPolicy",
            "updates to reclaimPolicy are forbidden.",
        ));
    }
    if old["volumeBindingMode"].as_str() != new["volumeBindingMode"].as_str() {
        out.push(FieldError::invalid(
            "volumeBindingMode",
            new["volumeBindingMode"].as_str().unwrap_or("null"),
            "field is immutable",
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::apiserver::validation::testing::{bodies, def};
    use crate::apiserver::validation::validate;
    use serde_json::{Value, json};

    #[test]
    fn class_topologies_are_validated_as_kube_validates_them() {
        let classes = def("storage.k8s.io", "storageclasses");
        let class = |topologies: Value| {
            json!({"metadata": {"name": "c"}, "provisioner": "p", "reclaimPolicy": "Delete",
                "volumeBindingMode": "WaitForFirstConsumer", "allowedTopologies": topologies})
        };
        let good = class(json!([
            {"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": ["a", "b"]}]},
            {"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": ["c"]}]},
        ]));
        assert!(validate(&classes, &good, true).is_empty());
        let bad = class(json!([
            {"matchLabelExpressions": [
                {"key": "zone", "values": []},
                {"key": "zone", "values": ["a", "a"]},
                {"key": "bad key", "values": ["x"]}]},
            {"matchLabelExpressions": [{"key": "rack", "values": ["1"]}]},
            {"matchLabelExpressions": [{"key": "rack", "values": ["1"]}]},
        ]));
        assert_eq!(
            bodies(&validate(&classes, &bad, true)),
            [
                "allowedTopologies[0].matchLabelExpressions[0].values: Required value",
                "allowedTopologies[0].matchLabelExpressions[1].values[1]: Duplicate value: \"a\"",
                "allowedTopologies[0].matchLabelExpressions[1].key: Duplicate value: \"zone\"",
                "allowedTopologies[0].matchLabelExpressions[2].key: Invalid value: \"bad key\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
                "allowedTopologies[2].matchLabelExpressions: Duplicate value: \"\"",
            ]
        );
    }
}
