//! What upstream's validating admission webhook (`/datavolume-validate`) refuses of a
//! DataVolume, in its words and field paths, so `kubectl apply` of a bad DataVolume fails at once
//! as it does against upstream. The controller judges the same rules again when it sees the
//! object (a DataVolume made while no webhook ran), and says so in the DataVolume's conditions.

use cdi_api::datavolume::{DataVolume, DataVolumeSpec};
use cdi_api::enums::ContentType;
use k8s_openapi::api::core::v1::VolumeResourceRequirements;

use crate::quantity::Quantity;

/// One reason for a refusal: a `metav1.StatusCause`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// `FieldValueInvalid`, or `FieldValueDuplicate`.
    pub reason: &'static str,
    pub message: String,
    pub field: String,
}

const INVALID: &str = "FieldValueInvalid";
const DUPLICATE: &str = "FieldValueDuplicate";
const MIB: i64 = 1 << 20;
const ACCESS_MODES: [&str; 4] = [
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];

fn cause(message: impl Into<String>, field: &str) -> Cause {
    Cause {
        reason: INVALID,
        message: message.into(),
        field: field.into(),
    }
}

/// The spec with what a multi-stage import may change between stages left out.
fn comparable(spec: &DataVolumeSpec) -> serde_json::Value {
    let mut spec = spec.clone();
    let source = spec.source.as_ref();
    let multi_stage = source.is_some_and(|s| s.vddk.is_some() || s.imageio.is_some())
        && spec.checkpoints.as_ref().is_some_and(|c| !c.is_empty());
    if multi_stage {
        spec.checkpoints = None;
        spec.final_checkpoint = None;
    }
    serde_json::to_value(spec).unwrap_or_default()
}

/// Why `dv` may not be created (`old` is `None`) or `old` may not become `dv`; empty when it
/// may. Upstream's order: the first group that fails is what is said.
pub fn data_volume(dv: &DataVolume, old: Option<&DataVolume>) -> Vec<Cause> {
    if let Some(old) = old
        && comparable(&dv.spec) != comparable(&old.spec)
    {
        return vec![Cause {
            reason: DUPLICATE,
            message: "Cannot update DataVolume Spec".into(),
            field: "DataVolume.Spec".into(),
        }];
    }
    spec(dv, "spec")
}

/// cdi-rs's own DataVolume annotations (docs/controllers.md#admission-webhooks), refused when set or changed to something that
/// is not one: a `first-consumer` value that is no pod scheduling template, a
/// `worker-placement` value cdi-rs does not know. An object that already carries a bad value
/// stays updatable (and deletable); the controller says so in an event.
pub fn extensions(dv: &DataVolume, old: Option<&DataVolume>) -> Vec<Cause> {
    use cdi_api::ext;
    let value = |d: &DataVolume, key: &str| {
        d.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .cloned()
    };
    let changed = |key: &str| old.is_none_or(|o| value(o, key) != value(dv, key));
    let field = |key: &str| format!("metadata.annotations[{key}]");
    let mut causes = Vec::new();
    if changed(ext::FIRST_CONSUMER)
        && let Some(Err(message)) = crate::first_consumer::template(dv)
    {
        causes.push(cause(message, &field(ext::FIRST_CONSUMER)));
    }
    let what = format!(
        "DataVolume {}/{}",
        dv.metadata.namespace.as_deref().unwrap_or(""),
        dv.metadata.name.as_deref().unwrap_or("")
    );
    if changed(ext::WORKER_PLACEMENT)
        && let Some(message) =
            crate::placement::placement_refused(dv.metadata.annotations.as_ref(), &what)
    {
        causes.push(cause(message, &field(ext::WORKER_PLACEMENT)));
    }
    causes
}

/// Upstream's refusal of a new DataVolume whose claim name is taken (`claim`, the claim of its
/// name if there is one): unless the claim was populated for it or may be adopted
/// (`allowClaimAdoption`, or the `DataVolumeClaimAdoption` gate of `cfg`), or a DataVolume
/// controls it (the controller then says whose it is).
pub fn claim_taken(
    dv: &DataVolume,
    claim: Option<&k8s_openapi::api::core::v1::PersistentVolumeClaim>,
    cfg: Option<&cdi_api::config::CDIConfig>,
) -> Option<Cause> {
    let claim = claim?;
    let name = dv.metadata.name.as_deref().unwrap_or("");
    let populated_for = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(cdi_api::keys::ann::POPULATED_FOR))
        .is_some_and(|n| n == name);
    if populated_for || crate::claims::adoptable(claim, dv, cfg) {
        return None;
    }
    let controlled_by_a_dv = claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind == "DataVolume");
    if controlled_by_a_dv {
        return None;
    }
    let ns = dv.metadata.namespace.as_deref().unwrap_or("");
    Some(Cause {
        reason: DUPLICATE,
        message: format!("Destination PVC {ns}/{name} already exists"),
        field: "DataVolume.Name".into(),
    })
}

