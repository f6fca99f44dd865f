//! Deployments and ReplicaSets, as kube-controller-manager's deployment and replicaset
//! controllers run them: a ReplicaSet keeps `replicas` pods of its template (owned by it,
//! replaced when they fail or are deleted); a Deployment keeps one ReplicaSet per pod template
//! (named by its `pod-template-hash`) and moves replicas from the old ones to the new one within
//! `maxSurge` and `maxUnavailable` (RollingUpdate) or all at once (Recreate), with the status and
//! conditions `kubectl rollout status` reads. Pure: [`plan`] decides, [`agent`] writes.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use super::{name, namespace};

/// The label each ReplicaSet of a Deployment and its pods carry: the hash of the template.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
/// The revision of a Deployment's rollout, on it and on its ReplicaSets.
pub const REVISION: &str = "deployment.kubernetes.io/revision";

/// One change to make.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// A pod of a ReplicaSet.
    CreatePod {
        namespace: String,
        pod: Box<Pod>,
    },
    DeletePod {
        namespace: String,
        name: String,
    },
    CreateReplicaSet {
        namespace: String,
        replica_set: Box<ReplicaSet>,
    },
    /// Set a ReplicaSet's `spec.replicas` (and its revision annotation).
    ScaleReplicaSet {
        namespace: String,
        name: String,
        replicas: i32,
        revision: Option<String>,
    },
    /// Write a ReplicaSet's status.
    ReplicaSetStatus {
        namespace: String,
        name: String,
        status: Value,
    },
    /// Write a Deployment's status, and its revision annotation.
    DeploymentStatus {
        namespace: String,
        name: String,
        status: Value,
        revision: String,
    },
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::CreatePod { namespace, pod } => write!(
                f,
                "create a pod {namespace}/{}*",
                pod.metadata.generate_name.as_deref().unwrap_or("")
            ),
            Action::DeletePod { namespace, name } => write!(f, "delete pod {namespace}/{name}"),
            Action::CreateReplicaSet {
                namespace,
                replica_set,
            } => write!(
                f,
                "create ReplicaSet {namespace}/{}",
                replica_set.metadata.name.as_deref().unwrap_or("")
            ),
            Action::ScaleReplicaSet {
                namespace,
                name,
                replicas,
                ..
            } => write!(f, "scale ReplicaSet {namespace}/{name} to {replicas}"),
            Action::ReplicaSetStatus {
                namespace, name, ..
            } => write!(f, "status of ReplicaSet {namespace}/{name}"),
            Action::DeploymentStatus {
                namespace,
                name,
                revision,
                ..
            } => write!(
                f,
                "status of Deployment {namespace}/{name} (revision {revision})"
            ),
        }
    }
}

fn controller_uid<T: kube::Resource>(o: &T) -> Option<&str> {
    o.meta()
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.as_str())
}

fn uid<T: kube::Resource>(o: &T) -> &str {
    o.meta().uid.as_deref().unwrap_or("")
}

fn deleting<T: kube::Resource>(o: &T) -> bool {
    o.meta().deletion_timestamp.is_some()
}

/// Counted by its ReplicaSet: not being deleted and not finished.
fn active(p: &Pod) -> bool {
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    !deleting(p) && !matches!(phase, Some("Succeeded" | "Failed"))
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn owner(api_version: &str, kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The pods a ReplicaSet controls.
fn pods_of<'a>(rs: &ReplicaSet, pods: &'a [Pod]) -> Vec<&'a Pod> {
    pods.iter()
        .filter(|p| namespace(*p) == namespace(rs) && controller_uid(*p) == Some(uid(rs)))
        .collect()
}

/// The order in which a ReplicaSet gives up pods (kube's `ActivePods` ranking): unscheduled,
/// then pending, then not ready, then the newest.
fn deletion_rank(p: &Pod) -> (u8, u8, u8, std::cmp::Reverse<String>) {
    let scheduled = p
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let pending = p.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running");
    let created = p
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .unwrap_or_default();
    (
        u8::from(scheduled),
        u8::from(!pending),
        u8::from(ready(p)),
        std::cmp::Reverse(created),
    )
}

