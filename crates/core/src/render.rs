//! Rendering the PersistentVolumeClaim of a DataVolume (docs/design.md#rendering-the-claim): what the DataVolume
//! controller creates, decided from plain data.

use std::collections::BTreeMap;

use cdi_api::config::CDIConfig;
use cdi_api::datavolume::{
    DataVolume, DataVolumeSource, StorageSpec, VOLUME_MODE_FROM_STORAGE_PROFILE,
};
use cdi_api::enums::ContentType;
use cdi_api::populators::{
    VOLUME_CLONE_SOURCE_KIND, VOLUME_IMPORT_SOURCE_KIND, VOLUME_UPLOAD_SOURCE_KIND,
};
use cdi_api::storageprofile::StorageProfile;
use cdi_api::{ann, gate, label, name};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, TypedObjectReference,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::quantity::{Quantity, QuantityError};
use crate::size::{self, ClaimApi, MIB, Overhead, VolumeMode, resolve_volume_mode};

/// What the cluster looks like, as far as rendering is concerned.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderContext<'a> {
    pub storage_classes: &'a [StorageClass],
    pub storage_profiles: &'a [StorageProfile],
    pub config: Option<&'a CDIConfig>,
    /// Names of the CSIDriver objects in the cluster.
    pub csi_drivers: &'a [String],
    /// A clone's source size in bytes (its capacity, else its request): the size of a clone
    /// that asks for none.
    pub clone_size: Option<i64>,
}

/// Why a DataVolume's claim cannot be rendered. Every message names the object and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("{dv}: set exactly one of spec.pvc or spec.storage")]
    NoClaimSpec { dv: String },
    #[error("{dv}: spec.pvc and spec.storage are mutually exclusive; keep one")]
    BothClaimSpecs { dv: String },
    #[error("{dv}: spec.source needs exactly one source kind, found {found}")]
    SourceKinds { dv: String, found: String },
    #[error("{dv}: {api}.resources.requests.storage is missing; set the disk size, such as 10Gi")]
    MissingSize { dv: String, api: &'static str },
    #[error("{dv}: requested storage {size} is smaller than 1Mi; ask for at least 1Mi")]
    TooSmall { dv: String, size: String },
    #[error("{dv}: requested storage: {source}")]
    BadSize { dv: String, source: QuantityError },
    #[error(
        "{dv}: requested storage {size} with the filesystem overhead {overhead} needs a claim larger than 2^63-1 bytes; ask for less"
    )]
    Unrepresentable {
        dv: String,
        size: String,
        overhead: String,
    },
    #[error("{dv}: contentType archive needs a Filesystem volume; remove volumeMode: Block")]
    ArchiveOnBlock { dv: String },
    #[error(
        "{dv}: no StorageClass to choose access modes from; set {api}.accessModes and {api}.storageClassName, or mark a class as default"
    )]
    NoStorageClass { dv: String, api: &'static str },
    #[error(
        "StorageProfile {profile} has no claimPropertySets: set {api}.accessModes in {dv} or fill the profile's spec.claimPropertySets"
    )]
    EmptyProfile {
        dv: String,
        api: &'static str,
        profile: String,
    },
    #[error(
        "StorageProfile {profile} has no claimPropertySet for volumeMode {mode}: set {api}.accessModes in {dv} or add a set for {mode} to the profile"
    )]
    NoMatchingAccessMode {
        dv: String,
        api: &'static str,
        profile: String,
        mode: String,
    },
    #[error(
        "StorageProfile {profile} does not exist yet: it is created for StorageClass {profile}; retry, or set {api}.accessModes and volumeMode"
    )]
    MissingProfile {
        dv: String,
        api: &'static str,
        profile: String,
    },
    #[error("{dv}: annotation {key}={value:?} is not a boolean; use \"true\" or \"false\"")]
    BadUsePopulator {
        dv: String,
        key: &'static str,
        value: String,
    },
}

/// The claim to create, and what was decided on the way.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedClaim {
    pub claim: PersistentVolumeClaim,
    /// Whether the populator path is used (written back to the DataVolume's
    /// `storage.usePopulator` annotation, as upstream does).
    pub use_populator: bool,
    /// Warnings for the user, emitted as events (the `spec.pvc` size surprise).
    pub warnings: Vec<String>,
}

