//! PersistentVolumes: their spec (access modes, capacity, reclaim policy, node affinity, classes),
//! their defaults, and what an update may change.

use serde_json::Value;

use super::field::{BadValue, ErrorType, FieldError, go_quote};
use super::selectors::node_selector;
use super::volume_fields::{access_modes, class_name, semantic, volume_mode};

const PV_RECLAIM_POLICIES: &[&str] = &["Delete", "Recycle", "Retain"];
/// ValidatePersistentVolumeSpec's access modes, capacity, reclaim policy and volume mode.
pub fn persistent_volume(obj: &Value) -> Vec<FieldError> {
    let spec = &obj["spec"];
    let mut out = Vec::new();
    access_modes(spec, "spec", "", &mut out);
    let capacity = spec["capacity"].as_object();
    let keys: Vec<&String> = capacity.map(|c| c.keys().collect()).unwrap_or_default();
    if keys.is_empty() {
        out.push(FieldError::required("spec.capacity", ""));
    }
    if !keys.iter().any(|k| *k == "storage") || keys.len() > 1 {
        // Go's `%#v` of the ResourceList (quantities elided).
        let shown = if keys.is_empty() {
            "core.ResourceList(nil)".to_string()
        } else {
            let entries: Vec<String> = keys
                .iter()
                .map(|k| format!("{}:resource.Quantity{{...}}", go_quote(k)))
                .collect();
            format!("core.ResourceList{{{}}}", entries.join(", "))
        };
        out.push(FieldError::not_supported(
            "spec.capacity",
            BadValue::Raw(shown),
            &["storage"],
        ));
    }
    for (key, value) in capacity.into_iter().flatten() {
        let at = format!("spec.capacity[{key}]");
        if let Some(q) = value
            .as_str()
            .and_then(|t| t.trim().parse::<k8s_rules::Quantity>().ok())
            && q.nanos() <= 0
        {
            out.push(FieldError::invalid(
                &at,
                &q.to_string(),
                "must be greater than zero",
            ));
        }
    }
    if let Some(policy) = spec["persistentVolumeReclaimPolicy"].as_str()
        && !policy.is_empty()
        && !PV_RECLAIM_POLICIES.contains(&policy)
    {
        out.push(FieldError::not_supported(
            "spec.persistentVolumeReclaimPolicy",
            BadValue::Str(policy.into()),
            PV_RECLAIM_POLICIES,
        ));
    }
    // validateVolumeNodeAffinity; a local volume needs one.
    if spec["local"].is_object() && !spec["nodeAffinity"].is_object() {
        out.push(FieldError::required(
            "spec.nodeAffinity",
            "Local volume requires node affinity",
        ));
    }
    if spec["nodeAffinity"].is_object() {
        let required = &spec["nodeAffinity"]["required"];
        if required.is_object() {
            node_selector(required, "spec.nodeAffinity.required", &mut out);
        } else {
            out.push(FieldError::required(
                "spec.nodeAffinity.required",
                "must specify required node constraints",
            ));
        }
    }
    if let Some(class) = spec["storageClassName"].as_str().filter(|c| !c.is_empty()) {
        class_name(class, "spec.storageClassName", &mut out);
    }
    volume_mode(spec, "spec", &mut out);
    if let Some(class) = spec["volumeAttributesClassName"].as_str() {
        let at = "spec.volumeAttributesClassName";
        if class.is_empty() {
            out.push(FieldError::required(at, "an empty string is disallowed"));
        } else {
            class_name(class, at, &mut out);
        }
        if !spec["csi"].is_object() {
            out.push(FieldError::required(
                "spec.csi",
                "has to be specified when using volumeAttributesClassName",
            ));
        }
    }
    out
}

/// SetDefaults_PersistentVolume: reclaim policy Retain, volume mode Filesystem, phase Pending.
pub fn default_persistent_volume(obj: &mut Value) {
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    let spec = map
        .entry("spec")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Some(spec) = spec.as_object_mut() {
        if spec
            .get("persistentVolumeReclaimPolicy")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            spec.insert("persistentVolumeReclaimPolicy".into(), "Retain".into());
        }
        if spec.get("volumeMode").is_none_or(Value::is_null) {
            spec.insert("volumeMode".into(), "Filesystem".into());
        }
    }
    let status = map
        .entry("status")
        .or_insert_with(|| Value::Object(Default::default()));
    if status.is_null() {
        *status = Value::Object(Default::default());
    }
    if let Some(status) = status.as_object_mut()
        && status
            .get("phase")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        status.insert("phase".into(), "Pending".into());
    }
}

