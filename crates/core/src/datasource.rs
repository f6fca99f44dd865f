//! DataSource (docs/design.md#datasources-and-sourceref; upstream's DataSource controller) and what a DataVolume's `sourceRef`
//! means: a DataSource names a golden image once (a claim or a snapshot, or another DataSource
//! one level deep, in its namespace); its `Ready` condition says whether the image can be
//! consumed, and `status.source` is what it resolved to. A DataVolume naming it clones what it
//! names.

use std::collections::BTreeMap;

use cdi_api::datasource::{
    DATA_SOURCE_READY, DataSource, DataSourceCondition, DataSourceSource, DataSourceStatus,
};
use cdi_api::datavolume::{DataVolume, DataVolumeSource, SOURCE_REF_KIND_DATA_SOURCE};
use cdi_api::enums::{ConditionStatus, DataVolumePhase};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::source::Refusal;

/// Why a DataSource's reference to another cannot be followed (upstream's errors and reasons).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainError {
    pub reason: &'static str,
    pub message: String,
}

fn ns_or<'a>(ns: &'a str, default: &'a str) -> &'a str {
    if ns.is_empty() { default } else { ns }
}

/// The DataSource whose `spec.source` holds the image: `ds` itself, or the one it refers to in
/// its namespace (one level at most, not itself). `get` looks a DataSource up by namespace and
/// name.
pub fn resolve_chain(
    ds: &DataSource,
    get: impl Fn(&str, &str) -> Option<DataSource>,
) -> Result<DataSource, ChainError> {
    let Some(r) = &ds.spec.source.data_source else {
        return Ok(ds.clone());
    };
    let own = ds.metadata.namespace.as_deref().unwrap_or("");
    let ns = ns_or(&r.namespace, own);
    if ns != own {
        return Err(ChainError {
            reason: "CrossNamespaceReference",
            message: "DataSource cannot reference a DataSource in another namespace".into(),
        });
    }
    if Some(r.name.as_str()) == ds.metadata.name.as_deref() {
        return Err(ChainError {
            reason: "SelfReference",
            message: "DataSource cannot self-reference".into(),
        });
    }
    let Some(target) = get(ns, &r.name) else {
        return Err(ChainError {
            reason: "NotFound",
            message: format!("datasources.cdi.kubevirt.io \"{}\" not found", r.name),
        });
    };
    if target.spec.source.data_source.is_some() {
        return Err(ChainError {
            reason: "MaxReferenceDepthReached",
            message: "DataSource reference chain exceeds maximum depth of 1".into(),
        });
    }
    Ok(target)
}

/// What the DataSource controller observed of the image a resolved DataSource names.
#[derive(Debug, Clone, Default)]
pub struct Image<'a> {
    pub claim: Option<&'a PersistentVolumeClaim>,
    /// The DataVolume of the claim's name.
    pub dv: Option<&'a DataVolume>,
    /// For a snapshot source: whether it exists, and whether it is `readyToUse`.
    pub snapshot: Option<bool>,
    /// The snapshot's labels.
    pub snapshot_labels: BTreeMap<String, String>,
}

/// Labels a DataSource takes from its image (upstream's `CopyAllowedLabels`): those under
/// `kubevirt.io/` or a `*.kubevirt.io/` prefix (instance types and preferences KubeVirt infers).
pub fn allowed_label(key: &str) -> bool {
    let Some((prefix, name)) = key.split_once('/') else {
        return false;
    };
    let name_ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    let prefix_ok = prefix == "kubevirt.io"
        || prefix.strip_suffix(".kubevirt.io").is_some_and(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.'))
        });
    prefix_ok && name_ok
}

