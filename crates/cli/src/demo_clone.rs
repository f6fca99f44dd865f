//! `cdi demo --clone`: the golden-image story (docs/cloning.md#example-a-golden-image-and-a-clone-of-it, docs/design.md#datasources-and-sourceref). A disk image is imported once
//! into namespace `golden` and published as a DataSource; alice, who edits namespace `vms` only,
//! is refused a clone of it by CDI's admission webhook, then, allowed to read golden's volumes,
//! gets two VM disks cloned from it through `sourceRef`: one on local-path (a host-assisted
//! copy) and one on the CSI-like class (through the clone populator, by CSI clone or snapshot).
//! The timeline says the strategy each took and why.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use cdi_api::datasource::DataSource;
use cdi_api::datavolume::DataVolume;
use cdi_api::keys::ann;
use cdi_api::kubevirt::VirtualMachine;
use cdi_api::storageprofile::StorageProfile;
use k8s_openapi::api::core::v1::{Event, Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::timeline::Timeline;

const GOLDEN: &str = "golden";
const VMS: &str = "vms";
const IMAGE: &str = "fedora";
const USER: &str = "alice";
/// The two VMs: name, disk, class.
const VM_DISKS: [(&str, &str, &str); 2] = [
    ("vm-local", "vm-local-root", "local-path"),
    ("vm-csi", "vm-csi-root", "csi"),
];

fn disk(name: &str, class: &str) -> Value {
    json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": name, "namespace": VMS},
        "spec": {"sourceRef": {"kind": "DataSource", "namespace": GOLDEN, "name": IMAGE},
            "storage": {"storageClassName": class, "accessModes": ["ReadWriteOnce"]}}})
}

fn vm(name: &str, disk: &str) -> Value {
    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": VMS},
        "spec": {"running": true, "template": {"spec": {
            "domain": {"resources": {"requests": {"memory": "1Gi"}},
                "devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}},
            "volumes": [{"name": "root", "dataVolume": {"name": disk}}]}}}})
}

async fn create<K>(api: &Api<K>, value: Value) -> anyhow::Result<K>
where
    K: kube::Resource
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + k8s_openapi::serde::Serialize
        + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value)?;
    Ok(api.create(&PostParams::default(), &object).await?)
}

/// The admin's client acting as `user` (impersonation), as that user's kubectl would.
async fn client_as(kubeconfig: &Path, user: &str) -> anyhow::Result<Client> {
    let file = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let mut config = kube::Config::from_custom_kubeconfig(file, &Default::default()).await?;
    config.auth_info.impersonate = Some(user.into());
    Ok(Client::try_from(config)?)
}

/// What the timeline says of a cloned disk, each line once (by its key): its phases, the
/// strategy its claim took and why, the events on it.
/// `chosen_by` says where a strategy taken without a fallback came from.
pub fn disk_lines(
    dv: &DataVolume,
    claim: Option<&PersistentVolumeClaim>,
    chosen_by: &str,
    events: &[Event],
) -> Vec<(String, String)> {
    let name = dv.name_any();
    let mut lines = Vec::new();
    if let Some(status) = &dv.status {
        let phase = status
            .phase
            .as_ref()
            .map(|p| p.to_string())
            .unwrap_or_default();
        if !phase.is_empty() {
            let progress = status
                .progress
                .as_deref()
                .filter(|p| *p != "N/A")
                .map(|p| format!(" ({p})"))
                .unwrap_or_default();
            lines.push((
                format!("{name}/phase/{phase}"),
                format!("DataVolume {VMS}/{name}: {phase}{progress}"),
            ));
        }
    }
    if let Some(claim) = claim {
        let anns = claim.annotations();
        if let Some(strategy) = anns.get(ann::CLONE_TYPE) {
            let why = match anns.get(ann::CLONE_FALLBACK_REASON) {
                Some(r) => format!(", falling back because: {r}"),
                None => format!(" ({chosen_by})"),
            };
            lines.push((
                format!("{name}/strategy"),
                format!("claim {VMS}/{name}: clone strategy {strategy}{why}"),
            ));
        } else if let Some(source) = anns.get(ann::CLONE_REQUEST) {
            lines.push((
                format!("{name}/strategy"),
                format!(
                    "claim {VMS}/{name}: host-assisted copy of {source} (class {} has no CSI driver to clone or snapshot with)",
                    claim
                        .spec
                        .as_ref()
                        .and_then(|s| s.storage_class_name.as_deref())
                        .unwrap_or("")
                ),
            ));
        }
    }
    for e in events {
        let about = e.involved_object.name.as_deref().unwrap_or("");
        if about != name {
            continue;
        }
        let kind = e.involved_object.kind.as_deref().unwrap_or("");
        let reason = e.reason.as_deref().unwrap_or("");
        lines.push((
            format!("{name}/event/{kind}/{reason}"),
            format!(
                "event on {kind} {VMS}/{name}: {reason}: {}",
                e.message.as_deref().unwrap_or("")
            ),
        ));
    }
    lines
}

