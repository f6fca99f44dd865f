//! Built-in objects decoded as kube-apiserver decodes every body into its Go type before anything
//! else: a `null` in a map becomes the element's zero value (`""`, a zero quantity), a quantity
//! must parse, `[]byte` must be base64, and a body that does not fit the type is a 400. What is
//! stored is then always decodable by the typed (k8s-openapi) clients the agents and controllers
//! list with — one undecodable object would otherwise break every list of its kind.

use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::errors::{ApiError, ApiResult};
use super::registry::ResourceDef;

/// apimachinery's `ErrFormatWrong`, the error of every quantity that does not parse.
const QUANTITY_FORMAT: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// Maps of strings anywhere in a built-in object (their nulls become "").
const STRING_MAPS: &[&str] = &[
    "labels",
    "annotations",
    "matchLabels",
    "nodeSelector",
    "volumeAttributes",
    "allocatedResourceStatuses",
];

/// Maps of quantities anywhere in a built-in object (their nulls become a zero quantity).
const QUANTITY_MAPS: &[&str] = &[
    "requests",
    "limits",
    "capacity",
    "allocatable",
    "overhead",
    "allocatedResources",
];

/// Top-level maps of strings (or base64 bytes) per kind, by (group, plural).
fn top_level_maps(def: &ResourceDef) -> &'static [&'static str] {
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "configmaps") => &["data", "binaryData"],
        ("", "secrets") => &["data", "stringData"],
        ("storage.k8s.io", "storageclasses") => &["parameters"],
        ("snapshot.storage.k8s.io", "volumesnapshotclasses") => &["parameters"],
        _ => &[],
    }
}

fn decode_error(def: &ResourceDef, detail: impl std::fmt::Display) -> ApiError {
    // The versioning decoder's wording.
    ApiError::bad_request(format!(
        "{kind} in version \"{v}\" cannot be handled as a {kind}: {detail}",
        kind = def.kind,
        v = def.version
    ))
}

fn fill_nulls(map: &mut serde_json::Map<String, Value>, zero: &str) {
    for v in map.values_mut() {
        if v.is_null() {
            *v = json!(zero);
        }
    }
}

