//! PersistentVolumeClaims: their spec (access modes, the storage request, selector, classes,
//! data sources) and what an update may change.

use serde_json::Value;

use super::field::FieldError;
use super::names::is_dns1123_subdomain;
use super::selectors::label_selector;
use super::volume_fields::{access_modes, class_name, semantic, volume_mode};

/// validateDataSource / validateDataSourceRef.
fn data_source(source: &Value, path: &str, out: &mut Vec<FieldError>) {
    let name = source["name"].as_str().unwrap_or("");
    let kind = source["kind"].as_str().unwrap_or("");
    if name.is_empty() {
        out.push(FieldError::required(&format!("{path}.name"), ""));
    }
    if kind.is_empty() {
        out.push(FieldError::required(&format!("{path}.kind"), ""));
    }
    let group = source["apiGroup"].as_str().unwrap_or("");
    if group.is_empty() && kind != "PersistentVolumeClaim" {
        out.push(FieldError::invalid(
            path,
            kind,
            "must be 'PersistentVolumeClaim' when referencing the default apiGroup",
        ));
    }
    if !group.is_empty() {
        for msg in is_dns1123_subdomain(group) {
            out.push(FieldError::invalid(
                &format!("{path}.apiGroup"),
                group,
                &msg,
            ));
        }
    }
}

/// ValidatePersistentVolumeClaimSpec: access modes, the storage request (present and greater
/// than zero; decoding made sure it is a quantity; kube's path keys `resources`, not
/// `resources.requests`), volume mode, and the data sources.
pub fn claim_spec(spec: &Value, path: &str) -> Vec<FieldError> {
    let mut out = Vec::new();
    access_modes(spec, path, "at least 1 access mode is required", &mut out);
    if spec["selector"].is_object() {
        label_selector(&spec["selector"], &format!("{path}.selector"), &mut out);
    }
    let at = format!("{path}.resources[storage]");
    match spec["resources"]["requests"].get("storage") {
        None => out.push(FieldError::required(&at, "")),
        Some(storage) => {
            let text = storage.as_str().unwrap_or_default();
            match text.trim().parse::<k8s_rules::Quantity>() {
                Ok(q) if q.nanos() > 0 => {}
                Ok(q) => out.push(FieldError::invalid(
                    &at,
                    &q.to_string(),
                    "must be greater than zero",
                )),
                // Not reached after decoding; refused all the same.
                Err(e) => out.push(FieldError::invalid(&at, text, &e.to_string())),
            }
        }
    }
    if let Some(class) = spec["storageClassName"].as_str().filter(|c| !c.is_empty()) {
        class_name(class, &format!("{path}.storageClassName"), &mut out);
    }
    volume_mode(spec, path, &mut out);
    let (source, reference) = (&spec["dataSource"], &spec["dataSourceRef"]);
    if source.is_object() {
        data_source(source, &format!("{path}.dataSource"), &mut out);
    }
    if reference.is_object() {
        data_source(reference, &format!("{path}.dataSourceRef"), &mut out);
    }
    let namespaced_ref = reference["namespace"]
        .as_str()
        .is_some_and(|n| !n.is_empty());
    if reference.is_object() && namespaced_ref {
        if source.is_object() {
            out.push(FieldError::invalid(
                path,
                &format!("{path}.dataSource"),
                "may not be specified when dataSourceRef.namespace is specified",
            ));
        }
    } else if source.is_object() && reference.is_object() {
        let same = source["apiGroup"].as_str() == reference["apiGroup"].as_str()
            && source["kind"].as_str().unwrap_or("") == reference["kind"].as_str().unwrap_or("")
            && source["name"].as_str().unwrap_or("") == reference["name"].as_str().unwrap_or("");
        if !same {
            out.push(FieldError::invalid(
                path,
                &format!("{path}.dataSource"),
                "must match dataSourceRef",
            ));
        }
    }
    // An empty name is allowed on a claim (it means "no class"); a PersistentVolume's is not.
    if let Some(class) = spec["volumeAttributesClassName"]
        .as_str()
        .filter(|c| !c.is_empty())
    {
        class_name(
            class,
            &format!("{path}.volumeAttributesClassName"),
            &mut out,
        );
    }
    out
}