/// Go's `strconv.ParseBool`.
fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The default StorageClass: with `virt` (kubevirt content), the virt default first, then the
/// Kubernetes default; among several, the newest, then the first by name.
pub fn default_storage_class(classes: &[StorageClass], virt: bool) -> Option<&StorageClass> {
    let pick = |key: &str| {
        classes
            .iter()
            .filter(|c| annotation(&c.metadata, key) == Some("true"))
            .min_by(|a, b| {
                let ts = |c: &StorageClass| c.metadata.creation_timestamp.as_ref().map(|t| t.0);
                ts(b)
                    .cmp(&ts(a))
                    .then_with(|| a.metadata.name.cmp(&b.metadata.name))
            })
    };
    (if virt {
        pick(ann::DEFAULT_VIRT_STORAGE_CLASS)
    } else {
        None
    })
    .or_else(|| pick(ann::DEFAULT_STORAGE_CLASS))
}

fn class_named<'a>(classes: &'a [StorageClass], name: &str) -> Option<&'a StorageClass> {
    classes
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(name))
}

/// The filesystem overhead for claims of `class`: the per-class value of CDIConfig's status, else
/// its global value, else 0.06. Block volumes have none. Values that do not match upstream's
/// `Percent` pattern are skipped as if absent.
pub fn filesystem_overhead(
    config: Option<&CDIConfig>,
    class: Option<&str>,
    mode: VolumeMode,
) -> Overhead {
    let fs = config
        .and_then(|c| c.status.as_ref())
        .and_then(|s| s.filesystem_overhead.as_ref());
    let per_class = class.and_then(|name| {
        fs.and_then(|f| f.storage_class.as_ref())
            .and_then(|m| m.get(name))
    });
    let global = fs.and_then(|f| f.global.as_ref());
    per_class
        .and_then(|p| p.0.parse::<Overhead>().ok())
        .or_else(|| global.and_then(|p| p.0.parse().ok()))
        .unwrap_or(size::DEFAULT_OVERHEAD)
        .for_mode(mode)
}

fn gate_enabled(config: Option<&CDIConfig>, name: &str) -> bool {
    config.is_some_and(|c| c.spec.gate_enabled(name))
}