/// What a ReplicaSet needs: pods made or removed to reach `replicas`, and its status.
fn plan_replica_set(rs: &ReplicaSet, pods: &[Pod], out: &mut Vec<Action>) {
    let ns = namespace(rs).to_string();
    let spec = rs.spec.clone().unwrap_or_default();
    let want = spec.replicas.unwrap_or(1).max(0) as usize;
    let owned = pods_of(rs, pods);
    let mut live: Vec<&Pod> = owned.iter().copied().filter(|p| active(p)).collect();
    if !deleting(rs) {
        if live.len() < want {
            let template = spec.template.clone().unwrap_or_default();
            for _ in live.len()..want {
                let mut meta = template.metadata.clone().unwrap_or_default();
                meta.name = None;
                meta.generate_name = Some(format!("{}-", name(rs)));
                meta.namespace = Some(ns.clone());
                meta.owner_references =
                    Some(vec![owner("apps/v1", "ReplicaSet", name(rs), uid(rs))]);
                let pod = Pod {
                    metadata: meta,
                    spec: template.spec.clone(),
                    status: None,
                };
                out.push(Action::CreatePod {
                    namespace: ns.clone(),
                    pod: Box::new(pod),
                });
            }
        } else if live.len() > want {
            live.sort_by_key(|p| deletion_rank(p));
            for p in &live[..live.len() - want] {
                out.push(Action::DeletePod {
                    namespace: ns.clone(),
                    name: name(*p).to_string(),
                });
            }
        }
    }
    let ready_count = live.iter().filter(|p| ready(p)).count();
    let status = json!({
        "replicas": live.len(),
        "fullyLabeledReplicas": live.len(),
        "readyReplicas": ready_count,
        "availableReplicas": ready_count,
        "observedGeneration": rs.metadata.generation.unwrap_or(0),
    });
    if !same_status(
        rs.status.as_ref().map(|s| serde_json::to_value(s).ok()),
        &status,
    ) {
        out.push(Action::ReplicaSetStatus {
            namespace: ns,
            name: name(rs).to_string(),
            status,
        });
    }
}

/// Whether the written status already says `want` (fields absent there read as zero).
fn same_status(have: Option<Option<Value>>, want: &Value) -> bool {
    let have = have.flatten().unwrap_or(Value::Null);
    want.as_object().into_iter().flatten().all(|(k, v)| {
        let h = &have[k];
        h == v || (h.is_null() && (v == &json!(0) || v.as_array().is_some_and(Vec::is_empty)))
    })
}

/// A rollout parameter (`25%` or `1`) against `of` replicas, rounded up or down as kube does.
fn scaled(v: Option<&IntOrString>, default: &str, of: i32, round_up: bool) -> i32 {
    let v = v
        .cloned()
        .unwrap_or_else(|| IntOrString::String(default.into()));
    match v {
        IntOrString::Int(n) => n.max(0),
        IntOrString::String(s) => {
            let percent: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            let product = percent.max(0) * i64::from(of);
            let n = if round_up {
                (product + 99) / 100
            } else {
                product / 100
            };
            n as i32
        }
    }
}

/// The hash that names a template's ReplicaSet: its JSON (pod-template-hash label left out),
/// in the alphabet kube's names use, ten characters.
pub fn template_hash(template: &Value) -> String {
    let mut t = template.clone();
    if let Some(labels) = t["metadata"]["labels"].as_object_mut() {
        labels.remove(POD_TEMPLATE_HASH);
    }
    let hex = super::short_hash(&t.to_string());
    let mut n = u64::from_str_radix(&hex, 16).unwrap_or(0);
    const SAFE: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..10)
        .map(|_| {
            let c = SAFE[(n % SAFE.len() as u64) as usize] as char;
            n /= SAFE.len() as u64;
            c
        })
        .collect()
}

fn revision_of(rs: &ReplicaSet) -> i64 {
    rs.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REVISION))
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

fn replicas_of(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
}

fn available_of(rs: &ReplicaSet) -> i32 {
    rs.status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
}

