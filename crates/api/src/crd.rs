//! The CustomResourceDefinitions of the CDI kinds, generated from the types.
//!
//! `deploy/crds/` holds the rendered output; a test fails when it differs from what the types
//! generate, so the checked-in files can never drift from the code.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::{
    CDI, CDIConfig, DataImportCron, DataSource, DataVolume, ObjectTransfer, StorageProfile,
    VolumeCloneSource, VolumeImportSource, VolumeUploadSource,
};

/// Upstream declares the status subresource only on these kinds; on the others `status` is
/// written with the main resource.
const STATUS_SUBRESOURCE: &[&str] = &["DataVolume", "StorageProfile", "ObjectTransfer"];

/// Every CDI CustomResourceDefinition, in a stable order (by plural name).
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut all = vec![
        CDIConfig::crd(),
        CDI::crd(),
        DataImportCron::crd(),
        DataSource::crd(),
        DataVolume::crd(),
        ObjectTransfer::crd(),
        StorageProfile::crd(),
        VolumeCloneSource::crd(),
        VolumeImportSource::crd(),
        VolumeUploadSource::crd(),
    ];
    let quantity = quantity_schema_as_derived();
    for crd in &mut all {
        let kind = crd.spec.names.kind.clone();
        for version in &mut crd.spec.versions {
            if !STATUS_SUBRESOURCE.contains(&kind.as_str()) {
                version.subresources = None;
            }
            if let Some(schema) = version
                .schema
                .as_mut()
                .and_then(|s| s.open_api_v3_schema.as_mut())
            {
                let mut value = serde_json::to_value(&*schema).expect("a schema is JSON");
                drop_nullable(&mut value);
                with_quantity_pattern(&mut value, &quantity);
                with_object_fields(&mut value);
                *schema = serde_json::from_value(value).expect("still a schema");
            }
        }
        crd.metadata.labels = Some(
            [
                (
                    crate::label::APP.to_string(),
                    crate::label::APP_VALUE.to_string(),
                ),
                ("operator.cdi.kubevirt.io".to_string(), String::new()),
            ]
            .into(),
        );
    }
    // Upstream serves the CDI kind at v1alpha1 too (not stored, the same schema), so that old
    // CDI manifests still apply.
    for crd in all.iter_mut().filter(|c| c.spec.names.kind == "CDI") {
        let mut older = crd.spec.versions[0].clone();
        older.name = "v1alpha1".into();
        older.storage = false;
        crd.spec.versions.insert(0, older);
    }
    all.sort_by(|a, b| a.spec.names.plural.cmp(&b.spec.names.plural));
    all
}

/// The fields every object has, beside `spec` and `status`, as upstream's schemas list them (the
/// derive leaves them out): `kubectl explain` shows them.
fn with_object_fields(root: &mut serde_json::Value) {
    let Some(properties) = root
        .get_mut("properties")
        .and_then(serde_json::Value::as_object_mut)
    else {
        return;
    };
    let fields = [
        (
            "apiVersion",
            serde_json::json!({"type": "string", "description":
                "The versioned schema this object is written in, such as cdi.kubevirt.io/v1beta1."}),
        ),
        (
            "kind",
            serde_json::json!({"type": "string", "description":
                "The kind of object this is, in CamelCase, such as DataVolume."}),
        ),
        ("metadata", serde_json::json!({"type": "object"})),
    ];
    for (name, schema) in fields {
        properties.entry(name).or_insert(schema);
    }
}

/// Upstream's schemas (controller-gen) mark nothing nullable: a `null` sent for an optional
/// field is pruned by the API server instead of stored. The derive marks every `Option` field
/// nullable and adds `null` to enums, so both are removed to behave as upstream.
fn drop_nullable(node: &mut serde_json::Value) {
    match node {
        serde_json::Value::Object(map) => {
            map.remove("nullable");
            if let Some(serde_json::Value::Array(values)) = map.get_mut("enum") {
                values.retain(|v| !v.is_null());
            }
            map.values_mut().for_each(drop_nullable);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(drop_nullable),
        _ => {}
    }
}

/// The pattern kube's `resource.Quantity` carries in every generated schema (its
/// `OpenAPISchemaPattern`): a string quantity must be a signed decimal number with an optional
/// binary-SI, decimal-SI or exponent suffix.
pub const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// The schema k8s-openapi derives for a `Quantity`: its long description and
/// `x-kubernetes-int-or-string`, nothing that validates the string.
fn quantity_schema_as_derived() -> serde_json::Value {
    use schemars::JsonSchema;
    let schema = k8s_openapi::apimachinery::pkg::api::resource::Quantity::json_schema(
        &mut schemars::SchemaGenerator::default(),
    );
    serde_json::to_value(schema).expect("a schema is JSON")
}

/// Upstream's schemas (controller-gen) give every `resource.Quantity` field
/// `anyOf: [{type: integer}, {type: string}]`, the quantity `pattern` and
/// `x-kubernetes-int-or-string`, so "10 Gi" is refused at admission rather than by a controller
/// later. Every node that is exactly the derived Quantity schema becomes upstream's.
fn with_quantity_pattern(node: &mut serde_json::Value, quantity: &serde_json::Value) {
    if node == quantity {
        *node = serde_json::json!({
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": true,
        });
        return;
    }
    match node {
        serde_json::Value::Object(map) => map
            .values_mut()
            .for_each(|v| with_quantity_pattern(v, quantity)),
        serde_json::Value::Array(items) => items
            .iter_mut()
            .for_each(|v| with_quantity_pattern(v, quantity)),
        _ => {}
    }
}

/// The file name a CRD is checked in under: `<plural>.<group>.yaml`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.{}.yaml", crd.spec.names.plural, crd.spec.group)
}

/// One CRD rendered as a YAML document.
pub fn to_yaml(crd: &CustomResourceDefinition) -> String {
    // Serialising plain data to a string cannot fail; a failure is a bug in the types.
    serde_saphyr::to_string(crd).expect("a CustomResourceDefinition serialises to YAML")
}

/// Every CRD with the file name it is checked in under, in [`crds`] order.
pub fn rendered() -> Vec<(String, String)> {
    crds().iter().map(|c| (file_name(c), to_yaml(c))).collect()
}
