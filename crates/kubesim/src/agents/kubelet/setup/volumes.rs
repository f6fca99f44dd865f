//! A pod's volumes on the host: claims resolved to their volumes' directories or block files;
//! Secret, ConfigMap, downward API, projected and emptyDir volumes written under the pod's
//! directory (and Secrets and ConfigMaps kept up to date while it runs); host paths as they are.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Volume};
use kube::{Api, Client};

use super::blocked::{Blocked, io_blocked};
use super::dirs::{HostVolume, PodDir};
use super::files::{holds, write_files};
use super::sources::{config_map_data, field, pod_ns, secret_data, select};
use super::tokens::service_account_token;
use crate::agents::volumes::{CSI_DRIVER, SHARED_DRIVER};

async fn claim_volume(client: &Client, ns: &str, claim: &str) -> Result<HostVolume, Blocked> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pvc = claims
        .get_opt(claim)
        .await
        .map_err(|e| Blocked::Waiting(format!("reading claim {ns}/{claim}: {e}")))?
        .ok_or_else(|| Blocked::Waiting(format!("persistentvolumeclaim \"{claim}\" not found")))?;
    // A claim being deleted is kept only for the pods already running with it.
    if pvc.metadata.deletion_timestamp.is_some() {
        return Err(Blocked::Waiting(format!(
            "can't start pod because PVC {ns}/{claim} is being deleted"
        )));
    }
    let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let name = pvc.spec.as_ref().and_then(|s| s.volume_name.clone());
    let (true, Some(name)) = (bound, name) else {
        return Err(Blocked::Waiting(format!(
            "waiting for persistentvolumeclaim \"{claim}\" to be bound"
        )));
    };
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get_opt(&name)
        .await
        .map_err(|e| Blocked::Waiting(format!("reading volume {name}: {e}")))?
        .ok_or_else(|| Blocked::Waiting(format!("persistentvolume \"{name}\" not found")))?;
    let path = crate::agents::volumes::volume_path(&pv).ok_or_else(|| {
        Blocked::Config(format!(
            "persistentvolume \"{name}\" (of claim \"{claim}\") has no source the cdi dev \
             kubelet can mount: it mounts hostPath, local, {CSI_DRIVER} and {SHARED_DRIVER} volumes"
        ))
    })?;
    let block = pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block");
    let capacity = pv
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref()?.get("storage"))
        .and_then(|q| k8s_rules::Quantity::try_from(q).ok())
        .map(|q| q.value().max(0) as u64);
    Ok(HostVolume {
        path,
        block,
        capacity,
    })
}

/// Bring a running pod's Secret and ConfigMap volumes up to date, as the kubelet's periodic
/// sync does (an operator rotating a certificate relies on it); what cannot be read now is
/// left as it is.
pub async fn refresh_volumes(client: &Client, pod: &Pod, dir: &PodDir) {
    let ns = pod_ns(pod);
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let Some(Ok((files, mode, what))) = object_files(client, ns, v).await else {
            continue;
        };
        let here = dir.volume(&v.name);
        if holds(&here, &files) {
            continue;
        }
        match write_files(&here, &files, Some(mode)) {
            Ok(()) => tracing::info!(volume = %v.name, source = %what, "updated a volume"),
            Err(e) => tracing::warn!(volume = %v.name, error = %e, "updating a volume"),
        }
    }
}

/// The files of a Secret or ConfigMap volume (None for other volumes), with their mode and
/// the object they come from.
async fn object_files(
    client: &Client,
    ns: &str,
    v: &Volume,
) -> Option<Result<(BTreeMap<String, Vec<u8>>, i32, String), Blocked>> {
    let (data, items, what, mode, optional) = if let Some(s) = &v.secret {
        let name = s.secret_name.as_deref().unwrap_or("");
        let optional = s.optional.unwrap_or(false);
        (
            secret_data(client, ns, name, optional).await,
            s.items.as_ref(),
            format!("Secret {ns}/{name}"),
            s.default_mode.unwrap_or(0o644),
            optional,
        )
    } else if let Some(c) = &v.config_map {
        let optional = c.optional.unwrap_or(false);
        (
            config_map_data(client, ns, &c.name, optional).await,
            c.items.as_ref(),
            format!("ConfigMap {ns}/{}", c.name),
            c.default_mode.unwrap_or(0o644),
            optional,
        )
    } else {
        return None;
    };
    Some(data.and_then(|data| {
        let files = select(data.unwrap_or_default(), items, &what, optional)?;
        Ok((files, mode, what))
    }))
}

/// Whether the pod has volumes [`refresh_volumes`] keeps up to date.
pub fn has_refreshed_volumes(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .any(|v| v.secret.is_some() || v.config_map.is_some())
}

