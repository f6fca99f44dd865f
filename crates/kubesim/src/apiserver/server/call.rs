//! What the handlers of a request share: the [`Call`] (the store, who asks, the query's write
//! options), the object an item request names, and what the server lends them: where pods'
//! logs are, the audit log, the live objects tokens are checked against.

use std::sync::Arc;

use axum::http::Method;
use serde_json::Value;

use super::request::Query;
use crate::apiserver::auth::Authenticator;
use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::rbac::UserInfo;
use crate::apiserver::registry::ResourceDef;
use crate::apiserver::store::{Owner, Store, WriteOptions};
use crate::apiserver::view::Resource;

/// Where a node's kubelet keeps the logs of containers, which `pods/log` reads as kube-apiserver
/// asks the kubelet for them.
pub trait PodLogs: Send + Sync {
    /// The log of run `instance` (its restart count then) of `container` of pod `pod_uid` on
    /// `node`.
    fn log_file(
        &self,
        node: &str,
        pod_uid: &str,
        container: &str,
        instance: u32,
    ) -> std::path::PathBuf;
}

/// The audit log's file, shared by the requests that write to it.
pub(super) type AuditLog = Arc<std::sync::Mutex<std::fs::File>>;

/// Append one event to the audit log; a lost line is not worth failing the request over.
pub(super) fn write_audit(audit: &AuditLog, event: &Value) {
    let mut f = audit.lock().unwrap_or_else(|e| e.into_inner());
    let _ = std::io::Write::write_all(&mut *f, format!("{event}\n").as_bytes());
}

/// What every handler of a request needs besides its target.
pub(super) struct Call {
    pub(super) store: Arc<Store>,
    /// Who the request acts as.
    pub(super) user: UserInfo,
    pub(super) pod_logs: Option<Arc<dyn PodLogs>>,
    pub(super) auth: Arc<Authenticator>,
    /// Created claims and volumes get the in-use protection finalizers.
    pub(super) protect_storage: bool,
    pub(super) q: Query,
    pub(super) method: Method,
    pub(super) accept: String,
    /// Every value was checked to be "All" before a write uses this.
    pub(super) dry_run: bool,
    pub(super) manager: Option<String>,
    pub(super) force: bool,
    pub(super) writer: Option<Owner>,
    pub(super) validation: String,
    /// For a server-side apply: whether the user may also create what it names, which kube asks
    /// when the object does not exist yet (`create` besides `patch`).
    pub(super) may_create: bool,
    pub(super) audit: Option<AuditLog>,
}

impl Call {
    /// Where the objects of `def` are (for a view, another resource's).
    pub(super) fn resource(&self, def: ResourceDef) -> ApiResult<Resource> {
        Resource::new(self.store.clone(), def)
    }

    /// `kubectl get` asks for a Table.
    pub(super) fn wants_table(&self) -> bool {
        crate::apiserver::table::wants_table(&self.accept)
    }

    /// A Table of `items`, their whole objects in the rows if asked (`includeObject=Object`).
    pub(super) fn table(&self, def: &ResourceDef, items: &[Value], rv: &str) -> Value {
        let include = self.q.get("includeObject").is_some_and(|i| i == "Object");
        crate::apiserver::table::table(def, items, rv, include)
    }

    /// How this request writes: its dry run, and its field manager as the owner of what it sets.
    pub(super) fn write(&self, status_only: bool) -> WriteOptions<'_> {
        WriteOptions {
            dry_run: self.dry_run,
            status_only,
            owner: self.writer.as_ref(),
        }
    }

    /// A refused method, in kube's words: `PUT is not supported on pods/binding`.
    pub(super) fn not_supported(&self, def: &ResourceDef, sub: &str) -> ApiError {
        ApiError::method_not_allowed(format!(
            "{} is not supported on {}/{sub}",
            self.method, def.plural
        ))
    }
}

/// The object an item request names.
pub(super) struct Named {
    pub(super) res: Resource,
    pub(super) ns: String,
    pub(super) name: String,
}

/// The uids the authenticator checks tokens against.
pub(super) struct Live<'a>(pub(super) &'a Store);

impl crate::apiserver::auth::Lookup for Live<'_> {
    fn uid(&self, plural: &str, namespace: &str, name: &str) -> Option<String> {
        let def = self.0.registry().get("", "v1", plural)?.clone();
        let obj = self.0.get(&def, namespace, name).ok()?;
        obj["metadata"]["uid"].as_str().map(str::to_string)
    }
}
