//! The narrator of `cdi demo`: what a snapshot of the seed's objects says happened, as lines
//! keyed so each is told once, and whether the story is over. Pure: the demo observes the
//! cluster and prints; this decides what to print.

use std::ops::ControlFlow;
use std::path::PathBuf;

use cdi_api::datavolume::DataVolume;
use cdi_api::kubevirt::{EPHEMERAL_PROVISIONING_ANNOTATION, VirtualMachineInstance};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};

/// What the demo observed at one moment.
#[derive(Debug, Default, Clone)]
pub struct Scene {
    /// The DataVolume, its claim and the VM's instance, each named by the story.
    pub dv: Option<DataVolume>,
    pub claim: Option<PersistentVolumeClaim>,
    pub vmi: Option<VirtualMachineInstance>,
    /// Every pod, claim and volume: worker pods, PVC prime and the volumes are found by name.
    pub pods: Vec<Pod>,
    pub claims: Vec<PersistentVolumeClaim>,
    pub volumes: Vec<PersistentVolume>,
}

/// How the story ends: the VM's launcher runs on `node` over the volume at `path`.
#[derive(Debug, Clone, PartialEq)]
pub struct Ending {
    pub node: String,
    pub path: PathBuf,
}

/// What one scene adds to the story.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Chapter {
    /// (key, line): a line whose key was told before is not told again.
    pub lines: Vec<(String, String)>,
    /// Over: the launcher runs, or something failed for good (the reason).
    pub end: Option<Result<Ending, String>>,
}

impl Chapter {
    fn say(&mut self, key: impl Into<String>, line: String) {
        self.lines.push((key.into(), line));
    }
}

/// The story of the seed's VirtualMachine `vm`, its DataVolume `dv`; `populator` when the disk
/// takes the populator path.
pub struct Narrator {
    pub vm: String,
    pub dv: String,
    pub populator: bool,
    last_phase: String,
    importer_seen: bool,
}

/// What a worker pod of CDI's does, by its name: `importer-…` or `cdi-upload-…`.
fn worker_kind(name: &str) -> Option<&'static str> {
    if name.starts_with("importer-") {
        Some("importer")
    } else if name.starts_with("cdi-upload-") {
        Some("upload")
    } else {
        None
    }
}