/// The status a DataSource should have: `Ready` with upstream's reasons and messages, the source
/// it resolved to when ready, and the labels it takes from its image. The transition time of a
/// condition that did not change is kept.
pub fn status(
    ds: &DataSource,
    resolved: &Result<DataSource, ChainError>,
    image: &Image<'_>,
    now: Timestamp,
) -> (DataSourceStatus, BTreeMap<String, String>) {
    let mut labels = BTreeMap::new();
    let (ready, reason, message, source) = match resolved {
        Err(e) => (false, e.reason.to_string(), e.message.clone(), None),
        Ok(r) => {
            let s = &r.spec.source;
            if s.pvc.is_some() {
                let phase = image.dv.and_then(|d| d.status.as_ref()?.phase.clone());
                match (image.dv, image.claim, phase) {
                    (None, None, _) => (false, "NotFound".into(), "PVC not found".into(), None),
                    (Some(_), _, Some(DataVolumePhase::Succeeded)) | (None, Some(_), _) => {
                        for obj in [
                            image.dv.map(|d| &d.metadata),
                            image.claim.map(|c| &c.metadata),
                        ]
                        .into_iter()
                        .flatten()
                        {
                            for (k, v) in obj.labels.iter().flatten() {
                                if allowed_label(k) {
                                    labels.insert(k.clone(), v.clone());
                                }
                            }
                        }
                        ready_now(s)
                    }
                    (Some(_), _, phase) => {
                        let p = phase.map(|p| p.as_str().to_string()).unwrap_or_default();
                        (
                            false,
                            p.clone(),
                            format!("Import DataVolume phase {p}"),
                            None,
                        )
                    }
                }
            } else if s.snapshot.is_some() {
                match image.snapshot {
                    None => (false, "NotFound".into(), "Snapshot not found".into(), None),
                    Some(false) => (
                        false,
                        "SnapshotNotReady".into(),
                        "Snapshot phase is not ready".into(),
                        None,
                    ),
                    Some(true) => {
                        labels.extend(
                            image
                                .snapshot_labels
                                .iter()
                                .filter(|(k, _)| allowed_label(k))
                                .map(|(k, v)| (k.clone(), v.clone())),
                        );
                        ready_now(s)
                    }
                }
            } else {
                (false, "NoSource".into(), "No source PVC set".into(), None)
            }
        }
    };
    let old = ds.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == DATA_SOURCE_READY)
    });
    let status_value = if ready {
        ConditionStatus::True
    } else {
        ConditionStatus::False
    };
    let same = old.is_some_and(|o| {
        o.status == status_value
            && o.reason.as_deref() == Some(reason.as_str())
            && o.message.as_deref() == Some(message.as_str())
    });
    let condition = if same {
        old.cloned().expect("checked above")
    } else {
        let transition = old
            .filter(|o| o.status == status_value)
            .and_then(|o| o.last_transition_time.clone())
            .unwrap_or(Time(now));
        DataSourceCondition {
            type_: DATA_SOURCE_READY.into(),
            status: status_value,
            last_transition_time: Some(transition),
            last_heartbeat_time: Some(Time(now)),
            reason: Some(reason),
            message: Some(message),
        }
    };
    (
        DataSourceStatus {
            source: Some(source.unwrap_or_default()),
            conditions: Some(vec![condition]),
        },
        labels,
    )
}

fn ready_now(s: &DataSourceSource) -> (bool, String, String, Option<DataSourceSource>) {
    (
        true,
        "Ready".into(),
        "DataSource is ready to be consumed".into(),
        Some(s.clone()),
    )
}

/// Where a DataVolume's `sourceRef` points: `(namespace, name)` of the DataSource (the
/// DataVolume's namespace when it names none), or why it names none.
pub fn source_ref_target(dv: &DataVolume) -> Option<Result<(String, String), Refusal>> {
    let r = dv.spec.source_ref.as_ref()?;
    let id = format!(
        "{}/{}",
        dv.metadata.namespace.as_deref().unwrap_or(""),
        dv.metadata.name.as_deref().unwrap_or("")
    );
    let refuse = |message: String| Refusal {
        reason: crate::source::INVALID_SOURCE,
        message,
    };
    if r.kind != SOURCE_REF_KIND_DATA_SOURCE {
        return Some(Err(refuse(format!(
            "DataVolume {id}: Unsupported sourceRef kind {}, currently only DataSource is supported; set spec.sourceRef.kind: DataSource",
            r.kind
        ))));
    }
    if r.name.is_empty() {
        return Some(Err(refuse(format!(
            "DataVolume {id}: Missing sourceRef name; name the DataSource in spec.sourceRef.name"
        ))));
    }
    let ns = r
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| dv.metadata.namespace.clone())
        .unwrap_or_default();
    Some(Ok((ns, r.name.clone())))
}

