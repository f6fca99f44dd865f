//! `spec.customizeComponents` of the CDI resource, as upstream's operator applies it: each patch
//! (JSON, merge or strategic merge) to the Deployments and Services it names by kind and name
//! (case-insensitive, `*` for any), the `flags` of a component as its container's whole `args`,
//! and on every object patched an annotation identifying the customization.

use cdi_api::config::{CustomizeComponents, CustomizeComponentsPatch};
use cdi_api::enums::PatchType;
use serde_json::{Value, json};

/// The annotation naming the customization an object was patched with (a hash of it).
pub const IDENTIFIER: &str = "cdi.kubevirt.io/customizer-identifier";

/// The kinds customizations apply to among what the operator makes (upstream also patches the
/// webhooks and APIService, which `cdi apiserver` registers itself here).
const KINDS: [&str; 2] = ["Deployment", "Service"];

fn matches(value: &str, key: &str) -> bool {
    value == "*" || value.eq_ignore_ascii_case(key)
}

/// The patches asked for: the listed ones, then one per component whose flags are set.
fn patches(c: &CustomizeComponents) -> Vec<CustomizeComponentsPatch> {
    let mut all = c.patches.clone().unwrap_or_default();
    if let Some(flags) = &c.flags {
        for (component, flags) in [
            (crate::install::APISERVER, &flags.api),
            (crate::install::CONTROLLER, &flags.controller),
            (crate::install::UPLOAD_PROXY, &flags.upload_proxy),
        ] {
            let Some(flags) = flags.as_ref().filter(|f| !f.is_empty()) else {
                continue;
            };
            let mut args = Vec::new();
            for (flag, value) in flags {
                args.push(format!("-{}", flag.to_lowercase()));
                if !value.is_empty() {
                    args.push(value.clone());
                }
            }
            all.push(CustomizeComponentsPatch {
                resource_name: component.into(),
                resource_type: "Deployment".into(),
                patch: json!({"spec": {"template": {"spec": {"containers": [
                    {"name": component, "args": args}]}}}})
                .to_string(),
                type_: PatchType::Strategic,
            });
        }
    }
    all
}

/// A hash of the customization (SHA-1 of it with its patches ordered by length, upstream's
/// recipe), so that a change of it changes every object it patched.
pub fn identifier(c: &CustomizeComponents) -> String {
    use sha1::Digest;
    let mut c = c.clone();
    if let Some(p) = c.patches.as_mut() {
        p.sort_by_key(|p| p.patch.len());
    }
    let text = serde_json::to_vec(&c).unwrap_or_default();
    sha1::Sha1::digest(&text)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Apply `c` to `objects`; a patch that cannot be applied is an error naming it.
pub fn apply(objects: &mut [Value], c: &CustomizeComponents) -> Result<(), String> {
    let patches = patches(c);
    if patches.is_empty() {
        return Ok(());
    }
    let id = identifier(c);
    for o in objects.iter_mut() {
        let kind = o["kind"].as_str().unwrap_or("").to_string();
        let name = o["metadata"]["name"].as_str().unwrap_or("").to_string();
        if !KINDS.contains(&kind.as_str()) {
            continue;
        }
        let mine: Vec<&CustomizeComponentsPatch> = patches
            .iter()
            .filter(|p| matches(&p.resource_type, &kind) && matches(&p.resource_name, &name))
            .collect();
        if mine.is_empty() {
            continue;
        }
        for p in mine {
            let what = || format!("the {} patch for {kind} {name}", p.type_.as_str());
            let patch: Value =
                serde_json::from_str(&p.patch).map_err(|e| format!("{}: not JSON: {e}", what()))?;
            match p.type_ {
                PatchType::Json => {
                    let ops: json_patch::Patch = serde_json::from_value(patch)
                        .map_err(|e| format!("{}: not a JSON patch: {e}", what()))?;
                    json_patch::patch(o, &ops).map_err(|e| format!("{}: {e}", what()))?;
                }
                PatchType::Merge => json_patch::merge(o, &patch),
                PatchType::Strategic => strategic(o, &patch, &kind),
            }
        }
        let annotated = o
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .map(|m| m.entry("annotations").or_insert_with(|| json!({})))
            .and_then(Value::as_object_mut)
            .map(|a| a.insert(IDENTIFIER.into(), json!(id)));
        if annotated.is_none() {
            return Err(format!(
                "the patches for {kind} {name} leave it without metadata.annotations as an object"
            ));
        }
    }
    Ok(())
}

/// The key list items of `field` are merged by (kube's patchMergeKey for the fields of
/// Deployments and Services); other lists are replaced.
fn merge_key(field: &str, kind: &str, in_container: bool) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "ports" if in_container => Some("containerPort"),
        "ports" if kind == "Service" => Some("port"),
        _ => None,
    }
}

/// A strategic merge patch as kube applies one to these kinds: maps merged (a null removes a
/// field), keyed lists merged item by item (an item with `$patch: delete` removes its match),
/// other lists and values replaced.
pub fn strategic(target: &mut Value, patch: &Value, kind: &str) {
    merge_map(target, patch, kind, false);
}

