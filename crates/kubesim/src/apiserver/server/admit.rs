//! An object's admission before it is stored, in kube-apiserver's order: decoding and defaults,
//! validation (the kind's rules, a custom resource's schema, the rules of updates), and the
//! admission webhooks.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::call::Call;
use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::registry::ResourceDef;
use crate::apiserver::store::{ListOptions, Store};

/// What a write is, for admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Write {
    Create,
    Update,
    /// Through the status subresource: only status is taken, so only the schema applies.
    Status,
}

/// A create's admission in kube-apiserver's order: decoding and defaults, the mutating
/// webhooks, validation, the validating webhooks. (A mutating webhook may thus fill what
/// validation requires, as CDI's claim rendering does.)
pub(super) async fn admit_create(
    call: &Call,
    def: &ResourceDef,
    ns: &str,
    obj: &mut Value,
    url_name: Option<&str>,
) -> ApiResult<Vec<String>> {
    let store = &call.store;
    if !crate::apiserver::admission::any(store, def) {
        return admit(def, obj, &call.validation, Write::Create, url_name);
    }
    prepare(def, obj, Write::Create)?;
    let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
    let attempt = crate::apiserver::admission::Attempt {
        operation: "CREATE",
        def,
        subresource: "",
        namespace: ns,
        name: &name,
        old: None,
        user: &call.user,
        dry_run: call.dry_run,
    };
    let mut warnings = crate::apiserver::admission::mutate(store, &attempt, obj).await?;
    warnings.extend(admit(def, obj, &call.validation, Write::Create, url_name)?);
    warnings.extend(crate::apiserver::admission::validate(store, &attempt, Some(obj)).await?);
    Ok(warnings)
}

/// The admission webhooks of a create or update (`how` says which, and whether of the status
/// subresource): the mutating ones' patches applied to `obj` (which is admitted again when they
/// changed it), then the validating ones asked. Returns their warnings.
pub(super) async fn webhooks(
    call: &Call,
    def: &ResourceDef,
    ns: &str,
    name: &str,
    old: Option<&Value>,
    obj: &mut Value,
    how: Write,
) -> ApiResult<Vec<String>> {
    let store = &call.store;
    if !crate::apiserver::admission::any(store, def) {
        return Ok(Vec::new());
    }
    let (operation, subresource) = match how {
        Write::Create => ("CREATE", ""),
        Write::Update => ("UPDATE", ""),
        Write::Status => ("UPDATE", "status"),
    };
    let attempt = crate::apiserver::admission::Attempt {
        operation,
        def,
        subresource,
        namespace: ns,
        name,
        old,
        user: &call.user,
        dry_run: call.dry_run,
    };
    let before = obj.clone();
    let mut warnings = crate::apiserver::admission::mutate(store, &attempt, obj).await?;
    if *obj != before {
        warnings.extend(admit(def, obj, &call.validation, how, Some(name))?);
    }
    warnings.extend(crate::apiserver::admission::validate(store, &attempt, Some(obj)).await?);
    Ok(warnings)
}

/// Admit an object before it is stored: [`prepare`], then [`check`].
pub(super) fn admit(
    def: &ResourceDef,
    obj: &mut Value,
    field_validation: &str,
    write: Write,
    url_name: Option<&str>,
) -> ApiResult<Vec<String>> {
    prepare(def, obj, write)?;
    check(def, obj, field_validation, write, url_name)
}

/// Decode and default an object as kube-apiserver does before admission: a Secret's
/// `stringData` is folded in, defaults are set, a created object's `generateName` becomes its
/// name.
fn prepare(def: &ResourceDef, obj: &mut Value, write: Write) -> ApiResult<()> {
    crate::apiserver::decode::decode(def, obj)?;
    if def.group.is_empty() && def.plural == "secrets" {
        fold_string_data(obj);
        // SetDefaults_Secret.
        if obj["type"].as_str().is_none_or(str::is_empty) {
            obj["type"] = json!("Opaque");
        }
    }
    if write != Write::Status {
        match (def.group.as_str(), def.plural.as_str()) {
            ("storage.k8s.io", "storageclasses") => {
                crate::apiserver::validation::default_storage_class(obj);
            }
            ("", "persistentvolumes") => {
                crate::apiserver::validation::default_persistent_volume(obj)
            }
            // SetDefaults_PersistentVolumeClaimSpec.
            ("", "persistentvolumeclaims") => {
                if let Some(spec) = obj["spec"].as_object_mut()
                    && spec.get("volumeMode").is_none_or(Value::is_null)
                {
                    spec.insert("volumeMode".into(), json!("Filesystem"));
                }
            }
            _ => {}
        }
    }
    if write == Write::Create {
        generate_name(obj);
    }
    Ok(())
}

/// Validate an object as kube-apiserver's strategies do (names, metadata, the kind's rules, a
/// custom resource's schema), every failure in one 422. Unknown fields of custom resources are
/// pruned, refused under `fieldValidation=Strict`, and reported as warnings otherwise.
fn check(
    def: &ResourceDef,
    obj: &mut Value,
    field_validation: &str,
    write: Write,
    url_name: Option<&str>,
) -> ApiResult<Vec<String>> {
    let mut causes: Vec<(String, String)> = if write == Write::Status {
        Vec::new()
    } else {
        crate::apiserver::validation::validate(def, obj, write == Write::Create)
            .iter()
            .map(crate::apiserver::validation::FieldError::cause)
            .collect()
    };
    let mut unknown = Vec::new();
    if let Some(schema) = &def.schema {
        let result = crate::apiserver::schema::admit(schema, obj);
        causes.extend(result.invalid);
        unknown = result.unknown;
    }
    if !causes.is_empty() {
        let name = obj["metadata"]["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .or(url_name)
            .unwrap_or("")
            .to_string();
        return Err(ApiError::invalid(&qualified_kind(def), &name, causes));
    }
    let unknown: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field \"{f}\""))
        .collect();
    if field_validation == "Strict" && !unknown.is_empty() {
        return Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            unknown.join(", ")
        )));
    }
    if field_validation == "Ignore" {
        return Ok(Vec::new());
    }
    Ok(unknown)
}

