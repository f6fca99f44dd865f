//! A KubeVirt-like consumer of DataVolumes (docs/design.md#the-waitforfirstconsumer-handshake), so the WaitForFirstConsumer handshake
//! runs end to end without KubeVirt: VirtualMachine `dataVolumeTemplates` become DataVolumes; a
//! VirtualMachineInstance is created once every DataVolume is Succeeded, WaitForFirstConsumer
//! or PendingPopulation; while one is WaitForFirstConsumer a temporary pod with the VMI's
//! scheduling constraints (annotated `kubevirt.io/ephemeral-provisioning`) binds the claims
//! where the VM can run; then the launcher pod. It labels nodes schedulable, as virt-handler
//! does. Pure: [`plan`] decides from a [`View`]; [`agent`] reads and writes.

use std::collections::BTreeMap;

use cdi_api::datavolume::DataVolume;
use cdi_api::enums::DataVolumePhase;
use cdi_api::kubevirt::{
    CONDITION_PROVISIONING, CREATED_BY_LABEL, EPHEMERAL_PROVISIONING_ANNOTATION,
    SCHEDULABLE_NODE_LABEL, VirtualMachine, VirtualMachineInstance,
};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use serde_json::{Value, json};

fn name_of<T: kube::Resource>(o: &T) -> &str {
    o.meta().name.as_deref().unwrap_or("")
}

fn ns_of<T: kube::Resource>(o: &T) -> &str {
    o.meta().namespace.as_deref().unwrap_or("")
}

/// The launcher image the pods use (the kubelet maps it to `cdi dev launcher`).
pub const LAUNCHER_IMAGE: &str = "quay.io/kubevirt/virt-launcher:v1.6.0";
/// Where KubeVirt mounts a filesystem disk (`<dir>/<volume>/disk.img`).
pub const DISKS_DIR: &str = "/var/run/kubevirt-private/vmi-disks";

/// Everything the consumer decides from (one namespace or all).
#[derive(Debug, Clone, Default)]
pub struct View {
    pub vms: Vec<VirtualMachine>,
    pub vmis: Vec<VirtualMachineInstance>,
    pub dvs: Vec<DataVolume>,
    pub claims: Vec<PersistentVolumeClaim>,
    pub pods: Vec<Pod>,
}

/// One change to make.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    CreateDataVolume(Box<DataVolume>),
    CreateVmi(Box<VirtualMachineInstance>),
    CreatePod(Box<Pod>),
    /// Delete a temporary pod at once (grace 0), with an event on the VMI.
    DeleteTempPod {
        namespace: String,
        name: String,
        vmi: String,
    },
    VmStatus {
        namespace: String,
        name: String,
        status: Value,
    },
    VmiStatus {
        namespace: String,
        name: String,
        status: Value,
    },
}

fn phase(dv: &DataVolume) -> Option<DataVolumePhase> {
    dv.status.as_ref().and_then(|s| s.phase.clone())
}

fn runs(vm: &VirtualMachine) -> bool {
    match vm.spec.run_strategy.as_deref() {
        Some("Always" | "RerunOnFailure" | "Once") => true,
        Some(_) => false,
        None => vm.spec.running == Some(true),
    }
}

fn controller_ref(api_version: &str, kind: &str, name: &str, uid: &str) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": uid,
        "controller": true, "blockOwnerDeletion": true})
}

fn controlled_by(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    uid: &str,
) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// The state of each VMI volume: (ready, waiting for its first consumer); `None` while a claim
/// is missing.
fn volumes_state(view: &View, vmi: &VirtualMachineInstance) -> Option<Vec<(String, bool, bool)>> {
    let ns = ns_of(vmi);
    let mut out = Vec::new();
    for v in vmi.spec.volumes.iter().flatten() {
        let Some(claim_name) = v.claim_name() else {
            continue;
        };
        let claim = view
            .claims
            .iter()
            .find(|c| ns_of(*c) == ns && name_of(*c) == claim_name)?;
        // The DataVolume: named by the volume, or the claim's controller of kind DataVolume.
        let dv_name = match &v.data_volume {
            Some(d) => Some(d.name.clone()),
            None => claim
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true) && o.kind == "DataVolume")
                .map(|o| o.name.clone()),
        };
        let dv = dv_name.and_then(|n| {
            view.dvs
                .iter()
                .find(|d| ns_of(*d) == ns && name_of(*d) == n)
        });
        let (ready, wffc) = match dv.and_then(phase) {
            None if dv.is_none() => (true, false),
            Some(DataVolumePhase::Succeeded | DataVolumePhase::PendingPopulation) => (true, false),
            Some(DataVolumePhase::WaitForFirstConsumer) => (false, true),
            _ => (false, false),
        };
        out.push((v.name.clone(), ready, wffc));
    }
    Some(out)
}

