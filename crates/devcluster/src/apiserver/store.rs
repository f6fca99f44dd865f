//! The object store: every object as JSON, one cluster-wide resourceVersion, a bounded history
//! of changes for watches to resume from, finalizers and ownerReference garbage collection.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::errors::{ApiError, ApiResult};
use super::registry::{Registry, ResourceDef};
use super::selector::{FieldSelector, LabelSelector};

/// Changes kept for watches to resume from; older versions answer 410 Gone.
pub const HISTORY: usize = 50_000;

/// (group, plural, namespace, name)
pub type Key = (String, String, String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "ADDED",
            ChangeKind::Modified => "MODIFIED",
            ChangeKind::Deleted => "DELETED",
        }
    }
}

/// One change, as watchers see it.
#[derive(Debug, Clone)]
pub struct Change {
    pub rv: u64,
    pub group: String,
    pub plural: String,
    pub namespace: String,
    pub kind: ChangeKind,
    pub object: Value,
}

struct Inner {
    /// Field ownership per object, for server-side apply: leaf path → field manager.
    owners: BTreeMap<Key, BTreeMap<String, String>>,
    history_cap: usize,
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Arc<Change>>,
    registry: Registry,
}

/// The store, shared by all handlers.
pub struct Store {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<Change>>,
}

/// List options after parsing.
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_after: Option<String>,
}

/// A subscription: retained changes after the asked version, the live feed, and the version
/// at subscription.
pub type Watch = (Vec<Arc<Change>>, broadcast::Receiver<Arc<Change>>, u64);

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

static UID_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A unique id in UUID form (not cryptographic: ids only need to be unique).
pub fn new_uid() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mix = |seed: u64| {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let n = UID_COUNTER.fetch_add(1, Ordering::Relaxed);
    let a = mix(nanos ^ n.rotate_left(32));
    let b = mix(a ^ n ^ std::process::id() as u64);
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | ((b >> 48) & 0x3fff),
        b & 0xffff_ffff_ffff
    )
}

/// Now, as Kubernetes writes timestamps (RFC 3339, seconds).
pub fn now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn meta(obj: &Value) -> &Value {
    obj.get("metadata").unwrap_or(&Value::Null)
}

fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    meta(obj)
        .get("labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .get("finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn owner_uids(obj: &Value) -> Vec<String> {
    meta(obj)
        .get("ownerReferences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|o| o.get("uid").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// What decides `metadata.generation`: everything but metadata and status.
fn generation_content(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    v
}

const FOREGROUND: &str = "foregroundDeletion";

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

/// Leaf fields of an object (lists are atomic), as dotted paths, with their values.
fn leaves(v: &Value, prefix: &str, out: &mut Vec<(String, Value)>) {
    match v.as_object() {
        Some(m) if !m.is_empty() => {
            for (k, sub) in m {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(sub, &path, out);
            }
        }
        _ => out.push((prefix.to_string(), v.clone())),
    }
}

fn owned_leaves(obj: &Value) -> Vec<(String, Value)> {
    let mut all = Vec::new();
    leaves(obj, "", &mut all);
    all.retain(|(p, _)| {
        !matches!(p.as_str(), "apiVersion" | "kind") && !p.starts_with("metadata.") && !p.is_empty()
    });
    all
}

fn at_path<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |cur, seg| cur.get(seg))
}

impl Store {
    pub fn new(registry: Registry) -> Store {
        Self::with_history(registry, HISTORY)
    }

    /// A store keeping `history_cap` changes for watches to resume from.
    pub fn with_history(registry: Registry, history_cap: usize) -> Store {
        let (tx, _) = broadcast::channel(16_384);
        let mut inner = Inner {
            owners: BTreeMap::new(),
            history_cap,
            rv: 1,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            registry,
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
        }
        Store {
            inner: Mutex::new(inner),
            tx,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("store lock")
    }

    pub fn registry(&self) -> Registry {
        self.lock().registry.clone()
    }

    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// Subscribe to changes, with the retained history of changes after `since` (None: none).
    /// Fails with 410 when `since` is older than the history.
    pub fn watch_from(&self, since: Option<u64>) -> ApiResult<Watch> {
        let inner = self.lock();
        let rx = self.tx.subscribe();
        let past = match since {
            None => Vec::new(),
            Some(rv) => {
                let oldest = inner.history.front().map(|c| c.rv).unwrap_or(inner.rv + 1);
                if rv + 1 < oldest && rv < inner.rv {
                    return Err(ApiError::gone(format!(
                        "too old resource version: {rv} ({})",
                        oldest - 1
                    )));
                }
                inner
                    .history
                    .iter()
                    .filter(|c| c.rv > rv)
                    .cloned()
                    .collect()
            }
        };
        Ok((past, rx, inner.rv))
    }

    /// Record a change (under the lock): bump the version, stamp it, keep and broadcast it.
    fn commit(&self, inner: &mut Inner, key: &Key, mut obj: Value, kind: ChangeKind) -> Value {
        inner.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
        match kind {
            ChangeKind::Deleted => {
                inner.objects.remove(key);
                inner.owners.remove(key);
            }
            _ => {
                inner.objects.insert(key.clone(), obj.clone());
            }
        }
        let change = Arc::new(Change {
            rv: inner.rv,
            group: key.0.clone(),
            plural: key.1.clone(),
            namespace: key.2.clone(),
            kind,
            object: obj.clone(),
        });
        inner.history.push_back(change.clone());
        while inner.history.len() > inner.history_cap {
            inner.history.pop_front();
        }
        let _ = self.tx.send(change);
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
        for ((g, p, n, name), obj) in inner.objects.iter() {
            if g != &def.group || p != &def.plural || prefix_ns.is_some_and(|want| want != n) {
                continue;
            }
            let position = format!("{n}/{name}");
            if opts
                .continue_after
                .as_ref()
                .is_some_and(|after| position.as_str() <= after.as_str())
            {
                continue;
            }
            if !opts.labels.matches(&labels_of(obj)) || !opts.fields.matches(obj) {
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
        Ok(self.commit(&mut inner, &key, obj, ChangeKind::Added))
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
        let deleting =
            meta(&next).get("deletionTimestamp").is_some() && finalizers(&next).is_empty();
        let stored = self.commit(&mut inner, &key, next, ChangeKind::Modified);
        if deleting {
            let gone = self.commit(&mut inner, &key, stored, ChangeKind::Deleted);
            self.collect(&mut inner, &gone, Propagation::Background);
            return Ok(gone);
        }
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
        let mut fins = finalizers(&current);
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
            return Ok(self.commit(&mut inner, &key, next, ChangeKind::Modified));
        }
        if propagation == Propagation::Foreground && !fins.iter().any(|f| f == FOREGROUND) {
            let has_dependents = {
                let uid = meta(&current)["uid"].as_str().unwrap_or("").to_string();
                inner.objects.values().any(|o| owner_uids(o).contains(&uid))
            };
            if has_dependents {
                fins.push(FOREGROUND.to_string());
            }
        }
        if !fins.is_empty() || is_namespace {
            if meta(&current).get("deletionTimestamp").is_some() {
                return Ok(current);
            }
            let mut next = current.clone();
            next["metadata"]["deletionTimestamp"] = json!(now());
            next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            if !fins.is_empty() {
                next["metadata"]["finalizers"] = json!(fins);
            }
            if is_namespace {
                next["status"]["phase"] = json!("Terminating");
            }
            let stored = self.commit(&mut inner, &key, next, ChangeKind::Modified);
            if propagation == Propagation::Foreground || is_namespace {
                self.collect(&mut inner, &stored, propagation);
            }
            if is_namespace {
                self.finish_namespaces(&mut inner);
            }
            return Ok(inner.objects.get(&key).cloned().unwrap_or(stored));
        }
        let gone = self.commit(&mut inner, &key, current, ChangeKind::Deleted);
        self.collect(&mut inner, &gone, propagation);
        Ok(gone)
    }

    /// Garbage collection after `owner` was deleted (or started foreground deletion).
    fn collect(&self, inner: &mut Inner, owner: &Value, propagation: Propagation) {
        let uid = meta(owner)["uid"].as_str().unwrap_or("").to_string();
        let owner_is_namespace = owner["kind"] == "Namespace" && owner["apiVersion"] == "v1";
        let ns_name = meta(owner)["name"].as_str().unwrap_or("").to_string();
        let dependents: Vec<Key> = inner
            .objects
            .iter()
            .filter(|(k, o)| {
                owner_uids(o).contains(&uid)
                    || (owner_is_namespace && k.2 == ns_name && !k.2.is_empty())
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in dependents {
            let Some(obj) = inner.objects.get(&key).cloned() else {
                continue;
            };
            if propagation == Propagation::Orphan && !owner_is_namespace {
                let mut next = obj.clone();
                if let Some(refs) = next["metadata"]["ownerReferences"].as_array_mut() {
                    refs.retain(|r| r["uid"].as_str() != Some(uid.as_str()));
                }
                self.commit(inner, &key, next, ChangeKind::Modified);
                continue;
            }
            if finalizers(&obj).is_empty() {
                let gone = self.commit(inner, &key, obj, ChangeKind::Deleted);
                self.collect(inner, &gone, Propagation::Background);
            } else if meta(&obj).get("deletionTimestamp").is_none() {
                let mut next = obj.clone();
                next["metadata"]["deletionTimestamp"] = json!(now());
                self.commit(inner, &key, next, ChangeKind::Modified);
            }
        }
        self.finish_foreground(inner);
        self.finish_namespaces(inner);
    }

    /// Owners in foreground deletion whose dependents are gone lose the finalizer (and go).
    fn finish_foreground(&self, inner: &mut Inner) {
        loop {
            let ready: Option<(Key, Value)> = inner
                .objects
                .iter()
                .find(|(_, o)| {
                    finalizers(o).iter().any(|f| f == FOREGROUND) && {
                        let uid = meta(o)["uid"].as_str().unwrap_or("");
                        !inner
                            .objects
                            .values()
                            .any(|d| owner_uids(d).iter().any(|u| u == uid))
                    }
                })
                .map(|(k, o)| (k.clone(), o.clone()));
            let Some((key, mut obj)) = ready else { return };
            let rest: Vec<String> = finalizers(&obj)
                .into_iter()
                .filter(|f| f != FOREGROUND)
                .collect();
            obj["metadata"]["finalizers"] = json!(rest);
            let stored = self.commit(inner, &key, obj, ChangeKind::Modified);
            if rest.is_empty() {
                let gone = self.commit(inner, &key, stored, ChangeKind::Deleted);
                self.collect(inner, &gone, Propagation::Background);
            }
        }
    }

    /// Terminating namespaces with nothing left in them go.
    fn finish_namespaces(&self, inner: &mut Inner) {
        let ready: Vec<(Key, Value)> = inner
            .objects
            .iter()
            .filter(|(k, o)| {
                k.0.is_empty() && k.1 == "namespaces" && meta(o).get("deletionTimestamp").is_some()
            })
            .filter(|(k, _)| !inner.objects.keys().any(|other| other.2 == k.3))
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect();
        for (key, obj) in ready {
            self.commit(inner, &key, obj, ChangeKind::Deleted);
        }
    }

    /// Check an apply for conflicts with other managers, then record who owns what after the
    /// write from `before` to `after`.
    fn own(
        inner: &mut Inner,
        def: &ResourceDef,
        key: &Key,
        before: Option<&Value>,
        after: &Value,
        owner: Option<&Owner>,
    ) -> ApiResult<()> {
        let Some(owner) = owner else {
            return Ok(());
        };
        let owners = inner.owners.entry(key.clone()).or_default();
        if let (Some(applied), false) = (&owner.applied, owner.force) {
            let conflicts: Vec<String> = owned_leaves(applied)
                .into_iter()
                .filter(|(path, value)| {
                    let current = before.and_then(|b| at_path(b, path));
                    current.is_some_and(|c| c != value)
                        && owners.get(path).is_some_and(|m| *m != owner.manager)
                })
                .map(|(path, _)| path)
                .collect();
            if !conflicts.is_empty() {
                let details: Vec<String> = conflicts
                    .iter()
                    .map(|p| format!("conflict with \"{}\": .{p}", owners[p]))
                    .collect();
                let mut e = ApiError::conflict(&def.group, &def.plural, &key.3);
                e.message = format!(
                    "Apply failed with {} conflict{}: {}",
                    conflicts.len(),
                    if conflicts.len() == 1 { "" } else { "s" },
                    details.join(", ")
                );
                return Err(e);
            }
        }
        let after_leaves = owned_leaves(after);
        let present: std::collections::BTreeSet<&String> =
            after_leaves.iter().map(|(p, _)| p).collect();
        owners.retain(|p, _| present.contains(p));
        let claimed: Vec<String> = match &owner.applied {
            Some(applied) => owned_leaves(applied)
                .into_iter()
                .map(|(p, _)| p)
                .filter(|p| present.contains(p))
                .collect(),
            None => after_leaves
                .iter()
                .filter(|(p, v)| before.and_then(|b| at_path(b, p)) != Some(v))
                .map(|(p, _)| p.clone())
                .collect(),
        };
        for p in claimed {
            owners.insert(p, owner.manager.clone());
        }
        Ok(())
    }

    /// Register (or replace) a custom resource definition's resource.
    pub fn register(&self, def: ResourceDef) {
        self.lock().registry.add(def);
    }

    /// Remove a custom resource and every object of it.
    pub fn unregister(&self, group: &str, plural: &str) {
        let mut inner = self.lock();
        inner.registry.remove(group, plural);
        let keys: Vec<Key> = inner
            .objects
            .keys()
            .filter(|k| k.0 == group && k.1 == plural)
            .cloned()
            .collect();
        for key in keys {
            if let Some(obj) = inner.objects.get(&key).cloned() {
                self.commit(&mut inner, &key, obj, ChangeKind::Deleted);
            }
        }
    }

    /// Every object of every resource (for dumps).
    pub fn snapshot(&self) -> Vec<Value> {
        self.lock().objects.values().cloned().collect()
    }
}
