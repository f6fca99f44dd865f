//! Which source a DataVolume names, and a refusal naming the problem when it names none, several,
//! or one this version cannot fill. Upstream refuses malformed specs in its admission webhook
//! (same rules, same wording); the controller checks again because a DataVolume can reach it
//! without the webhook (none installed yet, or created while it was down).

use cdi_api::datavolume::{DataVolume, SourceKind};

/// What fills the DataVolume's claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filled {
    /// One of the sources this controller imports: http or blank.
    Import(SourceKind),
    /// Something else, named by the claim's `dataSource`/`dataSourceRef` (external population).
    External,
}

/// Why a DataVolume is not acted on: the event reason and a message naming the DataVolume and the
/// fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: &'static str,
    pub message: String,
}

/// The spec is malformed: it can never be filled as written.
pub const INVALID_SOURCE: &str = "ErrInvalidSource";
/// The spec is well formed but names a source this version does not fill yet.
pub const UNSUPPORTED_SOURCE: &str = "ErrUnsupportedSource";

fn external(dv: &DataVolume) -> bool {
    let pvc = dv.spec.pvc.as_ref();
    let storage = dv.spec.storage.as_ref();
    pvc.is_some_and(|p| p.data_source.is_some() || p.data_source_ref.is_some())
        || storage.is_some_and(|s| s.data_source.is_some() || s.data_source_ref.is_some())
}

/// The DataVolume's source, or why it is refused.
pub fn check(dv: &DataVolume) -> Result<Filled, Refusal> {
    let ns = dv.metadata.namespace.as_deref().unwrap_or("");
    let name = dv.metadata.name.as_deref().unwrap_or("");
    let invalid = |what: &str, fix: &str| Refusal {
        reason: INVALID_SOURCE,
        message: format!("DataVolume {ns}/{name}: {what}; {fix}"),
    };
    let source = dv.spec.source.as_ref();
    let has_ref = dv.spec.source_ref.is_some();
    if external(dv) {
        if source.is_some() || has_ref {
            return Err(invalid(
                "External population is incompatible with Source and SourceRef",
                "remove spec.source and spec.sourceRef, or the dataSource/dataSourceRef of the claim spec",
            ));
        }
        return Ok(Filled::External);
    }
    let either = "Data volume should have either Source or SourceRef, or be externally populated";
    let source = match (source, has_ref) {
        (None, false) => {
            return Err(invalid(
                either,
                "set spec.source (http, blank, ...) or spec.sourceRef",
            ));
        }
        (Some(_), true) => {
            return Err(invalid(
                either,
                "it has both: keep spec.source or spec.sourceRef, not both",
            ));
        }
        (None, true) => {
            return Err(Refusal {
                reason: UNSUPPORTED_SOURCE,
                message: format!(
                    "DataVolume {ns}/{name}: sourceRef is not supported by this version of cdi-rs yet"
                ),
            });
        }
        (Some(s), false) => s,
    };
    match source.kinds().as_slice() {
        [] => Err(invalid(
            "Missing Data volume source",
            "spec.source names no source: set one of http, blank, ...",
        )),
        [kind @ (SourceKind::Http | SourceKind::Blank)] => Ok(Filled::Import(*kind)),
        [kind] => Err(Refusal {
            reason: UNSUPPORTED_SOURCE,
            message: format!(
                "DataVolume {ns}/{name}: {} sources are not supported by this version of cdi-rs yet",
                kind.field()
            ),
        }),
        kinds => {
            let names: Vec<&str> = kinds.iter().map(|k| k.field()).collect();
            Err(invalid(
                "Multiple Data volume sources",
                &format!("spec.source sets {}: keep exactly one", names.join(" and ")),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dv(spec: serde_json::Value) -> DataVolume {
        serde_json::from_value(
            json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "disk", "namespace": "vms"}, "spec": spec}),
        )
        .unwrap()
    }

    #[test]
    fn sources() {
        let pvc = json!({"resources": {"requests": {"storage": "1Gi"}}});
        let cases = [
            (
                json!({"source": {"http": {"url": "http://x"}}, "pvc": pvc}),
                Ok(Filled::Import(SourceKind::Http)),
            ),
            (
                json!({"source": {"blank": {}}, "pvc": pvc}),
                Ok(Filled::Import(SourceKind::Blank)),
            ),
            (
                json!({"pvc": {"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "p"}}}),
                Ok(Filled::External),
            ),
            (
                json!({"pvc": pvc}),
                Err((
                    INVALID_SOURCE,
                    "DataVolume vms/disk: Data volume should have either Source or SourceRef, or be \
                     externally populated; set spec.source (http, blank, ...) or spec.sourceRef",
                )),
            ),
            (
                json!({"source": {}, "pvc": pvc}),
                Err((
                    INVALID_SOURCE,
                    "DataVolume vms/disk: Missing Data volume source; spec.source names no source: \
                     set one of http, blank, ...",
                )),
            ),
            (
                json!({"source": {"http": {"url": "http://x"}, "blank": {}}, "pvc": pvc}),
                Err((
                    INVALID_SOURCE,
                    "DataVolume vms/disk: Multiple Data volume sources; spec.source sets http and \
                     blank: keep exactly one",
                )),
            ),
            (
                json!({"source": {"blank": {}}, "sourceRef": {"kind": "DataSource", "name": "d"}, "pvc": pvc}),
                Err((
                    INVALID_SOURCE,
                    "DataVolume vms/disk: Data volume should have either Source or SourceRef, or be \
                     externally populated; it has both: keep spec.source or spec.sourceRef, not both",
                )),
            ),
            (
                json!({"source": {"blank": {}}, "storage": {"dataSource": {"kind": "PersistentVolumeClaim", "name": "p"}}}),
                Err((
                    INVALID_SOURCE,
                    "DataVolume vms/disk: External population is incompatible with Source and \
                     SourceRef; remove spec.source and spec.sourceRef, or the dataSource/dataSourceRef \
                     of the claim spec",
                )),
            ),
            (
                json!({"source": {"registry": {"url": "docker://x"}}, "pvc": pvc}),
                Err((
                    UNSUPPORTED_SOURCE,
                    "DataVolume vms/disk: registry sources are not supported by this version of \
                     cdi-rs yet",
                )),
            ),
            (
                json!({"sourceRef": {"kind": "DataSource", "name": "d"}, "pvc": pvc}),
                Err((
                    UNSUPPORTED_SOURCE,
                    "DataVolume vms/disk: sourceRef is not supported by this version of cdi-rs yet",
                )),
            ),
        ];
        for (spec, want) in cases {
            let got = check(&dv(spec.clone()));
            let want = want.map_err(|(reason, message)| Refusal {
                reason,
                message: message.into(),
            });
            assert_eq!(got, want, "{spec}");
        }
    }
}