/// The launcher pod for `vmi` (temporary: exits at once, annotated as ephemeral).
pub fn launcher_pod(view: &View, vmi: &VirtualMachineInstance, temporary: bool) -> Pod {
    let ns = ns_of(vmi);
    let name = name_of(vmi);
    let uid = vmi.metadata.uid.clone().unwrap_or_default();
    let spec = &vmi.spec;
    let mut selector = BTreeMap::from([(SCHEDULABLE_NODE_LABEL.to_string(), "true".to_string())]);
    selector.extend(spec.node_selector.clone().unwrap_or_default());
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    let mut devices = Vec::new();
    let mut disks = Vec::new();
    for v in spec.volumes.iter().flatten() {
        let Some(claim) = v.claim_name() else {
            continue;
        };
        volumes.push(json!({"name": v.name, "persistentVolumeClaim": {"claimName": claim}}));
        let block = view.claims.iter().any(|c| {
            ns_of(c) == ns
                && name_of(c) == claim
                && c.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block")
        });
        if block {
            let path = format!("/dev/{}", v.name);
            devices.push(json!({"name": v.name, "devicePath": path}));
            disks.push(format!("{}={path}", v.name));
        } else {
            let dir = format!("{DISKS_DIR}/{}", v.name);
            mounts.push(json!({"name": v.name, "mountPath": dir}));
            disks.push(format!("{}={dir}/disk.img", v.name));
        }
    }
    let requests = spec
        .domain
        .as_ref()
        .and_then(|d| d.get("resources"))
        .and_then(|r| r.get("requests"))
        .cloned()
        .unwrap_or(json!({}));
    let (command, args) = if temporary {
        (json!(["/bin/bash"]), json!(["-c", "echo", "bound PVCs"]))
    } else {
        let mut args = vec![json!("--name"), json!(name)];
        for d in &disks {
            args.push(json!("--disk"));
            args.push(json!(d));
        }
        (
            json!(["/usr/bin/virt-launcher-monitor"]),
            Value::Array(args),
        )
    };
    let mut annotations = json!({"kubectl.kubernetes.io/default-container": "compute"});
    if temporary {
        annotations[EPHEMERAL_PROVISIONING_ANNOTATION] = json!("true");
    }
    let mut labels: BTreeMap<String, String> = vmi.metadata.labels.clone().unwrap_or_default();
    labels.insert("kubevirt.io".into(), "virt-launcher".into());
    labels.insert(CREATED_BY_LABEL.into(), uid.clone());
    labels.insert("vm.kubevirt.io/name".into(), name.into());
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": format!("virt-launcher-{name}-"), "namespace": ns,
            "labels": labels, "annotations": annotations,
            "ownerReferences": [controller_ref("kubevirt.io/v1", "VirtualMachineInstance", name, &uid)]},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": selector,
            "affinity": spec.affinity,
            "tolerations": spec.tolerations,
            "schedulerName": spec.scheduler_name,
            "topologySpreadConstraints": spec.topology_spread_constraints,
            "priorityClassName": spec.priority_class_name,
            "enableServiceLinks": false,
            "containers": [{"name": "compute", "image": LAUNCHER_IMAGE,
                "command": command, "args": args,
                "resources": {"requests": requests},
                "volumeMounts": mounts, "volumeDevices": devices}],
            "volumes": volumes,
        }
    });
    serde_json::from_value(strip_nulls(pod)).expect("a Pod")
}

fn strip_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(strip_nulls).collect()),
        other => other,
    }
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    let mut c = json!({"type": type_, "status": status});
    if !reason.is_empty() {
        c["reason"] = json!(reason);
    }
    if !message.is_empty() {
        c["message"] = json!(message);
    }
    c
}

/// Everything the consumer would do now.
pub fn plan(view: &View) -> Vec<Action> {
    let mut out = Vec::new();
    for vm in &view.vms {
        out.extend(plan_vm(view, vm));
    }
    for vmi in &view.vmis {
        out.extend(plan_vmi(view, vmi));
    }
    out
}

