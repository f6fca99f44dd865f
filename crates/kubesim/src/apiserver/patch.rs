//! The patch flavours clients send: JSON patch (RFC 6902), JSON merge patch (RFC 7386),
//! strategic merge patch (merge patch with lists merged by their key, for the built-in kinds'
//! common keyed lists) and server-side apply (merged like a strategic patch, its list items
//! told apart by the list-map keys, which add the protocol to ports).

use serde_json::Value;

use super::errors::{ApiError, ApiResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchKind {
    pub fn from_content_type(ct: &str) -> ApiResult<PatchKind> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/json-patch+json" => Ok(PatchKind::Json),
            "application/merge-patch+json" => Ok(PatchKind::Merge),
            "application/strategic-merge-patch+json" => Ok(PatchKind::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(PatchKind::Apply),
            other => Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml; got {other:?}"
            ))),
        }
    }
}

/// A field of a list item's key, and the value kube defaults it to when absent.
type KeyField = (&'static str, Option<&'static str>);

/// Where a list is, which decides its key: in a core Service, in an apply (keyed by the
/// schema's list-map keys rather than the strategic patchMergeKey), in a container.
#[derive(Debug, Clone, Copy)]
struct Lists {
    service: bool,
    apply: bool,
    in_container: bool,
}

/// The fields by which the items of the list `field` are merged in the built-in kinds (kube's
/// patchMergeKey; for an apply, the list-map keys, which add the protocol to ports: a number
/// may be served over TCP and UDP). Other lists are replaced.
fn merge_key(field: &str, at: Lists) -> Option<&'static [KeyField]> {
    const TCP: Option<&str> = Some("TCP");
    let key: &'static [KeyField] = match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets" => &[("name", None)],
        "volumeMounts" => &[("mountPath", None)],
        "volumeDevices" => &[("devicePath", None)],
        // Ports need no name (a Service's single one usually has none): they are numbers.
        "ports" if at.in_container && at.apply => &[("containerPort", None), ("protocol", TCP)],
        "ports" if at.in_container => &[("containerPort", None)],
        "ports" if at.service && at.apply => &[("port", None), ("protocol", TCP)],
        "ports" if at.service => &[("port", None)],
        "conditions" => &[("type", None)],
        "ownerReferences" => &[("uid", None)],
        _ => return None,
    };
    Some(key)
}

/// The values of `key`'s fields in `item`, absent (or empty) ones as kube defaults them;
/// `None` when one without a default is missing.
fn key_of(item: &Value, key: &[KeyField]) -> Option<Vec<Value>> {
    key.iter()
        .map(|(field, default)| match item.get(*field) {
            Some(v) if !v.is_null() && v.as_str() != Some("") => Some(v.clone()),
            _ => default.map(Value::from),
        })
        .collect()
}

/// Merge `items` into `list` by `key`: an item changes the one with its key (one marked
/// `$patch: delete` removes it) or is added; an item without its key matches nothing.
fn merge_list(list: &mut Vec<Value>, items: &[Value], key: &[KeyField], at: Lists) {
    for item in items {
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        let found = key_of(item, key).and_then(|id| {
            list.iter()
                .position(|e| key_of(e, key).as_ref() == Some(&id))
        });
        match found {
            Some(i) if delete => {
                list.remove(i);
            }
            Some(i) => strategic(&mut list[i], item, at),
            None if delete => {}
            None => list.push(item.clone()),
        }
    }
}

