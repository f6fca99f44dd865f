//! The object store: every object as JSON, one cluster-wide resourceVersion, a bounded history
//! of changes for watches to resume from, finalizers and ownerReference garbage collection.

mod crds;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::errors::{ApiError, ApiResult};
use super::registry::{Registry, ResourceDef};
use super::selector::{FieldSelector, LabelSelector};

/// Changes kept for watches to resume from; older versions answer 410 Gone.
pub const HISTORY: usize = 50_000;

/// Bytes of changes kept (their objects as JSON): large objects must not pin the memory that
/// 50,000 changes of them would.
pub const HISTORY_BYTES: usize = 64 << 20;

/// (group, plural, namespace, name)
pub type Key = (String, String, String, String);

/// The fields the store indexes, per (group, plural): the ones agents and controllers select on
/// each pass (a kubelet its node's pods, a controller a claim's events). Without the index each
/// such list reads every pod or event, so a pass costs what the whole cluster holds.
const INDEXED_FIELDS: &[(&str, &str, &str)] = &[
    ("", "pods", "spec.nodeName"),
    ("", "events", "involvedObject.name"),
];

/// (group, plural, field path, value) → the objects with that value.
type FieldIndex = HashMap<(String, String, &'static str, String), BTreeSet<Key>>;

/// A field's value as field selectors read it: a string, or "" when missing (other JSON values
/// are not indexed: selectors on them fall back to a scan).
fn field_value<'a>(obj: &'a Value, path: &str) -> Option<&'a str> {
    match super::selector::field(obj, path) {
        Value::String(s) => Some(s),
        Value::Null => Some(""),
        _ => None,
    }
}

fn indexed_fields(key: &Key) -> impl Iterator<Item = &'static str> + '_ {
    INDEXED_FIELDS
        .iter()
        .filter(|(g, p, _)| *g == key.0 && *p == key.1)
        .map(|(_, _, path)| *path)
}

/// Keep the index current for `key` going from `before` to `after` (`None`: absent).
fn reindex(index: &mut FieldIndex, key: &Key, before: Option<&Value>, after: Option<&Value>) {
    for path in indexed_fields(key) {
        let old = before.and_then(|o| field_value(o, path));
        let new = after.and_then(|o| field_value(o, path));
        if old == new {
            continue;
        }
        if let Some(old) = old {
            let slot = (key.0.clone(), key.1.clone(), path, old.to_string());
            if let Some(keys) = index.get_mut(&slot) {
                keys.remove(key);
                if keys.is_empty() {
                    index.remove(&slot);
                }
            }
        }
        if let Some(new) = new {
            index
                .entry((key.0.clone(), key.1.clone(), path, new.to_string()))
                .or_default()
                .insert(key.clone());
        }
    }
}

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

/// The retained changes, bounded by count and by bytes; kept apart from the objects so that
/// watchers read them without taking the store's lock.
struct History {
    changes: VecDeque<(Arc<Change>, usize)>,
    bytes: usize,
    cap: usize,
    byte_cap: usize,
    /// The newest version committed.
    last: u64,
}

impl History {
    fn push(&mut self, change: Arc<Change>) {
        let size = json_len(&change.object);
        self.last = change.rv;
        self.bytes += size;
        self.changes.push_back((change, size));
        // The newest change stays whatever its size, so that live watchers never miss it.
        while self.changes.len() > 1
            && (self.changes.len() > self.cap || self.bytes > self.byte_cap)
        {
            if let Some((_, size)) = self.changes.pop_front() {
                self.bytes -= size;
            }
        }
    }

    /// Whether changes after `rv` were dropped (a watch from it cannot be served).
    fn lost(&self, rv: u64) -> bool {
        let oldest = self
            .changes
            .front()
            .map(|(c, _)| c.rv)
            .unwrap_or(self.last + 1);
        rv + 1 < oldest && rv < self.last
    }

    fn after(&self, rv: u64) -> Vec<Arc<Change>> {
        let start = self.changes.partition_point(|(c, _)| c.rv <= rv);
        self.changes
            .range(start..)
            .map(|(c, _)| c.clone())
            .collect()
    }
}

/// The length of a value as JSON, without building the text.
fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
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