/// `Kind`, or `Kind.group`, as Kubernetes names a kind in messages.
fn qualified_kind(def: &ResourceDef) -> String {
    if def.group.is_empty() {
        def.kind.clone()
    } else {
        format!("{}.{}", def.kind, def.group)
    }
}

/// A name from `generateName` as kube makes one: the prefix (cut to 58 bytes, so that the name
/// stays a valid label) and five random characters of its alphabet.
fn generate_name(obj: &mut Value) {
    if obj["metadata"]["name"]
        .as_str()
        .is_some_and(|n| !n.is_empty())
    {
        return;
    }
    let Some(prefix) = obj["metadata"]["generateName"]
        .as_str()
        .filter(|p| !p.is_empty())
        .map(str::to_string)
    else {
        return;
    };
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut cut = prefix.len().min(58);
    while !prefix.is_char_boundary(cut) {
        cut -= 1;
    }
    let seed = crate::apiserver::store::new_uid().replace('-', "");
    let suffix: String = seed
        .as_bytes()
        .chunks(2)
        .take(5)
        .map(|pair| {
            let n = u8::from_str_radix(std::str::from_utf8(pair).unwrap_or("0"), 16).unwrap_or(0);
            ALPHABET[n as usize % ALPHABET.len()] as char
        })
        .collect();
    obj["metadata"]["name"] = json!(format!("{}{suffix}", &prefix[..cut]));
}

/// A Secret's write-only `stringData` is merged into `data` (base64) on every write, its keys
/// winning, as kube-apiserver does; it is never stored.
fn fold_string_data(secret: &mut Value) {
    use base64::Engine;
    let Some(map) = secret.as_object_mut() else {
        return;
    };
    let Some(Value::Object(strings)) = map.remove("stringData") else {
        return;
    };
    let data = map.entry("data").or_insert_with(|| json!({}));
    if data.is_null() {
        *data = json!({});
    }
    if let Some(data) = data.as_object_mut() {
        for (k, v) in strings {
            let text = v.as_str().unwrap_or_default();
            data.insert(
                k,
                base64::engine::general_purpose::STANDARD
                    .encode(text)
                    .into(),
            );
        }
    }
}

/// Whether `def` is PersistentVolumeClaims.
fn is_claims(def: &ResourceDef) -> bool {
    def.group.is_empty() && def.plural == "persistentvolumeclaims"
}

/// The classes with `allowVolumeExpansion`, read before a claim is changed (not while the store
/// is held for the change).
pub(super) fn expandable_classes(store: &Store, def: &ResourceDef) -> BTreeSet<String> {
    if !is_claims(def) {
        return BTreeSet::new();
    }
    let Some(classes) = store
        .registry()
        .get("storage.k8s.io", "v1", "storageclasses")
        .cloned()
    else {
        return BTreeSet::new();
    };
    let (items, _, _) = store.list(&classes, None, &ListOptions::default());
    items
        .iter()
        .filter(|c| c["allowVolumeExpansion"] == true)
        .filter_map(|c| c["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

/// Rules kube-apiserver applies to changes of existing objects, all failures in one 422
/// (ValidateStorageClassUpdate, ValidatePersistentVolumeClaimUpdate). Then, for claims, the
/// PersistentVolumeClaimResize admission plugin: a bound claim's request may grow only when its
/// class has `allowVolumeExpansion`.
pub(super) fn validate_update(
    def: &ResourceDef,
    expandable: &BTreeSet<String>,
    current: &Value,
    next: &Value,
) -> ApiResult<()> {
    use crate::apiserver::validation::{
        FieldError, claim_update, persistent_volume_update, storage_class_update,
    };
    let errors = match (def.group.as_str(), def.plural.as_str()) {
        ("storage.k8s.io", "storageclasses") => storage_class_update(current, next),
        ("", "persistentvolumes") => persistent_volume_update(current, next),
        ("", "persistentvolumeclaims") => claim_update(current, next),
        _ => return Ok(()),
    };
    let name = current["metadata"]["name"].as_str().unwrap_or("");
    if !errors.is_empty() {
        return Err(ApiError::invalid(
            &qualified_kind(def),
            name,
            errors.iter().map(FieldError::cause).collect(),
        ));
    }
    if !is_claims(def) || current["status"]["phase"] != "Bound" {
        return Ok(());
    }
    let size = |v: &Value| {
        v.as_str()
            .and_then(|s| s.parse::<k8s_rules::Quantity>().ok())
            .map(|q| q.milli_value())
    };
    let path = |o: &Value| o["spec"]["resources"]["requests"]["storage"].clone();
    let (Some(old), Some(new)) = (size(&path(current)), size(&path(next))) else {
        return Ok(());
    };
    let class = current["spec"]["storageClassName"].as_str().unwrap_or("");
    if new > old && !expandable.contains(class) {
        return Err(ApiError::forbidden(format!(
            "persistentvolumeclaims \"{name}\" is forbidden: only dynamically provisioned pvc \
             can be resized and the storageclass that provisions the pvc must support resize"
        )));
    }
    Ok(())
}