fn strategic(target: &mut Value, patch: &Value, at: Lists) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if k.starts_with("$") {
                    continue;
                }
                if v.is_null() {
                    t.remove(k);
                    continue;
                }
                // A container's ports are keyed by containerPort, a Service's by port.
                let inner = Lists {
                    in_container: at.in_container
                        || matches!(
                            k.as_str(),
                            "containers" | "initContainers" | "ephemeralContainers"
                        ),
                    ..at
                };
                match (merge_key(k, at), t.get_mut(k), v) {
                    (Some(key), Some(Value::Array(existing)), Value::Array(items)) => {
                        merge_list(existing, items, key, inner)
                    }
                    (_, Some(existing), _) if existing.is_object() && v.is_object() => {
                        strategic(existing, v, inner)
                    }
                    _ => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// Apply `body` (the request body) to `current`.
pub fn apply(kind: PatchKind, current: &Value, body: &[u8]) -> ApiResult<Value> {
    let parse = |b: &[u8]| -> ApiResult<Value> {
        serde_json::from_slice(b)
            .or_else(|_| serde_saphyr::from_slice::<Value>(b).map_err(|e| e.to_string()))
            .map_err(|e| ApiError::bad_request(format!("the patch is not valid: {e}")))
    };
    let mut out = current.clone();
    match kind {
        PatchKind::Json => {
            let patch: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("the JSON patch is not valid: {e}")))?;
            json_patch::patch(&mut out, &patch).map_err(|e| {
                ApiError::invalid(
                    current["kind"].as_str().unwrap_or(""),
                    current["metadata"]["name"].as_str().unwrap_or(""),
                    vec![("patch".into(), e.to_string())],
                )
            })?;
        }
        PatchKind::Merge => json_patch::merge(&mut out, &parse(body)?),
        PatchKind::Strategic | PatchKind::Apply => {
            let at = Lists {
                service: current["apiVersion"] == "v1" && current["kind"] == "Service",
                apply: kind == PatchKind::Apply,
                in_container: false,
            };
            strategic(&mut out, &parse(body)?, at)
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn the_four_flavours() {
        let pod = json!({"metadata": {"name": "p", "labels": {"a": "1", "b": "2"}}, "spec": {"containers": [{"name": "c", "image": "x"}, {"name": "d", "image": "y"}]}});
        let merged = apply(
            PatchKind::Merge,
            &pod,
            br#"{"metadata":{"labels":{"a":null,"c":"3"}}}"#,
        )
        .unwrap();
        assert_eq!(merged["metadata"]["labels"], json!({"b": "2", "c": "3"}));
        let replaced = apply(
            PatchKind::Merge,
            &pod,
            br#"{"spec":{"containers":[{"name":"c","image":"z"}]}}"#,
        )
        .unwrap();
        assert_eq!(
            replaced["spec"]["containers"].as_array().unwrap().len(),
            1,
            "merge patch replaces lists"
        );
        let strategic = apply(
            PatchKind::Strategic,
            &pod,
            br#"{"spec":{"containers":[{"name":"c","image":"z"}]}}"#,
        )
        .unwrap();
        assert_eq!(
            strategic["spec"]["containers"],
            json!([{"name": "c", "image": "z"}, {"name": "d", "image": "y"}])
        );
        let jp = apply(PatchKind::Json, &pod, br#"[{"op":"replace","path":"/metadata/labels/a","value":"9"},{"op":"add","path":"/spec/x","value":1}]"#).unwrap();
        assert_eq!(
            (
                jp["metadata"]["labels"]["a"].clone(),
                jp["spec"]["x"].clone()
            ),
            (json!("9"), json!(1))
        );
        let yaml = apply(
            PatchKind::Apply,
            &pod,
            b"metadata:\n  labels:\n    e: \"5\"\n",
        )
        .unwrap();
        assert_eq!(yaml["metadata"]["labels"]["e"], "5");
        assert!(
            apply(
                PatchKind::Json,
                &pod,
                br#"[{"op":"test","path":"/metadata/name","value":"q"}]"#
            )
            .is_err()
        );
        assert!(PatchKind::from_content_type("text/plain").is_err());
    }

    #[test]
    fn lists_merge_by_their_keys() {
        // cdi-api as the operator applies it on every pass: its one port stays one (ports were
        // merged by name, which it has none of, so each pass added one).
        let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "cdi-api"},
            "spec": {"ports": [{"port": 443, "targetPort": 8443, "protocol": "TCP"}]}});
        let body = serde_json::to_vec(&svc).unwrap();
        let mut live = svc.clone();
        for _ in 0..3 {
            live = apply(PatchKind::Apply, &live, &body).unwrap();
        }
        assert_eq!(live["spec"]["ports"], svc["spec"]["ports"]);
        // An apply tells ports apart by number and protocol, an absent protocol being TCP...
        let both =
            br#"{"spec":{"ports":[{"port":443,"protocol":"UDP"},{"port":443,"targetPort":9443}]}}"#;
        assert_eq!(
            apply(PatchKind::Apply, &live, both).unwrap()["spec"]["ports"],
            json!([{"port": 443, "targetPort": 9443, "protocol": "TCP"},
                {"port": 443, "protocol": "UDP"}])
        );
        // ...a strategic merge patch by number alone (kube's patchMergeKey for Service ports).
        let udp = br#"{"spec":{"ports":[{"port":443,"protocol":"UDP"}]}}"#;
        assert_eq!(
            apply(PatchKind::Strategic, &live, udp).unwrap()["spec"]["ports"],
            json!([{"port": 443, "targetPort": 8443, "protocol": "UDP"}])
        );
        // A container's ports by containerPort, its mounts by path; `$patch: delete` removes.
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "spec": {"containers": [{"name": "c",
            "ports": [{"name": "http", "containerPort": 8080}],
            "volumeMounts": [{"name": "d", "mountPath": "/a"}, {"name": "d", "mountPath": "/b"}]}]}});
        let changed = apply(
            PatchKind::Apply,
            &pod,
            br#"{"spec":{"containers":[{"name":"c","ports":[{"name":"web","containerPort":8080,"protocol":"TCP"}],
                "volumeMounts":[{"name":"d","mountPath":"/b","readOnly":true}]}]}}"#,
        )
        .unwrap();
        assert_eq!(
            changed["spec"]["containers"][0]["ports"],
            json!([{"name": "web", "containerPort": 8080, "protocol": "TCP"}])
        );
        assert_eq!(
            changed["spec"]["containers"][0]["volumeMounts"],
            json!([{"name": "d", "mountPath": "/a"},
                {"name": "d", "mountPath": "/b", "readOnly": true}])
        );
        let removed = apply(
            PatchKind::Strategic,
            &pod,
            br#"{"spec":{"containers":[{"name":"c","volumeMounts":[{"$patch":"delete","mountPath":"/a"}]}]}}"#,
        )
        .unwrap();
        assert_eq!(
            removed["spec"]["containers"][0]["volumeMounts"],
            json!([{"name": "d", "mountPath": "/b"}])
        );
        // Lists named ports elsewhere are replaced whole.
        let other = json!({"apiVersion": "v1", "kind": "ConfigMap", "ports": [{"port": 1}]});
        let replaced = apply(PatchKind::Apply, &other, br#"{"ports":[{"port":2}]}"#).unwrap();
        assert_eq!(replaced["ports"], json!([{"port": 2}]));
    }

    proptest! {
        #[test]
        fn merge_patch_sets_what_it_says(k in "[a-z]{1,6}", v in "[a-z0-9]{0,6}") {
            let base = json!({"metadata": {"labels": {"x": "y"}}});
            let body = serde_json::to_vec(&json!({"metadata": {"labels": {k.clone(): v.clone()}}})).unwrap();
            let out = apply(PatchKind::Merge, &base, &body).unwrap();
            prop_assert_eq!(&out["metadata"]["labels"][&k], &json!(v));
        }

        #[test]
        fn patches_never_panic(body in proptest::collection::vec(any::<u8>(), 0..64)) {
            let base = json!({"a": [1, 2], "b": {"c": 1}});
            for kind in [PatchKind::Json, PatchKind::Merge, PatchKind::Strategic, PatchKind::Apply] {
                let _ = apply(kind, &base, &body);
            }
        }
    }
}
