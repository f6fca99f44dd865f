//! PVC rendering from DataVolumes, table by table, without a cluster.

use std::collections::BTreeMap;

use cdi_api::config::{CDIConfigStatus, FilesystemOverhead};
use cdi_api::storageprofile::{ClaimPropertySet, StorageProfileStatus};
use cdi_api::{AccessMode, CDIConfig, CDIConfigSpec, DataVolume, StorageProfile, VolumeMode, ann};
use cdi_core::render::{
    RenderContext, RenderError, default_storage_class, filesystem_overhead, render_claim,
};
use cdi_core::size;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

fn dv(yaml: &str) -> DataVolume {
    let mut dv: DataVolume = serde_saphyr::from_str(yaml).unwrap();
    dv.metadata
        .namespace
        .get_or_insert_with(|| "default".into());
    dv.metadata.uid = Some("5e1d".into());
    dv
}

fn pairs(p: &[(&str, &str)]) -> BTreeMap<String, String> {
    p.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn class(name: &str, provisioner: &str, annotations: &[(&str, &str)]) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: Some(pairs(annotations)),
            ..Default::default()
        },
        provisioner: provisioner.into(),
        volume_binding_mode: Some("WaitForFirstConsumer".into()),
        ..Default::default()
    }
}

fn profile(
    name: &str,
    sets: Vec<ClaimPropertySet>,
    annotations: &[(&str, &str)],
) -> StorageProfile {
    let mut p = StorageProfile::new(name, Default::default());
    p.metadata.annotations = Some(pairs(annotations));
    p.status = Some(StorageProfileStatus {
        claim_property_sets: Some(sets),
        ..Default::default()
    });
    p
}

fn config(gates: &[&str], global: &str, per_class: &[(&str, &str)]) -> CDIConfig {
    let spec = CDIConfigSpec {
        feature_gates: Some(gates.iter().map(|g| g.to_string()).collect()),
        ..Default::default()
    };
    let mut c = CDIConfig::new("config", spec);
    c.status = Some(CDIConfigStatus {
        filesystem_overhead: Some(FilesystemOverhead {
            global: Some(global.into()),
            storage_class: Some(
                per_class
                    .iter()
                    .map(|(k, v)| (k.to_string(), (*v).into()))
                    .collect(),
            ),
        }),
        ..Default::default()
    });
    c
}

fn set(mode: AccessMode, volume: VolumeMode) -> ClaimPropertySet {
    ClaimPropertySet::new([mode], volume)
}

struct World {
    classes: Vec<StorageClass>,
    profiles: Vec<StorageProfile>,
    config: CDIConfig,
    drivers: Vec<String>,
}

impl World {
    fn new() -> Self {
        use AccessMode::ReadWriteOnce as Rwo;
        World {
            classes: vec![
                class("local-path-wffc", "rancher.io/local-path", &[]),
                class("csi-local", "csi.cdi-rs.dev", &[]),
                class("ebs-io2", "ebs.csi.aws.com", &[]),
                class("empty", "example.com/unknown", &[]),
            ],
            profiles: vec![
                profile(
                    "local-path-wffc",
                    vec![set(Rwo, VolumeMode::Filesystem)],
                    &[],
                ),
                profile(
                    "csi-local",
                    vec![
                        set(Rwo, VolumeMode::Block),
                        set(Rwo, VolumeMode::Filesystem),
                    ],
                    &[],
                ),
                profile(
                    "ebs-io2",
                    vec![set(Rwo, VolumeMode::Block)],
                    &[(ann::MINIMUM_SUPPORTED_PVC_SIZE, "4Gi")],
                ),
                profile("empty", vec![], &[]),
            ],
            config: config(&["HonorWaitForFirstConsumer"], "0.06", &[]),
            drivers: vec!["csi.cdi-rs.dev".into()],
        }
    }

    fn ctx(&self) -> RenderContext<'_> {
        RenderContext {
            storage_classes: &self.classes,
            storage_profiles: &self.profiles,
            config: Some(&self.config),
            csi_drivers: &self.drivers,
            clone_size: None,
        }
    }
}