/// What a Deployment needs: its ReplicaSet for the current template, replicas moved to it, and
/// its status.
fn plan_deployment(d: &Deployment, sets: &[ReplicaSet], out: &mut Vec<Action>) {
    if deleting(d) {
        return;
    }
    let rollout = Rollout::of(d, sets);
    let Some(new) = rollout.new else {
        // The new template's ReplicaSet, empty while old ones still hold pods.
        out.push(rollout.create_new());
        return;
    };
    rollout.scale(new, out);
    let status = rollout.status(new);
    out.extend(rollout.status_change(status));
}

/// A Deployment's rollout as one pass sees it: its ReplicaSets (the current template's and the
/// old ones), its revision, and the bounds its strategy sets.
struct Rollout<'a> {
    d: &'a Deployment,
    ns: String,
    spec: DeploymentSpec,
    /// The replicas asked for.
    want: i32,
    /// The current template's hash, which names its ReplicaSet.
    hash: String,
    owned: Vec<&'a ReplicaSet>,
    new: Option<&'a ReplicaSet>,
    old: Vec<&'a ReplicaSet>,
    revision: i64,
    recreate: bool,
    /// maxSurge and maxUnavailable, as numbers of replicas.
    surge: i32,
    unavailable: i32,
    /// The replicas the old ReplicaSets are set to.
    old_replicas: i32,
}