/// Walks `v`, zeroing nulls in the maps named above and checking quantities.
fn walk(v: &mut Value) -> Result<(), String> {
    match v {
        Value::Object(map) => {
            for (k, child) in map.iter_mut() {
                if let Value::Object(inner) = child {
                    if STRING_MAPS.contains(&k.as_str()) {
                        fill_nulls(inner, "");
                    } else if QUANTITY_MAPS.contains(&k.as_str()) {
                        fill_nulls(inner, "0");
                        for q in inner.values_mut() {
                            quantity(q)?;
                        }
                        continue;
                    }
                }
                walk(child)?;
            }
        }
        Value::Array(items) => {
            for item in items {
                walk(item)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// A quantity as `Quantity.UnmarshalJSON` takes it: a string or a bare number, which must parse.
fn quantity(q: &mut Value) -> Result<(), String> {
    if let Value::Number(n) = q {
        *q = json!(n.to_string());
    }
    let Some(s) = q.as_str() else {
        return Err(format!(
            "json: cannot unmarshal {} into Go value of type resource.Quantity",
            go_type(q)
        ));
    };
    s.trim()
        .parse::<k8s_rules::Quantity>()
        .map(|_| ())
        .map_err(|_| QUANTITY_FORMAT.to_string())
}

fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
        Value::Null => "null",
    }
}

/// Go's base64 (`StdEncoding`) error for a `[]byte` field.
fn base64_data(map: &Value) -> Result<(), String> {
    use base64::DecodeError;
    use base64::Engine;
    for v in map.as_object().into_iter().flat_map(|m| m.values()) {
        let Some(s) = v.as_str() else {
            return Err(format!(
                "json: cannot unmarshal {} into Go value of type []uint8",
                go_type(v)
            ));
        };
        if let Err(e) = base64::engine::general_purpose::STANDARD.decode(s) {
            let at = match e {
                DecodeError::InvalidByte(at, _) | DecodeError::InvalidLastSymbol(at, _) => at,
                DecodeError::InvalidLength(_) | DecodeError::InvalidPadding => s.len(),
            };
            return Err(format!("illegal base64 data at input byte {at}"));
        }
    }
    Ok(())
}

fn typed<T: DeserializeOwned>(def: &ResourceDef, obj: &Value) -> ApiResult<()> {
    // The kind and version come from the URL; a body may leave them out.
    let mut obj = obj.clone();
    obj["apiVersion"] = json!(def.api_version());
    obj["kind"] = json!(def.kind);
    serde_path_to_error::deserialize::<_, T>(obj)
        .map(|_| ())
        .map_err(|e| decode_error(def, unmarshal_error(def, "", &e)))
}

/// A type error as Go's `encoding/json` words it, naming the field:
/// `json: cannot unmarshal number into Go struct field ObjectMeta.metadata.name of type string`.
/// Go prefixes the path with the Go type holding the field; that is known here for the
/// metadata's fields and the object's own, and left out deeper down. Other errors (a missing
/// required field, a bad enum) keep serde's words, after the field's path.
fn unmarshal_error(
    def: &ResourceDef,
    under: &str,
    e: &serde_path_to_error::Error<serde_json::Error>,
) -> String {
    // Go's path leaves out list indices.
    let mut segments: Vec<String> = e
        .path()
        .iter()
        .filter_map(|s| match s {
            serde_path_to_error::Segment::Map { key } => Some(key.clone()),
            serde_path_to_error::Segment::Seq { .. } => None,
            other => Some(other.to_string()),
        })
        .collect();
    if !under.is_empty() {
        segments.insert(0, under.to_string());
    }
    let path = segments.join(".");
    let inner = e.inner().to_string();
    // serde_json: "invalid type: integer `7`, expected a string at line 1 column 2"
    let Some(rest) = inner.strip_prefix("invalid type: ") else {
        return if path.is_empty() {
            inner
        } else {
            format!("{path}: {inner}")
        };
    };
    let got = match rest.split([' ', ',']).next().unwrap_or("") {
        "integer" | "floating" => "number",
        "string" => "string",
        "boolean" => "bool",
        "map" => "object",
        "sequence" => "array",
        "null" => "null",
        other => other,
    };
    let expected = rest
        .split_once("expected ")
        .map(|(_, x)| x.split(" at line").next().unwrap_or(x))
        .unwrap_or("");
    let go_type = match expected {
        "a string" => "string",
        "a boolean" => "bool",
        "i32" => "int32",
        "i64" => "int64",
        "f64" => "float64",
        "a sequence" => "[]",
        "a map" => "map",
        other => other,
    };
    let holder = match segments.as_slice() {
        [first, _] if first == "metadata" => "ObjectMeta.".to_string(),
        [_] => format!("{}.", def.kind),
        _ => String::new(),
    };
    format!("json: cannot unmarshal {got} into Go struct field {holder}{path} of type {go_type}")
}

/// Whether `def` is one of the built-in kinds (custom resources have their schema instead).
fn builtin(def: &ResourceDef) -> bool {
    def.schema.is_none() && !def.create_only
}

/// Normalise `obj` as Go's decoding would and refuse it (400) where it does not decode into its
/// kind's type.
pub fn decode(def: &ResourceDef, obj: &mut Value) -> ApiResult<()> {
    // Every kind's metadata is an ObjectMeta, custom resources' too (their schema leaves it to
    // the server): a null label must not reach, nor a number break, a typed list of DataVolumes.
    if let Some(Value::Object(meta)) = obj.get_mut("metadata") {
        for key in ["labels", "annotations"] {
            if let Some(Value::Object(map)) = meta.get_mut(key) {
                fill_nulls(map, "");
            }
        }
    }
    if let Some(meta) = obj.get("metadata") {
        serde_path_to_error::deserialize::<
            _,
            k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        >(meta.clone())
        .map_err(|e| decode_error(def, unmarshal_error(def, "metadata", &e)))?;
    }
    if !builtin(def) {
        return Ok(());
    }
    for key in top_level_maps(def) {
        if let Some(Value::Object(map)) = obj.get_mut(*key) {
            fill_nulls(map, "");
        }
    }
    // A CRD's schema names its properties `requests`, `labels`…: they are not maps of values.
    if def.plural != "customresourcedefinitions" {
        walk(obj).map_err(|e| decode_error(def, e))?;
    }
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "secrets") => base64_data(&obj["data"]).map_err(|e| decode_error(def, e))?,
        ("", "configmaps") => base64_data(&obj["binaryData"]).map_err(|e| decode_error(def, e))?,
        _ => {}
    }
    check_type(def, obj)
}

