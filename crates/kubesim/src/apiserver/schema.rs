//! Custom resources as kube-apiserver treats them: nulls of non-nullable fields dropped, unknown
//! fields pruned (or refused under `fieldValidation=Strict`), defaults applied, and the object
//! validated against the CRD's structural schema, every failure naming its field.

use serde_json::{Map, Value};

/// What admission found.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Admission {
    /// Field paths that were not in the schema (pruned).
    pub unknown: Vec<String>,
    /// (field, message) for every violation.
    pub invalid: Vec<(String, String)>,
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 60 {
        format!("{}…", &s[..60])
    } else {
        s
    }
}

/// Prune, default and validate `value` at `path` against `schema`.
fn walk(schema: &Value, value: &mut Value, path: &str, out: &mut Admission) {
    let preserve = schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if value.is_null() && schema.get("nullable") == Some(&Value::Bool(true)) {
        return;
    }
    if let Some(message) = wrong_type(schema, value, path) {
        out.invalid.push((path.to_string(), message));
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
        out.invalid.push((
            path.to_string(),
            format!(
                "Unsupported value: {}: supported values: {}",
                short(value),
                list.join(", ")
            ),
        ));
    }
    match value {
        Value::String(s) => string(schema, s, path, out),
        Value::Number(n) => number(schema, n, path, out),
        Value::Array(items) => array(schema, items, path, out),
        Value::Object(map) => object(schema, map, path, preserve, out),
        _ => {}
    }
}

/// Why `value` is not of the schema's `type` (an int-or-string field takes either), if it is
/// not.
fn wrong_type(schema: &Value, value: &Value, path: &str) -> Option<String> {
    let int_or_string = schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    let actual = type_name(value);
    if let Some(want) = schema.get("type").and_then(Value::as_str) {
        let ok = actual == want || (want == "number" && actual == "integer");
        return (!ok).then(|| {
            format!(
                "Invalid value: \"{actual}\": {path} in body must be of type {want}: {}",
                short(value)
            )
        });
    }
    (int_or_string && !matches!(actual, "integer" | "string")).then(|| {
        format!(
            "Invalid value: {}: {path} in body must be of type integer or string",
            short(value)
        )
    })
}

/// A string's `pattern`, `minLength` and `maxLength`.
fn string(schema: &Value, s: &str, path: &str, out: &mut Admission) {
    if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
        match regex::Regex::new(p) {
            Ok(re) if !re.is_match(s) => out.invalid.push((
                path.to_string(),
                format!("Invalid value: \"{s}\": {path} in body should match '{p}'"),
            )),
            _ => {}
        }
    }
    let n = s.chars().count() as u64;
    if schema
        .get("minLength")
        .and_then(Value::as_u64)
        .is_some_and(|m| n < m)
    {
        out.invalid.push((
            path.to_string(),
            format!(
                "Invalid value: \"{s}\": {path} in body should be at least {} chars long",
                schema["minLength"]
            ),
        ));
    }
    if schema
        .get("maxLength")
        .and_then(Value::as_u64)
        .is_some_and(|m| n > m)
    {
        out.invalid.push((
            path.to_string(),
            format!(
                "Too long: may not be more than {} bytes",
                schema["maxLength"]
            ),
        ));
    }
}

/// A number's `minimum` and `maximum`.
fn number(schema: &Value, n: &serde_json::Number, path: &str, out: &mut Admission) {
    let x = n.as_f64().unwrap_or(0.0);
    if schema
        .get("minimum")
        .and_then(Value::as_f64)
        .is_some_and(|m| x < m)
    {
        out.invalid.push((
            path.to_string(),
            format!(
                "Invalid value: {x}: {path} in body should be greater than or equal to {}",
                schema["minimum"]
            ),
        ));
    }
    if schema
        .get("maximum")
        .and_then(Value::as_f64)
        .is_some_and(|m| x > m)
    {
        out.invalid.push((
            path.to_string(),
            format!(
                "Invalid value: {x}: {path} in body should be less than or equal to {}",
                schema["maximum"]
            ),
        ));
    }
}

/// An array's `maxItems` and `minItems`, then each item against `items`.
fn array(schema: &Value, items: &mut [Value], path: &str, out: &mut Admission) {
    let n = items.len() as u64;
    if schema
        .get("maxItems")
        .and_then(Value::as_u64)
        .is_some_and(|m| n > m)
    {
        out.invalid.push((
            path.to_string(),
            format!(
                "Too many: {n}: must have at most {} items",
                schema["maxItems"]
            ),
        ));
    }
    if schema
        .get("minItems")
        .and_then(Value::as_u64)
        .is_some_and(|m| n < m)
    {
        out.invalid.push((
            path.to_string(),
            format!(
                "Invalid value: {n}: {path} in body should have at least {} items",
                schema["minItems"]
            ),
        ));
    }
    if let Some(item_schema) = schema.get("items") {
        for (i, item) in items.iter_mut().enumerate() {
            walk(item_schema, item, &format!("{path}[{i}]"), out);
        }
    }
}