/// Upstream's `validateExternalPopulation`: every cause of a DataVolume filled by a populator
/// of its own choosing. Field paths as upstream prints them (`name[]`: Go's path of an empty
/// child). One difference: upstream refuses any DataVolume that sets both `dataSource` and
/// `dataSourceRef` (its comparison of the two types never holds); cdi-rs only when they differ.
fn external_population(
    with_source: bool,
    data_source: Option<&k8s_openapi::api::core::v1::TypedLocalObjectReference>,
    data_source_ref: Option<&k8s_openapi::api::core::v1::TypedObjectReference>,
    at: &dyn Fn(&str) -> String,
) -> Vec<Cause> {
    let mut causes = Vec::new();
    if with_source {
        causes.push(cause(
            "External population is incompatible with Source and SourceRef",
            &at("source"),
        ));
    }
    if let (Some(a), Some(b)) = (data_source, data_source_ref) {
        let same = a.name == b.name
            && a.kind == b.kind
            && a.api_group.as_deref().unwrap_or("") == b.api_group.as_deref().unwrap_or("")
            && b.namespace.as_deref().unwrap_or("").is_empty();
        if !same {
            causes.push(cause("DataSourceRef and DataSource must match", ""));
        }
    }
    let reference = |what: &str, name: &str, kind: &str, group: Option<&str>| {
        let mut causes = Vec::new();
        let root = at(&format!("{}{}", what[..1].to_lowercase(), &what[1..]));
        if name.is_empty() {
            causes.push(cause(
                format!("Required value: {what} name"),
                &format!("{root}.name[]"),
            ));
        }
        if kind.is_empty() {
            causes.push(cause(
                format!("Required value: {what} kind"),
                &format!("{root}.kind"),
            ));
        }
        if group.unwrap_or("").is_empty() && kind != "PersistentVolumeClaim" {
            causes.push(cause(
                format!("Required value: {what} apiGroup when kind is not 'PersistentVolumeClaim'"),
                &format!("{root}.apiGroup[]"),
            ));
        }
        causes
    };
    if let Some(d) = data_source {
        causes.extend(reference(
            "DataSource",
            &d.name,
            &d.kind,
            d.api_group.as_deref(),
        ));
    }
    if let Some(d) = data_source_ref {
        if d.namespace.as_deref().is_some_and(|n| !n.is_empty()) {
            causes.push(cause(
                "Invalid value: DataSourceRef namespace not supported",
                &at("dataSourceRef.namespace[]"),
            ));
        }
        causes.extend(reference(
            "DataSourceRef",
            &d.name,
            &d.kind,
            d.api_group.as_deref(),
        ));
    }
    causes
}

