//! Upstream-shaped manifests read into the typed API and written back lose nothing.

use cdi_api::*;
use k8s_openapi::api::storage::v1::StorageClass;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The API server drops `null`s of optional fields; a round trip is compared without them.
fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

fn round_trip<T: DeserializeOwned + Serialize>(doc: &Value) -> Value {
    let typed: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{} {}: {e}", doc["kind"], doc["metadata"]["name"]));
    serde_json::to_value(&typed).unwrap()
}

fn check_file(name: &str) -> Vec<String> {
    let path = format!("{}/tests/manifests/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let mut kinds = Vec::new();
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap().to_string();
        let back = match kind.as_str() {
            "DataVolume" => round_trip::<DataVolume>(&doc),
            "CDIConfig" => round_trip::<CDIConfig>(&doc),
            "CDI" => round_trip::<CDI>(&doc),
            "StorageProfile" => round_trip::<StorageProfile>(&doc),
            "DataSource" => round_trip::<DataSource>(&doc),
            "DataImportCron" => round_trip::<DataImportCron>(&doc),
            "VolumeImportSource" => round_trip::<VolumeImportSource>(&doc),
            "VolumeUploadSource" => round_trip::<VolumeUploadSource>(&doc),
            "VolumeCloneSource" => round_trip::<VolumeCloneSource>(&doc),
            "ObjectTransfer" => round_trip::<ObjectTransfer>(&doc),
            "UploadTokenRequest" => round_trip::<UploadTokenRequest>(&doc),
            "VirtualMachine" => round_trip::<VirtualMachine>(&doc),
            "VirtualMachineInstance" => round_trip::<VirtualMachineInstance>(&doc),
            "StorageClass" => round_trip::<StorageClass>(&doc),
            other => panic!("no type for kind {other}"),
        };
        pretty_assertions::assert_eq!(
            without_nulls(&doc),
            back,
            "{kind} {} changed on a round trip",
            doc["metadata"]["name"]
        );
        kinds.push(kind);
    }
    kinds
}

#[test]
fn seed_virtual_machine_and_storage_class() {
    assert_eq!(
        check_file("seed-vm-wffc.yaml"),
        ["StorageClass", "VirtualMachine"]
    );
}

#[test]
fn a_datavolume_of_every_source_kind() {
    let kinds = check_file("datavolumes.yaml");
    assert!(kinds.iter().all(|k| k == "DataVolume"));
    let text = std::fs::read_to_string(format!(
        "{}/tests/manifests/datavolumes.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let dvs: Vec<DataVolume> = serde_saphyr::from_multiple(&text).unwrap();
    let mut seen: Vec<&str> = dvs
        .iter()
        .filter_map(|dv| dv.spec.source.as_ref())
        .flat_map(|s| s.kinds())
        .map(|k| k.field())
        .collect();
    seen.sort();
    seen.dedup();
    assert_eq!(
        seen,
        [
            "blank", "gcs", "http", "imageio", "pvc", "registry", "s3", "snapshot", "upload",
            "vddk"
        ]
    );
    assert!(dvs.iter().any(|dv| dv.spec.source_ref.is_some()));
}

#[test]
fn config_profiles_and_install() {
    assert_eq!(
        check_file("config-and-profiles.yaml"),
        ["CDIConfig", "StorageProfile", "StorageProfile", "CDI"]
    );
}

#[test]
fn golden_images_populators_transfer_upload_and_vmi() {
    assert_eq!(check_file("golden-images.yaml").len(), 8);
}

#[test]
fn typed_fields_read_as_expected() {
    let path = format!(
        "{}/tests/manifests/seed-vm-wffc.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&std::fs::read_to_string(path).unwrap()).unwrap();
    let vm: VirtualMachine = serde_json::from_value(docs[1].clone()).unwrap();
    let dvt = &vm.spec.data_volume_templates.as_ref().unwrap()[0];
    assert_eq!(dvt.metadata.name.as_deref(), Some("vm-with-wffc-disk-root"));
    let pvc = dvt.spec.pvc.as_ref().unwrap();
    assert_eq!(pvc.storage_class_name.as_deref(), Some("local-path-wffc"));
    let vmi = vm.spec.template.as_ref().unwrap().spec.as_ref().unwrap();
    assert_eq!(
        vmi.node_selector.as_ref().unwrap()["node-role.kubernetes.io/virt-local"],
        "true"
    );
    assert_eq!(
        vmi.tolerations.as_ref().unwrap()[0].effect.as_deref(),
        Some("NoSchedule")
    );
    assert_eq!(
        vmi.volumes.as_ref().unwrap()[0].claim_name(),
        Some("vm-with-wffc-disk-root")
    );
}