/// The members of PersistentVolumeSpec's inlined PersistentVolumeSource: one volume type each.
const PV_SOURCES: &[&str] = &[
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "csi",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "glusterfs",
    "hostPath",
    "iscsi",
    "local",
    "nfs",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "rbd",
    "scaleIO",
    "storageos",
    "vsphereVolume",
];

/// kube's betaToGALabel: a PersistentVolume's node affinity may move a key from the beta label
/// to its GA one.
const BETA_TO_GA_LABELS: &[(&str, &str)] = &[
    (
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/zone",
    ),
    (
        "failure-domain.beta.kubernetes.io/region",
        "topology.kubernetes.io/region",
    ),
    ("beta.kubernetes.io/os", "kubernetes.io/os"),
    ("beta.kubernetes.io/arch", "kubernetes.io/arch"),
    (
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
    ),
];

/// `old`'s node affinity with every requirement key that `new` moved from a beta label to its
/// GA label rewritten to the GA key (getMaskNodeSelectorLabelChangeEqualities).
fn mask_beta_to_ga(old: &Value, new: &Value) -> Value {
    let mut masked = old.clone();
    let terms = |v: &Value| v["required"]["nodeSelectorTerms"].as_array().cloned();
    let (Some(new_terms), Some(old_terms)) = (terms(new), terms(old)) else {
        return masked;
    };
    for (i, (o, n)) in old_terms.iter().zip(&new_terms).enumerate() {
        let exprs = |t: &Value| {
            t["matchExpressions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        };
        for (j, (oe, ne)) in exprs(o).iter().zip(exprs(n).iter()).enumerate() {
            let (ok, nk) = (oe["key"].as_str(), ne["key"].as_str());
            if let (Some(ok), Some(nk)) = (ok, nk)
                && BETA_TO_GA_LABELS.contains(&(ok, nk))
            {
                masked["required"]["nodeSelectorTerms"][i]["matchExpressions"][j]["key"] =
                    Value::String(nk.into());
            }
        }
    }
    masked
}

/// ValidatePersistentVolumeUpdate's immutability rules (the spec's own rules are checked by
/// `persistent_volume` on every write): the volume source may not change (except setting a CSI
/// volume's controllerExpandSecretRef the first time), nor the volume mode, nor a node affinity
/// once set (except beta to GA label keys), and a volumeAttributesClassName may not be unset.
/// kube appends a cmp.Diff of the two sources to the first message; that diff is not rendered.
pub fn persistent_volume_update(old: &Value, new: &Value) -> Vec<FieldError> {
    let mut out = Vec::new();
    let source = |spec: &Value| -> Value {
        Value::Object(
            PV_SOURCES
                .iter()
                .filter_map(|k| spec.get(*k).map(|v| (k.to_string(), v.clone())))
                .collect(),
        )
    };
    let (old_source, mut new_source) = (source(&old["spec"]), source(&new["spec"]));
    let no_expand_ref =
        |s: &Value| s["csi"].is_object() && s["csi"]["controllerExpandSecretRef"].is_null();
    if no_expand_ref(&old_source)
        && new_source["csi"].is_object()
        && let Some(csi) = new_source["csi"].as_object_mut()
    {
        csi.remove("controllerExpandSecretRef");
    }
    if semantic(&old_source) != semantic(&new_source) {
        out.push(FieldError::forbidden(
            "spec.persistentvolumesource",
            "spec.persistentvolumesource is immutable after creation",
        ));
    }
    let (old_mode, new_mode) = (
        old["spec"]["volumeMode"].as_str(),
        new["spec"]["volumeMode"].as_str(),
    );
    if old_mode != new_mode {
        out.push(FieldError::invalid(
            "volumeMode",
            new_mode.unwrap_or("null"),
            "field is immutable",
        ));
    }
    let (old_affinity, new_affinity) = (&old["spec"]["nodeAffinity"], &new["spec"]["nodeAffinity"]);
    if !old_affinity.is_null()
        && semantic(&mask_beta_to_ga(old_affinity, new_affinity)) != semantic(new_affinity)
    {
        // Go prints the new *VolumeNodeAffinity with %#v; its pointer's address is elided.
        let shown = if new_affinity.is_object() {
            let required = if new_affinity["required"].is_object() {
                "..."
            } else {
                "nil"
            };
            BadValue::Raw(format!(
                "core.VolumeNodeAffinity{{Required:(*core.NodeSelector)({required})}}"
            ))
        } else {
            BadValue::Str("null".into())
        };
        out.push(FieldError::new(
            ErrorType::Invalid,
            "nodeAffinity",
            shown,
            "field is immutable, except for updating from beta label to GA",
        ));
    }
    if !old["spec"]["volumeAttributesClassName"].is_null()
        && new["spec"]["volumeAttributesClassName"].is_null()
    {
        out.push(FieldError::forbidden(
            "spec.volumeAttributesClassName",
            "update from non-nil value to nil is forbidden",
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::validation::testing::{SUBDOMAIN, bodies, def};
    use crate::apiserver::validation::validate;
    use serde_json::json;

    fn pv(spec: Value) -> Value {
        json!({"metadata": {"name": "pv"}, "spec": spec})
    }

    fn local_pv() -> Value {
        pv(
            json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "local": {"path": "/x"}, "volumeMode": "Filesystem",
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "failure-domain.beta.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}]}}}),
        )
    }

    /// `obj` with the field at `pointer` set (its parent exists).
    fn with(mut obj: Value, pointer: &str, value: Value) -> Value {
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        match obj.pointer_mut(parent).unwrap() {
            Value::Array(items) => items[key.parse::<usize>().unwrap()] = value,
            other => other[key] = value,
        }
        obj
    }

    #[test]
    fn volumes_source_mode_and_node_affinity_are_immutable() {
        let old = local_pv();
        assert!(persistent_volume_update(&old, &old).is_empty());
        let moved = with(old.clone(), "/spec/local/path", json!("/y"));
        assert_eq!(
            bodies(&persistent_volume_update(&old, &moved)),
            [
                "spec.persistentvolumesource: Forbidden: spec.persistentvolumesource is immutable after creation"
            ]
        );
        let block = with(old.clone(), "/spec/volumeMode", json!("Block"));
        assert_eq!(
            bodies(&persistent_volume_update(&old, &block)),
            ["volumeMode: Invalid value: \"Block\": field is immutable"]
        );
        let elsewhere = with(
            old.clone(),
            "/spec/nodeAffinity/required/nodeSelectorTerms/0/matchExpressions/0/values",
            json!(["b"]),
        );
        assert_eq!(
            bodies(&persistent_volume_update(&old, &elsewhere)),
            [
                "nodeAffinity: Invalid value: core.VolumeNodeAffinity{Required:(*core.NodeSelector)(...)}: field is immutable, except for updating from beta label to GA"
            ]
        );
        let dropped = with(old.clone(), "/spec/nodeAffinity", Value::Null);
        assert_eq!(
            bodies(&persistent_volume_update(&old, &dropped)),
            [
                "nodeAffinity: Invalid value: \"null\": field is immutable, except for updating from beta label to GA"
            ]
        );
        // Beta to GA keys is the one change allowed; setting an affinity where none was is too.
        let ga = with(
            old.clone(),
            "/spec/nodeAffinity/required/nodeSelectorTerms/0/matchExpressions/0/key",
            json!("topology.kubernetes.io/zone"),
        );
        assert!(persistent_volume_update(&old, &ga).is_empty());
        assert!(persistent_volume_update(&dropped, &old).is_empty());
        // A CSI volume may get its controllerExpandSecretRef once; the reclaim policy may change.
        let csi = pv(json!({"csi": {"driver": "d", "volumeHandle": "h"}}));
        let expand = with(
            csi.clone(),
            "/spec/csi",
            json!({"driver": "d", "volumeHandle": "h", "controllerExpandSecretRef": {"name": "s"}}),
        );
        assert!(persistent_volume_update(&csi, &expand).is_empty());
        assert_eq!(persistent_volume_update(&expand, &csi).len(), 1);
        let retained = with(
            old.clone(),
            "/spec/persistentVolumeReclaimPolicy",
            json!("Retain"),
        );
        assert!(persistent_volume_update(&old, &retained).is_empty());
        let classed = with(
            csi.clone(),
            "/spec/volumeAttributesClassName",
            json!("gold"),
        );
        assert_eq!(
            bodies(&persistent_volume_update(&classed, &csi)),
            [
                "spec.volumeAttributesClassName: Forbidden: update from non-nil value to nil is forbidden"
            ]
        );
    }

    #[test]
    fn volumes_are_defaulted_as_kube_defaults_them() {
        let mut v = pv(json!({"capacity": {"storage": "1Gi"}}));
        default_persistent_volume(&mut v);
        assert_eq!(v["spec"]["persistentVolumeReclaimPolicy"], "Retain");
        assert_eq!(v["spec"]["volumeMode"], "Filesystem");
        assert_eq!(v["status"]["phase"], "Pending");
        let mut kept =
            pv(json!({"persistentVolumeReclaimPolicy": "Delete", "volumeMode": "Block"}));
        kept["status"] = json!({"phase": "Bound"});
        let before = kept.clone();
        default_persistent_volume(&mut kept);
        assert_eq!(kept, before);
    }

    #[test]
    fn volume_node_affinity_class_names_and_attributes_class() {
        let pvs = def("", "persistentvolumes");
        let base = local_pv();
        assert!(validate(&pvs, &base, true).is_empty());
        let unplaced = with(base.clone(), "/spec/nodeAffinity", Value::Null);
        assert_eq!(
            bodies(&validate(&pvs, &unplaced, true)),
            ["spec.nodeAffinity: Required value: Local volume requires node affinity"]
        );
        let no_required = with(base.clone(), "/spec/nodeAffinity", json!({}));
        assert_eq!(
            bodies(&validate(&pvs, &no_required, true)),
            ["spec.nodeAffinity.required: Required value: must specify required node constraints"]
        );
        let no_terms = with(
            base.clone(),
            "/spec/nodeAffinity/required",
            json!({"nodeSelectorTerms": []}),
        );
        assert_eq!(
            bodies(&validate(&pvs, &no_terms, true)),
            [
                "spec.nodeAffinity.required.nodeSelectorTerms: Required value: must have at least one node selector term"
            ]
        );
        let bad_terms = with(
            base.clone(),
            "/spec/nodeAffinity/required/nodeSelectorTerms",
            json!([{"matchExpressions": [
                {"key": "zone", "operator": "In"},
                {"key": "zone", "operator": "Exists", "values": ["a"]},
                {"key": "size", "operator": "Gt", "values": ["1", "2"]},
                {"key": "-bad", "operator": "Near", "values": ["a b"]}],
              "matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["a", "b"]}]}]),
        );
        assert_eq!(
            bodies(&validate(&pvs, &bad_terms, true)),
            [
                "spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'",
                "spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[1].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                "spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[2].values: Required value: must be specified single value when `operator` is 'Lt' or 'Gt'",
                "spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[3].operator: Invalid value: \"Near\": not a valid selector operator",
                "spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[3].key: Invalid value: \"-bad\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
                "spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[3].values[0]: Invalid value: \"a b\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
                "spec.nodeAffinity.required.nodeSelectorTerms[0].matchFields[0].values: Required value: must be only one value when `operator` is 'In' or 'NotIn' for node field selector",
                "spec.nodeAffinity.required.nodeSelectorTerms[0].matchFields[0].key: Invalid value: \"metadata.uid\": not a valid field selector key",
            ]
        );
        let classes = with(
            with(base.clone(), "/spec/storageClassName", json!("Gold")),
            "/spec/volumeAttributesClassName",
            json!(""),
        );
        assert_eq!(
            bodies(&validate(&pvs, &classes, true)),
            [
                format!("spec.storageClassName: Invalid value: \"Gold\": {SUBDOMAIN}"),
                "spec.volumeAttributesClassName: Required value: an empty string is disallowed".to_string(),
                "spec.csi: Required value: has to be specified when using volumeAttributesClassName".to_string(),
            ]
        );
    }
}
