//! Small operations on API objects that several controllers do the same way: read the live
//! object, create and delete idempotently, finalizers, snapshots, handing a volume over, patches.

use kube::Client;

use crate::runtime::error::Error;

/// `obj` as the API server holds it now, if it is still the same object (same uid) and not being
/// deleted. A reflector's cache can still hold an object that was just deleted, or an older
/// version of it; what a controller creates for it (with an owner reference to it) would be made
/// for nothing, or for a state already past, so creations ask first.
pub async fn live<K>(client: &Client, obj: &K) -> Result<Option<K>, kube::Error>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let ns = obj.meta().namespace.as_deref().unwrap_or_default();
    let api: kube::Api<K> = kube::Api::namespaced(client.clone(), ns);
    let name = obj.meta().name.as_deref().unwrap_or_default();
    Ok(api.get_opt(name).await?.filter(|live| {
        live.meta().uid == obj.meta().uid && live.meta().deletion_timestamp.is_none()
    }))
}

/// Create `object`; already there is fine (a pass that failed half way is repeated).
pub async fn create<K>(api: &kube::Api<K>, object: &K) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&kube::api::PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Delete object `name`; already gone is fine.
pub async fn delete<K>(api: &kube::Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &kube::api::DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Add or remove `name` among the object's finalizers (conditional on the version read, so a
/// concurrent change is not lost).
pub(crate) async fn set_finalizer<K>(
    api: &kube::Api<K>,
    object: &K,
    name: &str,
    present: bool,
) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    use kube::ResourceExt;
    let mut list = object.finalizers().to_vec();
    if list.iter().any(|f| f == name) == present {
        return Ok(());
    }
    if present {
        list.push(name.to_string());
    } else {
        list.retain(|f| f != name);
    }
    let patch = serde_json::json!({"metadata": {"finalizers": list,
        "resourceVersion": object.meta().resource_version}});
    api.patch(
        &object.name_any(),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// A kind of the snapshot API (`snapshot.storage.k8s.io/v1`), read as dynamic objects: the
/// controller does not depend on the snapshot CRDs being installed.
pub(crate) fn snapshot_api(kind: &str, plural: &str) -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: "snapshot.storage.k8s.io".into(),
        version: "v1".into(),
        api_version: "snapshot.storage.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// The VolumeSnapshot `namespace/name`, if it exists (and the snapshot API is served).
pub(crate) async fn get_snapshot(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<kube::api::DynamicObject>, Error> {
    let snapshots: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(
        client.clone(),
        namespace,
        &snapshot_api("VolumeSnapshot", "volumesnapshots"),
    );
    Ok(snapshots.get_opt(name).await?)
}

/// What `snapshot` says about itself: the CSI driver that took it and the volume mode of what
/// it was taken of (its bound VolumeSnapshotContent's, when known), its restore size (0 while
/// it has none).
pub(crate) async fn snapshot_source(
    client: &Client,
    snapshot: &kube::api::DynamicObject,
) -> Result<cdi_core::clone::SnapshotSource, Error> {
    let mut found = cdi_core::clone::SnapshotSource {
        driver: None,
        volume_mode: None,
        restore_size: cdi_core::clonepop::restore_size(&snapshot.data).unwrap_or(0),
    };
    let Some(content) = snapshot.data["status"]["boundVolumeSnapshotContentName"].as_str() else {
        return Ok(found);
    };
    let contents: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(
        client.clone(),
        &snapshot_api("VolumeSnapshotContent", "volumesnapshotcontents"),
    );
    if let Some(c) = contents.get_opt(content).await? {
        let spec = &c.data["spec"];
        found.driver = spec["driver"].as_str().map(String::from);
        found.volume_mode = spec["sourceVolumeMode"]
            .as_str()
            .map(|m| cdi_core::size::resolve_volume_mode(Some(m)));
    }
    Ok(found)
}

/// Hand `volume` over to `target` (the PV's `claimRef` switched, no data copied): how every
/// populator gives its target the volume its temporary claim filled.
pub(crate) async fn hand_over(
    client: &Client,
    volume: &str,
    target: &k8s_openapi::api::core::v1::PersistentVolumeClaim,
) -> Result<(), kube::Error> {
    use kube::ResourceExt;
    let claim_ref = serde_json::json!({"spec": {"claimRef": {"apiVersion": "v1",
        "kind": "PersistentVolumeClaim", "namespace": target.namespace(), "name": target.name_any(),
        "uid": target.metadata.uid, "resourceVersion": null}}});
    kube::Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(client.clone())
        .patch(
            volume,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&claim_ref),
        )
        .await?;
    tracing::info!(target = %format!("{}/{}", target.namespace().unwrap_or_default(), target.name_any()),
        volume = %volume, "rebound the volume to the target");
    Ok(())
}

/// Write the annotations (and add the labels) that differ from the claim's.
pub async fn patch_claim(
    claims: &kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim>,
    claim: &k8s_openapi::api::core::v1::PersistentVolumeClaim,
    anns: &std::collections::BTreeMap<String, String>,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<(), kube::Error> {
    use kube::ResourceExt;
    let changed = cdi_core::import::annotation_patch(claim.annotations(), anns, false);
    let new_labels = cdi_core::import::annotation_patch(claim.labels(), labels, false);
    if changed.is_empty() && new_labels.is_empty() {
        return Ok(());
    }
    let patch = serde_json::json!({"metadata": {"annotations": changed, "labels": new_labels}});
    claims
        .patch(
            &claim.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}

/// A merge patch that turns `old` into `new` exactly: what `new` leaves out is set to null, so a
/// field the new status no longer has (a proxy removed from the spec, a deleted class's overhead,
/// something a user wrote) goes instead of staying for ever.
pub fn merge_patch(old: &serde_json::Value, new: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut patch = serde_json::Map::new();
            for (k, nv) in n {
                match o.get(k) {
                    Some(ov) if ov == nv => {}
                    Some(ov) => {
                        patch.insert(k.clone(), merge_patch(ov, nv));
                    }
                    None => {
                        patch.insert(k.clone(), nv.clone());
                    }
                }
            }
            for k in o.keys().filter(|k| !n.contains_key(*k)) {
                patch.insert(k.clone(), Value::Null);
            }
            Value::Object(patch)
        }
        _ => new.clone(),
    }
}

/// The merge patch replacing an object's whole `status` with `new`.
pub fn status_patch<S: serde::Serialize>(
    old: Option<&S>,
    new: &S,
) -> Result<serde_json::Value, Error> {
    let json = |v| serde_json::to_value(v).map_err(|e| Error::Other(e.to_string()));
    let old = match old {
        Some(o) => json(o)?,
        None => serde_json::Value::Null,
    };
    Ok(serde_json::json!({"status": merge_patch(&old, &json(new)?)}))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn merge_patches_remove_what_the_new_value_leaves_out() {
        let old = json!({"importProxy": {"HTTPProxy": "http://x"}, "overhead": {"a": "0.1", "b": "0.2"},
            "list": [1, 2], "same": 1});
        let new = json!({"overhead": {"a": "0.1"}, "list": [1], "same": 1, "added": true});
        let patch = super::merge_patch(&old, &new);
        assert_eq!(
            patch,
            json!({"importProxy": null, "overhead": {"b": null}, "list": [1], "added": true})
        );
        // Applying it (RFC 7386) gives `new`.
        let mut applied = old.clone();
        merge(&mut applied, &patch);
        assert_eq!(applied, new);
    }

    fn merge(target: &mut serde_json::Value, patch: &serde_json::Value) {
        match patch {
            serde_json::Value::Object(p) => {
                if !target.is_object() {
                    *target = json!({});
                }
                let t = target.as_object_mut().unwrap();
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                    }
                }
            }
            _ => *target = patch.clone(),
        }
    }
}