/// Upstream's `validateDataVolumeSpec`: field paths and messages under `root` (`spec` for a
/// DataVolume, `Template` for a DataImportCron's template).
fn spec(dv: &DataVolume, root: &str) -> Vec<Cause> {
    let spec = &dv.spec;
    let at = |field: &str| format!("{root}.{field}");
    let source = spec.source.as_ref();
    let clone = spec.source_ref.is_some()
        || source.is_some_and(|s| s.pvc.is_some() || s.snapshot.is_some());
    match (&spec.pvc, &spec.storage) {
        (None, None) => return vec![cause("Missing Data volume PVC", &at("PVC"))],
        (Some(_), Some(_)) => {
            return vec![cause(
                "Duplicate storage definition, both target storage and target pvc defined",
                &at("PVC.Storage"),
            )];
        }
        (Some(pvc), None) => {
            if let Some(c) = size(root, "PVC", pvc.resources.as_ref(), true) {
                return vec![c];
            }
            let modes = pvc.access_modes.clone().unwrap_or_default();
            let field = &at("PVC.accessModes");
            match modes.as_slice() {
                [] => {
                    return vec![cause(
                        "Required value: at least 1 access mode is required",
                        field,
                    )];
                }
                [one] if !ACCESS_MODES.contains(&one.as_str()) => {
                    return vec![cause(unsupported_mode(one), field)];
                }
                [_] => {}
                _ => return vec![cause("PVC multiple accessModes", field)],
            }
        }
        (None, Some(storage)) => {
            if let Some(c) = size(root, "Storage", storage.resources.as_ref(), !clone) {
                return vec![c];
            }
            if let Some(bad) = storage
                .access_modes
                .iter()
                .flatten()
                .find(|m| !ACCESS_MODES.contains(&m.as_str()))
            {
                return vec![cause(unsupported_mode(bad), &at("PVC.accessModes"))];
            }
        }
    }
    let (data_source, data_source_ref) = match (&spec.pvc, &spec.storage) {
        (Some(p), _) => (p.data_source.as_ref(), p.data_source_ref.as_ref()),
        (None, Some(s)) => (s.data_source.as_ref(), s.data_source_ref.as_ref()),
        (None, None) => (None, None),
    };
    if data_source.is_some() || data_source_ref.is_some() {
        return external_population(
            source.is_some() || spec.source_ref.is_some(),
            data_source,
            data_source_ref,
            &at,
        );
    }
    if source.is_some() == spec.source_ref.is_some() {
        return vec![cause(
            "Data volume should have either Source or SourceRef, or be externally populated",
            &at("source"),
        )];
    }
    if let Some(r) = &spec.source_ref {
        let kind = r.kind.as_str();
        if kind.is_empty() {
            return vec![cause("Missing sourceRef kind", &at("sourceRef.Kind"))];
        }
        if kind != "DataSource" {
            return vec![cause(
                format!(
                    "Unsupported sourceRef kind {kind}, currently only DataSource is supported"
                ),
                &at("sourceRef.Kind"),
            )];
        }
        if r.name.is_empty() {
            return vec![cause("Missing sourceRef name", &at("sourceRef.Name"))];
        }
        return Vec::new();
    }
    let Some(source) = source else {
        return Vec::new();
    };
    match source.kinds().len() {
        0 => return vec![cause("Missing Data volume source", &at("source"))],
        1 => {}
        _ => return vec![cause("Multiple Data volume sources", &at("source"))],
    }
    source_rules(dv, source, root)
}

/// Each source kind's rules (upstream's 4j): URL schemes, the checksum, blank with archive,
/// the registry's.
fn source_rules(
    dv: &DataVolume,
    source: &cdi_api::datavolume::DataVolumeSource,
    root: &str,
) -> Vec<Cause> {
    let spec = &dv.spec;
    let at = |field: &str| format!("{root}.{field}");
    let url = |url: &str, schemes: &[&str], field: &str| {
        crate::source::check_url(url, schemes)
            .err()
            .map(|e| cause(format!("{root}.source {e}"), field))
    };
    let mut causes = Vec::new();
    if let Some(http) = &source.http {
        causes.extend(url(&http.url, &["http", "https"], &at("source.HTTP.url")));
        if let Err(e) = crate::source::check_checksum(http.checksum.as_deref().unwrap_or("")) {
            causes.push(cause(
                format!("Invalid checksum format: {e}"),
                &at("source.HTTP.checksum"),
            ));
        }
    }
    if let Some(s3) = &source.s3 {
        causes.extend(url(&s3.url, &["http", "https", "s3"], &at("source.S3.url")));
    }
    if let Some(gcs) = &source.gcs {
        causes.extend(url(
            &gcs.url,
            &["gs", "http", "https"],
            &at("source.GCS.url"),
        ));
    }
    if source.blank.is_some() && spec.content_type == Some(ContentType::Archive) {
        causes.push(cause(
            "SourceType cannot be blank and the contentType be archive",
            &at("contentType"),
        ));
    }
    if let Some(registry) = &source.registry
        && let Err((message, _)) = crate::source::registry(dv, Some(registry))
    {
        let field = if message.starts_with("ContentType") {
            &at("contentType")
        } else if message.contains("ImageStream") && !message.contains("either") {
            &at("source.Registry.importMethod")
        } else if message.contains("either") {
            &at("source.Registry")
        } else {
            &at("source.Registry.URL")
        };
        causes.push(cause(message, field));
    }
    causes
}