fn merge_map(target: &mut Value, patch: &Value, kind: &str, in_container: bool) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (field, value) in patch {
        if field.starts_with('$') {
            continue;
        }
        if value.is_null() {
            if let Some(map) = target.as_object_mut() {
                map.remove(field);
            }
            continue;
        }
        let nested = in_container || matches!(field.as_str(), "containers" | "initContainers");
        match (merge_key(field, kind, in_container), value) {
            (Some(key), Value::Array(items)) if target[field].is_array() => {
                merge_list(&mut target[field], items, key, kind, nested);
            }
            (_, Value::Object(_)) if target[field].is_object() => {
                merge_map(&mut target[field], value, kind, in_container);
            }
            (_, Value::Object(_)) => {
                let mut fresh = Value::Null;
                merge_map(&mut fresh, value, kind, nested);
                target[field] = fresh;
            }
            _ => target[field] = strip_directives(value),
        }
    }
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

fn merge_list(target: &mut Value, items: &[Value], key: &str, kind: &str, in_container: bool) {
    let Some(list) = target.as_array_mut() else {
        return;
    };
    for item in items {
        let id = &item[key];
        let found = list.iter().position(|t| !id.is_null() && t[key] == *id);
        let delete = item["$patch"] == "delete";
        match (found, delete) {
            (Some(i), true) => {
                list.remove(i);
            }
            (Some(i), false) => merge_map(&mut list[i], item, kind, in_container),
            (None, true) => {}
            (None, false) => list.push(strip_directives(item)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment() -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "cdi-apiserver", "labels": {"a": "1"}},
            "spec": {"template": {"spec": {
                "containers": [{"name": "cdi-apiserver", "image": "i", "args": ["-v=1"],
                    "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}],
                    "ports": [{"containerPort": 8443, "name": "https"}]}],
                "tolerations": [{"key": "a"}]}}}})
    }

    fn customization(patches: Value, flags: Value) -> CustomizeComponents {
        serde_json::from_value(json!({"patches": patches, "flags": flags})).unwrap()
    }

    #[test]
    fn patches_reach_the_objects_they_name_with_the_identifier() {
        let c = customization(
            json!([
                {"resourceName": "CDI-APISERVER", "resourceType": "deployment", "type": "strategic",
                 "patch": r#"{"metadata":{"labels":{"b":"2","a":null}},"spec":{"template":{"spec":{"containers":[{"name":"cdi-apiserver","env":[{"name":"Y","value":"3"},{"name":"Z","value":"4"},{"name":"X","$patch":"delete"}]}],"tolerations":[{"key":"b"}]}}}}"#},
                {"resourceName": "*", "resourceType": "Service", "type": "merge",
                 "patch": r#"{"metadata":{"annotations":{"m":"yes"}}}"#},
                {"resourceName": "cdi-apiserver", "resourceType": "Deployment", "type": "json",
                 "patch": r#"[{"op":"add","path":"/spec/replicas","value":2}]"#},
            ]),
            json!({"api": {"V": "3", "alsologtostderr": ""}}),
        );
        let service = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "cdi-api"}, "spec": {"ports": [{"port": 443}]}});
        let role = json!({"kind": "Role", "metadata": {"name": "cdi-apiserver"}});
        let mut objects = vec![deployment(), service, role.clone()];
        apply(&mut objects, &c).unwrap();
        let d = &objects[0];
        assert_eq!(d["metadata"]["labels"], json!({"b": "2"}));
        let container = &d["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            container["env"],
            json!([{"name": "Y", "value": "3"}, {"name": "Z", "value": "4"}])
        );
        // Lists without a merge key are replaced; the flags replace the arguments.
        assert_eq!(
            d["spec"]["template"]["spec"]["tolerations"],
            json!([{"key": "b"}])
        );
        assert_eq!(container["args"], json!(["-v", "3", "-alsologtostderr"]));
        assert_eq!(container["image"], "i");
        assert_eq!(d["spec"]["replicas"], 2);
        assert_eq!(d["metadata"]["annotations"][IDENTIFIER], identifier(&c));
        assert_eq!(objects[1]["metadata"]["annotations"]["m"], "yes");
        assert!(objects[1]["metadata"]["annotations"][IDENTIFIER].is_string());
        // Not a kind customizations reach.
        assert_eq!(objects[2], role);
        // Another customization, another identifier.
        assert_ne!(identifier(&c), identifier(&CustomizeComponents::default()));
    }

    #[test]
    fn a_patch_that_cannot_apply_is_named() {
        let bad = customization(
            json!([{"resourceName": "cdi-apiserver", "resourceType": "Deployment",
                "type": "json", "patch": r#"[{"op":"replace","path":"/nope/x","value":1}]"#}]),
            json!(null),
        );
        let err = apply(&mut [deployment()], &bad).unwrap_err();
        assert!(
            err.starts_with("the json patch for Deployment cdi-apiserver: "),
            "{err}"
        );
        let garbage = customization(
            json!([{"resourceName": "*", "resourceType": "*", "type": "merge", "patch": "{"}]),
            json!(null),
        );
        assert!(
            apply(&mut [deployment()], &garbage)
                .unwrap_err()
                .contains("not JSON")
        );
        // A patch that breaks the object's shape is refused, not followed.
        let shapeless = customization(
            json!([{"resourceName": "*", "resourceType": "*", "type": "merge",
                "patch": r#"{"metadata":5}"#}]),
            json!(null),
        );
        assert!(
            apply(&mut [deployment()], &shapeless)
                .unwrap_err()
                .contains("without metadata.annotations")
        );
        // Nothing asked, nothing changed.
        let mut same = [deployment()];
        apply(&mut same, &CustomizeComponents::default()).unwrap();
        assert_eq!(same[0], deployment());
    }
}
