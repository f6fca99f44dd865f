//! A first consumer without KubeVirt (docs/design.md#a-first-consumer-without-kubevirt): a DataVolume annotated `cdi-rs.dev/first-consumer`
//! with a pod scheduling template gets a temporary pod, as KubeVirt makes for a VM's disks, that
//! mounts its WaitForFirstConsumer claim, so the scheduler binds the claim where the template
//! places the pod. The pod exits at once and is deleted when its work is done.

use std::collections::BTreeMap;

use cdi_api::datavolume::DataVolume;
use cdi_api::{ext, label};
use k8s_openapi::api::core::v1::{
    Affinity, Container, PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec,
    ResourceRequirements, SeccompProfile, Toleration, TopologySpreadConstraint, Volume,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

/// The event when the template cannot be read.
pub const ERR_TEMPLATE: &str = "ErrFirstConsumerTemplate";
/// The event when the scheduler finds no node for the pod.
pub const UNSCHEDULABLE: &str = "FirstConsumerUnschedulable";
/// The container's name.
pub const CONTAINER: &str = "first-consumer";

/// The scheduling part of a PodSpec: all a template may say.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Template {
    #[serde(default)]
    pub node_selector: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub affinity: Option<Affinity>,
    #[serde(default)]
    pub tolerations: Option<Vec<Toleration>>,
    #[serde(default)]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,
    #[serde(default)]
    pub priority_class_name: Option<String>,
}

fn dv_name(dv: &DataVolume) -> String {
    format!(
        "{}/{}",
        dv.metadata.namespace.as_deref().unwrap_or(""),
        dv.metadata.name.as_deref().unwrap_or("")
    )
}

/// The DataVolume's template: `None` without the annotation, `Err` (naming the DataVolume and
/// the fix) when it is not a scheduling template. An empty value places the pod anywhere.
pub fn template(dv: &DataVolume) -> Option<Result<Template, String>> {
    let text = dv.metadata.annotations.as_ref()?.get(ext::FIRST_CONSUMER)?;
    if text.trim().is_empty() {
        return Some(Ok(Template::default()));
    }
    // JSON is YAML: one parser reads both.
    Some(serde_saphyr::from_str::<Template>(text).map_err(|e| {
        let e = e.to_string();
        let first = e.lines().next().unwrap_or("");
        format!(
            "the {} annotation of DataVolume {} is not a pod scheduling template ({first}); \
                 write a YAML or JSON mapping of nodeSelector, affinity, tolerations, \
                 topologySpreadConstraints and priorityClassName, as in a PodSpec",
            ext::FIRST_CONSUMER,
            dv_name(dv)
        )
    }))
}

/// The temporary pod's name: `<datavolume>-first-consumer`, shortened when long.
pub fn pod_name(dv: &DataVolume) -> String {
    crate::naming::resource_name(dv.metadata.name.as_deref().unwrap_or(""), CONTAINER)
}

/// The temporary pod for `dv`'s claim `claim`, placed by `t`, run from `image` (the importer's:
/// a pod of CDI's that does nothing but exist).
pub fn pod(dv: &DataVolume, claim: &str, t: &Template, image: &str) -> Pod {
    let small = BTreeMap::from([
        ("cpu".to_string(), Quantity("10m".into())),
        ("memory".to_string(), Quantity("16Mi".into())),
    ]);
    let container = Container {
        name: CONTAINER.into(),
        image: Some(image.into()),
        command: Some(vec!["/bin/sh".into(), "-c".into(), "exit 0".into()]),
        resources: Some(ResourceRequirements {
            requests: Some(small.clone()),
            limits: Some(small),
            ..Default::default()
        }),
        security_context: Some(crate::import::worker_security_context()),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(dv)),
            namespace: dv.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([
                (label::APP.to_string(), label::APP_VALUE.to_string()),
                (
                    ext::FIRST_CONSUMER_FOR.to_string(),
                    crate::naming::label_name(dv.metadata.name.as_deref().unwrap_or("")),
                ),
            ])),
            owner_references: crate::datavolume::refs::owner_reference(dv).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![container],
            // Named, not mounted: a volume in the spec is what the scheduler binds.
            volumes: Some(vec![Volume {
                name: "claim".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.into(),
                    read_only: None,
                }),
                ..Default::default()
            }]),
            restart_policy: Some("Never".into()),
            termination_grace_period_seconds: Some(0),
            enable_service_links: Some(false),
            automount_service_account_token: Some(false),
            node_selector: t.node_selector.clone(),
            affinity: t.affinity.clone(),
            tolerations: t.tolerations.clone(),
            topology_spread_constraints: t.topology_spread_constraints.clone(),
            priority_class_name: t.priority_class_name.clone(),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(107),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    localhost_profile: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// The scheduler's reason when it found no node for the pod.