fn request(claim: &PersistentVolumeClaim) -> String {
    claim
        .spec
        .as_ref()
        .unwrap()
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()["storage"]
        .0
        .clone()
}

fn annotations(claim: &PersistentVolumeClaim) -> &BTreeMap<String, String> {
    claim.metadata.annotations.as_ref().unwrap()
}

/// A DataVolume with a blank source and the given `spec.storage` (flow YAML).
fn blank_storage(storage: &str) -> DataVolume {
    dv(&format!(
        "metadata: {{name: d}}\nspec:\n  source: {{blank: {{}}}}\n  storage: {storage}\n"
    ))
}

const SEED_DV: &str = r#"
metadata:
  name: vm-with-wffc-disk-root
spec:
  source:
    http:
      url: "https://example.com/images/root.qcow2"
  priorityClassName: vm-disks
  serviceAccountName: importer
  pvc:
    storageClassName: local-path-wffc
    accessModes: [ReadWriteOnce]
    resources:
      requests:
        storage: 20Gi
"#;

#[test]
fn seed_spec_pvc_is_verbatim_with_import_annotations() {
    let world = World::new();
    let dv = dv(SEED_DV);
    let r = render_claim(&dv, &world.ctx()).unwrap();
    assert_eq!(r.claim.spec, dv.spec.pvc, "spec.pvc is copied verbatim");
    assert!(!r.use_populator, "local-path has no CSIDriver");
    let a = annotations(&r.claim);
    assert_eq!(
        a[ann::IMPORT_ENDPOINT],
        "https://example.com/images/root.qcow2"
    );
    assert_eq!(a[ann::IMPORT_SOURCE], "http");
    assert_eq!(a[ann::CONTENT_TYPE], "kubevirt");
    assert_eq!(a[ann::POD_RESTARTS], "0");
    assert_eq!(a[ann::USE_POPULATOR], "false");
    assert_eq!(a[ann::PREALLOCATION_REQUESTED], "false");
    assert_eq!(a[ann::CREATED_FOR_DATA_VOLUME], "5e1d");
    assert_eq!(a[ann::PRIORITY_CLASS_NAME], "vm-disks");
    assert_eq!(a[ann::POD_SERVICE_ACCOUNT_NAME], "importer");
    assert!(
        !a.contains_key(ann::IMMEDIATE_BINDING),
        "gate on: the claim waits for its consumer"
    );
    let meta = &r.claim.metadata;
    assert_eq!(
        (meta.name.as_deref(), meta.namespace.as_deref()),
        (Some("vm-with-wffc-disk-root"), Some("default"))
    );
    let owner = &meta.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("DataVolume", "5e1d", Some(true))
    );
    let labels = meta.labels.as_ref().unwrap();
    assert_eq!(labels["app"], "containerized-data-importer");
    assert_eq!(
        labels["alerts.k8s.io/KubePersistentVolumeFillingUp"],
        "disabled"
    );
    // The 6% surprise is reported.
    assert_eq!(r.warnings.len(), 1);
    assert!(
        r.warnings[0].contains("use spec.storage"),
        "{}",
        r.warnings[0]
    );
}

#[test]
fn gate_off_adds_immediate_binding() {
    let mut world = World::new();
    world.config = config(&[], "0.06", &[]);
    let r = render_claim(&dv(SEED_DV), &world.ctx()).unwrap();
    assert_eq!(annotations(&r.claim)[ann::IMMEDIATE_BINDING], "");
}

#[test]
fn spec_storage_is_completed_and_inflated() {
    let world = World::new();
    let r = render_claim(
        &blank_storage(
            "{storageClassName: local-path-wffc, resources: {requests: {storage: 10Gi}}}",
        ),
        &world.ctx(),
    )
    .unwrap();
    let spec = r.claim.spec.as_ref().unwrap();
    assert_eq!(request(&r.claim), "11381663335");
    assert_eq!(
        spec.access_modes.as_deref(),
        Some(&["ReadWriteOnce".to_string()][..])
    );
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    assert_eq!(annotations(&r.claim)[ann::IMPORT_SOURCE], "none");
    assert!(r.warnings.is_empty());
}

