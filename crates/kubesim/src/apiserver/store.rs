//! The object store: every object as JSON, one cluster-wide resourceVersion, a bounded history
//! of changes for watches to resume from, finalizers and ownerReference garbage collection.
//! Here the [`Store`] and its reads and writes; below, the history, the field index, object
//! metadata, deletion and garbage collection, field ownership, and CustomResourceDefinitions.

mod crds;
mod gc;
mod history;
mod index;
mod objects;
mod ownership;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

pub use history::{Change, ChangeKind, HISTORY, HISTORY_BYTES, Watch};
pub use objects::{Key, new_uid, now};

use super::errors::{ApiError, ApiResult};
use super::registry::{Registry, ResourceDef};
use super::selector::{FieldSelector, LabelSelector};
use history::History;
use index::{FieldIndex, INDEXED_FIELDS, reindex};
use objects::{being_deleted, finalizers, generation_content, labels_of, meta};

struct Inner {
    /// Field ownership per object, for server-side apply: leaf path → field manager.
    owners: BTreeMap<Key, BTreeMap<String, String>>,
    rv: u64,
    objects: BTreeMap<Key, Value>,
    /// Shared with the requests that read it: a request costs a pointer, not a copy of every
    /// resource definition (that copy was a third of the API server's time under load).
    registry: Arc<Registry>,
    /// The garbage collector's graph: owner uid → the objects whose ownerReferences name it.
    dependents: HashMap<String, BTreeSet<Key>>,
    /// Objects the garbage collector has to look at (as kube's attemptToDelete queue).
    gc_queue: VecDeque<Key>,
    /// [`INDEXED_FIELDS`]' values → objects, for lists that select on them.
    fields: FieldIndex,
    /// Something was deleted, or a CRD is terminating: terminating namespaces and CRDs may be
    /// done now.
    to_finish: bool,
    /// The version of the last change in each API group (what a cache of one group's objects,
    /// such as the RBAC policy, is current as of).
    group_versions: HashMap<String, u64>,
}

/// The store, shared by all handlers.
pub struct Store {
    inner: Mutex<Inner>,
    history: Mutex<History>,
    /// The newest version, for watchers to wake on.
    notify: tokio::sync::watch::Sender<u64>,
    /// The cluster CA every namespace's `kube-root-ca.crt` ConfigMap publishes.
    root_ca: std::sync::OnceLock<String>,
}

/// List options after parsing.
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_after: Option<String>,
}

/// How a delete is made.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub propagation: Propagation,
    /// Delete only if the object still has this uid.
    pub precondition_uid: Option<String>,
    /// Seconds a pod on a node gets to stop (its `terminationGracePeriodSeconds` by default).
    pub grace_period: Option<i64>,
    pub dry_run: bool,
}

/// How dependents of a deleted object are treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Propagation {
    Orphan,
    #[default]
    Background,
    Foreground,
}

/// The ServiceAccount every namespace has, which pods run as unless they name another.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// The ConfigMap in every namespace that holds the cluster's CA (`ca.crt`).
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";

/// How an update is made.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteOptions<'a> {
    /// Check and return the result without storing it.
    pub dry_run: bool,
    /// Through the status subresource: only status changes.
    pub status_only: bool,
    /// Who writes, for field ownership.
    pub owner: Option<&'a Owner>,
}

/// Who writes, for field ownership (server-side apply).
#[derive(Debug, Clone)]
pub struct Owner {
    pub manager: String,
    /// An apply, with the applied configuration: its fields conflict with other managers' unless
    /// `force`.
    pub applied: Option<Value>,
    pub force: bool,
}

impl Store {
    pub fn new(registry: Registry) -> Store {
        Self::with_history(registry, HISTORY)
    }

    /// A store keeping `history_cap` changes for watches to resume from.
    pub fn with_history(registry: Registry, history_cap: usize) -> Store {
        Self::with_history_limits(registry, history_cap, HISTORY_BYTES)
    }