pub fn unschedulable(pod: &Pod) -> Option<&str> {
    let pending = pod.status.as_ref()?.phase.as_deref() == Some("Pending")
        || pod.status.as_ref()?.phase.is_none();
    pod.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| {
            pending
                && c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        })
        .and_then(|c| c.message.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dv(annotation: Option<&str>) -> DataVolume {
        let mut anns = json!({});
        if let Some(a) = annotation {
            anns[ext::FIRST_CONSUMER] = json!(a);
        }
        serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "DataVolume", "metadata": {"name": "disk", "namespace": "vms",
            "uid": "dv-uid", "annotations": anns},
            "spec": {"source": {"blank": {}}, "storage": {}}}))
        .unwrap()
    }

    #[test]
    fn templates_are_yaml_or_json_and_only_scheduling() {
        assert_eq!(template(&dv(None)), None);
        assert_eq!(template(&dv(Some(""))), Some(Ok(Template::default())));
        let yaml = "nodeSelector: {kubernetes.io/hostname: node-3}\n\
                    tolerations: [{key: virt-local, operator: Exists}]\n\
                    priorityClassName: high";
        let t = template(&dv(Some(yaml))).unwrap().unwrap();
        assert_eq!(t.node_selector.unwrap()["kubernetes.io/hostname"], "node-3");
        assert_eq!(t.priority_class_name.as_deref(), Some("high"));
        let json = r#"{"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname",
            "operator": "In", "values": ["node-3"]}]}]}}}}"#;
        assert!(
            template(&dv(Some(json)))
                .unwrap()
                .unwrap()
                .affinity
                .is_some()
        );
        for bad in [
            "containers: [{name: x, image: y}]",
            "nodeSelector: [a, b]",
            "just words",
            "{",
        ] {
            let err = template(&dv(Some(bad))).unwrap().unwrap_err();
            assert!(err.contains("DataVolume vms/disk"), "{bad}: {err}");
            assert!(err.contains("nodeSelector, affinity, tolerations"), "{err}");
        }
    }

    #[test]
    fn the_pod_mounts_the_claim_where_the_template_says() {
        let t = Template {
            node_selector: Some(BTreeMap::from([(
                "kubernetes.io/hostname".into(),
                "node-3".into(),
            )])),
            ..Default::default()
        };
        let p = pod(&dv(Some("")), "disk", &t, "cdi-importer");
        assert_eq!(p.metadata.name.as_deref(), Some("disk-first-consumer"));
        assert_eq!(
            p.metadata.owner_references.as_ref().unwrap()[0].uid,
            "dv-uid"
        );
        assert_eq!(
            p.metadata.labels.as_ref().unwrap()[ext::FIRST_CONSUMER_FOR],
            "disk"
        );
        let spec = p.spec.unwrap();
        assert_eq!(
            spec.volumes.unwrap()[0]
                .persistent_volume_claim
                .as_ref()
                .unwrap()
                .claim_name,
            "disk"
        );
        assert_eq!(
            spec.node_selector.unwrap()["kubernetes.io/hostname"],
            "node-3"
        );
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    }

    #[test]
    fn the_schedulers_reason_is_read_while_pending() {
        let mut p: Pod = serde_json::from_value(json!({"metadata": {"name": "p"},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled",
                "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."}]}}))
        .unwrap();
        assert!(unschedulable(&p).unwrap().starts_with("0/3 nodes"));
        p.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert_eq!(unschedulable(&p), None);
    }
}