/// Where the clone populator's strategy for `class` comes from: CDI's override, the class's
/// StorageProfile, or the default (snapshot, when the driver has a VolumeSnapshotClass).
async fn chosen_by(client: &Client, class: &str) -> anyhow::Result<String> {
    let cdi_override = Api::<cdi_api::config::CDI>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .find_map(|c| c.spec.clone_strategy_override);
    if let Some(s) = cdi_override {
        return Ok(format!("the CDI resource's cloneStrategyOverride {s}"));
    }
    let profile = Api::<StorageProfile>::all(client.clone())
        .get_opt(class)
        .await?
        .and_then(|p| p.status?.clone_strategy);
    Ok(match profile {
        Some(s) => format!("StorageProfile {class} says cloneStrategy {s}"),
        None => format!(
            "StorageProfile {class} names no cloneStrategy: the default, a snapshot, as its driver has a VolumeSnapshotClass"
        ),
    })
}

/// Where a bound claim's volume keeps its data (the `disk.img` of a Filesystem volume).
async fn disk_image(client: &Client, claim: &PersistentVolumeClaim) -> anyhow::Result<PathBuf> {
    let pv_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .context("the claim is not bound")?;
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&pv_name)
        .await?;
    let spec = pv.spec.unwrap_or_default();
    let path = spec
        .host_path
        .map(|h| h.path)
        .or_else(|| spec.csi?.volume_attributes?.get("path").cloned())
        .with_context(|| format!("PersistentVolume {pv_name} names no path"))?;
    Ok(PathBuf::from(path).join("disk.img"))
}

/// A RoleBinding in `ns` giving the demo's user the ClusterRole `role`.
fn binding(ns: &str, name: &str, role: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]})
}

/// Run the story on a cluster where CDI runs (its webhook on); `raw` is the image's content.
pub async fn story(
    client: &Client,
    kubeconfig: &Path,
    url: &str,
    size: &str,
    raw: &[u8],
    timeout: Duration,
    t: &mut Timeline,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    wait_for_webhook(client, deadline).await?;
    set_up(client, url, size, t).await?;
    wait_for_golden(client, deadline, t).await?;
    alice_clones(client, kubeconfig, t).await?;
    follow_disks(client, deadline, timeout, t).await?;
    println!();
    check_disks(client, raw).await?;
    println!(
        "\nOK: both VMs run on disks cloned from {GOLDEN}/{IMAGE} through its DataSource, after {USER} was allowed to read namespace {GOLDEN}."
    );
    Ok(())
}

/// Wait until CDI's DataVolume webhook is registered (once CDI's API server is reachable
/// through its Service).
async fn wait_for_webhook(client: &Client, deadline: Instant) -> anyhow::Result<()> {
    let webhooks: Api<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration> =
        Api::all(client.clone());
    while webhooks
        .get_opt(cdi_apiserver::webhook::CONFIGURATION)
        .await?
        .is_none()
    {
        if Instant::now() > deadline {
            bail!(
                "CDI's DataVolume webhook ({}) was not registered in time",
                cdi_apiserver::webhook::CONFIGURATION
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Apply the namespaces, the golden image's DataVolume and DataSource, the user's right to
/// edit `vms`, and KubeVirt's share of `edit`.
async fn set_up(client: &Client, url: &str, size: &str, t: &mut Timeline) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in [GOLDEN, VMS] {
        create(&namespaces, json!({"metadata": {"name": ns}})).await?;
    }
    let golden_dvs: Api<DataVolume> = Api::namespaced(client.clone(), GOLDEN);
    create(
        &golden_dvs,
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": IMAGE, "namespace": GOLDEN},
            "spec": {"source": {"http": {"url": url}},
                "storage": {"storageClassName": "csi", "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": size}}}}}),
    )
    .await?;
    let sources: Api<DataSource> = Api::namespaced(client.clone(), GOLDEN);
    create(
        &sources,
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
            "metadata": {"name": IMAGE, "namespace": GOLDEN},
            "spec": {"source": {"pvc": {"namespace": GOLDEN, "name": IMAGE}}}}),
    )
    .await?;
    create(
        &Api::<RoleBinding>::namespaced(client.clone(), VMS),
        binding(VMS, "alice-edits", "edit"),
    )
    .await?;
    // What KubeVirt's install aggregates into `edit` (the development cluster has no KubeVirt).
    create(
        &Api::<ClusterRole>::all(client.clone()),
        json!({"metadata": {"name": "kubevirt.io:demo-edit",
                "labels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true"}},
            "rules": [{"apiGroups": ["kubevirt.io"],
                "resources": ["virtualmachines", "virtualmachineinstances"], "verbs": ["*"]}]}),
    )
    .await?;
    t.say(
        "setup",
        format!(
            "applied: DataVolume {GOLDEN}/{IMAGE} (http import, class csi, {size}), DataSource \
             {GOLDEN}/{IMAGE} naming its claim; {USER} may edit namespace {VMS}"
        ),
    );
    Ok(())
}