/// Fill `spec.storage`'s missing class, access modes and volume mode (upstream's order).
fn complete_storage(
    dv: &str,
    api: &'static str,
    storage: &StorageSpec,
    content: ContentType,
    ctx: &RenderContext<'_>,
) -> Result<PersistentVolumeClaimSpec, RenderError> {
    let mut spec = PersistentVolumeClaimSpec {
        access_modes: storage.access_modes.clone().filter(|m| !m.is_empty()),
        selector: storage.selector.clone(),
        resources: storage.resources.clone(),
        volume_name: storage.volume_name.clone(),
        storage_class_name: storage.storage_class_name.clone(),
        volume_mode: storage
            .volume_mode
            .clone()
            .filter(|m| !m.is_empty() && m != VOLUME_MODE_FROM_STORAGE_PROFILE),
        data_source: storage.data_source.clone(),
        data_source_ref: storage.data_source_ref.clone(),
        ..Default::default()
    };
    if content == ContentType::Archive {
        if spec.volume_mode.as_deref() == Some("Block") {
            return Err(RenderError::ArchiveOnBlock { dv: dv.into() });
        }
        spec.volume_mode = Some("Filesystem".into());
    }
    let class = match &spec.storage_class_name {
        Some(name) => class_named(ctx.storage_classes, name),
        None => default_storage_class(ctx.storage_classes, content == ContentType::KubeVirt),
    };
    let Some(class) = class else {
        if spec.access_modes.is_none() {
            return Err(RenderError::NoStorageClass { dv: dv.into(), api });
        }
        return Ok(spec);
    };
    let class_name = class.metadata.name.clone().unwrap_or_default();
    spec.storage_class_name = Some(class_name.clone());
    if spec.access_modes.is_some() && spec.volume_mode.is_some() {
        return Ok(spec);
    }
    let profile = ctx
        .storage_profiles
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(class_name.as_str()))
        .ok_or_else(|| RenderError::MissingProfile {
            dv: dv.into(),
            api,
            profile: class_name.clone(),
        })?;
    let sets = profile
        .status
        .as_ref()
        .and_then(|s| s.claim_property_sets.clone())
        .unwrap_or_default();
    let modes = |set: &cdi_api::ClaimPropertySet| -> Vec<String> {
        set.access_modes
            .iter()
            .map(|m| m.as_str().to_string())
            .collect()
    };
    match (&spec.access_modes, &spec.volume_mode) {
        (None, None) => {
            // Only the first set counts, as upstream.
            let first = sets
                .first()
                .filter(|s| !s.access_modes.is_empty())
                .ok_or_else(|| RenderError::EmptyProfile {
                    dv: dv.into(),
                    api,
                    profile: class_name.clone(),
                })?;
            spec.access_modes = Some(modes(first));
            spec.volume_mode = Some(first.volume_mode.as_str().to_string());
        }
        (None, Some(mode)) => {
            let set = sets
                .iter()
                .find(|s| s.volume_mode.as_str() == mode && !s.access_modes.is_empty())
                .ok_or_else(|| {
                    if sets.is_empty() {
                        RenderError::EmptyProfile {
                            dv: dv.into(),
                            api,
                            profile: class_name.clone(),
                        }
                    } else {
                        RenderError::NoMatchingAccessMode {
                            dv: dv.into(),
                            api,
                            profile: class_name.clone(),
                            mode: mode.clone(),
                        }
                    }
                })?;
            spec.access_modes = Some(modes(set));
        }
        (Some(wanted), None) => {
            // The first set sharing any access mode gives the volume mode; none is fine.
            if let Some(set) = sets.iter().find(|s| {
                s.access_modes
                    .iter()
                    .any(|m| wanted.iter().any(|w| w == m.as_str()))
            }) {
                spec.volume_mode = Some(set.volume_mode.as_str().to_string());
            }
        }
        (Some(_), Some(_)) => {}
    }
    Ok(spec)
}

/// Upstream's rendering of a claim labelled `cdi.kubevirt.io/applyStorageProfile: "true"` (its
/// `/pvc-mutate` webhook, `RenderPvc`): what a DataVolume's `spec.storage` gets, for a claim of
/// one's own. The class (the default when none is named), the access modes and volume mode from
/// the StorageProfile when the claim leaves them out (`volumeMode: FromStorageProfile` counts as
/// left out; `cdi.kubevirt.io/storage.contentType: archive` asks for a Filesystem volume), and
/// the size inflated by the filesystem overhead and raised to the profile's minimum. A restore
/// from a VolumeSnapshot keeps its size (no more than the snapshot holds); a clone through a
/// VolumeCloneSource keeps its size, or gets `ctx.clone_size`, its source's, when it asks for
/// none. The rest of the claim's spec is kept.
pub fn render_pvc(
    claim: &PersistentVolumeClaim,
    ctx: &RenderContext<'_>,
) -> Result<PersistentVolumeClaimSpec, RenderError> {
    let id = format!(
        "PersistentVolumeClaim {}/{}",
        claim.metadata.namespace.as_deref().unwrap_or(""),
        claim.metadata.name.as_deref().unwrap_or("")
    );
    let original = claim.spec.clone().unwrap_or_default();
    let storage = StorageSpec {
        access_modes: original.access_modes.clone(),
        selector: original.selector.clone(),
        resources: original.resources.clone(),
        volume_name: original.volume_name.clone(),
        storage_class_name: original.storage_class_name.clone(),
        volume_mode: original.volume_mode.clone(),
        data_source: original.data_source.clone(),
        data_source_ref: original.data_source_ref.clone(),
    };
    let content = match annotation(&claim.metadata, ann::CONTENT_TYPE) {
        Some("archive") => ContentType::Archive,
        _ => ContentType::KubeVirt,
    };
    let mut spec = complete_storage(&id, "spec", &storage, content, ctx)?;
    let is_kind = |group: Option<&str>, kind: &str, want_group: &str, want_kind: &str| {
        group == Some(want_group) && kind == want_kind
    };
    let snapshot = original.data_source_ref.as_ref().is_some_and(|r| {
        is_kind(
            r.api_group.as_deref(),
            &r.kind,
            "snapshot.storage.k8s.io",
            "VolumeSnapshot",
        )
    }) || original.data_source.as_ref().is_some_and(|r| {
        is_kind(
            r.api_group.as_deref(),
            &r.kind,
            "snapshot.storage.k8s.io",
            "VolumeSnapshot",
        )
    });
    let clone = original.data_source_ref.as_ref().is_some_and(|r| {
        is_kind(
            r.api_group.as_deref(),
            &r.kind,
            cdi_api::GROUP,
            "VolumeCloneSource",
        )
    });
    let asked = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .is_some_and(|q| Quantity::try_from(q).is_ok_and(|q| !q.is_zero()));
    if clone {
        if !asked && let Some(bytes) = ctx.clone_size {
            spec.resources
                .get_or_insert_with(VolumeResourceRequirements::default)
                .requests
                .get_or_insert_with(BTreeMap::new)
                .insert("storage".into(), Quantity::from_bytes_binary(bytes).into());
        }
    } else if !snapshot {
        size_storage(&id, "spec", &mut spec, false, ctx)?;
    }
    Ok(PersistentVolumeClaimSpec {
        access_modes: spec.access_modes,
        resources: spec.resources,
        storage_class_name: spec.storage_class_name,
        volume_mode: spec.volume_mode,
        ..original
    })
}

