//! Kubernetes' protobuf encoding, for the few kinds kubectl's generators send that way
//! (`kubectl create namespace|configmap|secret|serviceaccount|token|role|rolebinding|
//! clusterrole|clusterrolebinding`, `kubectl auth can-i` and `whoami`): client-go does not fall back to
//! JSON on a 415. Other kinds still get the 415.
//!
//! The envelope is `k8s\0` and a `runtime.Unknown` {1: typeMeta {1: apiVersion, 2: kind},
//! 2: raw object}; field numbers are those of the kinds' generated.proto.

use serde_json::{Map, Value, json};

use super::errors::{ApiError, ApiResult};

const MAGIC: &[u8] = b"k8s\0";

enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

fn varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut out = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos)?;
        *pos += 1;
        out |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(out);
        }
    }
    None
}

/// The fields of one message, in order.
fn fields(buf: &[u8]) -> Option<Vec<(u64, Wire<'_>)>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let key = varint(buf, &mut pos)?;
        let wire = match key & 7 {
            0 => Wire::Varint(varint(buf, &mut pos)?),
            1 => {
                pos = pos.checked_add(8).filter(|p| *p <= buf.len())?;
                Wire::Fixed
            }
            2 => {
                let len = usize::try_from(varint(buf, &mut pos)?).ok()?;
                let end = pos.checked_add(len).filter(|e| *e <= buf.len())?;
                let b = &buf[pos..end];
                pos = end;
                Wire::Bytes(b)
            }
            5 => {
                pos = pos.checked_add(4).filter(|p| *p <= buf.len())?;
                Wire::Fixed
            }
            _ => return None,
        };
        out.push((key >> 3, wire));
    }
    Some(out)
}

fn text(b: &[u8]) -> Option<Value> {
    Some(json!(std::str::from_utf8(b).ok()?))
}

/// A `map<string, string>` (or bytes, base64-encoded as JSON has them) entry into `into`.
fn map_entry(b: &[u8], bytes: bool, into: &mut Map<String, Value>) -> Option<()> {
    let (mut k, mut v) = (String::new(), Value::String(String::new()));
    for (n, w) in fields(b)? {
        match (n, w) {
            (1, Wire::Bytes(b)) => k = std::str::from_utf8(b).ok()?.to_string(),
            (2, Wire::Bytes(b)) if bytes => {
                use base64::Engine;
                v = json!(base64::engine::general_purpose::STANDARD.encode(b));
            }
            (2, Wire::Bytes(b)) => v = text(b)?,
            _ => {}
        }
    }
    into.insert(k, v);
    Some(())
}

fn object_meta(b: &[u8]) -> Option<Value> {
    let mut meta = Map::new();
    let (mut labels, mut annotations, mut finalizers) = (Map::new(), Map::new(), Vec::new());
    for (n, w) in fields(b)? {
        match (n, w) {
            (1, Wire::Bytes(b)) => _ = meta.insert("name".into(), text(b)?),
            (2, Wire::Bytes(b)) => _ = meta.insert("generateName".into(), text(b)?),
            (3, Wire::Bytes(b)) => _ = meta.insert("namespace".into(), text(b)?),
            (6, Wire::Bytes(b)) => _ = meta.insert("resourceVersion".into(), text(b)?),
            (11, Wire::Bytes(b)) => map_entry(b, false, &mut labels)?,
            (12, Wire::Bytes(b)) => map_entry(b, false, &mut annotations)?,
            (14, Wire::Bytes(b)) => finalizers.push(text(b)?),
            // A generator sets nothing else (creationTimestamp goes as an empty Time).
            _ => {}
        }
    }
    if !labels.is_empty() {
        meta.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        meta.insert("annotations".into(), Value::Object(annotations));
    }
    if !finalizers.is_empty() {
        meta.insert("finalizers".into(), Value::Array(finalizers));
    }
    Some(Value::Object(meta))
}

/// Append `item` to the list `obj[key]`.
fn push(obj: &mut Value, key: &str, item: Value) {
    match obj[key].as_array_mut() {
        Some(list) => list.push(item),
        None => obj[key] = json!([item]),
    }
}

