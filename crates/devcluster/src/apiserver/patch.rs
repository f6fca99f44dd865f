//! The patch flavours clients send: JSON patch (RFC 6902), JSON merge patch (RFC 7386),
//! strategic merge patch (merge patch with lists merged by their key, for the built-in kinds'
//! common keyed lists) and server-side apply (merged like a strategic patch).

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

/// Keys by which lists in built-in kinds are merged (strategic merge patch).
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "containers" | "initContainers" | "volumes" | "env" | "volumeMounts" | "ports"
        | "volumeDevices" | "imagePullSecrets" => Some("name"),
        "conditions" => Some("type"),
        "ownerReferences" => Some("uid"),
        _ => None,
    }
}

fn strategic(target: &mut Value, patch: &Value) {
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
                match (merge_key(k), t.get_mut(k), v) {
                    (Some(key), Some(Value::Array(existing)), Value::Array(items)) => {
                        for item in items {
                            let id = item.get(key);
                            match existing
                                .iter_mut()
                                .find(|e| id.is_some() && e.get(key) == id)
                            {
                                Some(e) => strategic(e, item),
                                None => existing.push(item.clone()),
                            }
                        }
                    }
                    (_, Some(existing), _) if existing.is_object() && v.is_object() => {
                        strategic(existing, v)
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
        PatchKind::Strategic | PatchKind::Apply => strategic(&mut out, &parse(body)?),
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