/// What one VirtualMachine needs: its missing DataVolumes, its instance once they are ready
/// (and it runs), and its status.
fn plan_vm(view: &View, vm: &VirtualMachine) -> Vec<Action> {
    let mut out = Vec::new();
    let ns = ns_of(vm);
    let name = name_of(vm);
    let ready = plan_datavolumes(view, vm, &mut out);
    let vmi = view
        .vmis
        .iter()
        .find(|v| ns_of(*v) == ns && name_of(*v) == name);
    if runs(vm)
        && ready
        && vmi.is_none()
        && let Some(vmi) = new_vmi(vm)
    {
        out.push(Action::CreateVmi(Box::new(vmi)));
    }
    out.extend(vm_status(view, vm, vmi));
    out
}

/// Create the VM's `dataVolumeTemplates` that do not exist yet; whether every one exists and
/// is far enough along for the instance (Succeeded, WaitForFirstConsumer or
/// PendingPopulation).
fn plan_datavolumes(view: &View, vm: &VirtualMachine, out: &mut Vec<Action>) -> bool {
    let ns = ns_of(vm);
    let name = name_of(vm);
    let uid = vm.metadata.uid.clone().unwrap_or_default();
    let mut ready = true;
    for t in vm.spec.data_volume_templates.iter().flatten() {
        let dv_name = t.metadata.name.clone().unwrap_or_default();
        match view
            .dvs
            .iter()
            .find(|d| ns_of(*d) == ns && name_of(*d) == dv_name)
        {
            None => {
                ready = false;
                let mut labels = t.metadata.labels.clone().unwrap_or_default();
                labels.insert(CREATED_BY_LABEL.into(), uid.clone());
                let mut annotations = t.metadata.annotations.clone().unwrap_or_default();
                annotations.insert(cdi_api::ann::ALLOW_CLAIM_ADOPTION.into(), "true".into());
                let dv = json!({
                    "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                    "metadata": {"name": dv_name, "namespace": ns, "labels": labels,
                        "annotations": annotations,
                        "ownerReferences": [controller_ref("kubevirt.io/v1", "VirtualMachine", name, &uid)]},
                    "spec": t.spec,
                });
                if let Ok(dv) = serde_json::from_value(strip_nulls(dv)) {
                    out.push(Action::CreateDataVolume(Box::new(dv)));
                }
            }
            Some(dv) => {
                ready &= matches!(
                    phase(dv),
                    Some(
                        DataVolumePhase::Succeeded
                            | DataVolumePhase::WaitForFirstConsumer
                            | DataVolumePhase::PendingPopulation
                    )
                );
            }
        }
    }
    ready
}

/// The VM's instance from its template, if it has one.
fn new_vmi(vm: &VirtualMachine) -> Option<VirtualMachineInstance> {
    let template = vm.spec.template.as_ref()?;
    let (ns, name) = (ns_of(vm), name_of(vm));
    let uid = vm.metadata.uid.clone().unwrap_or_default();
    let meta = template.metadata.clone().unwrap_or_default();
    let vmi = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": ns, "labels": meta.labels,
            "annotations": meta.annotations,
            "ownerReferences": [controller_ref("kubevirt.io/v1", "VirtualMachine", name, &uid)]},
        "spec": template.spec,
    });
    serde_json::from_value(strip_nulls(vmi)).ok()
}

