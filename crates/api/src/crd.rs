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
    all.sort_by(|a, b| a.spec.names.plural.cmp(&b.spec.names.plural));
    all
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
