//! ServiceAccount tokens in projected volumes: asked of the API server as the kubelet asks
//! them (a TokenRequest bound to the pod), and renewed before they expire.

use k8s_openapi::api::core::v1::{Pod, Volume};
use kube::{Api, Client};

use super::blocked::Blocked;
use super::dirs::PodDir;
use super::paths::relative;
use super::sources::pod_ns;

/// A token of the pod's ServiceAccount, bound to the pod, for `source`'s audience and lifetime.
pub(super) async fn service_account_token(
    client: &Client,
    pod: &Pod,
    source: &k8s_openapi::api::core::v1::ServiceAccountTokenProjection,
) -> Result<String, Blocked> {
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, TokenRequest, TokenRequestSpec,
    };
    let ns = pod_ns(pod);
    let account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into());
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: source.audience.clone().into_iter().collect(),
            expiration_seconds: source.expiration_seconds,
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    };
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), ns);
    let answer = accounts
        .create_token_request(&account, &Default::default(), &request)
        .await
        .map_err(|e| {
            Blocked::Waiting(format!(
                "requesting a token of ServiceAccount {ns}/{account}: {e}"
            ))
        })?;
    answer
        .status
        .map(|s| s.token)
        .ok_or_else(|| Blocked::Waiting(format!("no token for ServiceAccount {ns}/{account}")))
}

/// The ServiceAccount token sources of a pod's projected volumes.
fn token_sources(
    pod: &Pod,
) -> impl Iterator<
    Item = (
        &Volume,
        Option<i32>,
        &k8s_openapi::api::core::v1::ServiceAccountTokenProjection,
    ),
> {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    volumes.into_iter().flatten().flat_map(|v| {
        let p = v.projected.as_ref();
        let sources = p.and_then(|p| p.sources.as_ref()).into_iter().flatten();
        sources.filter_map(move |s| {
            let t = s.service_account_token.as_ref()?;
            Some((v, p.and_then(|p| p.default_mode), t))
        })
    })
}

/// The shortest lifetime of the pod's projected tokens, in seconds (kube's minimum is 600).
pub fn token_lifetime(pod: &Pod) -> Option<u64> {
    token_sources(pod)
        .map(|(_, _, t)| t.expiration_seconds.unwrap_or(3600).max(600) as u64)
        .min()
}

/// Write fresh ServiceAccount tokens into the pod's projected volumes, as the kubelet renews
/// them before they expire. Each file is replaced by a rename inside its directory, which a
/// container may have mounted.
pub async fn renew_tokens(client: &Client, pod: &Pod, dir: &PodDir) {
    use std::os::unix::fs::PermissionsExt;
    for (v, mode, t) in token_sources(pod) {
        let Ok(token) = service_account_token(client, pod, t).await else {
            continue;
        };
        let Ok(rel) = relative(&t.path) else { continue };
        let path = dir.volume(&v.name).join(rel);
        let fresh = path.with_extension("renewing");
        let written = std::fs::write(&fresh, token.as_bytes())
            .and_then(|()| {
                let mode = mode.unwrap_or(0o644) as u32 & 0o777;
                std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(mode))
            })
            .and_then(|()| std::fs::rename(&fresh, &path));
        if let Err(e) = written {
            tracing::warn!(volume = %v.name, error = %e, "renewing a token");
        }
    }
}