/// The pod's volumes on the host; Secret, ConfigMap, downward API and emptyDir volumes are
/// written under the pod's directory now.
pub async fn volumes(
    client: &Client,
    pod: &Pod,
    dir: &PodDir,
    pod_ip: Ipv4Addr,
    host_ip: Ipv4Addr,
) -> Result<HashMap<String, HostVolume>, Blocked> {
    let ns = pod_ns(pod);
    let mut out = HashMap::new();
    let empty = Vec::new();
    let specs: &Vec<Volume> = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .unwrap_or(&empty);
    for v in specs {
        let here = dir.volume(&v.name);
        let write = |files: &BTreeMap<String, Vec<u8>>, mode: Option<i32>| {
            write_files(&here, files, mode)
                .map_err(|e| Blocked::Config(format!("writing volume \"{}\": {e}", v.name)))?;
            Ok::<_, Blocked>(HostVolume {
                path: here.clone(),
                block: false,
                capacity: None,
            })
        };
        let volume = if let Some(c) = &v.persistent_volume_claim {
            claim_volume(client, ns, &c.claim_name).await?
        } else if let Some(found) = object_files(client, ns, v).await {
            let (files, mode, _) = found?;
            write(&files, Some(mode))?
        } else if let Some(d) = &v.downward_api {
            let mut files = BTreeMap::new();
            for item in d.items.iter().flatten() {
                let Some(f) = &item.field_ref else {
                    return Err(Blocked::Config(format!(
                        "volume \"{}\": only fieldRef items are supported by the cdi dev kubelet",
                        v.name
                    )));
                };
                files.insert(
                    item.path.clone(),
                    field(pod, pod_ip, host_ip, f)?.into_bytes(),
                );
            }
            write(&files, d.default_mode)?
        } else if let Some(p) = &v.projected {
            let mut files = BTreeMap::new();
            for source in p.sources.iter().flatten() {
                files
                    .extend(projected_source(client, pod, pod_ip, host_ip, &v.name, source).await?);
            }
            write(&files, Some(p.default_mode.unwrap_or(0o644)))?
        } else if v.empty_dir.is_some() {
            std::fs::create_dir_all(&here).map_err(|e| io_blocked("creating an emptyDir", e))?;
            HostVolume {
                path: here,
                block: false,
                capacity: None,
            }
        } else if let Some(h) = &v.host_path {
            HostVolume {
                path: h.path.clone().into(),
                block: false,
                capacity: None,
            }
        } else {
            return Err(Blocked::Config(format!(
                "volume \"{}\" is of a type the cdi dev kubelet does not mount: it mounts \
                 persistentVolumeClaim, secret, configMap, downwardAPI, projected, emptyDir and \
                 hostPath",
                v.name
            )));
        };
        out.insert(v.name.clone(), volume);
    }
    Ok(out)
}

/// The files of one source of a projected volume: a Secret's or ConfigMap's keys, downward API
/// fields, or a ServiceAccount token bound to the pod (asked of the API server as the kubelet
/// asks it, with a TokenRequest).
async fn projected_source(
    client: &Client,
    pod: &Pod,
    pod_ip: Ipv4Addr,
    host_ip: Ipv4Addr,
    volume: &str,
    source: &k8s_openapi::api::core::v1::VolumeProjection,
) -> Result<BTreeMap<String, Vec<u8>>, Blocked> {
    let ns = pod_ns(pod);
    if let Some(s) = &source.secret {
        let optional = s.optional.unwrap_or(false);
        let data = secret_data(client, ns, &s.name, optional).await?;
        return select(
            data.unwrap_or_default(),
            s.items.as_ref(),
            &format!("Secret {ns}/{}", s.name),
            optional,
        );
    }
    if let Some(c) = &source.config_map {
        let optional = c.optional.unwrap_or(false);
        let data = config_map_data(client, ns, &c.name, optional).await?;
        return select(
            data.unwrap_or_default(),
            c.items.as_ref(),
            &format!("ConfigMap {ns}/{}", c.name),
            optional,
        );
    }
    if let Some(d) = &source.downward_api {
        let mut files = BTreeMap::new();
        for item in d.items.iter().flatten() {
            let Some(f) = &item.field_ref else {
                return Err(Blocked::Config(format!(
                    "volume \"{volume}\": only fieldRef items are supported by the cdi dev kubelet"
                )));
            };
            files.insert(
                item.path.clone(),
                field(pod, pod_ip, host_ip, f)?.into_bytes(),
            );
        }
        return Ok(files);
    }
    if let Some(t) = &source.service_account_token {
        let token = service_account_token(client, pod, t).await?;
        return Ok(BTreeMap::from([(t.path.clone(), token.into_bytes())]));
    }
    Err(Blocked::Config(format!(
        "volume \"{volume}\": a projected source of a kind the cdi dev kubelet does not write \
         (it writes secret, configMap, downwardAPI and serviceAccountToken)"
    )))
}