/// The VM's status, the printable status of the handshake's stages, when it is not what the
/// VM says already.
fn vm_status(
    view: &View,
    vm: &VirtualMachine,
    vmi: Option<&VirtualMachineInstance>,
) -> Option<Action> {
    let (ns, name) = (ns_of(vm), name_of(vm));
    let dvs: Vec<&DataVolume> = vm
        .spec
        .data_volume_templates
        .iter()
        .flatten()
        .filter_map(|t| {
            let n = t.metadata.name.as_deref()?;
            view.dvs
                .iter()
                .find(|d| ns_of(*d) == ns && name_of(*d) == n)
        })
        .collect();
    let vmi_phase = vmi.and_then(|v| v.status.as_ref()?.phase.clone());
    let provisioning = dvs.iter().any(|d| {
        !matches!(
            phase(d),
            Some(
                DataVolumePhase::Succeeded
                    | DataVolumePhase::PendingPopulation
                    | DataVolumePhase::WaitForFirstConsumer
            )
        )
    });
    let printable = if !runs(vm) {
        "Stopped"
    } else if vmi_phase.as_deref() == Some("Running") {
        "Running"
    } else if dvs
        .iter()
        .any(|d| phase(d) == Some(DataVolumePhase::Failed))
    {
        "DataVolumeError"
    } else if provisioning {
        "Provisioning"
    } else if dvs
        .iter()
        .any(|d| phase(d) == Some(DataVolumePhase::WaitForFirstConsumer))
    {
        "WaitingForVolumeBinding"
    } else {
        "Starting"
    };
    let status = json!({"printableStatus": printable, "created": vmi.is_some(),
        "ready": vmi_phase.as_deref() == Some("Running")});
    let current = vm.status.as_ref().map(|s| {
        json!({"printableStatus": s.printable_status,
        "created": s.created.unwrap_or(false), "ready": s.ready.unwrap_or(false)})
    });
    (current.as_ref() != Some(&status)).then(|| Action::VmStatus {
        namespace: ns.into(),
        name: name.into(),
        status,
    })
}

/// What one VirtualMachineInstance needs: its launcher pod (temporary while a volume waits for
/// its first consumer), the temporary pod deleted once no volume waits, and its status.
fn plan_vmi(view: &View, vmi: &VirtualMachineInstance) -> Vec<Action> {
    let mut out = Vec::new();
    let ns = ns_of(vmi);
    let name = name_of(vmi);
    let uid = vmi.metadata.uid.clone().unwrap_or_default();
    let pods: Vec<&Pod> = view
        .pods
        .iter()
        .filter(|p| ns_of(*p) == ns && controlled_by(&p.metadata, &uid))
        .collect();
    let is_temp = |p: &Pod| {
        p.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(EPHEMERAL_PROVISIONING_ANNOTATION))
    };
    let launcher = pods
        .iter()
        .find(|p| !is_temp(p) && p.metadata.deletion_timestamp.is_none())
        .copied();
    let temp: Vec<&Pod> = pods.iter().filter(|p| is_temp(p)).copied().collect();
    let state = volumes_state(view, vmi);
    let wffc = state.as_ref().is_some_and(|s| s.iter().any(|(_, _, w)| *w));
    let all_ready = state
        .as_ref()
        .is_some_and(|s| s.iter().all(|(_, r, w)| *r || *w));
    let live_temp = temp.iter().any(|p| p.metadata.deletion_timestamp.is_none());
    if launcher.is_none() && !live_temp && all_ready {
        out.push(Action::CreatePod(Box::new(launcher_pod(view, vmi, wffc))));
    }
    if !wffc {
        for p in &temp {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            if matches!(phase, Some("Running" | "Succeeded" | "Failed"))
                && p.metadata.deletion_timestamp.is_none()
            {
                out.push(Action::DeleteTempPod {
                    namespace: ns.into(),
                    name: name_of(*p).into(),
                    vmi: name.into(),
                });
            }
        }
    }
    out.extend(vmi_status(vmi, launcher, &temp, wffc));
    out
}

/// The instance's status from its launcher pod and temporary pods (`wffc`: a volume waits for
/// its first consumer), when it is not what the instance says already.
fn vmi_status(
    vmi: &VirtualMachineInstance,
    launcher: Option<&Pod>,
    temp: &[&Pod],
    wffc: bool,
) -> Option<Action> {
    let launcher_phase = launcher.and_then(|p| p.status.as_ref()?.phase.clone());
    let node = launcher.and_then(|p| p.spec.as_ref()?.node_name.clone());
    let pod_ready = launcher.is_some_and(|p| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    });
    let temp_failed = temp
        .iter()
        .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed"));
    let phase = match launcher_phase.as_deref() {
        _ if temp_failed && wffc => "Failed",
        Some("Running") if pod_ready => "Running",
        Some("Running") | Some("Pending") if node.is_some() => "Scheduled",
        Some("Pending") => "Scheduling",
        Some("Failed") => "Failed",
        Some("Succeeded") => "Succeeded",
        _ => "Pending",
    };
    let conditions = vmi_conditions(phase, temp, wffc);
    let mut status = json!({"phase": phase, "conditions": conditions});
    if let Some(n) = &node {
        status["nodeName"] = json!(n);
    }
    if let Some(ip) = launcher.and_then(|p| p.status.as_ref()?.pod_ip.clone()) {
        status["interfaces"] = json!([{"ipAddress": ip, "name": "default"}]);
    }
    let current = vmi
        .status
        .as_ref()
        .map(|s| serde_json::to_value(s).unwrap_or_default());
    let same = current.as_ref().is_some_and(|c| {
        c["phase"] == status["phase"]
            && c["conditions"] == status["conditions"]
            && c["nodeName"] == status["nodeName"]
            && c["interfaces"] == status["interfaces"]
    });
    (!same).then(|| Action::VmiStatus {
        namespace: ns_of(vmi).into(),
        name: name_of(vmi).into(),
        status,
    })
}