/// The source a DataVolume's `sourceRef` stands for (upstream's `populateSourceIfSourceRef`):
/// the DataSource's `spec.source`, or for a DataSource that refers to another, what it resolved
/// to (`status.source`, empty until it is ready). `None` found means the DataSource is missing.
pub fn source_of_ref(
    dv: &DataVolume,
    at: &(String, String),
    found: Option<&DataSource>,
) -> Result<DataVolumeSource, Refusal> {
    let id = format!(
        "{}/{}",
        dv.metadata.namespace.as_deref().unwrap_or(""),
        dv.metadata.name.as_deref().unwrap_or("")
    );
    let Some(ds) = found else {
        return Err(Refusal {
            reason: "DataSourceNotFound",
            message: format!(
                "DataVolume {id}: DataSource {}/{} not found; create it or fix spec.sourceRef",
                at.0, at.1
            ),
        });
    };
    let s = if ds.spec.source.data_source.is_some() {
        ds.status
            .as_ref()
            .and_then(|s| s.source.clone())
            .unwrap_or_default()
    } else {
        ds.spec.source.clone()
    };
    if s.pvc.is_none() && s.snapshot.is_none() {
        return Err(Refusal {
            reason: "DataSourceNotReady",
            message: format!(
                "DataVolume {id}: Empty source field in '{}'. DataSource may not be ready yet",
                at.1
            ),
        });
    }
    let default_ns = |ns: &str| ns_or(ns, &at.0).to_string();
    // A claim wins over a snapshot, as upstream reads it.
    let pvc = s.pvc.map(|mut p| {
        p.namespace = default_ns(&p.namespace);
        p
    });
    let snapshot = if pvc.is_none() {
        s.snapshot.map(|mut p| {
            p.namespace = default_ns(&p.namespace);
            p
        })
    } else {
        None
    };
    Ok(DataVolumeSource {
        pvc,
        snapshot,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ds(v: serde_json::Value) -> DataSource {
        serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
            "metadata": {"name": v["name"], "namespace": "golden"}, "spec": {"source": v["source"]}}))
        .unwrap()
    }

    fn now() -> Timestamp {
        "2026-12-03T05:00:00Z".parse().unwrap()
    }

    fn ready(st: &DataSourceStatus) -> (String, String) {
        let c = &st.conditions.as_ref().unwrap()[0];
        (
            format!("{}:{}", c.status.as_str(), c.reason.clone().unwrap()),
            c.message.clone().unwrap(),
        )
    }

    #[test]
    fn chains_one_level_deep_in_one_namespace() {
        let fedora = ds(
            json!({"name": "fedora", "source": {"pvc": {"namespace": "golden", "name": "f40"}}}),
        );
        let alias = ds(
            json!({"name": "latest", "source": {"dataSource": {"namespace": "", "name": "fedora"}}}),
        );
        let get = |_: &str, n: &str| {
            [fedora.clone(), alias.clone()]
                .into_iter()
                .find(|d| d.metadata.name.as_deref() == Some(n))
        };
        assert_eq!(
            resolve_chain(&alias, get).unwrap().metadata.name.as_deref(),
            Some("fedora")
        );
        let selfish = ds(
            json!({"name": "me", "source": {"dataSource": {"namespace": "golden", "name": "me"}}}),
        );
        assert_eq!(
            resolve_chain(&selfish, get).unwrap_err().reason,
            "SelfReference"
        );
        let far = ds(
            json!({"name": "x", "source": {"dataSource": {"namespace": "other", "name": "fedora"}}}),
        );
        assert_eq!(
            resolve_chain(&far, get).unwrap_err().reason,
            "CrossNamespaceReference"
        );
        let deep = ds(
            json!({"name": "deep", "source": {"dataSource": {"namespace": "golden", "name": "latest"}}}),
        );
        assert_eq!(
            resolve_chain(&deep, get).unwrap_err().message,
            "DataSource reference chain exceeds maximum depth of 1"
        );
        let missing = ds(
            json!({"name": "m", "source": {"dataSource": {"namespace": "golden", "name": "nope"}}}),
        );
        assert_eq!(resolve_chain(&missing, get).unwrap_err().reason, "NotFound");
    }

    #[test]
    fn ready_as_upstream_says() {
        let fedora = ds(
            json!({"name": "fedora", "source": {"pvc": {"namespace": "golden", "name": "f40"}}}),
        );
        let resolved = Ok(fedora.clone());
        let (st, _) = status(&fedora, &resolved, &Image::default(), now());
        assert_eq!(
            ready(&st),
            ("False:NotFound".into(), "PVC not found".into())
        );
        assert_eq!(st.source, Some(DataSourceSource::default()));
        let importing: DataVolume = serde_json::from_value(json!({"metadata": {"name": "f40"},
            "spec": {}, "status": {"phase": "ImportInProgress"}}))
        .unwrap();
        let (st, _) = status(
            &fedora,
            &resolved,
            &Image {
                dv: Some(&importing),
                ..Default::default()
            },
            now(),
        );
        assert_eq!(
            ready(&st),
            (
                "False:ImportInProgress".into(),
                "Import DataVolume phase ImportInProgress".into()
            )
        );
        let claim: PersistentVolumeClaim =
            serde_json::from_value(json!({"metadata": {"name": "f40",
            "labels": {"instancetype.kubevirt.io/default-preference": "fedora", "app": "x"}}}))
            .unwrap();
        let (st, labels) = status(
            &fedora,
            &resolved,
            &Image {
                claim: Some(&claim),
                ..Default::default()
            },
            now(),
        );
        assert_eq!(
            ready(&st),
            (
                "True:Ready".into(),
                "DataSource is ready to be consumed".into()
            )
        );
        assert_eq!(
            st.source.as_ref().unwrap().pvc.as_ref().unwrap().name,
            "f40"
        );
        assert_eq!(
            labels.keys().collect::<Vec<_>>(),
            ["instancetype.kubevirt.io/default-preference"]
        );
        // Unchanged: the condition as it was.
        let mut again = fedora.clone();
        again.status = Some(st.clone());
        let later: Timestamp = "2026-12-03T06:00:00Z".parse().unwrap();
        let (st2, _) = status(
            &again,
            &resolved,
            &Image {
                claim: Some(&claim),
                ..Default::default()
            },
            later,
        );
        assert_eq!(st2, st);
        let snap =
            ds(json!({"name": "s", "source": {"snapshot": {"namespace": "golden", "name": "s1"}}}));
        let (st, _) = status(
            &snap,
            &Ok(snap.clone()),
            &Image {
                snapshot: Some(false),
                ..Default::default()
            },
            now(),
        );
        assert_eq!(ready(&st).0, "False:SnapshotNotReady");
        let none = ds(json!({"name": "n", "source": {}}));
        assert_eq!(
            ready(&status(&none, &Ok(none.clone()), &Image::default(), now()).0).1,
            "No source PVC set"
        );
        assert!(allowed_label("kubevirt.io/dynamic-credentials-support"));
        assert!(allowed_label("cdi.kubevirt.io/dataImportCron"));
        assert!(!allowed_label("app.kubernetes.io/name"));
    }

    #[test]
    fn a_source_ref_stands_for_what_the_data_source_names() {
        let dv: DataVolume = serde_json::from_value(json!({"metadata": {"name": "vm", "namespace": "vms"},
            "spec": {"sourceRef": {"kind": "DataSource", "name": "fedora", "namespace": "golden"}}})).unwrap();
        let at = source_ref_target(&dv).unwrap().unwrap();
        assert_eq!(at, ("golden".to_string(), "fedora".to_string()));
        let fedora =
            ds(json!({"name": "fedora", "source": {"pvc": {"namespace": "", "name": "f40"}}}));
        let src = source_of_ref(&dv, &at, Some(&fedora)).unwrap();
        let pvc = src.pvc.unwrap();
        assert_eq!(
            (pvc.namespace.as_str(), pvc.name.as_str()),
            ("golden", "f40")
        );
        let missing = source_of_ref(&dv, &at, None).unwrap_err();
        assert!(
            missing
                .message
                .contains("DataSource golden/fedora not found"),
            "{missing:?}"
        );
        let alias = ds(
            json!({"name": "fedora", "source": {"dataSource": {"namespace": "golden", "name": "x"}}}),
        );
        let empty = source_of_ref(&dv, &at, Some(&alias)).unwrap_err();
        assert!(
            empty
                .message
                .contains("Empty source field in 'fedora'. DataSource may not be ready yet")
        );
        let wrong: DataVolume =
            serde_json::from_value(json!({"metadata": {"name": "vm", "namespace": "vms"},
            "spec": {"sourceRef": {"kind": "Blob", "name": "x"}}}))
            .unwrap();
        assert!(
            source_ref_target(&wrong)
                .unwrap()
                .unwrap_err()
                .message
                .contains("Unsupported sourceRef kind Blob")
        );
    }
}