/// A PolicyRule {1: verbs, 2: apiGroups, 3: resources, 4: resourceNames, 5: nonResourceURLs}.
fn policy_rule(b: &[u8]) -> Option<Value> {
    let mut rule = json!({});
    for (n, w) in fields(b)? {
        let key = match n {
            1 => "verbs",
            2 => "apiGroups",
            3 => "resources",
            4 => "resourceNames",
            5 => "nonResourceURLs",
            _ => continue,
        };
        if let Wire::Bytes(v) = w {
            push(&mut rule, key, text(v)?);
        }
    }
    Some(rule)
}

/// A message of string fields, named by number.
fn string_fields(b: &[u8], names: &[(u64, &str)]) -> Option<Value> {
    let mut out = Map::new();
    for (n, w) in fields(b)? {
        let Some((_, name)) = names.iter().find(|(k, _)| *k == n) else {
            continue;
        };
        if let Wire::Bytes(v) = w {
            out.insert(name.to_string(), text(v)?);
        }
    }
    Some(Value::Object(out))
}

/// A SelfSubjectAccessReviewSpec {1: resourceAttributes {1: namespace, 2: verb, 3: group,
/// 4: version, 5: resource, 6: subresource, 7: name}, 2: nonResourceAttributes {1: path,
/// 2: verb}}, as `kubectl auth can-i` sends it.
fn access_review_spec(b: &[u8]) -> Option<Value> {
    let mut spec = json!({});
    for (n, w) in fields(b)? {
        match (n, w) {
            (1, Wire::Bytes(r)) => {
                spec["resourceAttributes"] = string_fields(
                    r,
                    &[
                        (1, "namespace"),
                        (2, "verb"),
                        (3, "group"),
                        (4, "version"),
                        (5, "resource"),
                        (6, "subresource"),
                        (7, "name"),
                    ],
                )?
            }
            (2, Wire::Bytes(p)) => {
                spec["nonResourceAttributes"] = string_fields(p, &[(1, "path"), (2, "verb")])?
            }
            _ => {}
        }
    }
    Some(spec)
}

/// A TokenRequestSpec {1: audiences, 3: boundObjectRef {1: kind, 2: apiVersion, 3: name,
/// 4: uid}, 4: expirationSeconds}, as `kubectl create token` sends it.
fn token_request_spec(b: &[u8]) -> Option<Value> {
    let mut spec = json!({});
    let mut audiences = Vec::new();
    for (n, w) in fields(b)? {
        match (n, w) {
            (1, Wire::Bytes(a)) => audiences.push(text(a)?),
            (3, Wire::Bytes(r)) => {
                let mut reference = Map::new();
                for (n, w) in fields(r)? {
                    let key = match n {
                        1 => "kind",
                        2 => "apiVersion",
                        3 => "name",
                        4 => "uid",
                        _ => continue,
                    };
                    if let Wire::Bytes(v) = w {
                        reference.insert(key.into(), text(v)?);
                    }
                }
                spec["boundObjectRef"] = Value::Object(reference);
            }
            (4, Wire::Varint(v)) => spec["expirationSeconds"] = json!(v as i64),
            _ => {}
        }
    }
    if !audiences.is_empty() {
        spec["audiences"] = json!(audiences);
    }
    Some(spec)
}