/// A subscription: retained changes after the asked version, a receiver that wakes on every
/// new version (read the changes with [`Store::changes_after`]), and the version at
/// subscription.
pub type Watch = (Vec<Arc<Change>>, tokio::sync::watch::Receiver<u64>, u64);

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
/// The ServiceAccount every namespace has, which pods run as unless they name another.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// The ConfigMap in every namespace that holds the cluster's CA (`ca.crt`).
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";

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

fn uid_of(obj: &Value) -> &str {
    meta(obj)["uid"].as_str().unwrap_or("")
}

fn has_finalizer(obj: &Value, name: &str) -> bool {
    finalizers(obj).iter().any(|f| f == name)
}

fn being_deleted(obj: &Value) -> bool {
    meta(obj)
        .get("deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

/// Waiting for its dependents to go (foreground deletion).
fn deleting_dependents(obj: &Value) -> bool {
    being_deleted(obj) && has_finalizer(obj, FOREGROUND)
}

fn owner_refs(obj: &Value) -> Vec<Value> {
    meta(obj)
        .get("ownerReferences")
        .and_then(Value::as_array)
        .cloned()
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
const ORPHAN: &str = "orphan";

/// What an owner reference points at, for the garbage collector (as kube's classifyReferences).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OwnerState {
    /// The owner exists and is not waiting for its dependents.
    Solid,
    /// No object of that kind and name has the uid: the owner is gone (or never was).
    Dangling,
    /// The owner is in foreground deletion.
    Waiting,
    /// The kind is not served (or a namespaced owner of a cluster-scoped object): kube's
    /// collector cannot decide and leaves the dependent alone.
    Unknown,
}

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
        crds::refuse_create(&inner, def)?;
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

    /// Delete the object at `key` (under the lock): with finalizers it only gets a
    /// deletionTimestamp, without it goes. Orphaning strips this owner from its dependents
    /// first; foreground deletion holds the object with the `foregroundDeletion` finalizer
    /// while it has dependents. Returns the object as last stored.
    fn delete_object(&self, inner: &mut Inner, key: &Key, propagation: Propagation) -> Value {
        let Some(current) = inner.objects.get(key).cloned() else {
            return Value::Null;
        };
        let mut fins = finalizers(&current);
        match propagation {
            // kube adds the `orphan` finalizer and its collector strips the references before
            // removing it; the result is the same done at once.
            Propagation::Orphan => self.orphan_dependents(inner, &current),
            Propagation::Foreground => {
                if Self::has_dependents(inner, uid_of(&current))
                    && !fins.iter().any(|f| f == FOREGROUND)
                {
                    fins.push(FOREGROUND.to_string());
                }
            }
            Propagation::Background => {}
        }
        // A CRD is held until its objects are gone (kube's CRD storage does this on the first
        // delete; `finish_crds` does the rest).
        let crd_first_delete = crds::is_crd(key) && !being_deleted(&current);
        if crd_first_delete && !fins.iter().any(|f| f == crds::CLEANUP) {
            fins.push(crds::CLEANUP.to_string());
        }
        if fins.is_empty() {
            return self.commit(inner, key, current, ChangeKind::Deleted);
        }
        if being_deleted(&current) && fins == finalizers(&current) {
            return current;
        }
        let mut next = current.clone();
        if !being_deleted(&current) {
            next["metadata"]["deletionTimestamp"] = json!(now());
            next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        }
        next["metadata"]["finalizers"] = json!(fins);
        if crd_first_delete {
            crds::set_terminating(&mut next, crds::PENDING);
        }
        self.commit(inner, key, next, ChangeKind::Modified)
    }

    fn has_dependents(inner: &Inner, uid: &str) -> bool {
        inner.dependents.get(uid).is_some_and(|d| !d.is_empty())
    }

    /// Remove the references to `owner` from its dependents.
    fn orphan_dependents(&self, inner: &mut Inner, owner: &Value) {
        let uid = uid_of(owner).to_string();
        let keys: Vec<Key> = inner
            .dependents
            .get(&uid)
            .map(|d| d.iter().cloned().collect())
            .unwrap_or_default();
        for k in keys {
            let Some(mut obj) = inner.objects.get(&k).cloned() else {
                continue;
            };
            if let Some(refs) = obj["metadata"]["ownerReferences"].as_array_mut() {
                refs.retain(|r| r["uid"].as_str() != Some(uid.as_str()));
            }
            self.commit(inner, &k, obj, ChangeKind::Modified);
        }
    }

    /// Remove one finalizer; the object goes with its last one when it is being deleted.
    fn remove_finalizer(&self, inner: &mut Inner, key: &Key, name: &str) {
        let Some(mut obj) = inner.objects.get(key).cloned() else {
            return;
        };
        let rest: Vec<String> = finalizers(&obj).into_iter().filter(|f| f != name).collect();
        if rest.is_empty() {
            if let Some(m) = obj["metadata"].as_object_mut() {
                m.remove("finalizers");
            }
        } else {
            obj["metadata"]["finalizers"] = json!(rest);
        }
        let stored = self.commit(inner, key, obj, ChangeKind::Modified);
        if rest.is_empty() && being_deleted(&stored) {
            self.commit(inner, key, stored, ChangeKind::Deleted);
        }
    }

    /// Keep the collector's graph current after a change of `key` from `before` to `after`,
    /// and queue what the change concerns (as kube's graph builder does from its watches); a
    /// CRD's change also concerns its objects and whether its kind is served.
    fn track(
        inner: &mut Inner,
        key: &Key,
        before: Option<&Value>,
        after: &Value,
        kind: ChangeKind,
    ) {
        let old = before.map(owner_uids).unwrap_or_default();
        let new = if kind == ChangeKind::Deleted {
            Vec::new()
        } else {
            owner_uids(after)
        };
        for uid in old.iter().filter(|u| !new.contains(u)) {
            if let Some(set) = inner.dependents.get_mut(uid) {
                set.remove(key);
                if set.is_empty() {
                    inner.dependents.remove(uid);
                }
            }
        }
        for uid in &new {
            inner
                .dependents
                .entry(uid.clone())
                .or_default()
                .insert(key.clone());
        }
        // Owners waiting for their dependents look again when one goes or lets go of them.
        let mut refs = before.map(owner_refs).unwrap_or_default();
        refs.extend(owner_refs(after));
        for r in &refs {
            if let Some(owner) = Self::owner_key(inner, key, r)
                && inner.objects.get(&owner).is_some_and(|o| {
                    deleting_dependents(o) && uid_of(o) == r["uid"].as_str().unwrap_or("")
                })
            {
                inner.gc_queue.push_back(owner);
            }
        }
        let uid = uid_of(after).to_string();
        match kind {
            ChangeKind::Deleted => {
                // Its dependents may be left without owners now.
                if let Some(deps) = inner.dependents.get(&uid) {
                    inner.gc_queue.extend(deps.iter().cloned());
                }
                inner.to_finish = true;
                // A CRD gone: its kind is no longer served.
                if crds::is_crd(key) {
                    crds::unserve(inner, after);
                }
            }
            _ => {
                // A terminating CRD has objects to delete (`finish_crds`).
                if crds::is_crd(key) && being_deleted(after) {
                    inner.to_finish = true;
                }
                let started_waiting =
                    deleting_dependents(after) && !before.is_some_and(deleting_dependents);
                if started_waiting && let Some(deps) = inner.dependents.get(&uid) {
                    inner.gc_queue.extend(deps.iter().cloned());
                }
                if !new.is_empty()
                    || deleting_dependents(after)
                    || (being_deleted(after) && has_finalizer(after, ORPHAN))
                {
                    inner.gc_queue.push_back(key.clone());
                }
            }
        }
    }

    /// Where an owner reference of the object at `dependent` points, if its kind is served.
    fn owner_key(inner: &Inner, dependent: &Key, r: &Value) -> Option<Key> {
        let api_version = r["apiVersion"].as_str().unwrap_or("");
        let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
        let kind = r["kind"].as_str().unwrap_or("");
        let def = inner
            .registry
            .all()
            .find(|d| d.group == group && d.kind == kind && !d.create_only)?;
        if def.namespaced && dependent.2.is_empty() {
            // A cluster-scoped object cannot have a namespaced owner.
            return None;
        }
        Some((
            def.group.clone(),
            def.plural.clone(),
            if def.namespaced {
                dependent.2.clone()
            } else {
                String::new()
            },
            r["name"].as_str().unwrap_or("").to_string(),
        ))
    }

    fn owner_state(inner: &Inner, dependent: &Key, r: &Value) -> OwnerState {
        let Some(key) = Self::owner_key(inner, dependent, r) else {
            return OwnerState::Unknown;
        };
        match inner.objects.get(&key) {
            Some(o) if uid_of(o) == r["uid"].as_str().unwrap_or("") => {
                if deleting_dependents(o) {
                    OwnerState::Waiting
                } else {
                    OwnerState::Solid
                }
            }
            _ => OwnerState::Dangling,
        }
    }

    /// Work the collector's queue until nothing is left to do (under the lock, so that every
    /// answer and every watch sees the collected state).
    fn run_gc(&self, inner: &mut Inner) {
        // Each step deletes, strips a reference or removes a finalizer, so the work ends; the
        // bound is a guard against a mistake turning into a hung server.
        let mut budget = 1_000_000usize;
        loop {
            while let Some(key) = inner.gc_queue.pop_front() {
                budget = budget.saturating_sub(1);
                if budget == 0 {
                    tracing::error!("garbage collection did not settle; dropping its queue");
                    inner.gc_queue.clear();
                    return;
                }
                self.attempt_to_delete(inner, &key);
            }
            if !inner.to_finish {
                return;
            }
            inner.to_finish = false;
            self.finish_namespaces(inner);
            self.finish_crds(inner);
        }
    }

    /// kube's attemptToDeleteItem (and its orphan and foreground workers) for one object.
    fn attempt_to_delete(&self, inner: &mut Inner, key: &Key) {
        let Some(obj) = inner.objects.get(key).cloned() else {
            return;
        };
        if being_deleted(&obj) && has_finalizer(&obj, ORPHAN) {
            self.orphan_dependents(inner, &obj);
            self.remove_finalizer(inner, key, ORPHAN);
            return;
        }
        if deleting_dependents(&obj) {
            // Only dependents that block their owner's deletion hold it.
            let uid = uid_of(&obj).to_string();
            let blocking: Vec<Key> = inner
                .dependents
                .get(&uid)
                .into_iter()
                .flatten()
                .filter(|d| {
                    inner.objects.get(*d).is_some_and(|o| {
                        owner_refs(o).iter().any(|r| {
                            r["uid"].as_str() == Some(uid.as_str())
                                && r["blockOwnerDeletion"] == json!(true)
                        })
                    })
                })
                .cloned()
                .collect();
            if blocking.is_empty() {
                self.remove_finalizer(inner, key, FOREGROUND);
                return;
            }
            for d in blocking {
                if inner
                    .objects
                    .get(&d)
                    .is_some_and(|o| !deleting_dependents(o))
                {
                    inner.gc_queue.push_back(d);
                }
            }
            return;
        }
        if being_deleted(&obj) {
            return;
        }
        let refs = owner_refs(&obj);
        if refs.is_empty() {
            return;
        }
        let (mut solid, mut gone, mut waiting) = (0, Vec::new(), Vec::new());
        for r in &refs {
            let uid = r["uid"].as_str().unwrap_or("").to_string();
            match Self::owner_state(inner, key, r) {
                OwnerState::Unknown => return,
                OwnerState::Solid => solid += 1,
                OwnerState::Dangling => gone.push(uid),
                OwnerState::Waiting => waiting.push(uid),
            }
        }
        if solid > 0 {
            // Live owners keep it; references to gone or going owners are removed.
            if gone.is_empty() && waiting.is_empty() {
                return;
            }
            let mut next = obj.clone();
            if let Some(refs) = next["metadata"]["ownerReferences"].as_array_mut() {
                refs.retain(|r| {
                    let uid = r["uid"].as_str().unwrap_or("");
                    !gone.iter().any(|g| g == uid) && !waiting.iter().any(|w| w == uid)
                });
            }
            self.commit(inner, key, next, ChangeKind::Modified);
            return;
        }
        let uid = uid_of(&obj).to_string();
        if !waiting.is_empty() && Self::has_dependents(inner, &uid) {
            // Its owner waits for it, and it has dependents of its own: it goes in the
            // foreground too. A dependent that waits as well would wait for it forever: its
            // references stop blocking first (kube's cycle breaking).
            let cycle = inner
                .dependents
                .get(&uid)
                .into_iter()
                .flatten()
                .any(|d| inner.objects.get(d).is_some_and(deleting_dependents));
            if cycle {
                let mut next = obj.clone();
                if let Some(refs) = next["metadata"]["ownerReferences"].as_array_mut() {
                    for r in refs.iter_mut() {
                        if r["blockOwnerDeletion"] == json!(true) {
                            r["blockOwnerDeletion"] = json!(false);
                        }
                    }
                }
                self.commit(inner, key, next, ChangeKind::Modified);
            }
            self.delete_object(inner, key, Propagation::Foreground);
            return;
        }
        let propagation = if has_finalizer(&obj, ORPHAN) {
            Propagation::Orphan
        } else if has_finalizer(&obj, FOREGROUND) {
            Propagation::Foreground
        } else {
            Propagation::Background
        };
        self.delete_object(inner, key, propagation);
    }

    /// Terminating namespaces with nothing left in them go.
    fn finish_namespaces(&self, inner: &mut Inner) {
        let first = (
            String::new(),
            "namespaces".to_string(),
            String::new(),
            String::new(),
        );
        let terminating: Vec<(Key, Value)> = inner
            .objects
            .range(first..)
            .take_while(|(k, _)| k.0.is_empty() && k.1 == "namespaces")
            .filter(|(_, o)| being_deleted(o))
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect();
        for (key, obj) in terminating {
            if !inner.objects.keys().any(|other| other.2 == key.3) {
                self.commit(inner, &key, obj, ChangeKind::Deleted);
            }
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

    /// Register (or replace) a custom resource definition's resource, while that CRD is stored:
    /// a write that deleted it (its last finalizer removed) must not serve its kind again. The
    /// store stops serving it when the CRD goes.
    pub fn register(&self, def: ResourceDef) {
        let mut inner = self.lock();
        if inner
            .objects
            .contains_key(&crds::crd_key(&def.group, &def.plural))
        {
            Arc::make_mut(&mut inner.registry).add(def);
        }
    }

    /// Every object of every resource (for dumps).
    pub fn snapshot(&self) -> Vec<Value> {
        self.lock().objects.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_maps() -> (Registry, ResourceDef) {
        let registry = Registry::with_builtins();
        let def = registry.get("", "v1", "configmaps").cloned().unwrap();
        (registry, def)
    }

    fn cm(name: &str, size: usize) -> Value {
        json!({"metadata": {"name": name}, "data": {"k": "x".repeat(size)}})
    }

    /// A list selecting on an indexed field returns what a scan of every object would, in the
    /// same order and pages, as objects are created, moved between values and deleted.
    #[test]
    fn indexed_field_lists_answer_as_a_scan_would() {
        let registry = Registry::with_builtins();
        let pods = registry.get("", "v1", "pods").cloned().unwrap();
        let store = Store::new(registry);
        let pod = |name: &str, node: Option<&str>| {
            let mut p = json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
            if let Some(node) = node {
                p["spec"]["nodeName"] = json!(node);
            }
            p
        };
        for i in 0..30 {
            let node = ["node-1", "node-2"].get(i % 3).copied();
            let ns = if i % 2 == 0 { "default" } else { "kube-system" };
            store
                .create(&pods, ns, pod(&format!("p{i:02}"), node), false, None)
                .unwrap();
        }
        let how = WriteOptions {
            dry_run: false,
            status_only: false,
            owner: None,
        };
        // Moved from node-1 to node-2, and from none to node-1.
        store
            .update(&pods, "default", "p00", pod("p00", Some("node-2")), &how)
            .unwrap();
        store
            .update(&pods, "default", "p02", pod("p02", Some("node-1")), &how)
            .unwrap();
        let gone = DeleteOptions {
            propagation: Propagation::Background,
            precondition_uid: None,
            grace_period: Some(0),
            dry_run: false,
        };
        store.delete(&pods, "kube-system", "p03", &gone).unwrap();

        let names = |items: &[Value]| -> Vec<String> {
            items
                .iter()
                .map(|o| {
                    format!(
                        "{}/{}",
                        o["metadata"]["namespace"].as_str().unwrap(),
                        o["metadata"]["name"].as_str().unwrap()
                    )
                })
                .collect()
        };
        for selector in [
            "spec.nodeName=node-1",
            "spec.nodeName==node-2",
            "spec.nodeName=",
            "spec.nodeName=node-3",
            "spec.nodeName=node-1,metadata.name!=p01",
        ] {
            let fields = FieldSelector::parse(selector).unwrap();
            let (all, _, _) = store.list(&pods, None, &ListOptions::default());
            let scan: Vec<Value> = all.into_iter().filter(|o| fields.matches(o)).collect();
            for ns in [None, Some("default"), Some("kube-system")] {
                let want: Vec<String> = names(&scan)
                    .into_iter()
                    .filter(|n| ns.is_none_or(|ns| n.starts_with(&format!("{ns}/"))))
                    .collect();
                let opts = ListOptions {
                    fields: fields.clone(),
                    ..Default::default()
                };
                let (got, _, next) = store.list(&pods, ns, &opts);
                assert_eq!(names(&got), want, "{selector} in {ns:?}");
                assert!(next.is_none());
                // Pages of 2 add up to the same.
                let mut paged = Vec::new();
                let mut after = None;
                loop {
                    let opts = ListOptions {
                        fields: fields.clone(),
                        limit: Some(2),
                        continue_after: after.clone(),
                        ..Default::default()
                    };
                    let (page, _, next) = store.list(&pods, ns, &opts);
                    paged.extend(names(&page));
                    match next {
                        Some(n) => after = Some(n),
                        None => break,
                    }
                }
                assert_eq!(paged, want, "{selector} in {ns:?}, paged");
            }
        }
        assert!(
            names(
                &store
                    .list(
                        &pods,
                        None,
                        &ListOptions {
                            fields: FieldSelector::parse("spec.nodeName=node-1").unwrap(),
                            ..Default::default()
                        }
                    )
                    .0
            )
            .contains(&"default/p02".to_string())
        );
    }

    #[test]
    fn the_history_is_bounded_by_bytes_as_well_as_count() {
        let (registry, def) = config_maps();
        let store = Store::with_history_limits(registry, 1_000, 20_000);
        let start = store.resource_version();
        for i in 0..50 {
            store
                .create(&def, "default", cm(&format!("cm-{i}"), 1_000), false, None)
                .unwrap();
        }
        {
            let history = store.history();
            assert!(history.bytes <= 20_000, "{} bytes kept", history.bytes);
            let kept = history.changes.len();
            assert!((10..50).contains(&kept), "{kept} changes kept");
            assert_eq!(
                history.bytes,
                history.changes.iter().map(|(_, s)| s).sum::<usize>()
            );
        }
        // Dropped versions answer 410; retained ones resume.
        assert_eq!(store.watch_from(Some(start)).unwrap_err().code, 410);
        assert!(store.changes_after(start).is_none());
        assert!(store.expired(start));
        let now = store.resource_version();
        let (past, _, at) = store.watch_from(Some(now - 3)).unwrap();
        assert_eq!(
            past.iter().map(|c| c.rv).collect::<Vec<_>>(),
            [now - 2, now - 1, now]
        );
        assert_eq!(at, now);
        assert_eq!(store.changes_after(now).unwrap().len(), 0);

        // A change larger than the whole budget is kept alone (watchers must see it).
        store
            .create(&def, "default", cm("huge", 30_000), false, None)
            .unwrap();
        assert_eq!(store.history().changes.len(), 1);
        assert_eq!(store.changes_after(now).unwrap().len(), 1);
        assert!(store.expired(now - 1));
    }

    #[test]
    fn the_count_bound_still_applies() {
        let (registry, def) = config_maps();
        let store = Store::with_history_limits(registry, 5, HISTORY_BYTES);
        for i in 0..20 {
            store
                .create(&def, "default", cm(&format!("cm-{i}"), 10), false, None)
                .unwrap();
        }
        assert_eq!(store.history().changes.len(), 5);
    }
}