/// The instance's conditions in `phase`: Provisioning while a volume waits (with the temporary
/// pod's scheduling trouble), and Ready.
fn vmi_conditions(phase: &str, temp: &[&Pod], wffc: bool) -> Vec<Value> {
    let mut conditions = Vec::new();
    if phase == "Pending" && wffc {
        conditions.push(condition(CONDITION_PROVISIONING, "True", "", ""));
        // The temporary pod's scheduling trouble shows on the VMI.
        if let Some(c) = temp.iter().find_map(|p| {
            p.status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                .cloned()
        }) {
            conditions.push(condition(
                "PodScheduled",
                "False",
                c.reason.as_deref().unwrap_or(""),
                c.message.as_deref().unwrap_or(""),
            ));
        }
    }
    if phase == "Running" {
        conditions.push(condition("Ready", "True", "", ""));
    } else {
        conditions.push(condition(
            "Ready",
            "False",
            "PodNotExists",
            "virt-launcher pod has not yet been scheduled",
        ));
    }
    conditions
}

/// The consumer as a loop over the API server.
pub mod agent {
    use std::time::Duration;

    use cdi_api::datavolume::DataVolume;
    use cdi_api::kubevirt::{SCHEDULABLE_NODE_LABEL, VirtualMachine, VirtualMachineInstance};
    use k8s_openapi::api::core::v1::{Event, Node, PersistentVolumeClaim, Pod};
    use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
    use kube::{Api, Client};
    use serde_json::json;

    use super::{Action, View, plan};