/// The object in a protobuf body, for the kinds above.
fn object(api_version: &str, kind: &str, raw: &[u8]) -> Option<Value> {
    let mut obj = json!({"apiVersion": api_version, "kind": kind});
    let (mut data, mut binary, mut strings) = (Map::new(), Map::new(), Map::new());
    for (n, w) in fields(raw)? {
        match (kind, n, w) {
            (_, 1, Wire::Bytes(b)) => obj["metadata"] = object_meta(b)?,
            ("ConfigMap", 2, Wire::Bytes(b)) => map_entry(b, false, &mut data)?,
            ("ConfigMap", 3, Wire::Bytes(b)) => map_entry(b, true, &mut binary)?,
            ("ConfigMap", 4, Wire::Varint(v)) | ("Secret", 5, Wire::Varint(v)) => {
                obj["immutable"] = json!(v != 0)
            }
            ("Secret", 2, Wire::Bytes(b)) => map_entry(b, true, &mut data)?,
            ("Secret", 3, Wire::Bytes(b)) => obj["type"] = text(b)?,
            ("Secret", 4, Wire::Bytes(b)) => map_entry(b, false, &mut strings)?,
            ("Namespace", 2, Wire::Bytes(b)) => {
                let mut finalizers = Vec::new();
                for (n, w) in fields(b)? {
                    if let (1, Wire::Bytes(f)) = (n, w) {
                        finalizers.push(text(f)?);
                    }
                }
                if !finalizers.is_empty() {
                    obj["spec"] = json!({"finalizers": finalizers});
                }
            }
            ("TokenRequest", 2, Wire::Bytes(b)) => obj["spec"] = token_request_spec(b)?,
            ("SelfSubjectAccessReview", 2, Wire::Bytes(b)) => obj["spec"] = access_review_spec(b)?,
            ("Role" | "ClusterRole", 2, Wire::Bytes(b)) => push(&mut obj, "rules", policy_rule(b)?),
            ("RoleBinding" | "ClusterRoleBinding", 2, Wire::Bytes(b)) => push(
                &mut obj,
                "subjects",
                string_fields(
                    b,
                    &[(1, "kind"), (2, "apiGroup"), (3, "name"), (4, "namespace")],
                )?,
            ),
            ("RoleBinding" | "ClusterRoleBinding", 3, Wire::Bytes(b)) => {
                obj["roleRef"] = string_fields(b, &[(1, "apiGroup"), (2, "kind"), (3, "name")])?
            }
            ("Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding", _, _) => {}
            ("SelfSubjectRulesReview", 2, Wire::Bytes(b)) => {
                obj["spec"] = string_fields(b, &[(1, "namespace")])?
            }
            (
                "Namespace"
                | "ServiceAccount"
                | "TokenRequest"
                | "SelfSubjectAccessReview"
                | "SelfSubjectRulesReview"
                | "SelfSubjectReview",
                _,
                _,
            ) => {}
            ("ConfigMap" | "Secret", _, _) => {}
            _ => return None,
        }
    }
    for (key, map) in [
        ("data", data),
        ("binaryData", binary),
        ("stringData", strings),
    ] {
        if !map.is_empty() {
            obj[key] = Value::Object(map);
        }
    }
    Some(obj)
}

/// Decode a protobuf body, or answer kube's 415 for a kind this server cannot read that way.
pub fn decode(bytes: &[u8]) -> ApiResult<Value> {
    let unsupported = || {
        ApiError::unsupported_media_type(
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml",
        )
    };
    let body = bytes.strip_prefix(MAGIC).ok_or_else(unsupported)?;
    let decoded = (|| {
        let (mut api_version, mut kind, mut raw) = ("", "", &[][..]);
        for (n, w) in fields(body)? {
            match (n, w) {
                (1, Wire::Bytes(b)) => {
                    for (n, w) in fields(b)? {
                        match (n, w) {
                            (1, Wire::Bytes(v)) => api_version = std::str::from_utf8(v).ok()?,
                            (2, Wire::Bytes(k)) => kind = std::str::from_utf8(k).ok()?,
                            _ => {}
                        }
                    }
                }
                (2, Wire::Bytes(b)) => raw = b,
                _ => {}
            }
        }
        if !matches!(
            api_version,
            "v1" | "authentication.k8s.io/v1"
                | "authorization.k8s.io/v1"
                | "rbac.authorization.k8s.io/v1"
        ) {
            return None;
        }
        object(api_version, kind, raw)
    })();
    decoded.ok_or_else(unsupported)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_or_foreign_bodies_are_415_not_panics() {
        let ns = b"k8s\0\x0a\x0f\x0a\x02v1\x12\x09Namespace\x12\x07\x0a\x05\x0a\x03abc";
        assert_eq!(
            decode(ns).unwrap(),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "abc"}})
        );
        for n in 0..ns.len() - 1 {
            if let Err(e) = decode(&ns[..n]) {
                assert_eq!(e.code, 415);
            }
        }
        let pod = b"k8s\0\x0a\x09\x0a\x02v1\x12\x03Pod\x12\x02\x10\x01";
        assert_eq!(decode(pod).unwrap_err().code, 415);
        assert_eq!(decode(b"\xff\xff\xff").unwrap_err().code, 415);
    }
}