/// Why a VolumeImportSource may not be created or changed (upstream's `/populator-validate`).
pub fn volume_import_source(
    vis: &cdi_api::populators::VolumeImportSource,
    old: Option<&cdi_api::populators::VolumeImportSource>,
) -> Vec<Cause> {
    let spec = &vis.spec;
    let source = spec.source.clone().unwrap_or_default();
    let multi_stage = (source.vddk.is_some() || source.imageio.is_some())
        && spec.checkpoints.as_ref().is_some_and(|c| !c.is_empty());
    if let Some(old) = old {
        let comparable = |s: &cdi_api::populators::VolumeImportSourceSpec| {
            let mut s = s.clone();
            if multi_stage {
                s.checkpoints = None;
                s.final_checkpoint = None;
            }
            serde_json::to_value(s).ok()
        };
        if comparable(spec) != comparable(&old.spec) {
            return vec![Cause {
                reason: DUPLICATE,
                message: "Cannot update VolumeImportSource Spec".into(),
                field: "VolumeImportSource.Spec".into(),
            }];
        }
    }
    if vis.metadata.name.as_deref().unwrap_or("").len() > CRON_NAME_MAX {
        return vec![cause(
            format!("Name cannot be longer than {CRON_NAME_MAX} characters"),
            "",
        )];
    }
    let as_dv = cdi_api::datavolume::DataVolumeSource {
        http: source.http,
        s3: source.s3,
        registry: source.registry,
        gcs: source.gcs,
        blank: source.blank,
        imageio: source.imageio,
        vddk: source.vddk,
        ..Default::default()
    };
    match as_dv.kinds().len() {
        0 => return vec![cause("Missing VolumeImport source", "spec.source")],
        1 => {}
        _ => return vec![cause("Multiple VolumeImport sources", "spec.source")],
    }
    if multi_stage && spec.target_claim.as_deref().is_none_or(str::is_empty) {
        return vec![cause(
            "Unable to do multi-stage import without specifying a target claim",
            "spec.targetClaim",
        )];
    }
    let mut dv = DataVolume::new("populator", DataVolumeSpec::default());
    dv.spec.content_type = spec.content_type;
    source_rules(&dv, &as_dv, "spec")
}

/// Why a VolumeUploadSource may not be created or changed (upstream's `/populator-validate`).
pub fn volume_upload_source(
    vus: &cdi_api::populators::VolumeUploadSource,
    old: Option<&cdi_api::populators::VolumeUploadSource>,
) -> Vec<Cause> {
    if let Some(old) = old
        && serde_json::to_value(&vus.spec).ok() != serde_json::to_value(&old.spec).ok()
    {
        return vec![Cause {
            reason: DUPLICATE,
            message: "Cannot update VolumeUploadSource Spec".into(),
            field: "VolumeUploadSource.Spec".into(),
        }];
    }
    if vus.metadata.name.as_deref().unwrap_or("").len() > CRON_NAME_MAX {
        return vec![cause(
            format!("Name cannot be longer than {CRON_NAME_MAX} characters"),
            "",
        )];
    }
    Vec::new()
}

/// The longest DataImportCron or managed DataSource name upstream takes (a DNS-1035 label).
const CRON_NAME_MAX: usize = 63;

/// Why a DataImportCron may not be created (`old` is `None`) or `old` may not become `cron`,
/// in upstream's words (`/dataimportcron-validate`); empty when it may.
pub fn data_import_cron(
    cron: &cdi_api::datasource::DataImportCron,
    old: Option<&cdi_api::datasource::DataImportCron>,
) -> Vec<Cause> {
    let too_long = || {
        cause(
            format!("Name cannot be longer than {CRON_NAME_MAX} characters"),
            "",
        )
    };
    if cron.metadata.name.as_deref().unwrap_or("").len() > CRON_NAME_MAX {
        return vec![too_long()];
    }
    if let Some(old) = old {
        if serde_json::to_value(&cron.spec).ok() != serde_json::to_value(&old.spec).ok() {
            return vec![Cause {
                reason: DUPLICATE,
                message: "Cannot update DataImportCron Spec".into(),
                field: "DataImportCron.Spec".into(),
            }];
        }
        return Vec::new();
    }
    let template = &cron.spec.template.spec;
    let source = template.source.as_ref();
    if source.is_none_or(|s| s.registry.is_none() && s.pvc.is_none()) {
        return vec![cause("Missing source", "spec.Template")];
    }
    if template.source_ref.is_some()
        || template.content_type.is_some()
        || template.checkpoints.as_ref().is_some_and(|c| !c.is_empty())
        || template.final_checkpoint.is_some_and(|f| f)
    {
        return vec![cause(
            "Unsettable fields: SourceRef, ContentType, Checkpoints, FinalCheckpoint",
            "spec.Template",
        )];
    }
    let as_dv = DataVolume::new("template", template.clone());
    let causes = spec(&as_dv, "Template");
    if !causes.is_empty() {
        return causes;
    }
    if !cron.spec.schedule.is_empty() && crate::dataimportcron::schedule(cron).is_err() {
        return vec![cause("Illegal cron schedule", "spec.Schedule")];
    }
    if cron.spec.imports_to_keep.is_some_and(|n| n < 0) {
        return vec![cause("Illegal ImportsToKeep value", "spec.ImportsToKeep")];
    }
    let managed = &cron.spec.managed_data_source;
    if managed.is_empty() {
        return vec![cause(
            "Illegal ManagedDataSource value",
            "spec.ManagedDataSource",
        )];
    }
    if managed.len() > CRON_NAME_MAX {
        return vec![too_long()];
    }
    Vec::new()
}