#[test]
fn per_class_overhead_and_block_volumes() {
    let mut world = World::new();
    world.config = config(
        &["HonorWaitForFirstConsumer"],
        "0.06",
        &[("local-path-wffc", "0.1")],
    );
    let storage = |mode: &str| {
        blank_storage(&format!(
            "{{storageClassName: local-path-wffc, accessModes: [ReadWriteOnce], volumeMode: {mode}, resources: {{requests: {{storage: 10Gi}}}}}}"
        ))
    };
    let r = render_claim(&storage("Filesystem"), &world.ctx()).unwrap();
    assert_eq!(
        request(&r.claim),
        size::required_space(10 << 30, "0.1".parse().unwrap())
            .unwrap()
            .to_string()
    );
    let r = render_claim(&storage("Block"), &world.ctx()).unwrap();
    assert_eq!(request(&r.claim), "10737418240", "Block is not inflated");
    assert!(
        !r.claim
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .contains_key("alerts.k8s.io/KubePersistentVolumeFillingUp")
    );
}

#[test]
fn overhead_resolution() {
    let c = config(&[], "0.05", &[("fast", "0.1"), ("broken", "ten")]);
    let fs = VolumeMode::Filesystem;
    assert_eq!(
        filesystem_overhead(Some(&c), Some("fast"), fs).to_string(),
        "0.1"
    );
    assert_eq!(
        filesystem_overhead(Some(&c), Some("other"), fs).to_string(),
        "0.05"
    );
    assert_eq!(
        filesystem_overhead(Some(&c), Some("broken"), fs).to_string(),
        "0.05"
    );
    assert_eq!(
        filesystem_overhead(None, Some("fast"), fs).to_string(),
        "0.06"
    );
    assert_eq!(
        filesystem_overhead(Some(&c), Some("fast"), VolumeMode::Block).to_string(),
        "0"
    );
}

#[test]
fn minimum_supported_size_raises_small_requests() {
    let world = World::new();
    let r = render_claim(
        &blank_storage("{storageClassName: ebs-io2, resources: {requests: {storage: 1Gi}}}"),
        &world.ctx(),
    )
    .unwrap();
    assert_eq!(request(&r.claim), "4Gi");
    assert_eq!(
        r.claim.spec.as_ref().unwrap().volume_mode.as_deref(),
        Some("Block")
    );
}

#[test]
fn volume_mode_given_picks_matching_access_modes_and_vice_versa() {
    let world = World::new();
    let r = render_claim(
        &blank_storage("{storageClassName: csi-local, volumeMode: Filesystem, resources: {requests: {storage: 1Gi}}}"),
        &world.ctx(),
    )
    .unwrap();
    assert_eq!(
        r.claim.spec.as_ref().unwrap().access_modes.as_deref(),
        Some(&["ReadWriteOnce".to_string()][..])
    );
    let r = render_claim(
        &blank_storage("{storageClassName: csi-local, accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}"),
        &world.ctx(),
    )
    .unwrap();
    assert_eq!(
        r.claim.spec.as_ref().unwrap().volume_mode.as_deref(),
        Some("Block"),
        "first set sharing a mode"
    );
}

#[test]
fn default_class_prefers_the_virt_default_then_the_newest() {
    let time = |s: &str| Some(Time(s.parse().unwrap()));
    let mut old = class("old-default", "p", &[(ann::DEFAULT_STORAGE_CLASS, "true")]);
    old.metadata.creation_timestamp = time("2026-01-01T00:00:00Z");
    let mut new = class("new-default", "p", &[(ann::DEFAULT_STORAGE_CLASS, "true")]);
    new.metadata.creation_timestamp = time("2026-06-01T00:00:00Z");
    let virt = class("virt", "p", &[(ann::DEFAULT_VIRT_STORAGE_CLASS, "true")]);
    let all = [old, new, virt.clone()];
    assert_eq!(
        default_storage_class(&all, true)
            .unwrap()
            .metadata
            .name
            .as_deref(),
        Some("virt")
    );
    assert_eq!(
        default_storage_class(&all, false)
            .unwrap()
            .metadata
            .name
            .as_deref(),
        Some("new-default")
    );
    assert!(default_storage_class(&[class("plain", "p", &[])], true).is_none());

    let mut world = World::new();
    world.classes.push(virt);
    world.profiles.push(profile(
        "virt",
        vec![set(AccessMode::ReadWriteMany, VolumeMode::Block)],
        &[],
    ));
    let r = render_claim(
        &blank_storage("{resources: {requests: {storage: 1Gi}}}"),
        &world.ctx(),
    )
    .unwrap();
    assert_eq!(
        r.claim.spec.as_ref().unwrap().storage_class_name.as_deref(),
        Some("virt")
    );
}