fn object(
    schema: &Value,
    map: &mut Map<String, Value>,
    path: &str,
    preserve: bool,
    out: &mut Admission,
) {
    let props = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    // Nulls of fields that are not nullable are dropped before anything else.
    let nullable = |field: &str| {
        props
            .and_then(|p| p.get(field))
            .and_then(|s| s.get("nullable"))
            == Some(&Value::Bool(true))
    };
    map.retain(|k, v| !v.is_null() || nullable(k));
    if let Some(props) = props {
        if !preserve && additional.is_none() {
            let unknown: Vec<String> = map
                .keys()
                .filter(|k| !props.contains_key(*k))
                .cloned()
                .collect();
            for k in unknown {
                map.remove(&k);
                out.unknown.push(join(path, &k));
            }
        }
        for (field, sub) in props {
            if !map.contains_key(field)
                && let Some(default) = sub.get("default")
            {
                map.insert(field.clone(), default.clone());
            }
            if let Some(v) = map.get_mut(field) {
                walk(sub, v, &join(path, field), out);
            }
        }
    } else if let Some(additional) = additional {
        for (k, v) in map.iter_mut() {
            walk(additional, v, &join(path, k), out);
        }
    } else if !preserve
        && schema.get("type").and_then(Value::as_str) == Some("object")
        && !map.is_empty()
    {
        // An object without properties keeps nothing unless it preserves unknown fields.
        let keys: Vec<String> = map.keys().cloned().collect();
        for k in keys {
            map.remove(&k);
            out.unknown.push(join(path, &k));
        }
    }
    for required in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !map.contains_key(required) {
            out.invalid
                .push((join(path, required), "Required value".to_string()));
        }
    }
}

/// Admit a custom resource against its schema: the root's `apiVersion`, `kind` and `metadata`
/// are the server's business; everything else is pruned, defaulted and validated.
pub fn admit(schema: &Value, obj: &mut Value) -> Admission {
    let mut out = Admission::default();
    let Some(map) = obj.as_object_mut() else {
        out.invalid
            .push((String::new(), "must be an object".into()));
        return out;
    };
    let keep: Vec<(String, Value)> = ["apiVersion", "kind", "metadata"]
        .iter()
        .filter_map(|k| map.remove(*k).map(|v| (k.to_string(), v)))
        .collect();
    let preserve = schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    object(schema, map, "", preserve, &mut out);
    for (k, v) in keep {
        map.insert(k, v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
                "spec": {
                    "type": "object",
                    "required": ["size"],
                    "properties": {
                        "size": {"x-kubernetes-int-or-string": true},
                        "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
                        "percent": {"type": "string", "pattern": "^(0(?:\\.\\d{1,3})?|1)$"},
                        "count": {"type": "integer", "minimum": 1, "maximum": 3},
                        "list": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "maybe": {"type": "string", "nullable": true},
                    },
                },
                "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
            },
        })
    }

    #[test]
    fn prune_default_and_accept() {
        let mut obj = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n", "anything": 1}, "spec": {"size": "1Gi", "extra": 1, "free": {"deep": {"x": 1}}, "labels": {"a": "b"}, "maybe": null, "count": null}, "other": true});
        let a = admit(&schema(), &mut obj);
        assert!(a.invalid.is_empty(), "{:?}", a.invalid);
        assert_eq!(a.unknown, ["other", "spec.extra"]);
        assert_eq!(obj["spec"]["mode"], "a", "defaulted");
        assert_eq!(obj["spec"]["free"]["deep"]["x"], 1, "preserved");
        assert_eq!(
            obj["metadata"]["anything"], 1,
            "metadata is not pruned here"
        );
        assert!(
            obj["spec"].get("maybe").is_some() && obj["spec"].get("count").is_none(),
            "nulls kept only where nullable"
        );
    }

    #[test]
    fn violations_name_their_fields() {
        let mut obj = json!({"spec": {"size": true, "mode": "c", "percent": "0.06x", "count": 9, "list": ["a", "b", "c"], "labels": {"a": 1}}});
        let a = admit(&schema(), &mut obj);
        let fields: Vec<&str> = a.invalid.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.count",
                "spec.labels.a",
                "spec.list",
                "spec.mode",
                "spec.percent",
                "spec.size"
            ]
        );
        let mode = &a.invalid.iter().find(|(f, _)| f == "spec.mode").unwrap().1;
        assert_eq!(
            mode,
            "Unsupported value: \"c\": supported values: \"a\", \"b\""
        );
        let mut missing = json!({"spec": {}});
        assert_eq!(
            admit(&schema(), &mut missing).invalid,
            [("spec.size".to_string(), "Required value".to_string())]
        );
    }

    /// controller-gen's schema of a `resource.Quantity`: integer or string, the pattern applying
    /// to strings only (as kube-openapi's validator does).
    #[test]
    fn quantities_are_integers_or_strings_of_the_pattern() {
        let pattern = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "requests": {"type": "object", "additionalProperties": {
                "anyOf": [{"type": "integer"}, {"type": "string"}],
                "pattern": pattern,
                "x-kubernetes-int-or-string": true,
            }},
        }}}});
        for good in [
            json!("10Gi"),
            json!(10737418240u64),
            json!("1.5e3"),
            json!("500m"),
            json!(0),
        ] {
            let mut obj = json!({"spec": {"requests": {"storage": good.clone()}}});
            let a = admit(&schema, &mut obj);
            assert!(a.invalid.is_empty(), "{good}: {:?}", a.invalid);
            assert_eq!(obj["spec"]["requests"]["storage"], good, "kept as sent");
        }
        for bad in ["10 Gi", "abc", "10GB", ""] {
            let mut obj = json!({"spec": {"requests": {"storage": bad}}});
            assert_eq!(
                admit(&schema, &mut obj).invalid,
                [(
                    "spec.requests.storage".to_string(),
                    format!(
                        "Invalid value: \"{bad}\": spec.requests.storage in body should match '{pattern}'"
                    )
                )],
                "{bad}"
            );
        }
        let mut obj = json!({"spec": {"requests": {"storage": 1.5}}});
        assert_eq!(
            admit(&schema, &mut obj).invalid,
            [(
                "spec.requests.storage".to_string(),
                "Invalid value: 1.5: spec.requests.storage in body must be of type integer or string"
                    .to_string()
            )]
        );
    }
}
