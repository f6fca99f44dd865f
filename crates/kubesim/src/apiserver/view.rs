//! Resources served over another resource's storage, as kube-apiserver serves several versions
//! of one stored kind: events.k8s.io/v1 Events are the core/v1 Events, converted each way, so
//! that either API reads what the other wrote.

use std::sync::Arc;

use serde_json::{Value, json};

use super::errors::{ApiError, ApiResult};
use super::registry::ResourceDef;
use super::store::{DeleteOptions, ListOptions, Owner, Store, WriteOptions};

/// A resource whose objects are another's, under other field names.
#[derive(Debug)]
pub struct View {
    /// The served resource: (group, plural).
    served: (&'static str, &'static str),
    /// The resource whose objects it serves: (group, version, plural).
    stored: (&'static str, &'static str, &'static str),
    /// (served, stored) names of the top-level fields that differ; the others are the same in
    /// both.
    renames: &'static [(&'static str, &'static str)],
    /// The field selector labels served, with the stored objects' field each selects (kube's
    /// field label conversion); any other label is refused.
    fields: &'static [(&'static str, &'static str)],
}

/// events.k8s.io/v1 Events over core/v1 Events (k8s.io/kubernetes pkg/apis/events/v1: the
/// conversion, and the field labels of AddFieldLabelConversionsForEvent).
pub const EVENTS: View = View {
    served: ("events.k8s.io", "events"),
    stored: ("", "v1", "events"),
    renames: &[
        ("regarding", "involvedObject"),
        ("note", "message"),
        ("reportingController", "reportingComponent"),
        ("deprecatedSource", "source"),
        ("deprecatedCount", "count"),
        ("deprecatedFirstTimestamp", "firstTimestamp"),
        ("deprecatedLastTimestamp", "lastTimestamp"),
    ],
    fields: &[
        ("metadata.name", "metadata.name"),
        ("metadata.namespace", "metadata.namespace"),
        ("reason", "reason"),
        ("regarding.kind", "involvedObject.kind"),
        ("regarding.namespace", "involvedObject.namespace"),
        ("regarding.name", "involvedObject.name"),
        ("regarding.uid", "involvedObject.uid"),
        ("regarding.apiVersion", "involvedObject.apiVersion"),
        (
            "regarding.resourceVersion",
            "involvedObject.resourceVersion",
        ),
        ("regarding.fieldPath", "involvedObject.fieldPath"),
        ("reportingController", "reportingComponent"),
        ("source", "source"),
        ("type", "type"),
    ],
};

const VIEWS: &[&View] = &[&EVENTS];

/// The view `def` is served as, if it is one.
pub fn of(def: &ResourceDef) -> Option<&'static View> {
    VIEWS
        .iter()
        .copied()
        .find(|v| v.served == (def.group.as_str(), def.plural.as_str()))
}

/// `obj` with its top-level fields renamed by `pairs` (from, to). A field that only the target
/// version has is not a field of the source one: it is dropped, as decoding into the source's
/// Go type drops it.
fn rename<'a>(obj: Value, pairs: impl Iterator<Item = (&'a str, &'a str)> + Clone) -> Value {
    let Value::Object(mut map) = obj else {
        return obj;
    };
    for (_, to) in pairs.clone() {
        map.remove(to);
    }
    for (from, to) in pairs {
        if let Some(v) = map.remove(from) {
            map.insert(to.to_string(), v);
        }
    }
    Value::Object(map)
}

impl View {
    /// A served object as the stored resource keeps it.
    pub fn to_stored(&self, obj: Value) -> Value {
        let (group, version, _) = self.stored;
        let mut out = rename(obj, self.renames.iter().copied());
        if out.is_object() {
            out["apiVersion"] = json!(api_version(group, version));
        }
        out
    }

    /// A stored object as the view serves it (`served` is the view's definition).
    pub fn from_stored(&self, obj: Value, served: &ResourceDef) -> Value {
        let mut out = rename(obj, self.renames.iter().map(|(s, t)| (*t, *s)));
        if out.is_object() {
            out["apiVersion"] = json!(served.api_version());
        }
        out
    }