#[test]
fn populator_path_on_csi_classes_unless_turned_off() {
    let world = World::new();
    let yaml = |ann_line: &str| {
        dv(&format!(
            "metadata:\n  name: d\n{ann_line}spec:\n  source: {{http: {{url: 'http://127.0.0.1/disk.qcow2'}}}}\n  storage: {{storageClassName: csi-local, resources: {{requests: {{storage: 1Gi}}}}}}\n"
        ))
    };
    let r = render_claim(&yaml(""), &world.ctx()).unwrap();
    assert!(r.use_populator);
    let reference = r
        .claim
        .spec
        .as_ref()
        .unwrap()
        .data_source_ref
        .clone()
        .unwrap();
    assert_eq!(reference.api_group.as_deref(), Some("cdi.kubevirt.io"));
    assert_eq!(
        (reference.kind.as_str(), reference.name.as_str()),
        ("VolumeImportSource", "volume-import-source-5e1d")
    );
    assert!(
        !annotations(&r.claim).contains_key(ann::IMPORT_ENDPOINT),
        "the source lives in the VolumeImportSource"
    );
    assert_eq!(annotations(&r.claim)[ann::USE_POPULATOR], "true");

    let r = render_claim(
        &yaml("  annotations: {cdi.kubevirt.io/storage.usePopulator: \"false\"}\n"),
        &world.ctx(),
    )
    .unwrap();
    assert!(!r.use_populator);
    assert!(r.claim.spec.as_ref().unwrap().data_source_ref.is_none());
    assert_eq!(
        annotations(&r.claim)[ann::IMPORT_ENDPOINT],
        "http://127.0.0.1/disk.qcow2"
    );

    // External population: the DataVolume's own dataSourceRef stays, the claim is marked.
    let external = dv(
        "metadata:\n  name: e\nspec:\n  storage: {storageClassName: csi-local, resources: {requests: {storage: 1Gi}}, dataSourceRef: {apiGroup: example.com, kind: Blob, name: b}}\n",
    );
    let r = render_claim(&external, &world.ctx()).unwrap();
    let reference = r
        .claim
        .spec
        .as_ref()
        .unwrap()
        .data_source_ref
        .clone()
        .unwrap();
    assert_eq!(
        (reference.kind.as_str(), reference.name.as_str()),
        ("Blob", "b")
    );
    assert_eq!(annotations(&r.claim)[ann::EXTERNAL_POPULATION], "true");
    assert!(!annotations(&r.claim).contains_key(ann::IMPORT_SOURCE));

    let err = render_claim(
        &yaml("  annotations: {cdi.kubevirt.io/storage.usePopulator: \"maybe\"}\n"),
        &world.ctx(),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("use \"true\" or \"false\""),
        "{err}"
    );
}

#[test]
fn upload_and_clone_sources() {
    let world = World::new();
    let r = render_claim(
        &dv("metadata: {name: u}\nspec:\n  source: {upload: {}}\n  pvc: {storageClassName: local-path-wffc, resources: {requests: {storage: 1Gi}}}\n"),
        &world.ctx(),
    )
    .unwrap();
    assert_eq!(annotations(&r.claim)[ann::UPLOAD_REQUEST], "");
    let r = render_claim(
        &dv("metadata: {name: c}\nspec:\n  source: {pvc: {namespace: golden, name: fedora}}\n  storage: {storageClassName: local-path-wffc}\n"),
        &world.ctx(),
    )
    .unwrap();
    assert_eq!(annotations(&r.claim)[ann::CLONE_REQUEST], "golden/fedora");
    assert_eq!(
        request(&r.claim),
        "0",
        "clone sizes are detected from the source later"
    );
}

