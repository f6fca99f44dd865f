//! CustomResourceDefinitions are deleted as kube-apiserver deletes them. The first delete holds
//! the CRD with the `customresourcecleanup.apiextensions.k8s.io` finalizer and marks it
//! Terminating (kube's CRD storage); then its objects are deleted in every namespace, each as
//! its own finalizers allow, while creating new ones is refused, and once none is left the
//! finalizer goes (kube's CRD finalizer controller). With the CRD, its kind stops being served.
//!
//! The controller's part runs with the garbage collector, under the store's lock, after every
//! deletion and every change of a terminating CRD, as the namespace controller's part does: a
//! deletion is the only event that can let a waiting CRD go, so nothing polls.

use std::sync::Arc;

use serde_json::{Value, json};

use super::history::ChangeKind;
use super::objects::{Key, being_deleted, has_finalizer, now};
use super::{Inner, Propagation, Store};
use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::registry::ResourceDef;

/// Holds a deleted CRD until its objects are gone.
pub(super) const CLEANUP: &str = "customresourcecleanup.apiextensions.k8s.io";
const GROUP: &str = "apiextensions.k8s.io";
const PLURAL: &str = "customresourcedefinitions";

/// A `Terminating` condition's status, reason and message (kube's words).
pub(super) type Terminating = (&'static str, &'static str, &'static str);

pub(super) const PENDING: Terminating = (
    "True",
    "InstanceDeletionPending",
    "CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon",
);
const IN_PROGRESS: Terminating = (
    "True",
    "InstanceDeletionInProgress",
    "CustomResource deletion is in progress",
);
const COMPLETED: Terminating = (
    "False",
    "InstanceDeletionCompleted",
    "removed all instances",
);

pub(super) fn is_crd(key: &Key) -> bool {
    key.0 == GROUP && key.1 == PLURAL
}

/// Where the CRD defining `group`'s `plural` is stored (its name is `{plural}.{group}`).
pub(super) fn crd_key(group: &str, plural: &str) -> Key {
    (
        GROUP.into(),
        PLURAL.into(),
        String::new(),
        format!("{plural}.{group}"),
    )
}

/// The (group, plural) a CRD defines.
fn defined(crd: &Value) -> (String, String) {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        text(&crd["spec"]["group"]),
        text(&crd["spec"]["names"]["plural"]),
    )
}

/// The objects of `group`'s `plural`, in every namespace.
fn instances(inner: &Inner, group: &str, plural: &str) -> Vec<Key> {
    let from: Key = (group.into(), plural.into(), String::new(), String::new());
    inner
        .objects
        .range(from..)
        .take_while(|(k, _)| k.0 == group && k.1 == plural)
        .map(|(k, _)| k.clone())
        .collect()
}

/// Set the CRD's `Terminating` condition; its transition time moves only with its status (as
/// kube's SetCRDCondition), so setting it again changes nothing.
pub(super) fn set_terminating(crd: &mut Value, (status, reason, message): Terminating) {
    // Anyone may write a CRD's status: what is there is not trusted to be an object.
    if !crd["status"].is_object() {
        crd["status"] = json!({});
    }
    let conditions = &mut crd["status"]["conditions"];
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    let Some(list) = conditions.as_array_mut() else {
        return;
    };
    let at = list.iter().position(|c| c["type"] == "Terminating");
    let since = at
        .filter(|&i| list[i]["status"] == status)
        .map(|i| list[i]["lastTransitionTime"].clone())
        .unwrap_or_else(|| json!(now()));
    let condition = json!({"type": "Terminating", "status": status, "reason": reason,
        "message": message, "lastTransitionTime": since});
    match at {
        Some(i) => list[i] = condition,
        None => list.push(condition),
    }
}

impl Inner {
    /// kube's custom resource handler refuses to create objects of a terminating CRD's kind (they
    /// would outlive it).
    pub(super) fn refuse_create(&self, def: &ResourceDef) -> ApiResult<()> {
        if def.schema.is_none() {
            return Ok(());
        }
        match self.objects.get(&crd_key(&def.group, &def.plural)) {
            Some(crd) if being_deleted(crd) => Err(ApiError::method_not_allowed(
                "create not allowed while custom resource definition is terminating",
            )),
            _ => Ok(()),
        }
    }
}

/// A CRD is gone: its kind is no longer served. Objects it did not take (its finalizer removed
/// by hand) stay stored, unserved, as in kube's etcd.
pub(super) fn unserve(inner: &mut Inner, crd: &Value) {
    let (group, plural) = defined(crd);
    let custom = inner
        .registry
        .all()
        .any(|d| d.group == group && d.plural == plural && d.schema.is_some());
    if custom {
        Arc::make_mut(&mut inner.registry).remove(&group, &plural);
    }
}

impl Store {
    /// Register (or replace) a custom resource definition's resource, while that CRD is stored:
    /// a write that deleted it (its last finalizer removed) must not serve its kind again. The
    /// store stops serving it when the CRD goes.
    pub fn register(&self, def: ResourceDef) {
        let mut inner = self.lock();
        if inner
            .objects
            .contains_key(&crd_key(&def.group, &def.plural))
        {
            Arc::make_mut(&mut inner.registry).add(def);
        }
    }

    /// kube's CRD finalizer controller, for every terminating CRD that still holds its
    /// finalizer.
    pub(super) fn finish_crds(&self, inner: &mut Inner) {
        let first: Key = (GROUP.into(), PLURAL.into(), String::new(), String::new());
        let terminating: Vec<Key> = inner
            .objects
            .range(first..)
            .take_while(|(k, _)| is_crd(k))
            .filter(|(_, o)| being_deleted(o) && has_finalizer(o, CLEANUP))
            .map(|(k, _)| k.clone())
            .collect();
        for key in terminating {
            self.finish_crd(inner, &key);
        }
    }

    /// Say the deletion is in progress, delete the CRD's objects not going yet, and once none
    /// is left let go of it. Each step writes only what changes, so that running this on every
    /// deletion settles.
    fn finish_crd(&self, inner: &mut Inner, key: &Key) {
        self.set_crd_condition(inner, key, IN_PROGRESS);
        let Some(crd) = inner.objects.get(key) else {
            return;
        };
        let (group, plural) = defined(crd);
        // A CRD naming a built-in kind (which the registry serves without a schema) takes none
        // of its objects with it.
        let custom = inner
            .registry
            .all()
            .any(|d| d.group == group && d.plural == plural && d.schema.is_some());
        let instances = |inner: &Inner| {
            if custom {
                instances(inner, &group, &plural)
            } else {
                Vec::new()
            }
        };
        let mut deleted = false;
        for k in instances(inner) {
            if inner.objects.get(&k).is_some_and(|o| !being_deleted(o)) {
                self.delete_object(inner, &k, Propagation::Background);
                deleted = true;
            }
        }
        // Objects their finalizers hold hold the CRD; the deletion of the last one brings the
        // store back here. Objects deleted just now have dependents the collector is still to
        // look at, by their owners' kind: the kind stays served until it has (a deletion
        // brings the store back here once the collector's queue is worked).
        if deleted || !instances(inner).is_empty() {
            return;
        }
        self.set_crd_condition(inner, key, COMPLETED);
        self.remove_finalizer(inner, key, CLEANUP);
    }

    fn set_crd_condition(&self, inner: &mut Inner, key: &Key, condition: Terminating) {
        let Some(crd) = inner.objects.get(key).cloned() else {
            return;
        };
        let mut next = crd.clone();
        set_terminating(&mut next, condition);
        if next != crd {
            self.commit(inner, key, next, ChangeKind::Modified);
        }
    }
}
