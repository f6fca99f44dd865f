//! A clone of a PVC waiting for its source (upstream's `CloneWithoutSource`): before its claim is
//! made (the DataVolume controller waits for the source to size the claim from it), and after,
//! when the source went away before the copy read it. Either way the DataVolume says so on its
//! Running condition; the clone controllers look for the source again by themselves.

use cdi_api::ann;
use cdi_api::datavolume::DataVolume;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::clone::populator::phase;
use crate::source::Refusal;

/// Upstream's reason for a clone whose source does not exist.
pub const CLONE_WITHOUT_SOURCE: &str = "CloneWithoutSource";

/// Why a clone of the PVC `source` (namespace, name) does not go on: it does not exist.
pub fn source_missing(dv: &DataVolume, (ns, name): (&str, &str)) -> Refusal {
    Refusal {
        reason: CLONE_WITHOUT_SOURCE,
        message: format!(
            "The source pvc {ns}/{name} doesn't exist; DataVolume {}/{} is cloned once it does",
            dv.metadata.namespace.as_deref().unwrap_or(""),
            dv.metadata.name.as_deref().unwrap_or("")
        ),
    }
}

/// The clone into `claim` still has to read its source: no copy is complete (`k8s.io/CloneOf`,
/// the upload server done), and on the populator path no strategy got past choosing or the
/// host-assisted copy (a CSI clone, a snapshot or what follows no longer reads it).
pub fn source_needed(claim: &PersistentVolumeClaim) -> bool {
    let anns = claim.metadata.annotations.as_ref();
    let get = |k: &str| anns.and_then(|a| a.get(k)).map(String::as_str);
    get(ann::CLONE_OF).is_none()
        && get(ann::POD_PHASE) != Some("Succeeded")
        && matches!(
            get(ann::CLONE_PHASE).unwrap_or(""),
            "" | phase::PENDING | phase::HOST_CLONE
        )
}

/// The claim a clone DataVolume's status is computed from when its source PVC is gone before the
/// clone read it: its Running condition says the clone waits for the source, as upstream's
/// DataVolume does. Only the status reads this copy (the claim's annotations are where the
/// status comes from); the claim itself is not changed, so the next pass that finds the source
/// computes the status from the claim as it is. `None` when the clone does not wait.
pub fn waiting_for_source(
    dv: &DataVolume,
    claim: &PersistentVolumeClaim,
    source_exists: bool,
) -> Option<PersistentVolumeClaim> {
    let (ns, name) = crate::datavolume::refs::clone_source_of(dv)?;
    if source_exists || !source_needed(claim) {
        return None;
    }
    let refusal = source_missing(dv, (ns.as_str(), name.as_str()));
    let mut waiting = claim.clone();
    let anns = waiting.metadata.annotations.get_or_insert_default();
    // What an earlier pod could not do is not what the clone waits for now.
    anns.remove(ann::POD_SCHEDULABLE);
    anns.insert(ann::RUNNING_CONDITION.into(), "false".into());
    anns.insert(ann::RUNNING_CONDITION_REASON.into(), refusal.reason.into());
    anns.insert(ann::RUNNING_CONDITION_MESSAGE.into(), refusal.message);
    Some(waiting)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn dv() -> DataVolume {
        serde_json::from_value(json!({
            "metadata": {"name": "disk", "namespace": "vms"},
            "spec": {"source": {"pvc": {"namespace": "golden", "name": "fedora"}}},
        }))
        .unwrap()
    }

    fn claim(anns: Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "disk", "namespace": "vms", "annotations": anns},
            "status": {"phase": "Bound"},
        }))
        .unwrap()
    }

    #[test]
    fn a_clone_waits_for_a_source_it_has_not_read() {
        let running = |anns: &Value| {
            waiting_for_source(&dv(), &claim(anns.clone()), false).map(|c| {
                let a = c.metadata.annotations.unwrap();
                (
                    a[ann::RUNNING_CONDITION].clone(),
                    a[ann::RUNNING_CONDITION_REASON].clone(),
                    a[ann::RUNNING_CONDITION_MESSAGE].clone(),
                    a.contains_key(ann::POD_SCHEDULABLE),
                )
            })
        };
        // (the claim's annotations, whether the clone waits for its source)
        let rows = [
            (json!({"k8s.io/CloneRequest": "golden/fedora"}), true),
            (
                json!({"cdi.kubevirt.io/storage.pod.phase": "Running",
                       "cdi.kubevirt.io/storage.pod.schedulable": "false"}),
                true,
            ),
            (json!({"cdi.kubevirt.io/clonePhase": "Pending"}), true),
            (json!({"cdi.kubevirt.io/clonePhase": "HostClone"}), true),
            (json!({"k8s.io/CloneOf": "true"}), false),
            (
                json!({"cdi.kubevirt.io/storage.pod.phase": "Succeeded"}),
                false,
            ),
            (json!({"cdi.kubevirt.io/clonePhase": "CSIClone"}), false),
            (json!({"cdi.kubevirt.io/clonePhase": "Rebind"}), false),
            (json!({"cdi.kubevirt.io/clonePhase": "Succeeded"}), false),
        ];
        for (anns, waits) in rows {
            let said = running(&anns);
            assert_eq!(said.is_some(), waits, "{anns}");
            if let Some((status, reason, message, schedulable)) = said {
                assert_eq!(status, "false");
                assert_eq!(reason, CLONE_WITHOUT_SOURCE);
                assert_eq!(
                    message,
                    "The source pvc golden/fedora doesn't exist; DataVolume vms/disk is cloned \
                     once it does"
                );
                assert!(!schedulable, "{anns}");
            }
        }
        // The source there, or no PVC source at all: nothing to say.
        assert!(waiting_for_source(&dv(), &claim(json!({})), true).is_none());
        let mut http = dv();
        http.spec.source = serde_json::from_value(json!({"http": {"url": "http://h/d"}})).unwrap();
        assert!(waiting_for_source(&http, &claim(json!({})), false).is_none());
    }
}