/// `spec.pvc` is taken as written, but its size must be there and at least 1 MiB, as upstream's
/// webhook requires (even for clones): a claim of 0 bytes would "succeed" with no disk.
fn check_pvc_size(dv: &str, spec: &PersistentVolumeClaimSpec) -> Result<(), RenderError> {
    let requested = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref()?.get("storage"))
        .ok_or_else(|| RenderError::MissingSize {
            dv: dv.into(),
            api: "spec.pvc",
        })?;
    let quantity = Quantity::try_from(requested).map_err(|source| RenderError::BadSize {
        dv: dv.into(),
        source,
    })?;
    if quantity.value() < MIB {
        return Err(RenderError::TooSmall {
            dv: dv.into(),
            size: requested.0.clone(),
        });
    }
    Ok(())
}

/// Inflate `spec.storage`'s size for a Filesystem volume and raise it to the profile's minimum.
fn size_storage(
    dv: &str,
    api: &'static str,
    spec: &mut PersistentVolumeClaimSpec,
    is_clone: bool,
    ctx: &RenderContext<'_>,
) -> Result<(), RenderError> {
    let requests = spec
        .resources
        .get_or_insert_with(VolumeResourceRequirements::default)
        .requests
        .get_or_insert_with(BTreeMap::new);
    let detected;
    let requested = match (requests.get("storage"), ctx.clone_size) {
        (Some(r), _) => r,
        // A clone that asks for no size gets its source's (upstream's detectCloneSize), with
        // the target's overhead on top as for any spec.storage size.
        (None, Some(bytes)) if is_clone => {
            detected = Quantity::from_bytes_binary(bytes).into();
            &detected
        }
        (None, None) if is_clone => {
            // Not known yet: the source is looked at again before the claim is made.
            requests.insert("storage".into(), Quantity::from_bytes(0).into());
            return Ok(());
        }
        (None, _) => {
            return Err(RenderError::MissingSize { dv: dv.into(), api });
        }
    };
    let quantity = Quantity::try_from(requested).map_err(|source| RenderError::BadSize {
        dv: dv.into(),
        source,
    })?;
    let bytes = quantity.value();
    if bytes < MIB {
        return Err(RenderError::TooSmall {
            dv: dv.into(),
            size: requested.0.clone(),
        });
    }
    let mode = resolve_volume_mode(spec.volume_mode.as_deref());
    let overhead = filesystem_overhead(ctx.config, spec.storage_class_name.as_deref(), mode);
    let plan = size::plan(ClaimApi::Storage, mode, bytes, overhead).ok_or_else(|| {
        RenderError::Unrepresentable {
            dv: dv.into(),
            size: requested.0.clone(),
            overhead: overhead.to_string(),
        }
    })?;
    let mut result: k8s_openapi::apimachinery::pkg::api::resource::Quantity =
        Quantity::from_bytes(plan.pvc_request).into();
    let minimum = spec
        .storage_class_name
        .as_deref()
        .and_then(|class| {
            ctx.storage_profiles
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(class))
        })
        .and_then(|p| annotation(&p.metadata, ann::MINIMUM_SUPPORTED_PVC_SIZE))
        .and_then(|m| m.parse::<Quantity>().ok().map(|q| (m, q)));
    if let Some((text, min)) = minimum
        && min.value() > plan.pvc_request
    {
        result = k8s_openapi::apimachinery::pkg::api::resource::Quantity(text.to_string());
    }
    requests.insert("storage".into(), result);
    Ok(())
}