    async fn list<K>(client: &Client) -> Result<Vec<K>, kube::Error>
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        Ok(Api::<K>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items)
    }

    pub async fn read(client: &Client) -> Result<View, kube::Error> {
        let vms = list::<VirtualMachine>(client).await?;
        let vmis = list::<VirtualMachineInstance>(client).await?;
        if vms.is_empty() && vmis.is_empty() {
            // Everything this agent does is for a VM or its instance: the rest is not read
            // (on a cluster busy with other work it would be most of this agent's cost).
            return Ok(View::default());
        }
        Ok(View {
            vms,
            vmis,
            dvs: list::<DataVolume>(client).await.unwrap_or_default(),
            claims: list::<PersistentVolumeClaim>(client).await?,
            pods: list::<Pod>(client).await?,
        })
    }

    async fn event(client: &Client, ns: &str, kind: &str, name: &str, reason: &str, message: &str) {
        let e: Result<Event, _> = serde_json::from_value(json!({
            // Named as kube's recorder names events (a generateName ending in '.' is invalid).
            "metadata": {"name": kubesim::agents::event_name(name, &kubesim::agents::unique_suffix()),
                "namespace": ns},
            "involvedObject": {"apiVersion": "kubevirt.io/v1", "kind": kind, "namespace": ns, "name": name},
            "reason": reason, "message": message, "type": "Normal",
            "source": {"component": "virt-controller"}, "count": 1,
            "firstTimestamp": k8s_openapi::jiff::Timestamp::now().to_string(),
            "lastTimestamp": k8s_openapi::jiff::Timestamp::now().to_string(),
        }));
        if let Ok(e) = e {
            let _ = Api::<Event>::namespaced(client.clone(), ns)
                .create(&PostParams::default(), &e)
                .await;
        }
    }

    /// Label every node schedulable for VMs, as virt-handler does.
    async fn label_nodes(client: &Client) -> Result<(), kube::Error> {
        let nodes: Api<Node> = Api::all(client.clone());
        for n in nodes.list(&ListParams::default()).await?.items {
            let labelled = n
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SCHEDULABLE_NODE_LABEL))
                .is_some();
            if !labelled && let Some(name) = &n.metadata.name {
                let patch = json!({"metadata": {"labels": {SCHEDULABLE_NODE_LABEL: "true"}}});
                nodes
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
        }
        Ok(())
    }

    /// The object's (first) owner: the VM or VMI an event is about.
    fn owner_name(meta: &kube::api::ObjectMeta) -> String {
        meta.owner_references
            .iter()
            .flatten()
            .next()
            .map(|o| o.name.clone())
            .unwrap_or_default()
    }

    pub async fn apply(client: &Client, action: &Action) -> Result<(), kube::Error> {
        match action {
            Action::CreateDataVolume(dv) => {
                let ns = dv.metadata.namespace.as_deref().unwrap_or("default");
                let name = dv.metadata.name.clone().unwrap_or_default();
                Api::<DataVolume>::namespaced(client.clone(), ns)
                    .create(&PostParams::default(), dv)
                    .await?;
                let vm = owner_name(&dv.metadata);
                event(
                    client,
                    ns,
                    "VirtualMachine",
                    &vm,
                    "SuccessfulDataVolumeCreate",
                    &format!("Created DataVolume {name}"),
                )
                .await;
            }
            Action::CreateVmi(vmi) => {
                let ns = vmi.metadata.namespace.as_deref().unwrap_or("default");
                Api::<VirtualMachineInstance>::namespaced(client.clone(), ns)
                    .create(&PostParams::default(), vmi)
                    .await?;
                let name = vmi.metadata.name.clone().unwrap_or_default();
                event(client, ns, "VirtualMachine", &name, "SuccessfulCreate", &format!("Started the virtual machine by creating the new virtual machine instance {name}")).await;
            }
            Action::CreatePod(pod) => {
                let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
                let created = Api::<Pod>::namespaced(client.clone(), ns)
                    .create(&PostParams::default(), pod)
                    .await?;
                let vmi = owner_name(&pod.metadata);
                let name = created.metadata.name.unwrap_or_default();
                event(
                    client,
                    ns,
                    "VirtualMachineInstance",
                    &vmi,
                    "SuccessfulCreate",
                    &format!("Created virtual machine pod {name}"),
                )
                .await;
            }
            Action::DeleteTempPod {
                namespace,
                name,
                vmi,
            } => {
                match Api::<Pod>::namespaced(client.clone(), namespace)
                    .delete(name, &DeleteParams::default().grace_period(0))
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
                event(
                    client,
                    namespace,
                    "VirtualMachineInstance",
                    vmi,
                    "SuccessfulDelete",
                    &format!("Deleted WaitForFirstConsumer temporary pod {name}"),
                )
                .await;
            }
            Action::VmStatus {
                namespace,
                name,
                status,
            } => {
                Api::<VirtualMachine>::namespaced(client.clone(), namespace)
                    .patch_status(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"status": status})),
                    )
                    .await?;
            }
            Action::VmiStatus {
                namespace,
                name,
                status,
            } => {
                Api::<VirtualMachineInstance>::namespaced(client.clone(), namespace)
                    .patch_status(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"status": status})),
                    )
                    .await?;
            }
        }
        Ok(())
    }

    pub async fn pass(client: &Client) -> Result<(), kube::Error> {
        label_nodes(client).await?;
        let view = read(client).await?;
        for action in plan(&view) {
            let what = match &action {
                Action::CreateDataVolume(d) => format!("create DataVolume {:?}", d.metadata.name),
                Action::CreateVmi(v) => format!("create VMI {:?}", v.metadata.name),
                Action::CreatePod(p) => format!("create pod {:?}", p.metadata.generate_name),
                Action::DeleteTempPod { name, .. } => format!("delete temporary pod {name}"),
                Action::VmStatus { name, status, .. } => {
                    format!("VM {name} {}", status["printableStatus"])
                }
                Action::VmiStatus { name, status, .. } => format!("VMI {name} {}", status["phase"]),
            };
            match apply(client, &action).await {
                Ok(()) => tracing::info!("{what}"),
                Err(e) => tracing::warn!(error = %e, "{what}"),
            }
        }
        Ok(())
    }

    pub async fn run(client: Client, changes: kubesim::agents::Changes, every: Duration) {
        kubesim::run_on_change!(changes.subscribe(), every, pass(&client))
    }
}