#[test]
fn errors_name_the_object_and_the_fix() {
    let world = World::new();
    let cases: &[(&str, &str)] = &[
        (
            "metadata: {name: e}\nspec:\n  source: {blank: {}}\n  storage: {storageClassName: empty, resources: {requests: {storage: 1Gi}}}\n",
            "StorageProfile empty has no claimPropertySets: set spec.storage.accessModes in DataVolume default/e or fill the profile's spec.claimPropertySets",
        ),
        (
            "metadata: {name: e}\nspec:\n  source: {blank: {}}\n",
            "DataVolume default/e: set exactly one of spec.pvc or spec.storage",
        ),
        (
            "metadata: {name: e}\nspec:\n  source: {blank: {}}\n  pvc: {}\n  storage: {}\n",
            "DataVolume default/e: spec.pvc and spec.storage are mutually exclusive; keep one",
        ),
        (
            "metadata: {name: e}\nspec:\n  source: {blank: {}, upload: {}}\n  pvc: {}\n",
            "DataVolume default/e: spec.source needs exactly one source kind, found upload, blank",
        ),
        (
            "metadata: {name: e}\nspec:\n  source: {blank: {}}\n  storage: {storageClassName: local-path-wffc}\n",
            "spec.storage.resources.requests.storage is missing",
        ),
        (
            "metadata: {name: e}\nspec:\n  source: {blank: {}}\n  storage: {storageClassName: local-path-wffc, resources: {requests: {storage: 10Ki}}}\n",
            "smaller than 1Mi",
        ),
        (
            "metadata: {name: e}\nspec:\n  source: {blank: {}}\n  storage: {storageClassName: local-path-wffc, resources: {requests: {storage: 10GB}}}\n",
            "unknown unit \"GB\"",
        ),
        (
            "metadata: {name: e}\nspec:\n  source: {blank: {}}\n  storage: {storageClassName: local-path-wffc, resources: {requests: {storage: \"9223372036854775807\"}}}\n",
            "DataVolume default/e: requested storage 9223372036854775807 with the filesystem overhead 0.06 needs a claim larger than 2^63-1 bytes; ask for less",
        ),
        (
            "metadata: {name: e}\nspec:\n  source: {blank: {}}\n  pvc: {accessModes: [ReadWriteOnce]}\n",
            "DataVolume default/e: spec.pvc.resources.requests.storage is missing",
        ),
        (
            "metadata: {name: e}\nspec:\n  source: {blank: {}}\n  pvc: {resources: {requests: {storage: \"0\"}}}\n",
            "requested storage 0 is smaller than 1Mi",
        ),
        (
            "metadata: {name: e}\nspec:\n  source: {blank: {}}\n  pvc: {resources: {requests: {storage: -1Gi}}}\n",
            "requested storage -1Gi is smaller than 1Mi",
        ),
        (
            "metadata: {name: e}\nspec:\n  source: {upload: {}}\n  contentType: archive\n  storage: {storageClassName: local-path-wffc, volumeMode: Block, resources: {requests: {storage: 1Gi}}}\n",
            "contentType archive needs a Filesystem volume",
        ),
        (
            "metadata: {name: e}\nspec:\n  source: {blank: {}}\n  storage: {resources: {requests: {storage: 1Gi}}}\n",
            "no StorageClass to choose access modes from",
        ),
        (
            "metadata: {name: e}\nspec:\n  source: {blank: {}}\n  storage: {storageClassName: local-path-wffc, volumeMode: Block, resources: {requests: {storage: 1Gi}}}\n",
            "has no claimPropertySet for volumeMode Block",
        ),
    ];
    for (yaml, want) in cases {
        let err = render_claim(&dv(yaml), &world.ctx()).expect_err(want);
        assert!(err.to_string().contains(want), "got {err}, want {want}");
    }
    let err = render_claim(
        &blank_storage("{storageClassName: local-path-wffc, volumeMode: Block, resources: {requests: {storage: 1Gi}}}"),
        &world.ctx(),
    )
    .unwrap_err();
    assert!(
        matches!(err, RenderError::NoMatchingAccessMode { .. }),
        "{err}"
    );
}