fn unsupported_mode(mode: &str) -> String {
    let supported: Vec<String> = ACCESS_MODES.iter().map(|m| format!("{m:?}")).collect();
    format!(
        "Unsupported value: {mode:?}: supported values: {}",
        supported.join(", ")
    )
}

/// Upstream's size rules: a request must be more than zero and at least 1 MiB; without one,
/// only a clone through `spec.storage` may be (it takes the source's size).
fn size(
    root: &str,
    api: &str,
    resources: Option<&VolumeResourceRequirements>,
    required: bool,
) -> Option<Cause> {
    let field = format!("{root}.{api}.resources.requests.size");
    let request = resources
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"));
    match request {
        None if required => Some(cause(format!("{api} size is missing"), &field)),
        None => None,
        Some(q) => {
            // A quantity that does not parse is refused by the API server's schema already.
            let q: Quantity = q.0.parse().ok()?;
            if q.is_zero() || q.value() < 0 {
                Some(cause(
                    format!("{api} size can't be equal or less than zero"),
                    &field,
                ))
            } else if q.value() < MIB {
                Some(cause(format!("{api} size should be at least 1MiB"), &field))
            } else {
                None
            }
        }
    }
}

/// Upstream's refusal message: every cause's message, each after a space.
pub fn message(causes: &[Cause]) -> String {
    causes.iter().map(|c| format!(" {}", c.message)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dv(spec: serde_json::Value) -> DataVolume {
        serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "DataVolume", "metadata": {"name": "disk", "namespace": "vms"},
            "spec": spec}))
        .unwrap()
    }

    fn said(spec: serde_json::Value) -> Vec<(String, String)> {
        data_volume(&dv(spec), None)
            .into_iter()
            .map(|c| (c.message, c.field))
            .collect()
    }

    #[test]
    fn externally_populated_data_volumes_name_each_missing_part() {
        let with = |refs: serde_json::Value| {
            let mut storage = json!({"resources": {"requests": {"storage": "1Gi"}}});
            for (k, v) in refs.as_object().unwrap() {
                storage[k] = v.clone();
            }
            said(json!({"storage": storage}))
        };
        let pair = |m: &str, f: &str| (m.to_string(), f.to_string());
        assert!(
            with(
                json!({"dataSourceRef": {"apiGroup": "example.com", "kind": "Blob", "name": "b"}})
            )
            .is_empty()
        );
        // The same reference written both ways is fine; different ones are not.
        assert!(
            with(json!({
            "dataSource": {"apiGroup": "example.com", "kind": "Blob", "name": "b"},
            "dataSourceRef": {"apiGroup": "example.com", "kind": "Blob", "name": "b"}}))
            .is_empty()
        );
        assert_eq!(
            with(json!({
                "dataSource": {"kind": "PersistentVolumeClaim", "name": "a"},
                "dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "b"}})),
            [pair("DataSourceRef and DataSource must match", "")]
        );
        assert_eq!(
            with(json!({"dataSource": {"kind": "", "name": ""}})),
            [
                pair("Required value: DataSource name", "spec.dataSource.name[]"),
                pair("Required value: DataSource kind", "spec.dataSource.kind"),
                pair(
                    "Required value: DataSource apiGroup when kind is not 'PersistentVolumeClaim'",
                    "spec.dataSource.apiGroup[]"
                ),
            ]
        );
        assert_eq!(
            with(json!({"dataSourceRef": {"kind": "Blob", "name": "b", "namespace": "other"}})),
            [
                pair(
                    "Invalid value: DataSourceRef namespace not supported",
                    "spec.dataSourceRef.namespace[]"
                ),
                pair(
                    "Required value: DataSourceRef apiGroup when kind is not 'PersistentVolumeClaim'",
                    "spec.dataSourceRef.apiGroup[]"
                ),
            ]
        );
    }

    #[test]
    fn cdi_rs_annotations_are_refused_when_set_to_what_they_cannot_be() {
        let with = |anns: serde_json::Value| {
            let mut d = dv(json!({}));
            d.metadata.annotations = serde_json::from_value(anns).unwrap();
            d
        };
        let good = with(
            json!({"cdi-rs.dev/first-consumer": "nodeSelector: {zone: a}",
                               "cdi-rs.dev/worker-placement": "cdi"}),
        );
        assert!(extensions(&good, None).is_empty());
        let bad = with(json!({"cdi-rs.dev/first-consumer": "nodeName: node-1",
                              "cdi-rs.dev/worker-placement": "kubevirt"}));
        let causes = extensions(&bad, None);
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "metadata.annotations[cdi-rs.dev/first-consumer]",
                "metadata.annotations[cdi-rs.dev/worker-placement]"
            ]
        );
        assert!(
            causes[0].message.starts_with(
                "the cdi-rs.dev/first-consumer annotation of DataVolume vms/disk is not a pod \
                 scheduling template ("
            ),
            "{causes:?}"
        );
        assert!(causes[1].message.contains("\"kubevirt\""), "{causes:?}");
        // Set to a bad value: refused; left as it was: admitted, so the object stays deletable.
        assert_eq!(extensions(&bad, Some(&good)).len(), 2);
        assert!(extensions(&bad, Some(&bad)).is_empty());
    }

    #[test]
    fn upstreams_refusals_in_its_words() {
        let pvc = json!({"accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}}});
        let http = json!({"http": {"url": "https://images/disk.qcow2"}});
        let one = |m: &str, f: &str| vec![(m.to_string(), f.to_string())];
        assert!(said(json!({"source": http, "pvc": pvc})).is_empty());
        assert!(
            said(
                json!({"sourceRef": {"kind": "DataSource", "name": "fedora"},
            "storage": {}})
            )
            .is_empty(),
            "a clone through storage may leave the size out"
        );
        for (spec, want) in [
            (json!({"source": http}), one("Missing Data volume PVC", "spec.PVC")),
            (
                json!({"source": http, "pvc": pvc, "storage": {}}),
                one(
                    "Duplicate storage definition, both target storage and target pvc defined",
                    "spec.PVC.Storage",
                ),
            ),
            (
                json!({"source": http, "pvc": {"accessModes": ["ReadWriteOnce"]}}),
                one("PVC size is missing", "spec.PVC.resources.requests.size"),
            ),
            (
                json!({"source": http, "storage": {"resources": {"requests": {"storage": "0"}}}}),
                one(
                    "Storage size can't be equal or less than zero",
                    "spec.Storage.resources.requests.size",
                ),
            ),
            (
                json!({"source": http, "storage": {"resources": {"requests": {"storage": "1000Ki"}}}}),
                one(
                    "Storage size should be at least 1MiB",
                    "spec.Storage.resources.requests.size",
                ),
            ),
            (
                json!({"source": http, "pvc": {"resources": {"requests": {"storage": "1Gi"}}}}),
                one(
                    "Required value: at least 1 access mode is required",
                    "spec.PVC.accessModes",
                ),
            ),
            (
                json!({"source": http, "pvc": {"accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
                    "resources": {"requests": {"storage": "1Gi"}}}}),
                one("PVC multiple accessModes", "spec.PVC.accessModes"),
            ),
            (
                json!({"source": http, "storage": {"accessModes": ["ReadWriteSometimes"],
                    "resources": {"requests": {"storage": "1Gi"}}}}),
                one(
                    "Unsupported value: \"ReadWriteSometimes\": supported values: \"ReadOnlyMany\", \"ReadWriteMany\", \"ReadWriteOnce\", \"ReadWriteOncePod\"",
                    "spec.PVC.accessModes",
                ),
            ),
            (
                json!({"pvc": pvc}),
                one(
                    "Data volume should have either Source or SourceRef, or be externally populated",
                    "spec.source",
                ),
            ),
            (
                json!({"source": http, "pvc": {"accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}},
                    "dataSourceRef": {"kind": "VolumeImportSource", "apiGroup": "cdi.kubevirt.io", "name": "v"}}}),
                one(
                    "External population is incompatible with Source and SourceRef",
                    "spec.source",
                ),
            ),
            (
                json!({"sourceRef": {"kind": "PersistentVolumeClaim", "name": "x"}, "pvc": pvc}),
                one(
                    "Unsupported sourceRef kind PersistentVolumeClaim, currently only DataSource is supported",
                    "spec.sourceRef.Kind",
                ),
            ),
            (json!({"source": {}, "pvc": pvc}), one("Missing Data volume source", "spec.source")),
            (
                json!({"source": {"http": {"url": "https://a/b"}, "blank": {}}, "pvc": pvc}),
                one("Multiple Data volume sources", "spec.source"),
            ),
            (
                json!({"source": {"http": {"url": "ftp://a/b", "checksum": "crc32:00"}}, "pvc": pvc}),
                vec![
                    (
                        "spec.source Invalid source URL scheme: ftp://a/b".into(),
                        "spec.source.HTTP.url".into(),
                    ),
                    (
                        "Invalid checksum format: unsupported hash algorithm 'crc32': supported algorithms are: md5, sha1, sha256, sha512".into(),
                        "spec.source.HTTP.checksum".into(),
                    ),
                ],
            ),
            (
                json!({"source": {"blank": {}}, "contentType": "archive", "pvc": pvc}),
                one(
                    "SourceType cannot be blank and the contentType be archive",
                    "spec.contentType",
                ),
            ),
            (
                json!({"source": {"registry": {"url": "quay.io/fedora:41"}}, "pvc": pvc}),
                one(
                    "Illegal registry source URL scheme quay.io/fedora:41",
                    "spec.source.Registry.URL",
                ),
            ),
        ] {
            assert_eq!(said(spec.clone()), want, "{spec}");
        }
    }

    #[test]
    fn a_taken_claim_name_is_refused_unless_the_claim_may_be_the_data_volumes() {
        let d = dv(json!({"source": {"blank": {}}, "pvc": {}}));
        let claim = |meta: serde_json::Value| -> k8s_openapi::api::core::v1::PersistentVolumeClaim {
            serde_json::from_value(json!({"metadata": meta})).unwrap()
        };
        assert_eq!(claim_taken(&d, None, None), None);
        let taken = claim_taken(&d, Some(&claim(json!({"name": "disk"}))), None).unwrap();
        assert_eq!(taken.message, "Destination PVC vms/disk already exists");
        assert_eq!(taken.field, "DataVolume.Name");
        for meta in [
            json!({"name": "disk", "annotations": {"cdi.kubevirt.io/storage.populatedFor": "disk"}}),
            json!({"name": "disk", "ownerReferences": [{"apiVersion": "cdi.kubevirt.io/v1beta1",
                "kind": "DataVolume", "name": "other", "uid": "o", "controller": true}]}),
        ] {
            assert_eq!(
                claim_taken(&d, Some(&claim(meta.clone())), None),
                None,
                "{meta}"
            );
        }
        let mut adopting = d.clone();
        adopting.metadata.annotations = Some(
            [(
                "cdi.kubevirt.io/allowClaimAdoption".to_string(),
                "true".to_string(),
            )]
            .into(),
        );
        assert_eq!(
            claim_taken(&adopting, Some(&claim(json!({"name": "disk"}))), None),
            None
        );
    }

    #[test]
    fn data_import_crons_in_upstreams_words() {
        let cron = |spec: serde_json::Value| -> cdi_api::datasource::DataImportCron {
            serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1",
                "kind": "DataImportCron", "metadata": {"name": "fedora", "namespace": "golden"},
                "spec": spec}))
            .unwrap()
        };
        let good = json!({"schedule": "0 */12 * * *", "managedDataSource": "fedora",
            "template": {"spec": {"source": {"registry": {"url": "docker://quay.io/fedora:41"}},
                "storage": {"resources": {"requests": {"storage": "5Gi"}}}}}});
        assert!(data_import_cron(&cron(good.clone()), None).is_empty());
        let with = |path: &[&str], value: serde_json::Value| {
            let mut spec = good.clone();
            let mut at = &mut spec;
            for key in &path[..path.len() - 1] {
                at = &mut at[*key];
            }
            at[path[path.len() - 1]] = value;
            cron(spec)
        };
        for (c, message, field) in [
            (
                with(
                    &["template", "spec", "source"],
                    json!({"http": {"url": "https://a/b"}}),
                ),
                "Missing source",
                "spec.Template",
            ),
            (
                with(&["template", "spec", "contentType"], json!("kubevirt")),
                "Unsettable fields: SourceRef, ContentType, Checkpoints, FinalCheckpoint",
                "spec.Template",
            ),
            (
                with(&["template", "spec", "storage"], json!({})),
                "Storage size is missing",
                "Template.Storage.resources.requests.size",
            ),
            (
                with(&["schedule"], json!("every day")),
                "Illegal cron schedule",
                "spec.Schedule",
            ),
            (
                with(&["importsToKeep"], json!(-1)),
                "Illegal ImportsToKeep value",
                "spec.ImportsToKeep",
            ),
            (
                with(&["managedDataSource"], json!("")),
                "Illegal ManagedDataSource value",
                "spec.ManagedDataSource",
            ),
        ] {
            let said = data_import_cron(&c, None);
            assert_eq!(
                (said[0].message.as_str(), said[0].field.as_str()),
                (message, field),
                "{:?}",
                c.spec
            );
        }
        let changed = with(&["importsToKeep"], json!(5));
        let said = data_import_cron(&changed, Some(&cron(good.clone())));
        assert_eq!(said[0].message, "Cannot update DataImportCron Spec");
        let mut labelled = cron(good.clone());
        labelled.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        assert!(data_import_cron(&labelled, Some(&cron(good))).is_empty());
    }

    #[test]
    fn populator_sources_in_upstreams_words() {
        use cdi_api::populators::{VolumeImportSource, VolumeUploadSource};
        let vis = |spec: serde_json::Value| -> VolumeImportSource {
            serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1",
                "kind": "VolumeImportSource", "metadata": {"name": "v", "namespace": "vms"},
                "spec": spec}))
            .unwrap()
        };
        let first = |c: Vec<Cause>| c.first().map(|c| (c.message.clone(), c.field.clone()));
        let good = vis(json!({"source": {"http": {"url": "https://a/b"}}}));
        assert!(volume_import_source(&good, None).is_empty());
        for (spec, message, field) in [
            (json!({}), "Missing VolumeImport source", "spec.source"),
            (
                json!({"source": {}}),
                "Missing VolumeImport source",
                "spec.source",
            ),
            (
                json!({"source": {"http": {"url": "https://a/b"}, "blank": {}}}),
                "Multiple VolumeImport sources",
                "spec.source",
            ),
            (
                json!({"source": {"http": {"url": "ftp://files/disk.img"}}}),
                "spec.source Invalid source URL scheme: ftp://files/disk.img",
                "spec.source.HTTP.url",
            ),
            (
                json!({"source": {"vddk": {"url": "https://vc", "uuid": "u", "backingFile": "f",
                    "thumbprint": "t", "secretRef": "s"}},
                    "checkpoints": [{"previous": "", "current": "a"}]}),
                "Unable to do multi-stage import without specifying a target claim",
                "spec.targetClaim",
            ),
        ] {
            assert_eq!(
                first(volume_import_source(&vis(spec.clone()), None)),
                Some((message.to_string(), field.to_string())),
                "{spec}"
            );
        }
        let moved = vis(json!({"source": {"http": {"url": "https://a/c"}}}));
        assert_eq!(
            first(volume_import_source(&moved, Some(&good))).unwrap().0,
            "Cannot update VolumeImportSource Spec"
        );
        let vus = |content: &str| -> VolumeUploadSource {
            serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1",
                "kind": "VolumeUploadSource", "metadata": {"name": "u", "namespace": "vms"},
                "spec": {"contentType": content}}))
            .unwrap()
        };
        assert!(volume_upload_source(&vus("kubevirt"), None).is_empty());
        assert_eq!(
            first(volume_upload_source(
                &vus("archive"),
                Some(&vus("kubevirt"))
            ))
            .unwrap()
            .0,
            "Cannot update VolumeUploadSource Spec"
        );
    }

    #[test]
    fn the_spec_is_immutable_but_for_a_multi_stage_imports_checkpoints() {
        let http = dv(json!({"source": {"http": {"url": "https://a/b"}},
            "pvc": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}));
        let mut grown = http.clone();
        grown.spec.pvc.as_mut().unwrap().resources =
            serde_json::from_value(json!({"requests": {"storage": "2Gi"}})).unwrap();
        let refused = data_volume(&grown, Some(&http));
        assert_eq!(refused[0].message, "Cannot update DataVolume Spec");
        assert_eq!(refused[0].reason, "FieldValueDuplicate");
        let mut labelled = http.clone();
        labelled.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        assert!(data_volume(&labelled, Some(&http)).is_empty());

        let stage = |checkpoints: serde_json::Value| {
            dv(json!({"source": {"vddk": {"url": "https://vc", "uuid": "u",
                "backingFile": "f", "thumbprint": "t", "secretRef": "s"}},
                "checkpoints": checkpoints,
                "pvc": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))
        };
        let first = stage(json!([{"previous": "", "current": "a"}]));
        let second =
            stage(json!([{"previous": "", "current": "a"}, {"previous": "a", "current": "b"}]));
        assert!(data_volume(&second, Some(&first)).is_empty());
        assert_eq!(message(&refused), " Cannot update DataVolume Spec");
    }
}
