//! The admission plugins kube-apiserver runs on a create: in-use protection finalizers, the
//! default StorageClass, the ServiceAccount plugin (and its token volume), and a Service's
//! defaults and cluster IP.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::registry::ResourceDef;
use crate::apiserver::store::{ListOptions, Store};

/// The finalizers of kube's in-use protection: a claim stays until no running pod mounts it, a
/// volume until no claim is bound to it.
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";

/// Add the in-use protection finalizer of a created claim or volume (once).
pub(super) fn protect(def: &ResourceDef, obj: &mut Value) {
    let finalizer = match (def.group.as_str(), def.plural.as_str()) {
        ("", "persistentvolumeclaims") => PVC_PROTECTION,
        ("", "persistentvolumes") => PV_PROTECTION,
        _ => return,
    };
    let Some(meta) = obj["metadata"].as_object_mut() else {
        return;
    };
    let list = meta.entry("finalizers").or_insert_with(|| json!([]));
    if !list.is_array() {
        *list = json!([]);
    }
    if let Some(list) = list.as_array_mut()
        && !list.iter().any(|f| f == finalizer)
    {
        list.push(json!(finalizer));
    }
}

/// The DefaultStorageClass admission plugin: a claim created without `storageClassName` (absent,
/// not `""`) gets the default class; with several defaults, the newest, as Kubernetes picks.
pub(super) fn default_storage_class(store: &Store, claim: &mut Value) {
    if !claim["spec"]["storageClassName"].is_null() {
        return;
    }
    let Some(classes) = store
        .registry()
        .get("storage.k8s.io", "v1", "storageclasses")
        .cloned()
    else {
        return;
    };
    let (items, _, _) = store.list(&classes, None, &ListOptions::default());
    let default = items
        .iter()
        .filter(|c| {
            let a = &c["metadata"]["annotations"];
            a["storageclass.kubernetes.io/is-default-class"] == "true"
                || a["storageclass.beta.kubernetes.io/is-default-class"] == "true"
        })
        .max_by_key(|c| {
            (
                c["metadata"]["creationTimestamp"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                c["metadata"]["name"].as_str().unwrap_or("").to_string(),
            )
        });
    if let (Some(class), Some(spec)) = (default, claim["spec"].as_object_mut()) {
        spec.insert("storageClassName".into(), class["metadata"]["name"].clone());
    }
}

/// Where a pod's ServiceAccount credentials are mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The lifetime the ServiceAccount admission plugin asks for a pod's token (kube's 3607 s).
const POD_TOKEN_SECONDS: i64 = 3607;

/// kube's ServiceAccount admission plugin on a new pod: it runs as `default` unless it names
/// another ServiceAccount, which must exist; unless the pod or its ServiceAccount opts out
/// (`automountServiceAccountToken: false`), a projected volume with a token bound to the pod,
/// the cluster CA and the namespace is mounted at [`SERVICE_ACCOUNT_DIR`] in every container.
pub(super) fn admit_service_account(store: &Store, ns: &str, pod: &mut Value) -> ApiResult<()> {
    if !pod["spec"].is_object() {
        return Ok(());
    }
    let account = pod["spec"]["serviceAccountName"]
        .as_str()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            pod["spec"]["serviceAccount"]
                .as_str()
                .filter(|s| !s.is_empty())
        })
        .unwrap_or(crate::apiserver::store::DEFAULT_SERVICE_ACCOUNT)
        .to_string();
    pod["spec"]["serviceAccountName"] = json!(account);
    pod["spec"]["serviceAccount"] = json!(account);
    let def = store
        .registry()
        .get("", "v1", "serviceaccounts")
        .cloned()
        .ok_or_else(ApiError::path_not_found)?;
    let found = store.get(&def, ns, &account).map_err(|_| {
        let name = pod["metadata"]["name"].as_str().unwrap_or("");
        ApiError::forbidden(format!(
            "pods {name:?} is forbidden: error looking up service account {ns}/{account}: serviceaccount {account:?} not found"
        ))
    })?;
    let automount = pod["spec"]["automountServiceAccountToken"]
        .as_bool()
        .or_else(|| found["automountServiceAccountToken"].as_bool())
        .unwrap_or(true);
    if !automount {
        return Ok(());
    }
    let mounted = |c: &Value| {
        c["volumeMounts"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["mountPath"] == SERVICE_ACCOUNT_DIR))
    };
    let volume = format!(
        "kube-api-access-{}",
        &crate::apiserver::auth::random_hex(3)[..5]
    );
    let mut needed = false;
    for list in ["initContainers", "containers"] {
        for c in pod["spec"][list].as_array_mut().into_iter().flatten() {
            if !c.is_object() || mounted(c) {
                continue;
            }
            needed = true;
            let mount = json!({"name": volume, "readOnly": true, "mountPath": SERVICE_ACCOUNT_DIR});
            match c["volumeMounts"].as_array_mut() {
                Some(mounts) => mounts.push(mount),
                None => c["volumeMounts"] = json!([mount]),
            }
        }
    }
    if needed {
        let projected = json!({"name": volume, "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": POD_TOKEN_SECONDS, "path": "token"}},
            {"configMap": {"name": crate::apiserver::store::ROOT_CA_CONFIG_MAP,
                "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}});
        match pod["spec"]["volumes"].as_array_mut() {
            Some(volumes) => volumes.push(projected),
            None => pod["spec"]["volumes"] = json!([projected]),
        }
    }
    Ok(())
}

/// Where Services' cluster IPs come from (kube's `--service-cluster-ip-range`; all of
/// 127.0.0.0/8 is local here, so a forwarder can listen on each).
pub const SERVICE_RANGE: (u32, u32) = (0x7f60_0000, 12);

/// kube's Service REST on create: the defaults (type ClusterIP, TCP, `targetPort` = `port`,
/// session affinity None) and a cluster IP from [`SERVICE_RANGE`], picked at random among the
/// free ones, as kube's allocator does; one asked for must be free.
pub(super) fn allocate_cluster_ip(store: &Store, svc: &mut Value) -> ApiResult<()> {
    if !svc["spec"].is_object() {
        return Ok(());
    }
    let spec = &mut svc["spec"];
    if spec["type"].as_str().is_none_or(str::is_empty) {
        spec["type"] = json!("ClusterIP");
    }
    if spec["sessionAffinity"].is_null() {
        spec["sessionAffinity"] = json!("None");
    }
    for port in spec["ports"].as_array_mut().into_iter().flatten() {
        if port["protocol"].is_null() {
            port["protocol"] = json!("TCP");
        }
        if port["targetPort"].is_null() {
            port["targetPort"] = port["port"].clone();
        }
    }
    if spec["type"] == "ExternalName" {
        return Ok(());
    }
    let asked = spec["clusterIP"].as_str().unwrap_or("").to_string();
    if asked == "None" {
        spec["clusterIPs"] = json!(["None"]);
        return Ok(());
    }
    let def = store
        .registry()
        .get("", "v1", "services")
        .cloned()
        .ok_or_else(ApiError::path_not_found)?;
    let (services, _, _) = store.list(&def, None, &ListOptions::default());
    let used: BTreeSet<String> = services
        .iter()
        .filter_map(|s| s["spec"]["clusterIP"].as_str().map(str::to_string))
        .collect();
    let name = svc["metadata"]["name"].as_str().unwrap_or("").to_string();
    let ip = if asked.is_empty() {
        let (base, bits) = SERVICE_RANGE;
        let size = 1u32 << (32 - bits);
        let start =
            u32::from_str_radix(&crate::apiserver::auth::random_hex(4), 16).unwrap_or(0) % size;
        (0..size)
            .map(|i| std::net::Ipv4Addr::from(base + (start + i) % size))
            // Neither the network's address nor its broadcast, as kube leaves them.
            .filter(|ip| !matches!(u32::from(*ip) - base, 0) && u32::from(*ip) - base != size - 1)
            .map(|ip| ip.to_string())
            .find(|ip| !used.contains(ip))
            .ok_or_else(|| ApiError::internal("no cluster IP is free"))?
    } else {
        if asked.parse::<std::net::Ipv4Addr>().is_err() {
            return Err(ApiError::invalid(
                "Service",
                &name,
                vec![(
                    "spec.clusterIPs[0]".into(),
                    format!(
                        "Invalid value: {asked:?}: must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
                    ),
                )],
            ));
        }
        if used.contains(&asked) {
            return Err(ApiError::invalid(
                "Service",
                &name,
                vec![(
                    "spec.clusterIPs".into(),
                    format!(
                        "Invalid value: []string{{{asked:?}}}: failed to allocate IP {asked}: provided IP is already allocated"
                    ),
                )],
            ));
        }
        asked
    };
    svc["spec"]["clusterIP"] = json!(ip);
    svc["spec"]["clusterIPs"] = json!([ip]);
    svc["spec"]["ipFamilies"] = json!(["IPv4"]);
    svc["spec"]["ipFamilyPolicy"] = json!("SingleStack");
    Ok(())
}
