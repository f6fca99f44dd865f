//! Object validation as kube-apiserver does it before storing: names per kind, metadata (labels,
//! annotations, owner references, finalizers), pods' containers, volumes, ports and mounts,
//! Services' ports, the size of ConfigMaps and Secrets, PersistentVolumes, claims and
//! StorageClasses. Every failure is a field error printed exactly as k8s.io/apimachinery's
//! `field.Error` prints it, so that messages match a real cluster's. [`validate`] picks a kind's
//! rules; the files below hold them, by API group and kind.
//!
//! The rules and messages come from k8s.io/apimachinery/pkg/util/validation/validation.go,
//! .../api/validation/{objectmeta,generic}.go, .../apis/meta/v1/validation and
//! k8s.io/kubernetes/pkg/apis/core/validation/validation.go (Kubernetes 1.33).

mod claim;
mod config;
mod field;
mod meta;
mod names;
mod persistentvolume;
mod pod;
mod selectors;
mod service;
mod storage;
#[cfg(test)]
mod testing;
mod volume_fields;

use serde_json::Value;

pub use claim::{claim_spec, claim_update};
pub use config::{DATA_MAX, config_map, secret};
pub use field::{BadValue, ErrorType, FieldError, go_quote};
pub use meta::{ANNOTATIONS_MAX, object_meta};
pub use names::{
    LABEL_MAX, NameRule, SUBDOMAIN_MAX, check_name, is_config_map_key, is_dns1035_label,
    is_dns1123_label, is_dns1123_subdomain, is_label_value, is_path_segment_name,
    is_qualified_name, is_valid_port_name, name_rule,
};
pub use persistentvolume::{
    default_persistent_volume, persistent_volume, persistent_volume_update,
};
pub use pod::pod_spec;
pub use storage::{default_storage_class, storage_class, storage_class_update};
pub use volume_fields::ACCESS_MODES;

use super::registry::ResourceDef;

/// Everything checked on a create (after name generation) or an update of `obj`.
pub fn validate(def: &ResourceDef, obj: &Value, create: bool) -> Vec<FieldError> {
    if def.create_only {
        return Vec::new();
    }
    let mut errs = object_meta(def, obj, create);
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "pods") => errs.extend(pod_spec(&obj["spec"], "spec")),
        ("", "persistentvolumeclaims") => errs.extend(claim_spec(&obj["spec"], "spec")),
        ("", "persistentvolumes") => errs.extend(persistent_volume(obj)),
        ("storage.k8s.io", "storageclasses") => errs.extend(storage_class(obj)),
        ("", "configmaps") => errs.extend(config_map(obj)),
        ("", "secrets") => errs.extend(secret(obj)),
        ("", "services") => errs.extend(service::ports(&obj["spec"]["ports"], "spec.ports")),
        _ => {}
    }
    errs
}