impl<'a> Rollout<'a> {
    fn of(d: &'a Deployment, sets: &'a [ReplicaSet]) -> Rollout<'a> {
        let ns = namespace(d).to_string();
        let spec = d.spec.clone().unwrap_or_default();
        let want = spec.replicas.unwrap_or(1).max(0);
        let template = serde_json::to_value(&spec.template).unwrap_or_default();
        let hash = template_hash(&template);
        let owned: Vec<&ReplicaSet> = sets
            .iter()
            .filter(|rs| namespace(*rs) == ns && controller_uid(*rs) == Some(uid(d)))
            .collect();
        let is_new = |rs: &&ReplicaSet| {
            rs.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(POD_TEMPLATE_HASH))
                == Some(&hash)
        };
        let new = owned.iter().copied().find(is_new);
        let old: Vec<&ReplicaSet> = owned.iter().copied().filter(|rs| !is_new(rs)).collect();
        let top_revision = owned.iter().map(|rs| revision_of(rs)).max().unwrap_or(0);
        let revision = match new {
            Some(rs) if revision_of(rs) > 0 => revision_of(rs),
            _ => top_revision + 1,
        };
        let recreate = spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("Recreate");
        let rolling = spec
            .strategy
            .as_ref()
            .and_then(|s| s.rolling_update.clone())
            .unwrap_or_default();
        let surge = scaled(rolling.max_surge.as_ref(), "25%", want, true);
        let mut unavailable = scaled(rolling.max_unavailable.as_ref(), "25%", want, false);
        if surge == 0 && unavailable == 0 {
            unavailable = 1;
        }
        let old_replicas: i32 = old.iter().map(|rs| replicas_of(rs)).sum();
        Rollout {
            d,
            ns,
            spec,
            want,
            hash,
            owned,
            new,
            old,
            revision,
            recreate,
            surge,
            unavailable,
            old_replicas,
        }
    }

    /// The ReplicaSet of the current template: all the replicas when no old one holds any
    /// (or a rolling update has none), else none yet.
    fn create_new(&self) -> Action {
        let (d, spec, hash) = (self.d, &self.spec, &self.hash);
        let first = if self.old_replicas == 0 || (!self.recreate && self.old.is_empty()) {
            self.want
        } else {
            0
        };
        let mut template: k8s_openapi::api::core::v1::PodTemplateSpec = spec.template.clone();
        let meta = template.metadata.get_or_insert_with(Default::default);
        meta.labels
            .get_or_insert_with(BTreeMap::new)
            .insert(POD_TEMPLATE_HASH.into(), hash.clone());
        let mut selector = spec.selector.clone();
        selector
            .match_labels
            .get_or_insert_with(BTreeMap::new)
            .insert(POD_TEMPLATE_HASH.into(), hash.clone());
        let replica_set = ReplicaSet {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(super::fit(&format!("{}-{hash}", name(d)), 253)),
                namespace: Some(self.ns.clone()),
                labels: meta.labels.clone(),
                annotations: Some(BTreeMap::from([(
                    REVISION.into(),
                    self.revision.to_string(),
                )])),
                owner_references: Some(vec![owner("apps/v1", "Deployment", name(d), uid(d))]),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::apps::v1::ReplicaSetSpec {
                replicas: Some(first),
                min_ready_seconds: spec.min_ready_seconds,
                selector,
                template: Some(template),
            }),
            status: None,
        };
        Action::CreateReplicaSet {
            namespace: self.ns.clone(),
            replica_set: Box::new(replica_set),
        }
    }

    /// Set `rs` to `to` replicas, where that changes it (or the new one's revision is stale).
    fn scale_to(&self, new: &ReplicaSet, rs: &ReplicaSet, to: i32, out: &mut Vec<Action>) {
        let is_new = rs.metadata.uid == new.metadata.uid;
        let stale_revision = is_new && revision_of(rs) != self.revision;
        if to != replicas_of(rs) || stale_revision {
            out.push(Action::ScaleReplicaSet {
                namespace: self.ns.clone(),
                name: name(rs).to_string(),
                replicas: to,
                revision: is_new.then(|| self.revision.to_string()),
            });
        }
    }

    /// Move replicas from the old ReplicaSets to `new` as the strategy allows.
    fn scale(&self, new: &ReplicaSet, out: &mut Vec<Action>) {
        let (want, old_replicas) = (self.want, self.old_replicas);
        let new_replicas = replicas_of(new);
        if self.recreate {
            // Everything old goes first; the new one comes up once no old pod is left.
            for rs in &self.old {
                self.scale_to(new, rs, 0, out);
            }
            let old_pods: i32 = self
                .old
                .iter()
                .map(|rs| rs.status.as_ref().map_or(0, |s| s.replicas))
                .sum();
            let target = if old_replicas == 0 && old_pods == 0 {
                want
            } else {
                new_replicas.min(want)
            };
            self.scale_to(new, new, target, out);
        } else if old_replicas == 0 {
            // Nothing to move: the new ReplicaSet holds them all (a scale).
            self.scale_to(new, new, want, out);
        } else {
            self.roll(new, out);
        }
    }

    /// A rolling update's step: up to replicas + maxSurge in all; old ones down while the
    /// available stay at least replicas - maxUnavailable (unavailable old replicas may go at
    /// once).
    fn roll(&self, new: &ReplicaSet, out: &mut Vec<Action>) {
        let want = self.want;
        let new_replicas = replicas_of(new);
        let total = new_replicas + self.old_replicas;
        let up = (want + self.surge - total)
            .max(0)
            .min((want - new_replicas).max(0));
        let new_target = if new_replicas > want {
            want
        } else {
            new_replicas + up
        };
        self.scale_to(new, new, new_target, out);
        let available: i32 = self.owned.iter().map(|rs| available_of(rs)).sum();
        let mut budget = (available - (want - self.unavailable)).max(0);
        let mut olds = self.old.clone();
        olds.sort_by_key(|rs| revision_of(rs));
        for rs in olds {
            let have = replicas_of(rs);
            if have == 0 {
                continue;
            }
            let unhealthy = (have - available_of(rs)).max(0);
            let down = (unhealthy + budget).min(have);
            budget -= (down - unhealthy).max(0);
            self.scale_to(new, rs, have - down, out);
        }
    }

    /// The Deployment's status, from its ReplicaSets' own.
    fn status(&self, new: &ReplicaSet) -> Value {
        let (d, want) = (self.d, self.want);
        let sum = |f: &dyn Fn(&ReplicaSet) -> i32| self.owned.iter().map(|rs| f(rs)).sum::<i32>();
        let replicas = sum(&|rs| rs.status.as_ref().map_or(0, |s| s.replicas));
        let ready_count = sum(&|rs| {
            rs.status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0)
        });
        let available = sum(&available_of);
        let updated = new.status.as_ref().map_or(0, |s| s.replicas);
        let complete = updated == want
            && replicas == want
            && available == want
            && self.old.iter().all(|rs| replicas_of(rs) == 0);
        let minimum = available >= want - self.unavailable;
        let now = crate::apiserver::store::now();
        let (progress_reason, progress_message) = if complete {
            (
                "NewReplicaSetAvailable",
                format!("ReplicaSet {:?} has successfully progressed.", name(new)),
            )
        } else {
            (
                "ReplicaSetUpdated",
                format!("ReplicaSet {:?} is progressing.", name(new)),
            )
        };
        let available_condition = if minimum {
            self.condition(
                &now,
                "Available",
                true,
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.".into(),
            )
        } else {
            self.condition(
                &now,
                "Available",
                false,
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.".into(),
            )
        };
        json!({
            "observedGeneration": d.metadata.generation.unwrap_or(0),
            "replicas": replicas,
            "updatedReplicas": updated,
            "readyReplicas": ready_count,
            "availableReplicas": available,
            "unavailableReplicas": (want - available).max(0),
            "conditions": [available_condition,
                self.condition(&now, "Progressing", true, progress_reason, progress_message)],
        })
    }

    /// A condition of the status; its transition time stays while the condition does (else
    /// `now`).
    fn condition(&self, now: &str, type_: &str, ok: bool, reason: &str, message: String) -> Value {
        let since = self
            .d
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == type_))
            .filter(|c| {
                c.status == if ok { "True" } else { "False" } && c.reason.as_deref() == Some(reason)
            })
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0.to_string())
            .unwrap_or_else(|| now.to_string());
        json!({"type": type_, "status": if ok { "True" } else { "False" }, "reason": reason,
            "message": message, "lastUpdateTime": since, "lastTransitionTime": since})
    }

    /// The write of `status` (and the revision annotation), unless the Deployment says so
    /// already (conditions compared by type, status and reason).
    fn status_change(&self, status: Value) -> Option<Action> {
        let d = self.d;
        let recorded = d
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REVISION))
            .cloned();
        let have = d.status.as_ref().and_then(|s| serde_json::to_value(s).ok());
        let conditions_same = have.as_ref().is_some_and(|h| {
            let pick = |v: &Value| -> Vec<(Value, Value, Value)> {
                v["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| (c["type"].clone(), c["status"].clone(), c["reason"].clone()))
                    .collect()
            };
            pick(h) == pick(&status)
        });
        let mut counts = status.clone();
        counts.as_object_mut().map(|o| o.remove("conditions"));
        let unchanged = same_status(Some(have), &counts) && conditions_same;
        (!unchanged || recorded.as_deref() != Some(&self.revision.to_string())).then(|| {
            Action::DeploymentStatus {
                namespace: self.ns.clone(),
                name: name(d).to_string(),
                status,
                revision: self.revision.to_string(),
            }
        })
    }
}