fn quantities(resources: &mut Value) {
    for part in ["requests", "limits"] {
        if let Some(map) = resources[part].as_object_mut() {
            for q in map.values_mut() {
                if let Some(parsed) = q
                    .as_str()
                    .and_then(|t| t.trim().parse::<k8s_rules::Quantity>().ok())
                {
                    *q = Value::String(parsed.nanos().to_string());
                }
            }
        }
    }
}

const BETA_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

/// ValidatePersistentVolumeClaimUpdate's immutability rules (the spec's own rules are checked by
/// `claim_spec` on every write): volumeName may be set once, storageClassName may be set from
/// nil (or from the beta annotation), a bound claim's storage request may change (not below
/// status.capacity), a bound claim's volumeAttributesClassName may change (not back to nil or
/// to ""); nothing else in the spec may.
pub fn claim_update(old: &Value, new: &Value) -> Vec<FieldError> {
    let mut out = Vec::new();
    let (mut old_spec, mut new_spec) = (old["spec"].clone(), new["spec"].clone());
    if !old_spec.is_object() {
        old_spec = Value::Object(Default::default());
    }
    if !new_spec.is_object() {
        new_spec = Value::Object(Default::default());
    }
    let set = |spec: &mut Value, key: &str, value: Value| {
        if let Some(map) = spec.as_object_mut() {
            map.insert(key.into(), value);
        }
    };
    if old["spec"]["volumeName"].as_str().unwrap_or("").is_empty() {
        set(
            &mut old_spec,
            "volumeName",
            new["spec"]["volumeName"].clone(),
        );
    }
    let old_annotation = old["metadata"]["annotations"][BETA_CLASS].as_str();
    let new_annotation = new["metadata"]["annotations"][BETA_CLASS].as_str();
    let old_class = old["spec"]["storageClassName"].as_str();
    let new_class = new["spec"]["storageClassName"].as_str();
    let from_annotation = old_annotation.is_some()
        && old_class.is_none()
        && new_class.is_some()
        && new_class == old_annotation
        && (new_annotation.is_none() || new_annotation == old_annotation);
    if from_annotation {
        set(&mut new_spec, "storageClassName", Value::Null);
    } else {
        if new_annotation != old_annotation {
            out.push(FieldError::invalid(
                &format!("metadata.annotations.{BETA_CLASS}"),
                new_annotation.unwrap_or(""),
                "field is immutable",
            ));
        }
        if new_class.is_some()
            && old_class.is_none()
            && (old_annotation.is_none() || new_class == old_annotation)
        {
            set(&mut new_spec, "storageClassName", Value::Null);
        }
    }
    let bound = old["status"]["phase"] == "Bound";
    if bound && new_spec["resources"]["requests"].is_object() {
        new_spec["resources"]["requests"]["storage"] =
            old["spec"]["resources"]["requests"]["storage"].clone();
    }
    if bound && !new_spec["volumeAttributesClassName"].is_null() {
        set(
            &mut new_spec,
            "volumeAttributesClassName",
            old_spec["volumeAttributesClassName"].clone(),
        );
    }
    for spec in [&mut old_spec, &mut new_spec] {
        if spec["resources"].is_object() {
            quantities(&mut spec["resources"]);
        }
    }
    if semantic(&old_spec) != semantic(&new_spec) {
        out.push(FieldError::forbidden(
            "spec",
            "spec is immutable after creation except resources.requests and \
             volumeAttributesClassName for bound claims",
        ));
    }
    let size = |v: &Value| {
        v.as_str()
            .and_then(|s| s.trim().parse::<k8s_rules::Quantity>().ok())
            .map_or(0, |q| q.nanos())
    };
    let old_size = size(&old["spec"]["resources"]["requests"]["storage"]);
    let new_size = size(&new["spec"]["resources"]["requests"]["storage"]);
    let capacity = size(&old["status"]["capacity"]["storage"]);
    if new_size < old_size && new_size <= capacity {
        out.push(FieldError::forbidden(
            "spec.resources.requests.storage",
            "field can not be less than status.capacity",
        ));
    }
    let (old_mode, new_mode) = (
        old["spec"]["volumeMode"].as_str(),
        new["spec"]["volumeMode"].as_str(),
    );
    if old_mode != new_mode {
        out.push(FieldError::invalid(
            "volumeMode",
            new_mode.unwrap_or("null"),
            "field is immutable",
        ));
    }
    let old_class = &old["spec"]["volumeAttributesClassName"];
    let new_class = &new["spec"]["volumeAttributesClassName"];
    if !old_class.is_null() && old_class != new_class {
        let at = "spec.volumeAttributesClassName";
        if new_class.is_null() {
            out.push(FieldError::forbidden(
                at,
                "update from non-nil value to nil is forbidden",
            ));
        } else if new_class.as_str() == Some("") {
            out.push(FieldError::forbidden(
                at,
                "update from non-nil value to an empty string is forbidden",
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::validation::testing::{SUBDOMAIN, bodies, def};
    use crate::apiserver::validation::validate;
    use serde_json::json;

    fn claim(spec: Value) -> Value {
        let mut c = json!({"metadata": {"name": "c", "namespace": "default"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
            "volumeMode": "Filesystem"}});
        for (k, v) in spec.as_object().unwrap() {
            c["spec"][k] = v.clone();
        }
        c
    }

    #[test]
    fn claim_selectors_and_class_names() {
        let claims = def("", "persistentvolumeclaims");
        let good = claim(
            json!({"selector": {"matchLabels": {"app": "db"}, "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a"]}, {"key": "x", "operator": "Exists"}]},
            "storageClassName": "local", "volumeAttributesClassName": ""}),
        );
        assert!(validate(&claims, &good, true).is_empty());
        let bad = claim(
            json!({"selector": {"matchLabels": {"a b": "c d"}, "matchExpressions": [
            {"key": "tier", "operator": "NotIn"},
            {"key": "x", "operator": "DoesNotExist", "values": ["a"]},
            {"key": "y", "operator": "Gt", "values": ["1"]}]},
            "storageClassName": "Local", "volumeAttributesClassName": "Gold"}),
        );
        assert_eq!(
            bodies(&validate(&claims, &bad, true)),
            [
                "spec.selector.matchLabels: Invalid value: \"a b\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".to_string(),
                "spec.selector.matchLabels: Invalid value: \"c d\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".to_string(),
                "spec.selector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'".to_string(),
                "spec.selector.matchExpressions[1].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'".to_string(),
                "spec.selector.matchExpressions[2].operator: Invalid value: \"Gt\": not a valid selector operator".to_string(),
                format!("spec.storageClassName: Invalid value: \"Local\": {SUBDOMAIN}"),
                format!("spec.volumeAttributesClassName: Invalid value: \"Gold\": {SUBDOMAIN}"),
            ]
        );
    }

    #[test]
    fn claim_attributes_class_changes_only_when_bound_and_never_back() {
        let bound = |class: Value| {
            let mut c = claim(json!({"volumeName": "pv"}));
            if !class.is_null() {
                c["spec"]["volumeAttributesClassName"] = class;
            }
            c["status"] = json!({"phase": "Bound"});
            c
        };
        assert!(claim_update(&bound(json!("gold")), &bound(json!("silver"))).is_empty());
        assert!(claim_update(&bound(Value::Null), &bound(json!("gold"))).is_empty());
        assert_eq!(
            bodies(&claim_update(&bound(json!("gold")), &bound(json!("")))),
            [
                "spec.volumeAttributesClassName: Forbidden: update from non-nil value to an empty string is forbidden"
            ]
        );
        let to_nil = bodies(&claim_update(&bound(json!("gold")), &bound(Value::Null)));
        assert_eq!(to_nil.len(), 2, "{to_nil:?}");
        assert_eq!(
            to_nil[1],
            "spec.volumeAttributesClassName: Forbidden: update from non-nil value to nil is forbidden"
        );
        let pending = |class: &str| {
            let mut c = claim(json!({"volumeAttributesClassName": class}));
            c["status"] = json!({"phase": "Pending"});
            c
        };
        assert_eq!(
            bodies(&claim_update(&pending("gold"), &pending("silver"))),
            [
                "spec: Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"
            ]
        );
    }
}