/// Follow the golden image's import, then its DataSource, until the DataSource is Ready.
async fn wait_for_golden(
    client: &Client,
    deadline: Instant,
    t: &mut Timeline,
) -> anyhow::Result<()> {
    let golden_dvs: Api<DataVolume> = Api::namespaced(client.clone(), GOLDEN);
    let sources: Api<DataSource> = Api::namespaced(client.clone(), GOLDEN);
    loop {
        if Instant::now() > deadline {
            bail!("the golden image was not imported in time");
        }
        let dv = golden_dvs.get(IMAGE).await?;
        if let Some(phase) = dv.status.as_ref().and_then(|s| s.phase.clone()) {
            t.say(
                &format!("golden/{phase}"),
                format!("DataVolume {GOLDEN}/{IMAGE}: {phase}"),
            );
        }
        let ds = sources.get(IMAGE).await?;
        let ready = ds
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .filter(|c| c.status.to_string() == "True")
            .map(|c| c.message.clone().unwrap_or_default());
        if let Some(message) = ready {
            t.say(
                "golden/ready",
                format!("DataSource {GOLDEN}/{IMAGE}: Ready ({message})"),
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Alice asks for a clone of another namespace's image: refused until she may read it; then,
/// allowed, she creates both disks and their VMs.
async fn alice_clones(client: &Client, kubeconfig: &Path, t: &mut Timeline) -> anyhow::Result<()> {
    let alice = client_as(kubeconfig, USER).await?;
    let alice_dvs: Api<DataVolume> = Api::namespaced(alice.clone(), VMS);
    let (_, disk_name, class) = VM_DISKS[0];
    match create(&alice_dvs, disk(disk_name, class)).await {
        Ok(_) => bail!(
            "{USER} was allowed to clone from namespace {GOLDEN} without any right there: \
             is CDI's DataVolume webhook registered?"
        ),
        Err(e) => {
            let why = match e.downcast_ref::<kube::Error>() {
                Some(kube::Error::Api(status)) => status.message.clone(),
                _ => e.to_string(),
            };
            t.say("refused", format!("{USER} creates DataVolume {VMS}/{disk_name} (sourceRef {GOLDEN}/{IMAGE}): refused: {why}"));
        }
    }
    create(
        &Api::<RoleBinding>::namespaced(client.clone(), GOLDEN),
        binding(GOLDEN, "alice-clones", "cdi.kubevirt.io:clone-sourcer"),
    )
    .await?;
    t.say(
        "granted",
        format!(
            "RoleBinding {GOLDEN}/alice-clones: {USER} may create datavolumes/source in {GOLDEN}"
        ),
    );
    let alice_vms: Api<VirtualMachine> = Api::namespaced(alice.clone(), VMS);
    for (vm_name, disk_name, class) in VM_DISKS {
        create(&alice_dvs, disk(disk_name, class))
            .await
            .with_context(|| format!("{USER} creating DataVolume {VMS}/{disk_name}"))?;
        create(&alice_vms, vm(vm_name, disk_name))
            .await
            .with_context(|| format!("{USER} creating VirtualMachine {VMS}/{vm_name}"))?;
        t.say(
            &format!("created/{vm_name}"),
            format!(
                "{USER} creates DataVolume {VMS}/{disk_name} (sourceRef {GOLDEN}/{IMAGE}, class {class}) and VirtualMachine {VMS}/{vm_name} using it"
            ),
        );
    }
    Ok(())
}

/// Follow both disks until both VMs run.
async fn follow_disks(
    client: &Client,
    deadline: Instant,
    timeout: Duration,
    t: &mut Timeline,
) -> anyhow::Result<()> {
    let events: Api<Event> = Api::namespaced(client.clone(), VMS);
    loop {
        if Instant::now() > deadline {
            bail!("the VMs were not running after {} s", timeout.as_secs());
        }
        let all_events = events.list(&ListParams::default()).await?.items;
        say_disks(client, &all_events, t).await?;
        if running_vms(client, t).await? == VM_DISKS.len() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Say what each disk there is does (phases, strategy, events); a failed disk fails the story.
async fn say_disks(client: &Client, all_events: &[Event], t: &mut Timeline) -> anyhow::Result<()> {
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), VMS);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), VMS);
    for (_, disk_name, _) in VM_DISKS {
        let Some(dv) = dvs.get_opt(disk_name).await? else {
            continue;
        };
        let claim = claims.get_opt(disk_name).await?;
        let class = claim
            .as_ref()
            .and_then(|c| c.spec.as_ref()?.storage_class_name.clone())
            .unwrap_or_default();
        let chosen_by = if class.is_empty() {
            String::new()
        } else {
            chosen_by(client, &class).await?
        };
        for (key, line) in disk_lines(&dv, claim.as_ref(), &chosen_by, all_events) {
            t.say(&key, line);
        }
        if dv
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .map(|p| p.to_string())
            == Some("Failed".into())
        {
            bail!("DataVolume {VMS}/{disk_name} failed");
        }
    }
    Ok(())
}

/// Say each VM whose launcher runs, and count them.
async fn running_vms(client: &Client, t: &mut Timeline) -> anyhow::Result<usize> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), VMS);
    let mut done = 0;
    for pod in pods.list(&ListParams::default()).await?.items {
        let name = pod.name_any();
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        if let Some((vm_name, _, _)) = VM_DISKS
            .iter()
            .find(|(vm, _, _)| name.starts_with(&format!("virt-launcher-{vm}-")))
            && running
        {
            let node = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            t.say(
                &format!("running/{vm_name}"),
                format!("VirtualMachine {VMS}/{vm_name}: launcher {name} running on {node}"),
            );
            done += 1;
        }
    }
    Ok(done)
}