fn check_type(def: &ResourceDef, obj: &Value) -> ApiResult<()> {
    use k8s_openapi::api::{apps, coordination, core, events, rbac, storage};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "namespaces") => typed::<core::v1::Namespace>(def, obj),
        ("", "nodes") => typed::<core::v1::Node>(def, obj),
        ("", "pods") => typed::<core::v1::Pod>(def, obj),
        ("", "services") => typed::<core::v1::Service>(def, obj),
        ("", "endpoints") => typed::<core::v1::Endpoints>(def, obj),
        ("discovery.k8s.io", "endpointslices") => {
            typed::<k8s_openapi::api::discovery::v1::EndpointSlice>(def, obj)
        }
        ("", "configmaps") => typed::<core::v1::ConfigMap>(def, obj),
        ("", "secrets") => typed::<core::v1::Secret>(def, obj),
        ("", "serviceaccounts") => typed::<core::v1::ServiceAccount>(def, obj),
        ("", "events") => typed::<core::v1::Event>(def, obj),
        ("", "persistentvolumeclaims") => typed::<core::v1::PersistentVolumeClaim>(def, obj),
        ("", "persistentvolumes") => typed::<core::v1::PersistentVolume>(def, obj),
        ("events.k8s.io", "events") => typed::<events::v1::Event>(def, obj),
        ("storage.k8s.io", "storageclasses") => typed::<storage::v1::StorageClass>(def, obj),
        ("storage.k8s.io", "csidrivers") => typed::<storage::v1::CSIDriver>(def, obj),
        ("storage.k8s.io", "volumeattachments") => typed::<storage::v1::VolumeAttachment>(def, obj),
        ("coordination.k8s.io", "leases") => typed::<coordination::v1::Lease>(def, obj),
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            typed::<apiext::CustomResourceDefinition>(def, obj)
        }
        ("apps", "deployments") => typed::<apps::v1::Deployment>(def, obj),
        ("apps", "replicasets") => typed::<apps::v1::ReplicaSet>(def, obj),
        ("apiregistration.k8s.io", "apiservices") => typed::<
            k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService,
        >(def, obj),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations") => typed::<
            k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration,
        >(def, obj),
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations") => typed::<
            k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration,
        >(def, obj),
        ("rbac.authorization.k8s.io", "roles") => typed::<rbac::v1::Role>(def, obj),
        ("rbac.authorization.k8s.io", "clusterroles") => typed::<rbac::v1::ClusterRole>(def, obj),
        ("rbac.authorization.k8s.io", "rolebindings") => typed::<rbac::v1::RoleBinding>(def, obj),
        ("rbac.authorization.k8s.io", "clusterrolebindings") => {
            typed::<rbac::v1::ClusterRoleBinding>(def, obj)
        }
        // The snapshot kinds have no k8s-openapi type; their maps were normalised above.
        _ => Ok(()),
    }
}