/// The import annotations of a classic-path claim (what the importer pod is built from).
pub(crate) fn source_annotations(source: &DataVolumeSource, into: &mut BTreeMap<String, String>) {
    let mut set = |k: &str, v: &str| {
        into.insert(k.to_string(), v.to_string());
    };
    let non_empty = |v: &Option<String>| v.as_deref().filter(|s| !s.is_empty()).map(str::to_string);
    if let Some(http) = &source.http {
        set(ann::IMPORT_ENDPOINT, &http.url);
        set(ann::IMPORT_SOURCE, "http");
        if let Some(v) = non_empty(&http.secret_ref) {
            set(ann::IMPORT_SECRET, &v);
        }
        if let Some(v) = non_empty(&http.cert_config_map) {
            set(ann::IMPORT_CERT_CONFIG_MAP, &v);
        }
        if let Some(v) = non_empty(&http.checksum) {
            set(ann::IMPORT_CHECKSUM, &v);
        }
        if http.insecure_skip_verify == Some(true) {
            set(ann::IMPORT_INSECURE_SKIP_VERIFY, "true");
        }
        for (i, h) in http.extra_headers.iter().flatten().enumerate() {
            set(&ann::extra_header(i), h);
        }
        for (i, h) in http.secret_extra_headers.iter().flatten().enumerate() {
            set(&ann::secret_extra_header(i), h);
        }
    } else if let Some(s3) = &source.s3 {
        set(ann::IMPORT_ENDPOINT, &s3.url);
        set(ann::IMPORT_SOURCE, "s3");
        if let Some(v) = non_empty(&s3.secret_ref) {
            set(ann::IMPORT_SECRET, &v);
        }
        if let Some(v) = non_empty(&s3.cert_config_map) {
            set(ann::IMPORT_CERT_CONFIG_MAP, &v);
        }
    } else if let Some(gcs) = &source.gcs {
        set(ann::IMPORT_ENDPOINT, &gcs.url);
        set(ann::IMPORT_SOURCE, "gcs");
        if let Some(v) = non_empty(&gcs.secret_ref) {
            set(ann::IMPORT_SECRET, &v);
        }
    } else if let Some(reg) = &source.registry {
        set(ann::IMPORT_SOURCE, "registry");
        if let Some(m) = reg.pull_method {
            set(ann::REGISTRY_IMPORT_METHOD, m.as_str());
        }
        if let Some(url) = non_empty(&reg.url) {
            set(ann::IMPORT_ENDPOINT, &url);
        } else if let Some(stream) = non_empty(&reg.image_stream) {
            set(ann::IMPORT_ENDPOINT, &stream);
            set(ann::REGISTRY_IMAGE_STREAM, "true");
        }
        if let Some(v) = non_empty(&reg.secret_ref) {
            set(ann::IMPORT_SECRET, &v);
        }
        if let Some(v) = non_empty(&reg.cert_config_map) {
            set(ann::IMPORT_CERT_CONFIG_MAP, &v);
        }
        if let Some(arch) = reg
            .platform
            .as_ref()
            .and_then(|p| non_empty(&p.architecture))
        {
            set(ann::REGISTRY_IMAGE_ARCHITECTURE, &arch);
        }
    } else if let Some(io) = &source.imageio {
        set(ann::IMPORT_ENDPOINT, &io.url);
        set(ann::IMPORT_SOURCE, "imageio");
        set(ann::IMPORT_SECRET, io.secret_ref.as_deref().unwrap_or(""));
        set(
            ann::IMPORT_CERT_CONFIG_MAP,
            io.cert_config_map.as_deref().unwrap_or(""),
        );
        set(ann::DISK_ID, &io.disk_id);
        if io.insecure_skip_verify == Some(true) {
            set(ann::IMPORT_INSECURE_SKIP_VERIFY, "true");
        }
    } else if let Some(vddk) = &source.vddk {
        set(ann::IMPORT_ENDPOINT, vddk.url.as_deref().unwrap_or(""));
        set(ann::IMPORT_SOURCE, "vddk");
        set(ann::IMPORT_SECRET, vddk.secret_ref.as_deref().unwrap_or(""));
        set(
            ann::BACKING_FILE,
            vddk.backing_file.as_deref().unwrap_or(""),
        );
        set(ann::UUID, vddk.uuid.as_deref().unwrap_or(""));
        set(ann::THUMBPRINT, vddk.thumbprint.as_deref().unwrap_or(""));
        if let Some(v) = non_empty(&vddk.init_image_url) {
            set(ann::VDDK_INIT_IMAGE_URL, &v);
        }
        if let Some(v) = non_empty(&vddk.extra_args) {
            set(ann::VDDK_EXTRA_ARGS, &v);
        }
    } else if source.blank.is_some() {
        set(ann::IMPORT_SOURCE, "none");
    }
}