    /// The stored objects' field a served field selector label selects, None where the view
    /// does not support the label.
    pub fn stored_field(&self, label: &str) -> Option<&'static str> {
        self.fields
            .iter()
            .find(|(served, _)| *served == label)
            .map(|(_, stored)| *stored)
    }
}

fn with_api_version(mut obj: Value, def: &ResourceDef) -> Value {
    if obj.is_object() {
        obj["apiVersion"] = json!(def.api_version());
    }
    obj
}

fn api_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    }
}

/// How a resource served over another's storage converts its objects.
#[derive(Clone, Copy, Debug)]
enum Conversion {
    /// Fields renamed (a built-in view).
    View(&'static View),
    /// The same object at another version of a custom resource: only `apiVersion` differs (a
    /// CRD's conversion strategy `None`).
    Version,
}

/// A served resource and where its objects are: in the store under its own name, or, for a
/// view or a further version, under the stored resource's, converted on the way in and out.
/// Errors about the stored resource name the served one.
#[derive(Clone)]
pub struct Resource {
    pub store: Arc<Store>,
    /// As served (what the URL names).
    pub def: ResourceDef,
    view: Option<(Conversion, ResourceDef)>,
}

impl Resource {
    /// `def` over `store`; a view whose stored resource is not served is not there (404).
    pub fn new(store: Arc<Store>, def: ResourceDef) -> ApiResult<Resource> {
        let stored = |(group, version, plural): (&str, &str, &str)| {
            store
                .registry()
                .get(group, version, plural)
                .cloned()
                .ok_or_else(ApiError::path_not_found)
        };
        let view = match (of(&def), &def.storage_version) {
            (Some(view), _) => Some((Conversion::View(view), stored(view.stored)?)),
            (None, Some(version)) => Some((
                Conversion::Version,
                stored((&def.group, version, &def.plural))?,
            )),
            (None, None) => None,
        };
        Ok(Resource { store, def, view })
    }

    /// The definition the store keeps the objects under.
    pub fn stored_def(&self) -> &ResourceDef {
        self.view.as_ref().map_or(&self.def, |(_, stored)| stored)
    }

    pub fn view(&self) -> Option<&'static View> {
        match self.view {
            Some((Conversion::View(view), _)) => Some(view),
            _ => None,
        }
    }

    /// A stored object as served.
    pub fn to_served(&self, obj: Value) -> Value {
        match &self.view {
            Some((Conversion::View(view), _)) => view.from_stored(obj, &self.def),
            Some((Conversion::Version, _)) => with_api_version(obj, &self.def),
            None => obj,
        }
    }

    fn to_stored(&self, obj: Value) -> Value {
        match &self.view {
            Some((Conversion::View(view), _)) => view.to_stored(obj),
            Some((Conversion::Version, stored)) => with_api_version(obj, stored),
            None => obj,
        }
    }

    fn error(&self, e: ApiError) -> ApiError {
        match self.view {
            Some(_) => {
                let stored = self.stored_def();
                e.about(
                    (&stored.group, &stored.plural),
                    (&self.def.group, &self.def.plural),
                )
            }
            None => e,
        }
    }

    /// An apply's owner, its applied configuration as the store compares it (stored fields).
    fn stored_owner(&self, owner: Option<&Owner>) -> Option<Owner> {
        let owner = owner?;
        Some(Owner {
            applied: owner.applied.clone().map(|a| self.to_stored(a)),
            ..owner.clone()
        })
    }

    pub fn get(&self, ns: &str, name: &str) -> ApiResult<Value> {
        self.store
            .get(self.stored_def(), ns, name)
            .map(|o| self.to_served(o))
            .map_err(|e| self.error(e))
    }

    /// As [`Store::list`]; the options' field selectors name stored fields already.
    pub fn list(&self, ns: Option<&str>, opts: &ListOptions) -> (Vec<Value>, u64, Option<String>) {
        let (items, rv, next) = self.store.list(self.stored_def(), ns, opts);
        let items = items.into_iter().map(|o| self.to_served(o)).collect();
        (items, rv, next)
    }

