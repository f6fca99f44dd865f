//! ObjectMeta as ValidateObjectMetaAccessor checks it: names (on create), labels, annotations
//! and their total size, owner references, finalizers.

use serde_json::Value;

use super::field::FieldError;
use super::names::{check_name, is_label_value, is_qualified_name, name_rule};
use crate::apiserver::registry::ResourceDef;

/// TotalAnnotationSizeLimitB.
pub const ANNOTATIONS_MAX: usize = 256 << 10;
pub(super) fn str_map(v: &Value) -> Vec<(String, String)> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// ValidateObjectMetaAccessor. `create`: the name (and generateName) are checked too; updates
/// cannot change the name.
pub fn object_meta(def: &ResourceDef, obj: &Value, create: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let meta = &obj["metadata"];
    let rule = name_rule(def);
    if create {
        let generate = meta["generateName"].as_str().unwrap_or("");
        if !generate.is_empty() {
            for m in check_name(rule, generate, true) {
                errs.push(FieldError::invalid("metadata.generateName", generate, &m));
            }
        }
        let name = meta["name"].as_str().unwrap_or("");
        if name.is_empty() {
            errs.push(FieldError::required(
                "metadata.name",
                "name or generateName is required",
            ));
        } else {
            for m in check_name(rule, name, false) {
                errs.push(FieldError::invalid("metadata.name", name, &m));
            }
        }
    }
    for (k, v) in str_map(&meta["labels"]) {
        for m in is_qualified_name(&k) {
            errs.push(FieldError::invalid("metadata.labels", &k, &m));
        }
        for m in is_label_value(&v) {
            errs.push(FieldError::invalid("metadata.labels", &v, &m));
        }
    }
    let annotations = str_map(&meta["annotations"]);
    for (k, _) in &annotations {
        // Annotation keys are qualified names in any case.
        for m in is_qualified_name(&k.to_lowercase()) {
            errs.push(FieldError::invalid("metadata.annotations", k, &m));
        }
    }
    let total: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > ANNOTATIONS_MAX {
        errs.push(FieldError::too_long(
            "metadata.annotations",
            ANNOTATIONS_MAX,
        ));
    }
    if let Some(refs) = meta["ownerReferences"].as_array() {
        let path = "metadata.ownerReferences";
        for r in refs {
            let api_version = r["apiVersion"].as_str().unwrap_or("");
            let version = api_version.rsplit('/').next().unwrap_or("");
            if version.is_empty() {
                errs.push(FieldError::invalid(
                    &format!("{path}.apiVersion"),
                    api_version,
                    "version must not be empty",
                ));
            }
            for field in ["kind", "name", "uid"] {
                let v = r[field].as_str().unwrap_or("");
                if v.is_empty() {
                    errs.push(FieldError::invalid(
                        &format!("{path}.{field}"),
                        v,
                        "must not be empty",
                    ));
                }
            }
        }
    }
    if let Some(fins) = meta["finalizers"].as_array() {
        for f in fins.iter().filter_map(Value::as_str) {
            for m in is_qualified_name(f) {
                errs.push(FieldError::invalid("metadata.finalizers", f, &m));
            }
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::validation::testing::{bodies, def};
    use crate::apiserver::validation::validate;
    use serde_json::json;

    #[test]
    fn labels_annotations_owners_and_finalizers() {
        let cm = def("", "configmaps");
        let obj = json!({"metadata": {"name": "x",
            "labels": {"a/b/c": "ok", "good": "bad value"},
            "annotations": {"Example.com/Key": "fine", "/x": "v"},
            "ownerReferences": [{"apiVersion": "", "kind": "K", "name": "n", "uid": ""}],
            "finalizers": ["example.com/ok", "bad finalizer"]}});
        let got = bodies(&validate(&cm, &obj, true));
        assert_eq!(
            got,
            [
                "metadata.labels: Invalid value: \"a/b/c\": a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                "metadata.labels: Invalid value: \"bad value\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
                "metadata.annotations: Invalid value: \"/x\": prefix part must be non-empty",
                "metadata.ownerReferences.apiVersion: Invalid value: \"\": version must not be empty",
                "metadata.ownerReferences.uid: Invalid value: \"\": must not be empty",
                "metadata.finalizers: Invalid value: \"bad finalizer\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
            ]
        );
        let big =
            json!({"metadata": {"name": "x", "annotations": {"k": "v".repeat(ANNOTATIONS_MAX)}}});
        assert_eq!(
            bodies(&validate(&cm, &big, true)),
            ["metadata.annotations: Too long: must have at most 262144 bytes"]
        );
    }
}