/// Render the claim of `dv` (name, namespace, labels, annotations, owner, spec).
pub fn render_claim(
    dv: &DataVolume,
    ctx: &RenderContext<'_>,
) -> Result<RenderedClaim, RenderError> {
    let dv_name = dv.metadata.name.clone().unwrap_or_default();
    let id = match &dv.metadata.namespace {
        Some(ns) => format!("DataVolume {ns}/{dv_name}"),
        None => format!("DataVolume {dv_name}"),
    };
    let source = dv.spec.source.clone().unwrap_or_default();
    let kinds = source.kinds();
    if kinds.len() > 1 || (kinds.is_empty() && dv.spec.source.is_some()) {
        let found = if kinds.is_empty() {
            "none".to_string()
        } else {
            kinds
                .iter()
                .map(|k| k.field())
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(RenderError::SourceKinds { dv: id, found });
    }
    let is_clone = source.pvc.is_some() || source.snapshot.is_some();
    let mut warnings = Vec::new();
    let mut spec = claim_spec(dv, &id, is_clone, ctx, &mut warnings)?;
    let use_populator = uses_populator(dv, &id, &spec, ctx)?;
    let labels = claim_labels(dv, &spec);
    let mut annotations = claim_annotations(dv, &spec, use_populator, ctx);
    if use_populator && !kinds.is_empty() {
        populator_source(dv, &source, &mut spec, &mut annotations);
    } else {
        request_annotations(dv, &source, &mut annotations);
    }
    let owner = OwnerReference {
        api_version: format!("{}/{}", cdi_api::GROUP, cdi_api::VERSION),
        kind: "DataVolume".into(),
        name: dv_name.clone(),
        uid: dv.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(dv_name),
            namespace: dv.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    };
    Ok(RenderedClaim {
        claim,
        use_populator,
        warnings,
    })
}

/// The claim's spec: `spec.pvc` as written (checked, perhaps with a size warning), or
/// `spec.storage` completed from the profile and sized (docs/design.md#the-size-math).
fn claim_spec(
    dv: &DataVolume,
    id: &str,
    is_clone: bool,
    ctx: &RenderContext<'_>,
    warnings: &mut Vec<String>,
) -> Result<PersistentVolumeClaimSpec, RenderError> {
    let content = dv.spec.content_type.unwrap_or_default();
    match (&dv.spec.pvc, &dv.spec.storage) {
        (Some(_), Some(_)) => Err(RenderError::BothClaimSpecs { dv: id.into() }),
        (None, None) => Err(RenderError::NoClaimSpec { dv: id.into() }),
        (Some(pvc), None) => {
            let spec = pvc.clone();
            check_pvc_size(id, &spec)?;
            if let Some(w) = pvc_size_warning(id, &spec, ctx) {
                warnings.push(w);
            }
            Ok(spec)
        }
        (None, Some(storage)) => {
            let mut spec = complete_storage(id, "spec.storage", storage, content, ctx)?;
            size_storage(id, "spec.storage", &mut spec, is_clone, ctx)?;
            Ok(spec)
        }
    }
}

/// The populator decision: the DataVolume's annotation, else "the provisioner is CSI".
fn uses_populator(
    dv: &DataVolume,
    id: &str,
    spec: &PersistentVolumeClaimSpec,
    ctx: &RenderContext<'_>,
) -> Result<bool, RenderError> {
    match annotation(&dv.metadata, ann::USE_POPULATOR) {
        Some(value) => parse_bool(value).ok_or_else(|| RenderError::BadUsePopulator {
            dv: id.into(),
            key: ann::USE_POPULATOR,
            value: value.to_string(),
        }),
        None => {
            let class = match &spec.storage_class_name {
                Some(name) => class_named(ctx.storage_classes, name),
                None => default_storage_class(ctx.storage_classes, false),
            };
            Ok(class.is_some_and(|c| ctx.csi_drivers.contains(&c.provisioner)))
        }
    }
}

/// CDI's labels (a Filesystem claim's filling up is not alerted on), the DataVolume's, and the
/// recommended ones.
fn claim_labels(dv: &DataVolume, spec: &PersistentVolumeClaimSpec) -> BTreeMap<String, String> {
    let mode = resolve_volume_mode(spec.volume_mode.as_deref());
    let mut labels = BTreeMap::from([(label::APP.to_string(), label::APP_VALUE.to_string())]);
    if mode == VolumeMode::Filesystem {
        labels.insert(
            label::KUBE_PERSISTENT_VOLUME_FILLING_UP_SUPPRESS.to_string(),
            label::KUBE_PERSISTENT_VOLUME_FILLING_UP_SUPPRESS_VALUE.to_string(),
        );
    }
    labels.extend(dv.metadata.labels.clone().unwrap_or_default());
    labels.insert(
        "app.kubernetes.io/managed-by".into(),
        "cdi-controller".into(),
    );
    labels.insert("app.kubernetes.io/component".into(), "storage".into());
    labels
}

/// The DataVolume's annotations, and what the claim says of itself for the controllers: the
/// path, the content type, external population, the worker pods' priority class, account and
/// preallocation, whose it is, and whether it binds at once.
fn claim_annotations(
    dv: &DataVolume,
    spec: &PersistentVolumeClaimSpec,
    use_populator: bool,
    ctx: &RenderContext<'_>,
) -> BTreeMap<String, String> {
    let content = dv.spec.content_type.unwrap_or_default();
    let mut annotations = dv.metadata.annotations.clone().unwrap_or_default();
    annotations.remove(ann::POPULATED_FOR);
    // Recorded by the controllers when the claim's node is chosen, never taken from a user.
    annotations.remove(cdi_api::ext::WORKER_TOLERATIONS);
    annotations.insert(ann::USE_POPULATOR.into(), use_populator.to_string());
    annotations.insert(ann::POD_RESTARTS.into(), "0".into());
    annotations.insert(ann::CONTENT_TYPE.into(), content.as_str().into());
    // Filled by something else than CDI (upstream marks it, and its import controller skips it).
    if dv.spec.source.is_none() && (spec.data_source.is_some() || spec.data_source_ref.is_some()) {
        annotations.insert(ann::EXTERNAL_POPULATION.into(), "true".into());
    }
    if let Some(pc) = dv
        .spec
        .priority_class_name
        .as_deref()
        .filter(|s| !s.is_empty())
    {
        annotations.insert(ann::PRIORITY_CLASS_NAME.into(), pc.into());
    }
    if let Some(sa) = dv
        .spec
        .service_account_name
        .as_deref()
        .filter(|s| !s.is_empty())
    {
        annotations.insert(ann::POD_SERVICE_ACCOUNT_NAME.into(), sa.into());
    }
    let preallocation = dv
        .spec
        .preallocation
        .or_else(|| {
            ctx.config
                .and_then(|c| c.status.as_ref())
                .and_then(|s| s.preallocation)
        })
        .unwrap_or(false);
    annotations.insert(
        ann::PREALLOCATION_REQUESTED.into(),
        preallocation.to_string(),
    );
    if let Some(uid) = &dv.metadata.uid {
        annotations.insert(ann::CREATED_FOR_DATA_VOLUME.into(), uid.clone());
    }
    // Without the gate, nothing waits for a first consumer: say so on the claim itself.
    if !gate_enabled(ctx.config, gate::HONOR_WAIT_FOR_FIRST_CONSUMER) {
        annotations.insert(ann::IMMEDIATE_BINDING.into(), String::new());
    }
    annotations
}

/// On the populator path (docs/design.md#the-populators) the claim names its populator's source
/// (`volume-<kind>-source-<uid>`); a clone's source in another namespace is named too.
fn populator_source(
    dv: &DataVolume,
    source: &DataVolumeSource,
    spec: &mut PersistentVolumeClaimSpec,
    annotations: &mut BTreeMap<String, String>,
) {
    let uid = dv.metadata.uid.clone().unwrap_or_default();
    let populator_ref = |kind: &str, prefix: &str| TypedObjectReference {
        api_group: Some(cdi_api::GROUP.into()),
        kind: kind.into(),
        name: format!("{prefix}-{uid}"),
        namespace: None,
    };
    if source.upload.is_some() {
        spec.data_source_ref = Some(populator_ref(
            VOLUME_UPLOAD_SOURCE_KIND,
            name::VOLUME_UPLOAD_SOURCE_PREFIX,
        ));
    } else if source.pvc.is_some() || source.snapshot.is_some() {
        spec.data_source_ref = Some(populator_ref(
            VOLUME_CLONE_SOURCE_KIND,
            name::VOLUME_CLONE_SOURCE_PREFIX,
        ));
        let src_ns = source
            .pvc
            .as_ref()
            .map(|p| &p.namespace)
            .or(source.snapshot.as_ref().map(|s| &s.namespace));
        if let Some(ns) = src_ns.filter(|ns| Some(*ns) != dv.metadata.namespace.as_ref()) {
            annotations.insert(ann::DATA_SOURCE_NAMESPACE.into(), ns.clone());
        }
    } else {
        spec.data_source_ref = Some(populator_ref(
            VOLUME_IMPORT_SOURCE_KIND,
            name::VOLUME_IMPORT_SOURCE_PREFIX,
        ));
    }
}

/// Off the populator path the claim's annotations ask its controller for the work: an upload,
/// a clone of `namespace/name`, or an import from the source.
fn request_annotations(
    dv: &DataVolume,
    source: &DataVolumeSource,
    annotations: &mut BTreeMap<String, String>,
) {
    if source.upload.is_some() {
        annotations.insert(ann::UPLOAD_REQUEST.into(), String::new());
    } else if let Some(pvc) = &source.pvc {
        let ns = if pvc.namespace.is_empty() {
            dv.metadata.namespace.clone().unwrap_or_default()
        } else {
            pvc.namespace.clone()
        };
        annotations.insert(ann::CLONE_REQUEST.into(), format!("{ns}/{}", pvc.name));
    } else {
        source_annotations(source, annotations);
    }
}

/// A size warning (docs/design.md#size-warnings): a `spec.pvc` Filesystem claim yields a disk smaller than its request.
fn pvc_size_warning(
    dv: &str,
    spec: &PersistentVolumeClaimSpec,
    ctx: &RenderContext<'_>,
) -> Option<String> {
    let mode = resolve_volume_mode(spec.volume_mode.as_deref());
    if mode == VolumeMode::Block {
        return None;
    }
    let requested = spec.resources.as_ref()?.requests.as_ref()?.get("storage")?;
    let bytes = Quantity::try_from(requested).ok()?.value();
    let overhead = filesystem_overhead(ctx.config, spec.storage_class_name.as_deref(), mode);
    let plan = size::plan(ClaimApi::Pvc, mode, bytes, overhead)?;
    (plan.disk_image < bytes).then(|| {
        format!(
            "{dv}: spec.pvc requests {} ({bytes} bytes) but the disk image will be {} bytes after the {overhead} filesystem overhead; use spec.storage to get a disk of the requested size",
            requested.0, plan.disk_image
        )
    })
}