fn claim(yaml: &str) -> PersistentVolumeClaim {
    let mut c: PersistentVolumeClaim = serde_saphyr::from_str(yaml).unwrap();
    c.metadata.namespace = Some("vms".into());
    c
}

#[test]
fn a_claim_asking_for_its_storage_profile_gets_it() {
    let classes = [class(
        "fast",
        "csi.example.com",
        &[("storageclass.kubernetes.io/is-default-class", "true")],
    )];
    let profiles = [profile(
        "fast",
        vec![set(AccessMode::ReadWriteMany, VolumeMode::Block)],
        &[],
    )];
    let cfg = config(&[], "0.06", &[]);
    let ctx = RenderContext {
        storage_classes: &classes,
        storage_profiles: &profiles,
        config: Some(&cfg),
        csi_drivers: &[],
        clone_size: None,
    };
    // No class, modes or volume mode: the default class's profile fills them; a Block volume
    // needs no overhead.
    let c = claim(
        "metadata: {name: disk, labels: {cdi.kubevirt.io/applyStorageProfile: 'true'}}
spec: {resources: {requests: {storage: 1Gi}}, volumeMode: FromStorageProfile, volumeAttributesClassName: gold}",
    );
    let spec = cdi_core::render::render_pvc(&c, &ctx).unwrap();
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(spec.access_modes, Some(vec!["ReadWriteMany".to_string()]));
    assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
    assert_eq!(
        spec.volume_attributes_class_name.as_deref(),
        Some("gold"),
        "the rest is kept"
    );
    // Filesystem: the request grows by the overhead, as spec.storage's does.
    let c = claim(
        "metadata: {name: disk}
spec: {resources: {requests: {storage: 1Gi}}, volumeMode: Filesystem, accessModes: [ReadWriteOnce]}",
    );
    let spec = cdi_core::render::render_pvc(&c, &ctx).unwrap();
    assert_eq!(
        spec.resources.unwrap().requests.unwrap()["storage"].0,
        "1138166334"
    );
    // A snapshot restore keeps its size; a clone asking for none gets its source's.
    let c = claim(
        "metadata: {name: disk}
spec: {resources: {requests: {storage: 1Gi}}, dataSourceRef: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: s}}",
    );
    let spec = cdi_core::render::render_pvc(&c, &ctx).unwrap();
    assert_eq!(
        spec.resources.unwrap().requests.unwrap()["storage"].0,
        "1Gi"
    );
    let c = claim(
        "metadata: {name: disk}
spec: {dataSourceRef: {apiGroup: cdi.kubevirt.io, kind: VolumeCloneSource, name: golden}}",
    );
    let sized = RenderContext {
        clone_size: Some(2 << 30),
        ..ctx
    };
    let spec = cdi_core::render::render_pvc(&c, &sized).unwrap();
    assert_eq!(
        spec.resources.unwrap().requests.unwrap()["storage"].0,
        "2Gi"
    );
    // Errors name the claim and its own fields.
    let c = claim("metadata: {name: disk}\nspec: {volumeMode: Block}");
    let err = cdi_core::render::render_pvc(&c, &ctx).unwrap_err();
    assert_eq!(
        err.to_string(),
        "PersistentVolumeClaim vms/disk: spec.resources.requests.storage is missing; set the disk size, such as 10Gi"
    );
    let empty = [profile("fast", vec![], &[])];
    let bare = RenderContext {
        storage_profiles: &empty,
        ..ctx
    };
    let c = claim("metadata: {name: disk}\nspec: {resources: {requests: {storage: 1Gi}}}");
    assert_eq!(
        cdi_core::render::render_pvc(&c, &bare)
            .unwrap_err()
            .to_string(),
        "StorageProfile fast has no claimPropertySets: set spec.accessModes in PersistentVolumeClaim vms/disk or fill the profile's spec.claimPropertySets"
    );
}