fn pod_phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn phase_of(c: &PersistentVolumeClaim) -> &str {
    c.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn volume_name(c: &PersistentVolumeClaim) -> Option<&str> {
    c.spec.as_ref()?.volume_name.as_deref()
}

fn annotation<'a>(
    meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &str,
) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The node affinity of a volume, as `key In [values]`.
fn affinity(v: &PersistentVolume) -> String {
    v.spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| {
            r.node_selector_terms
                .iter()
                .flat_map(|t| t.match_expressions.iter().flatten())
                .map(|e| {
                    format!(
                        "{} {} {:?}",
                        e.key,
                        e.operator,
                        e.values.clone().unwrap_or_default()
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

/// Where a volume's data lives on the machine.
fn volume_path(v: &PersistentVolume) -> Option<PathBuf> {
    let s = v.spec.clone()?;
    let csi = s
        .csi
        .and_then(|c| c.volume_attributes?.get("path").cloned());
    s.host_path.map(|h| h.path).or(csi).map(PathBuf::from)
}

impl Narrator {
    pub fn new(vm: &str, dv: &str, populator: bool) -> Narrator {
        Narrator {
            vm: vm.into(),
            dv: dv.into(),
            populator,
            last_phase: String::new(),
            importer_seen: false,
        }
    }

    /// The last DataVolume phase told (for a timeout's message).
    pub fn last_phase(&self) -> &str {
        &self.last_phase
    }

    fn volume<'a>(&self, scene: &'a Scene, name: &str) -> Option<&'a PersistentVolume> {
        scene
            .volumes
            .iter()
            .find(|v| v.metadata.name.as_deref() == Some(name))
    }

    /// What `scene` adds to the story: the DataVolume, each pod, the worker pods' end, PVC
    /// prime, the claim and the VM's instance, in that order. A failure told ends the chapter.
    pub fn observe(&mut self, scene: &Scene) -> Chapter {
        let mut out = Chapter::default();
        if self.tell_datavolume(scene, &mut out).is_break() {
            return out;
        }
        let claim_phase = scene.claim.as_ref().map(phase_of).unwrap_or("");
        for p in &scene.pods {
            if self.tell_pod(scene, p, claim_phase, &mut out).is_break() {
                return out;
            }
        }
        self.tell_workers_gone(scene, &mut out);
        self.tell_primes(scene, &mut out);
        self.tell_claim(scene, claim_phase, &mut out);
        self.tell_vmi(scene, &mut out);
        out
    }

    /// A new phase of the DataVolume; a failed one ends the story.
    fn tell_datavolume(&mut self, scene: &Scene, out: &mut Chapter) -> ControlFlow<()> {
        let dv = &self.dv;
        let Some(d) = &scene.dv else {
            return ControlFlow::Continue(());
        };
        let status = d.status.as_ref();
        let phase = status
            .and_then(|s| s.phase.as_ref())
            .map(|p| p.as_str().to_string())
            .unwrap_or_default();
        if !phase.is_empty() && phase != self.last_phase {
            let progress = status.and_then(|s| s.progress.clone()).unwrap_or_default();
            out.say(
                format!("dv-{phase}"),
                format!("DataVolume {dv}: {phase} ({progress})"),
            );
            self.last_phase = phase.clone();
        }
        if phase == "Failed" {
            out.end = Some(Err(format!(
                "DataVolume {dv} failed; see `kubectl describe dv {dv}`"
            )));
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    /// A pod the story knows by its name or annotation: the temporary pod, a worker pod, the
    /// VM's launcher. A worker pod before the claim is bound (off the populator path) ends the
    /// story: the gate did not hold.
    fn tell_pod(
        &mut self,
        scene: &Scene,
        p: &Pod,
        claim_phase: &str,
        out: &mut Chapter,
    ) -> ControlFlow<()> {
        let name = p.metadata.name.as_deref().unwrap_or("");
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        let phase = pod_phase(p);
        if annotation(&p.metadata, EPHEMERAL_PROVISIONING_ANNOTATION).is_some() {
            tell_temporary_pod(name, node.as_deref(), phase, out);
        } else if let Some(kind) = worker_kind(name) {
            return self.tell_worker_pod(p, kind, node.as_deref(), claim_phase, out);
        } else if name.starts_with("virt-launcher-") {
            self.tell_launcher_pod(scene, name, node.as_deref(), phase, out);
        }
        ControlFlow::Continue(())
    }

    /// A worker pod (importer or upload): created, running, done.
    fn tell_worker_pod(
        &mut self,
        p: &Pod,
        kind: &str,
        node: Option<&str>,
        claim_phase: &str,
        out: &mut Chapter,
    ) -> ControlFlow<()> {
        let dv = &self.dv;
        let name = p.metadata.name.as_deref().unwrap_or("");
        let phase = pod_phase(p);
        self.importer_seen = true;
        if claim_phase != "Bound" && !self.populator {
            out.end = Some(Err(format!(
                "{kind} pod {name} exists while claim {dv} is {claim_phase:?}: the gate did not hold"
            )));
            return ControlFlow::Break(());
        }
        let why = if self.populator {
            "for PVC prime; the VM's claim stays unbound".to_string()
        } else {
            format!("(claim {dv} is Bound)")
        };
        out.say(
            format!("{name}-created"),
            format!("{kind} pod {name} created {why}"),
        );
        if let (Some(n), "Running") = (node, phase) {
            let ip = p
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .unwrap_or_default();
            out.say(
                format!("{name}-running"),
                format!("{kind} pod {name} running on {n}, IP {ip}"),
            );
        }
        if phase == "Succeeded" {
            let on = node.unwrap_or("?");
            out.say(
                format!("{name}-done"),
                format!("{kind} pod {name} Succeeded on {on}"),
            );
        }
        ControlFlow::Continue(())
    }

    /// The launcher pod: created and placed, then running, which ends the story on the node
    /// and volume path it runs over.
    fn tell_launcher_pod(
        &self,
        scene: &Scene,
        name: &str,
        node: Option<&str>,
        phase: &str,
        out: &mut Chapter,
    ) {
        let dv = &self.dv;
        if phase != "Running" {
            out.say(
                format!("{name}-created"),
                format!("launcher pod {name} created: the first consumer of the claim"),
            );
            if let Some(n) = node {
                out.say(
                    format!("{name}-node"),
                    format!("launcher pod {name} bound to {n}"),
                );
            }
        } else if let Some(n) = node {
            out.say("launcher", format!("launcher pod {name} Running on {n}"));
            let path = scene
                .claim
                .as_ref()
                .and_then(volume_name)
                .and_then(|pv| self.volume(scene, pv))
                .and_then(volume_path);
            out.end = Some(match path {
                Some(path) => Ok(Ending {
                    node: n.to_string(),
                    path,
                }),
                None => Err(format!(
                    "the launcher runs but claim {dv} has no volume with a path"
                )),
            });
        }
    }

    /// The worker pods gone after one was seen: deleted after success.
    fn tell_workers_gone(&self, scene: &Scene, out: &mut Chapter) {
        let worker_left = scene.pods.iter().any(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| worker_kind(n).is_some())
        });
        if self.importer_seen && !worker_left {
            out.say("importer-gone", "worker pod deleted after success".into());
        }
    }

    /// PVC prime: created on a node, bound, and lost when its volume is handed over.
    fn tell_primes(&self, scene: &Scene, out: &mut Chapter) {
        let dv = &self.dv;
        for prime in &scene.claims {
            let name = prime.metadata.name.as_deref().unwrap_or("");
            if !name.starts_with("prime-") {
                continue;
            }
            let node = annotation(&prime.metadata, cdi_api::ann::SELECTED_NODE).unwrap_or("");
            out.say(
                format!("{name}-created"),
                format!("PVC prime {name} created for {dv}, selected-node={node}"),
            );
            match phase_of(prime) {
                "Bound" => {
                    let pv = volume_name(prime).unwrap_or("");
                    out.say(
                        format!("{name}-bound"),
                        format!("PVC prime {name} Bound to {pv}"),
                    );
                }
                "Lost" => out.say(
                    format!("{name}-lost"),
                    format!("PVC prime {name} Lost: its volume was handed to {dv}"),
                ),
                _ => {}
            }
        }
    }

    /// The VM's claim: its volume rebound (populator path), the node the scheduler selected,
    /// the placement its worker pods inherit, and the volume it is bound to.
    fn tell_claim(&self, scene: &Scene, claim_phase: &str, out: &mut Chapter) {
        let dv = &self.dv;
        let Some(c) = &scene.claim else {
            return;
        };
        if self.populator && claim_phase == "Bound" {
            let pv = volume_name(c).unwrap_or("");
            out.say(
                "rebind",
                format!("volume {pv} rebound: claimRef now {dv} (no data copied)"),
            );
        }
        if let Some(n) = annotation(&c.metadata, cdi_api::ann::SELECTED_NODE) {
            let consumer = if self.populator {
                "launcher pod"
            } else {
                "temporary pod"
            };
            out.say("selected", format!("claim {dv}: volume.kubernetes.io/selected-node={n} (set by the scheduler for the {consumer})"));
        }
        if let Ok(Some(record)) = cdi_core::placement::recorded(c) {
            out.say(
                "inherited",
                format!(
                    "claim {dv}: its worker pods inherit {}, as the scheduler placed that pod \
                     there ({}; no CDI spec.workload needed)",
                    record.describe(),
                    cdi_api::ext::WORKER_TOLERATIONS
                ),
            );
        }
        if claim_phase == "Bound"
            && let Some(pv) = volume_name(c)
            && let Some(v) = self.volume(scene, pv)
        {
            out.say(
                "bound",
                format!("claim {dv} Bound to {pv}: node affinity {}", affinity(v)),
            );
        }
    }

    /// The VM's instance: provisioning, then its phases.
    fn tell_vmi(&self, scene: &Scene, out: &mut Chapter) {
        let Some(vmi) = &scene.vmi else {
            return;
        };
        let vm = &self.vm;
        let status = vmi.status.as_ref();
        let phase = status.and_then(|s| s.phase.clone()).unwrap_or_default();
        let provisioning = status.and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Provisioning" && c["status"] == "True")
        });
        if provisioning {
            out.say(
                "vmi-provisioning",
                format!("VirtualMachineInstance {vm}: {phase}, condition Provisioning=True"),
            );
        } else if !phase.is_empty() {
            out.say(
                format!("vmi-{phase}"),
                format!("VirtualMachineInstance {vm}: {phase}"),
            );
        }
    }
}

/// The temporary pod that stands in for the VM's constraints: created, placed, done.
fn tell_temporary_pod(name: &str, node: Option<&str>, phase: &str, out: &mut Chapter) {
    out.say(
        format!("{name}-created"),
        format!(
            "temporary pod {name} created (the VM's constraints, {EPHEMERAL_PROVISIONING_ANNOTATION})"
        ),
    );
    if let Some(n) = node {
        out.say(
            format!("{name}-node"),
            format!("temporary pod {name} scheduled on {n}"),
        );
    }
    if phase == "Succeeded" {
        out.say(
            format!("{name}-done"),
            format!("temporary pod {name} Succeeded (bash -c echo \"bound PVCs\")"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, node: Option<&str>, phase: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"containers": [], "nodeName": node}, "status": {"phase": phase}}))
        .unwrap()
    }

    fn claim(phase: &str, volume: Option<&str>) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": "root"},
            "spec": {"volumeName": volume}, "status": {"phase": phase}}))
        .unwrap()
    }

    fn lines(c: &Chapter) -> Vec<&str> {
        c.lines.iter().map(|(_, l)| l.as_str()).collect()
    }

    #[test]
    fn an_importer_before_binding_ends_the_story() {
        let mut n = Narrator::new("vm", "root", false);
        let scene = Scene {
            claim: Some(claim("Pending", None)),
            pods: vec![pod("importer-root", None, "Pending")],
            ..Default::default()
        };
        let chapter = n.observe(&scene);
        assert!(matches!(&chapter.end, Some(Err(m)) if m.contains("the gate did not hold")));
        // On the populator path the importer fills PVC prime while the claim waits.
        let mut n = Narrator::new("vm", "root", true);
        let chapter = n.observe(&scene);
        assert_eq!(chapter.end, None);
        assert_eq!(
            lines(&chapter),
            ["importer pod importer-root created for PVC prime; the VM's claim stays unbound"]
        );
    }

    #[test]
    fn the_story_ends_where_the_launcher_runs() {
        let mut n = Narrator::new("vm", "root", false);
        let volume: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "pv-1"},
            "spec": {"hostPath": {"path": "/data/vm-disks/default/root"}}}))
        .unwrap();
        let scene = Scene {
            claim: Some(claim("Bound", Some("pv-1"))),
            pods: vec![
                pod("importer-root", Some("node-2"), "Succeeded"),
                pod("virt-launcher-vm-x", Some("node-2"), "Running"),
            ],
            volumes: vec![volume],
            ..Default::default()
        };
        let chapter = n.observe(&scene);
        assert_eq!(
            chapter.end,
            Some(Ok(Ending {
                node: "node-2".into(),
                path: "/data/vm-disks/default/root".into()
            }))
        );
        assert!(lines(&chapter).contains(&"importer pod importer-root Succeeded on node-2"));
        // The importer gone afterwards is told.
        let later = Scene {
            pods: vec![pod("virt-launcher-vm-x", Some("node-2"), "Running")],
            ..scene
        };
        assert!(
            n.observe(&later)
                .lines
                .iter()
                .any(|(k, _)| k == "importer-gone")
        );
    }
}