/// Print whether each disk's volume holds the golden image byte for byte; any that does not
/// fails the story.
async fn check_disks(client: &Client, raw: &[u8]) -> anyhow::Result<()> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), VMS);
    let mut wrong = Vec::new();
    for (_, disk_name, _) in VM_DISKS {
        let claim = claims.get(disk_name).await?;
        let path = disk_image(client, &claim).await?;
        let head = crate::demo_image::read_head(&path, raw.len());
        let same = head.as_deref() == Some(raw);
        println!(
            "{VMS}/{disk_name}: {} {}",
            path.display(),
            if same {
                "holds the golden image, byte for byte"
            } else {
                "DIFFERS from the golden image"
            }
        );
        if !same {
            wrong.push(disk_name);
        }
    }
    if !wrong.is_empty() {
        bail!("{} do not hold the golden image", wrong.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_says_its_phase_strategy_and_events_once_each() {
        let dv: DataVolume = serde_json::from_value(json!({
            "metadata": {"name": "vm-csi-root", "namespace": VMS},
            "spec": {},
            "status": {"phase": "CSICloneInProgress", "progress": "N/A"}}))
        .unwrap();
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "vm-csi-root", "annotations": {
                ann::CLONE_TYPE: "copy",
                ann::CLONE_FALLBACK_REASON: "no VolumeSnapshotClass"}}}))
        .unwrap();
        let event: Event = serde_json::from_value(json!({
            "metadata": {"name": "e"},
            "involvedObject": {"kind": "DataVolume", "name": "vm-csi-root"},
            "reason": "CloneSucceeded", "message": "Successfully cloned"}))
        .unwrap();
        let other: Event = serde_json::from_value(json!({
            "metadata": {"name": "f"},
            "involvedObject": {"kind": "DataVolume", "name": "vm-local-root"},
            "reason": "CloneSucceeded"}))
        .unwrap();
        let lines = disk_lines(&dv, Some(&claim), "unused", &[event, other]);
        let texts: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(
            texts,
            [
                "DataVolume vms/vm-csi-root: CSICloneInProgress",
                "claim vms/vm-csi-root: clone strategy copy, falling back because: no VolumeSnapshotClass",
                "event on DataVolume vms/vm-csi-root: CloneSucceeded: Successfully cloned",
            ]
        );
        let keys: std::collections::BTreeSet<&str> =
            lines.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys.len(), lines.len());
    }
}