/// Everything the Deployments and ReplicaSets need now.
pub fn plan(deployments: &[Deployment], sets: &[ReplicaSet], pods: &[Pod]) -> Vec<Action> {
    let mut out = Vec::new();
    for d in deployments {
        plan_deployment(d, sets, &mut out);
    }
    for rs in sets {
        plan_replica_set(rs, pods, &mut out);
    }
    out
}

pub mod agent {
    use std::time::Duration;

    use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
    use kube::{Api, Client};
    use serde_json::json;

    use super::{Action, REVISION, plan};
    use crate::agents::{Reader, list_all};

    async fn pass(reader: &Reader, client: &Client) -> Result<(), kube::Error> {
        let cluster = reader.read().await?;
        let deployments: Vec<Deployment> = list_all(client).await?;
        let sets: Vec<ReplicaSet> = list_all(client).await?;
        for action in plan(&deployments, &sets, &cluster.pods) {
            let what = action.to_string();
            // A conflict or a vanished object is decided again on the next pass.
            match apply(client, &action).await {
                Ok(()) => tracing::info!("{what}"),
                Err(e) => tracing::warn!(error = %e, "{what} failed"),
            }
        }
        Ok(())
    }

    async fn apply(client: &Client, action: &Action) -> Result<(), kube::Error> {
        let pp = PostParams::default();
        match action {
            Action::CreatePod { namespace, pod } => {
                Api::<Pod>::namespaced(client.clone(), namespace)
                    .create(&pp, pod)
                    .await?;
            }
            Action::DeletePod { namespace, name } => {
                Api::<Pod>::namespaced(client.clone(), namespace)
                    .delete(name, &DeleteParams::default())
                    .await?;
            }
            Action::CreateReplicaSet {
                namespace,
                replica_set,
            } => {
                Api::<ReplicaSet>::namespaced(client.clone(), namespace)
                    .create(&pp, replica_set)
                    .await?;
            }
            Action::ScaleReplicaSet {
                namespace,
                name,
                replicas,
                revision,
            } => {
                let mut patch = json!({"spec": {"replicas": replicas}});
                if let Some(r) = revision {
                    patch["metadata"] = json!({"annotations": {REVISION: r}});
                }
                Api::<ReplicaSet>::namespaced(client.clone(), namespace)
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            Action::ReplicaSetStatus {
                namespace,
                name,
                status,
            } => {
                Api::<ReplicaSet>::namespaced(client.clone(), namespace)
                    .patch_status(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"status": status})),
                    )
                    .await?;
            }
            Action::DeploymentStatus {
                namespace,
                name,
                status,
                revision,
            } => {
                let api = Api::<Deployment>::namespaced(client.clone(), namespace);
                api.patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"metadata": {"annotations": {REVISION: revision}}})),
                )
                .await?;
                api.patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"status": status})),
                )
                .await?;
            }
        }
        Ok(())
    }

    pub async fn run(client: Client, changes: crate::agents::Changes, every: Duration) {
        let reader = Reader::Shared(client.clone(), changes.clone());
        run_on_change!(changes.subscribe(), every, pass(&reader, &client))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(replicas: i32, image: &str, strategy: Value) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "d1", "generation": 2},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                "strategy": strategy,
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": image}]}}}}))
        .unwrap()
    }

    fn set_for(
        d: &Deployment,
        uid: &str,
        replicas: i32,
        available: i32,
        revision: i64,
    ) -> ReplicaSet {
        let template = serde_json::to_value(&d.spec.as_ref().unwrap().template).unwrap();
        let hash = template_hash(&template);
        serde_json::from_value(json!({
            "metadata": {"name": format!("web-{hash}"), "namespace": "ns", "uid": uid,
                "labels": {"app": "web", POD_TEMPLATE_HASH: hash},
                "annotations": {REVISION: revision.to_string()},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                    "uid": "d1", "controller": true}]},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                "template": template},
            "status": {"replicas": replicas, "availableReplicas": available,
                "readyReplicas": available}}))
        .unwrap()
    }

    fn scales(actions: &[Action]) -> Vec<(String, i32)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::ScaleReplicaSet { name, replicas, .. } => Some((name.clone(), *replicas)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_new_deployment_gets_one_replica_set_with_every_replica() {
        let d = deployment(3, "v1", json!({}));
        let actions = plan(std::slice::from_ref(&d), &[], &[]);
        let Action::CreateReplicaSet { replica_set, .. } = &actions[0] else {
            panic!("{actions:?}")
        };
        let spec = replica_set.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(3));
        let hash = &replica_set.metadata.labels.as_ref().unwrap()[POD_TEMPLATE_HASH];
        assert_eq!(
            replica_set.metadata.name.as_deref(),
            Some(format!("web-{hash}").as_str())
        );
        assert_eq!(
            spec.selector.match_labels.as_ref().unwrap()[POD_TEMPLATE_HASH],
            *hash
        );
        assert_eq!(hash.len(), 10);
    }

    #[test]
    fn a_rolling_update_stays_within_surge_and_unavailability() {
        let v1 = deployment(4, "v1", json!({}));
        let v2 = deployment(4, "v2", json!({}));
        let old = set_for(&v1, "rs1", 4, 4, 1);
        // The new template gets its (empty) ReplicaSet first.
        let actions = plan(std::slice::from_ref(&v2), std::slice::from_ref(&old), &[]);
        assert!(
            matches!(&actions[0], Action::CreateReplicaSet { replica_set, .. }
            if replica_set.spec.as_ref().unwrap().replicas == Some(0))
        );
        // 25% of 4: one more than 4 in all, one less than 4 available.
        let new = set_for(&v2, "rs2", 0, 0, 2);
        let actions = plan(std::slice::from_ref(&v2), &[old.clone(), new.clone()], &[]);
        let (old_name, new_name) = (name(&old).to_string(), name(&new).to_string());
        assert_eq!(
            scales(&actions),
            [(new_name.clone(), 1), (old_name.clone(), 3)]
        );
        // Done when the new one holds all and the old none.
        let done = [set_for(&v1, "rs1", 0, 0, 1), set_for(&v2, "rs2", 4, 4, 2)];
        let actions = plan(std::slice::from_ref(&v2), &done, &[]);
        assert_eq!(scales(&actions), []);
        let status = actions.iter().find_map(|a| match a {
            Action::DeploymentStatus {
                status, revision, ..
            } => Some((status.clone(), revision.clone())),
            _ => None,
        });
        let (status, revision) = status.unwrap();
        assert_eq!(revision, "2");
        assert_eq!(status["updatedReplicas"], 4);
        assert_eq!(status["conditions"][1]["reason"], "NewReplicaSetAvailable");
    }

    #[test]
    fn recreate_brings_the_new_pods_up_only_once_the_old_are_gone() {
        let v1 = deployment(2, "v1", json!({"type": "Recreate"}));
        let v2 = deployment(2, "v2", json!({"type": "Recreate"}));
        let old = set_for(&v1, "rs1", 2, 2, 1);
        let new = set_for(&v2, "rs2", 0, 0, 2);
        let actions = plan(std::slice::from_ref(&v2), &[old.clone(), new.clone()], &[]);
        assert_eq!(scales(&actions), [(name(&old).to_string(), 0)]);
        let mut gone = set_for(&v1, "rs1", 0, 0, 1);
        gone.status.as_mut().unwrap().replicas = 0;
        let actions = plan(std::slice::from_ref(&v2), &[gone, new.clone()], &[]);
        assert_eq!(scales(&actions), [(name(&new).to_string(), 2)]);
    }

    #[test]
    fn a_replica_set_replaces_missing_pods_and_gives_up_the_least_ready() {
        let rs: ReplicaSet = serde_json::from_value(json!({
            "metadata": {"name": "rs", "namespace": "ns", "uid": "r1", "generation": 1},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"a": "b"}},
                "template": {"metadata": {"labels": {"a": "b"}},
                    "spec": {"containers": [{"name": "c", "image": "i"}]}}}}))
        .unwrap();
        let pod = |n: &str, node: Option<&str>, phase: &str, ready: bool| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": n, "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z",
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                        "uid": "r1", "controller": true}]},
                "spec": {"nodeName": node, "containers": [{"name": "c"}]},
                "status": {"phase": phase, "conditions": [{"type": "Ready",
                    "status": if ready { "True" } else { "False" }}]}}))
            .unwrap()
        };
        let failed = pod("failed", Some("n"), "Failed", false);
        let actions = plan(&[], std::slice::from_ref(&rs), &[failed]);
        let made: Vec<_> = actions
            .iter()
            .filter_map(|a| match a {
                Action::CreatePod { pod, .. } => Some(pod),
                _ => None,
            })
            .collect();
        assert_eq!(made.len(), 2, "the failed pod does not count");
        assert_eq!(made[0].metadata.generate_name.as_deref(), Some("rs-"));
        assert_eq!(
            made[0].metadata.owner_references.as_ref().unwrap()[0].uid,
            "r1"
        );
        let pods = [
            pod("ready", Some("n"), "Running", true),
            pod("starting", Some("n"), "Running", false),
            pod("unscheduled", None, "Pending", false),
        ];
        let actions = plan(&[], std::slice::from_ref(&rs), &pods);
        let deleted: Vec<_> = actions
            .iter()
            .filter_map(|a| match a {
                Action::DeletePod { name, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(deleted, ["unscheduled"]);
    }
}