    /// A store keeping at most `history_cap` changes and `history_bytes` of them (the objects'
    /// JSON) for watches to resume from; older ones are dropped first.
    pub fn with_history_limits(
        registry: Registry,
        history_cap: usize,
        history_bytes: usize,
    ) -> Store {
        let mut inner = Inner {
            owners: BTreeMap::new(),
            rv: 1,
            objects: BTreeMap::new(),
            registry: Arc::new(registry),
            dependents: HashMap::new(),
            gc_queue: VecDeque::new(),
            fields: HashMap::new(),
            to_finish: false,
            group_versions: HashMap::new(),
        };
        for ns in ["default", "kube-system", "kube-public"] {
            let obj = json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": { "name": ns, "uid": new_uid(), "creationTimestamp": now(), "resourceVersion": "1" },
                "spec": { "finalizers": ["kubernetes"] },
                "status": { "phase": "Active" },
            });
            inner.objects.insert(
                (
                    String::new(),
                    "namespaces".into(),
                    String::new(),
                    ns.to_string(),
                ),
                obj,
            );
            // Every namespace has its `default` ServiceAccount (kube's serviceaccount controller).
            inner.objects.insert(
                (
                    String::new(),
                    "serviceaccounts".into(),
                    ns.to_string(),
                    DEFAULT_SERVICE_ACCOUNT.into(),
                ),
                json!({
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": { "name": DEFAULT_SERVICE_ACCOUNT, "namespace": ns, "uid": new_uid(), "creationTimestamp": now(), "resourceVersion": "1" },
                }),
            );
        }
        // The RBAC policy kube-apiserver bootstraps (its rbac/bootstrap-roles post-start hook).
        let rbac = "rbac.authorization.k8s.io";
        let roles = super::rbac::bootstrap_cluster_roles()
            .into_iter()
            .map(|r| ("clusterroles", "ClusterRole", serde_json::to_value(r)));
        let bindings = super::rbac::bootstrap_cluster_role_bindings()
            .into_iter()
            .map(|b| {
                (
                    "clusterrolebindings",
                    "ClusterRoleBinding",
                    serde_json::to_value(b),
                )
            });
        let namespaced = super::rbac::bootstrap_roles()
            .into_iter()
            .map(|r| ("roles", "Role", serde_json::to_value(r)));
        for (plural, kind, obj) in roles.chain(bindings).chain(namespaced) {
            let mut obj = obj.expect("RBAC objects serialize");
            let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
            let ns = obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string();
            obj["apiVersion"] = json!(format!("{rbac}/v1"));
            obj["kind"] = json!(kind);
            obj["metadata"]["uid"] = json!(new_uid());
            obj["metadata"]["creationTimestamp"] = json!(now());
            obj["metadata"]["resourceVersion"] = json!("1");
            inner
                .objects
                .insert((rbac.into(), plural.into(), ns, name), obj);
        }
        Store {
            inner: Mutex::new(inner),
            history: Mutex::new(History {
                changes: VecDeque::new(),
                bytes: 0,
                cap: history_cap,
                byte_cap: history_bytes,
                last: 1,
            }),
            notify: tokio::sync::watch::Sender::new(1),
            root_ca: std::sync::OnceLock::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("store lock")
    }

    /// Set once, by the server that owns the CA.
    pub fn set_root_ca(&self, pem: String) {
        let _ = self.root_ca.set(pem);
    }

    pub fn root_ca(&self) -> Option<&str> {
        self.root_ca.get().map(String::as_str)
    }

    pub fn registry(&self) -> Arc<Registry> {
        self.lock().registry.clone()
    }

    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    fn history(&self) -> std::sync::MutexGuard<'_, History> {
        self.history.lock().expect("history lock")
    }

    /// The version of the last change to an object of API group `group` (0: none since start).
    pub fn group_version(&self, group: &str) -> u64 {
        self.lock().group_versions.get(group).copied().unwrap_or(0)
    }

    /// A signal on every change (the newest resource version).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.notify.subscribe()
    }

    /// Subscribe to changes, with the retained history of changes after `since` (None: none).
    /// Fails with 410 when `since` is older than the history.
    pub fn watch_from(&self, since: Option<u64>) -> ApiResult<Watch> {
        let inner = self.lock();
        let rx = self.notify.subscribe();
        let history = self.history();
        let past = match since {
            None => Vec::new(),
            Some(rv) => {
                if history.lost(rv) {
                    let oldest = history.changes.front().map(|(c, _)| c.rv).unwrap_or(rv + 1);
                    return Err(ApiError::gone(format!(
                        "too old resource version: {rv} ({})",
                        oldest - 1
                    )));
                }
                history.after(rv)
            }
        };
        Ok((past, rx, inner.rv))
    }

    /// The retained changes after `rv`; None when some of them were dropped already (a watcher
    /// that fell that far behind must list again).
    pub fn changes_after(&self, rv: u64) -> Option<Vec<Arc<Change>>> {
        let history = self.history();
        if history.lost(rv) {
            return None;
        }
        Some(history.after(rv))
    }

    /// Whether a list or watch at `rv` can no longer be served from the retained changes.
    pub fn expired(&self, rv: u64) -> bool {
        self.history().lost(rv)
    }

    /// Record a change (under the lock): bump the version, stamp it, keep it, wake watchers,
    /// and keep the garbage collector's graph current.
    fn commit(&self, inner: &mut Inner, key: &Key, mut obj: Value, kind: ChangeKind) -> Value {
        inner.rv += 1;
        inner.group_versions.insert(key.0.clone(), inner.rv);
        obj["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
        let before = match kind {
            ChangeKind::Deleted => {
                inner.owners.remove(key);
                inner.objects.remove(key)
            }
            _ => inner.objects.insert(key.clone(), obj.clone()),
        };
        let after = (kind != ChangeKind::Deleted).then_some(&obj);
        reindex(&mut inner.fields, key, before.as_ref(), after);
        Self::track(inner, key, before.as_ref(), &obj, kind);
        let change = Arc::new(Change {
            rv: inner.rv,
            group: key.0.clone(),
            plural: key.1.clone(),
            namespace: key.2.clone(),
            kind,
            object: obj.clone(),
        });
        self.history().push(change);
        self.notify.send_replace(inner.rv);
        obj
    }

    fn key(def: &ResourceDef, ns: &str, name: &str) -> Key {
        (
            def.group.clone(),
            def.plural.clone(),
            if def.namespaced {
                ns.to_string()
            } else {
                String::new()
            },
            name.to_string(),
        )
    }

    pub fn get(&self, def: &ResourceDef, ns: &str, name: &str) -> ApiResult<Value> {
        self.lock()
            .objects
            .get(&Self::key(def, ns, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))
    }

    /// List matching objects (namespace `None`: all namespaces), with the list's version and a
    /// continue token when `limit` cut it short.
    pub fn list(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> (Vec<Value>, u64, Option<String>) {
        let inner = self.lock();
        let prefix_ns = ns.filter(|_| def.namespaced);
        let mut items = Vec::new();
        let mut next = None;
        // Only this kind's (and namespace's) part of the map: a list costs what it returns,
        // not what the whole store holds.
        let from: Key = (
            def.group.clone(),
            def.plural.clone(),
            prefix_ns.unwrap_or("").to_string(),
            String::new(),
        );
        let in_range = |(g, p, n, _): &Key| {
            g == &def.group && p == &def.plural && prefix_ns.is_none_or(|want| want == n)
        };
        // An equality on an indexed field reads only the objects with that value (in key
        // order, as the range: continue tokens mean the same either way).
        let indexed = opts.fields.0.iter().find_map(|(path, eq, value)| {
            let path = INDEXED_FIELDS
                .iter()
                .find(|(g, p, f)| *g == def.group && *p == def.plural && f == path && *eq)?
                .2;
            Some(
                inner
                    .fields
                    .get(&(def.group.clone(), def.plural.clone(), path, value.clone()))
                    .into_iter()
                    .flatten()
                    .filter(|k| in_range(k))
                    .filter_map(|k| inner.objects.get_key_value(k))
                    .collect::<Vec<_>>(),
            )
        });
        let candidates: Box<dyn Iterator<Item = (&Key, &Value)>> = match indexed {
            Some(found) => Box::new(found.into_iter()),
            None => Box::new(inner.objects.range(from..).take_while(|(k, _)| in_range(k))),
        };
        for ((g, p, n, name), obj) in candidates {
            debug_assert!(g == &def.group && p == &def.plural);
            if let Some(after) = &opts.continue_after
                && format!("{n}/{name}").as_str() <= after.as_str()
            {
                continue;
            }
            if !opts.labels.0.is_empty() && !opts.labels.matches(&labels_of(obj)) {
                continue;
            }
            if !opts.fields.matches(obj) {
                continue;
            }
            if opts.limit.is_some_and(|l| items.len() >= l) {
                next = items.last().map(|o: &Value| {
                    format!(
                        "{}/{}",
                        meta(o)["namespace"].as_str().unwrap_or(""),
                        meta(o)["name"].as_str().unwrap_or("")
                    )
                });
                break;
            }
            items.push(obj.clone());
        }
        (items, inner.rv, next)
    }

    /// Create an object. `dry_run` checks and returns it without storing.
    pub fn create(
        &self,
        def: &ResourceDef,
        ns: &str,
        mut obj: Value,
        dry_run: bool,
        owner: Option<&Owner>,
    ) -> ApiResult<Value> {
        let mut inner = self.lock();
        inner.refuse_create(def)?;
        if def.namespaced {
            let ns_key = (
                String::new(),
                "namespaces".to_string(),
                String::new(),
                ns.to_string(),
            );
            match inner.objects.get(&ns_key) {
                None => return Err(ApiError::not_found("", "namespaces", ns)),
                Some(n) if meta(n).get("deletionTimestamp").is_some() => {
                    return Err(ApiError::forbidden(format!(
                        "{} \"{}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                        def.plural,
                        meta(&obj)["name"].as_str().unwrap_or("")
                    )));
                }
                _ => {}
            }
        }
        let m = obj.get_mut("metadata").and_then(Value::as_object_mut);
        let Some(m) = m else {
            return Err(ApiError::invalid(
                &def.kind,
                "",
                vec![("metadata".into(), "Required value".into())],
            ));
        };
        let name = match m.get("name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => match m.get("generateName").and_then(Value::as_str) {
                Some(prefix) if !prefix.is_empty() => {
                    let uid = new_uid().replace('-', "");
                    format!("{prefix}{}", &uid[..5])
                }
                _ => {
                    return Err(ApiError::invalid(
                        &def.kind,
                        "",
                        vec![(
                            "metadata.name".into(),
                            "Required value: name or generateName is required".into(),
                        )],
                    ));
                }
            },
        };
        m.insert("name".into(), json!(name));
        if def.namespaced {
            m.insert("namespace".into(), json!(ns));
        } else {
            m.remove("namespace");
        }
        m.insert("uid".into(), json!(new_uid()));
        m.insert("creationTimestamp".into(), json!(now()));
        m.remove("deletionTimestamp");
        m.remove("resourceVersion");
        m.insert("generation".into(), json!(1));
        obj["apiVersion"] = json!(def.api_version());
        obj["kind"] = json!(def.kind);
        if def.has_status() && def.schema.is_some() {
            // Custom resources with a status subresource ignore status on create.
            if let Some(o) = obj.as_object_mut() {
                o.remove("status");
            }
        }
        match (def.group.as_str(), def.plural.as_str()) {
            ("", "pods" | "persistentvolumeclaims" | "persistentvolumes")
                if obj["status"]["phase"].is_null() =>
            {
                obj["status"]["phase"] = json!("Pending");
            }
            ("", "namespaces") => obj["status"]["phase"] = json!("Active"),
            _ => {}
        }
        let key = Self::key(def, ns, &name);
        if inner.objects.contains_key(&key) {
            return Err(ApiError::already_exists(&def.group, &def.plural, &name));
        }
        if dry_run {
            return Ok(obj);
        }
        Self::own(&mut inner, def, &key, None, &obj, owner)?;
        let created = self.commit(&mut inner, &key, obj, ChangeKind::Added);
        // Owners may be gone already (deleted before this create): kube's collector would
        // notice the new dependent and delete it; so does this one, before answering.
        self.run_gc(&mut inner);
        Ok(created)
    }

    /// Replace an object (or only its status). A body resourceVersion that is not the current
    /// one is a conflict.
    pub fn update(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        obj: Value,
        how: &WriteOptions<'_>,
    ) -> ApiResult<Value> {
        self.modify(def, ns, name, how, |_| Ok(obj))
    }

    /// Apply `change` to the current object atomically (patches), then store it as `update`
    /// does.
    pub fn modify(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        how: &WriteOptions<'_>,
        change: impl FnOnce(&Value) -> ApiResult<Value>,
    ) -> ApiResult<Value> {
        let WriteOptions {
            dry_run,
            status_only,
            owner,
        } = *how;
        let mut inner = self.lock();
        let key = Self::key(def, ns, name);
        let current = inner
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))?;
        let mut next = change(&current)?;
        let sent_rv = meta(&next)
            .get("resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if !sent_rv.is_empty()
            && sent_rv != meta(&current)["resourceVersion"].as_str().unwrap_or("")
        {
            return Err(ApiError::conflict(&def.group, &def.plural, name));
        }
        if meta(&next)
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| n != name)
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta(&next)["name"]
            )));
        }
        // Fields the server owns.
        for field in ["uid", "creationTimestamp", "namespace", "generation"] {
            match meta(&current).get(field) {
                Some(v) => next["metadata"][field] = v.clone(),
                None => {
                    if let Some(m) = next["metadata"].as_object_mut() {
                        m.remove(field);
                    }
                }
            }
        }
        next["metadata"]["name"] = json!(name);
        next["apiVersion"] = json!(def.api_version());
        next["kind"] = json!(def.kind);
        if meta(&current).get("deletionTimestamp").is_some() {
            next["metadata"]["deletionTimestamp"] = meta(&current)["deletionTimestamp"].clone();
        }
        if status_only {
            // The status endpoint changes status and nothing else.
            let status = next.get("status").cloned();
            next = current.clone();
            match status {
                Some(s) => next["status"] = s,
                None => {
                    if let Some(o) = next.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
        } else {
            if def.has_status() {
                match current.get("status") {
                    Some(s) => next["status"] = s.clone(),
                    None => {
                        if let Some(o) = next.as_object_mut() {
                            o.remove("status");
                        }
                    }
                }
            }
            if generation_content(&next) != generation_content(&current) {
                let g = meta(&current)["generation"].as_i64().unwrap_or(1);
                next["metadata"]["generation"] = json!(g + 1);
            }
        }
        if dry_run {
            return Ok(next);
        }
        Self::own(&mut inner, def, &key, Some(&current), &next, owner)?;
        if next == current {
            // A no-op write does not bump the version (as kube-apiserver).
            return Ok(current);
        }
        let deleting = being_deleted(&next) && finalizers(&next).is_empty();
        let mut stored = self.commit(&mut inner, &key, next, ChangeKind::Modified);
        if deleting {
            stored = self.commit(&mut inner, &key, stored, ChangeKind::Deleted);
        }
        self.run_gc(&mut inner);
        Ok(stored)
    }

    /// Delete an object: with finalizers it only gets a deletionTimestamp; without, it goes, and
    /// its dependents are handled per `propagation`.
    pub fn delete(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> ApiResult<Value> {
        let DeleteOptions {
            propagation,
            precondition_uid,
            grace_period,
            dry_run,
        } = opts.clone();
        let precondition_uid = precondition_uid.as_deref();
        let mut inner = self.lock();
        let key = Self::key(def, ns, name);
        let current = inner
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))?;
        if precondition_uid.is_some_and(|uid| meta(&current)["uid"].as_str() != Some(uid)) {
            return Err(ApiError::conflict(&def.group, &def.plural, name));
        }
        if dry_run {
            return Ok(current);
        }
        let fins = finalizers(&current);
        let is_namespace = def.group.is_empty() && def.plural == "namespaces";
        // A pod on a node is deleted gracefully: it is marked, and its kubelet stops it and
        // deletes it for good (with a zero grace period).
        let on_node = def.group.is_empty()
            && def.plural == "pods"
            && current["spec"]["nodeName"]
                .as_str()
                .is_some_and(|n| !n.is_empty());
        let grace = grace_period
            .or_else(|| current["spec"]["terminationGracePeriodSeconds"].as_i64())
            .unwrap_or(30);
        if on_node && grace > 0 && fins.is_empty() {
            if meta(&current).get("deletionTimestamp").is_some() {
                return Ok(current);
            }
            let mut next = current.clone();
            let deadline = jiff::Timestamp::now()
                .checked_add(jiff::SignedDuration::from_secs(grace))
                .ok()
                .and_then(|t| t.round(jiff::Unit::Second).ok())
                .map(|t| t.to_string())
                .unwrap_or_else(now);
            next["metadata"]["deletionTimestamp"] = json!(deadline);
            next["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            let stored = self.commit(&mut inner, &key, next, ChangeKind::Modified);
            self.run_gc(&mut inner);
            return Ok(stored);
        }
        if is_namespace {
            if being_deleted(&current) {
                return Ok(current);
            }
            let mut next = current.clone();
            next["metadata"]["deletionTimestamp"] = json!(now());
            next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            if !fins.is_empty() {
                next["metadata"]["finalizers"] = json!(fins);
            }
            next["status"]["phase"] = json!("Terminating");
            let stored = self.commit(&mut inner, &key, next, ChangeKind::Modified);
            // The namespace controller's work: everything in it is deleted.
            let name = key.3.clone();
            let contents: Vec<Key> = inner
                .objects
                .keys()
                .filter(|k| k.2 == name && !k.2.is_empty())
                .cloned()
                .collect();
            for k in contents {
                if inner.objects.get(&k).is_some_and(|o| !being_deleted(o)) {
                    self.delete_object(&mut inner, &k, Propagation::Background);
                }
            }
            inner.to_finish = true;
            self.run_gc(&mut inner);
            return Ok(inner.objects.get(&key).cloned().unwrap_or(stored));
        }
        let result = self.delete_object(&mut inner, &key, propagation);
        self.run_gc(&mut inner);
        Ok(inner.objects.get(&key).cloned().unwrap_or(result))
    }

    /// Every object of every resource (for dumps).
    pub fn snapshot(&self) -> Vec<Value> {
        self.lock().objects.values().cloned().collect()
    }
}