    pub fn create(
        &self,
        ns: &str,
        obj: Value,
        dry_run: bool,
        owner: Option<&Owner>,
    ) -> ApiResult<Value> {
        let owner = self.stored_owner(owner);
        self.store
            .create(
                self.stored_def(),
                ns,
                self.to_stored(obj),
                dry_run,
                owner.as_ref(),
            )
            .map(|o| self.to_served(o))
            .map_err(|e| self.error(e))
    }

    pub fn update(
        &self,
        ns: &str,
        name: &str,
        obj: Value,
        how: &WriteOptions<'_>,
    ) -> ApiResult<Value> {
        self.modify(ns, name, how, |_| Ok(obj))
    }

    /// As [`Store::modify`], `change` seeing and making the object as served.
    pub fn modify(
        &self,
        ns: &str,
        name: &str,
        how: &WriteOptions<'_>,
        change: impl FnOnce(&Value) -> ApiResult<Value>,
    ) -> ApiResult<Value> {
        let result = match self.view {
            None => self.store.modify(&self.def, ns, name, how, change),
            Some((_, ref stored)) => {
                let owner = self.stored_owner(how.owner);
                let how = WriteOptions {
                    owner: owner.as_ref(),
                    ..*how
                };
                self.store.modify(stored, ns, name, &how, |current| {
                    change(&self.to_served(current.clone())).map(|next| self.to_stored(next))
                })
            }
        };
        result.map(|o| self.to_served(o)).map_err(|e| self.error(e))
    }

    pub fn delete(&self, ns: &str, name: &str, opts: &DeleteOptions) -> ApiResult<Value> {
        self.store
            .delete(self.stored_def(), ns, name, opts)
            .map(|o| self.to_served(o))
            .map_err(|e| self.error(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::registry::Registry;

    fn events_def() -> ResourceDef {
        Registry::with_builtins()
            .get("events.k8s.io", "v1", "events")
            .cloned()
            .unwrap()
    }

    #[test]
    fn events_convert_both_ways_as_kube_does() {
        let served = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "default"},
            "regarding": {"kind": "Pod", "name": "p"},
            "related": {"kind": "Node", "name": "n"},
            "note": "pulled", "reason": "Pulled", "type": "Normal", "action": "Pull",
            "reportingController": "kubelet", "reportingInstance": "node-1",
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"},
            "deprecatedSource": {"component": "kubelet", "host": "node-1"},
            "deprecatedCount": 3,
            "deprecatedFirstTimestamp": "2026-01-01T00:00:00Z",
            "deprecatedLastTimestamp": "2026-01-01T00:02:00Z",
        });
        let core = EVENTS.to_stored(served.clone());
        assert_eq!(
            core,
            json!({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": "e", "namespace": "default"},
                "involvedObject": {"kind": "Pod", "name": "p"},
                "related": {"kind": "Node", "name": "n"},
                "message": "pulled", "reason": "Pulled", "type": "Normal", "action": "Pull",
                "reportingComponent": "kubelet", "reportingInstance": "node-1",
                "eventTime": "2026-01-01T00:00:00.000000Z",
                "series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"},
                "source": {"component": "kubelet", "host": "node-1"},
                "count": 3,
                "firstTimestamp": "2026-01-01T00:00:00Z",
                "lastTimestamp": "2026-01-01T00:02:00Z",
            })
        );
        assert_eq!(EVENTS.from_stored(core, &events_def()), served);
        // A field of the other version only is none of this one.
        let odd = EVENTS.to_stored(json!({"note": "n", "message": "m"}));
        assert_eq!(odd, json!({"apiVersion": "v1", "message": "n"}));
    }

    #[test]
    fn events_field_labels_select_stored_fields() {
        assert_eq!(
            EVENTS.stored_field("regarding.name"),
            Some("involvedObject.name")
        );
        assert_eq!(
            EVENTS.stored_field("reportingController"),
            Some("reportingComponent")
        );
        assert_eq!(EVENTS.stored_field("metadata.name"), Some("metadata.name"));
        assert_eq!(EVENTS.stored_field("involvedObject.name"), None);
        assert_eq!(EVENTS.stored_field("note"), None);
    }
}
