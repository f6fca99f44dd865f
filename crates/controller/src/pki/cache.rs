//! The upload path's certificate authorities as the controller reads them: made when missing,
//! read again when the operator rotated them.

use std::collections::BTreeMap;
use std::sync::Arc;

use cdi_pki::ca::Ca;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};

use kube::{Api, Client, ResourceExt};

use super::certs;
use super::names::*;
use crate::runtime::error::Error;

/// The upload path's certificate authorities as they are now, with the bundles that publish
/// them (the current CA and the older ones still valid).
pub struct UploadPki {
    pub(crate) server_ca: Ca,
    /// Signs the clients upload servers take: the proxy's, and each clone source pod's.
    pub(crate) client_ca: Ca,
    /// What a client of upload servers trusts them by.
    pub(crate) server_bundle: String,
    /// What an upload server trusts its clients by.
    pub(crate) client_bundle: String,
}

/// The CAs as last read, by the versions of the objects they were read from: read again when
/// those change, so a rotation by the operator is followed.
#[derive(Default)]
pub struct PkiCache {
    made: tokio::sync::OnceCell<()>,
    current: tokio::sync::Mutex<Option<(String, Arc<UploadPki>)>>,
}

impl PkiCache {
    /// The upload path's CAs in namespace `ns`, what is missing made first (once per leadership
    /// term).
    pub async fn get(&self, client: &Client, ns: &str) -> Result<Arc<UploadPki>, Error> {
        self.made.get_or_try_init(|| ensure_pki(client, ns)).await?;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        // The signers of the upload servers' certificates and of their clients'.
        let (server, clients) = (
            secrets.get(SERVER_SIGNER).await?,
            secrets.get(CLIENT_SIGNER).await?,
        );
        let (server_map, client_map) = (
            maps.get(SERVER_SIGNER_BUNDLE).await?,
            maps.get(CLIENT_SIGNER_BUNDLE).await?,
        );
        let version = [
            server.resource_version(),
            clients.resource_version(),
            server_map.resource_version(),
            client_map.resource_version(),
        ]
        .map(|v| v.unwrap_or_default())
        .join("/");
        let mut current = self.current.lock().await;
        if let Some((seen, pki)) = current.as_ref()
            && *seen == version
        {
            return Ok(pki.clone());
        }
        let ca = |s: &Secret| {
            let name = s.name_any();
            certs::pair_of(s)
                .and_then(|pair| Ca::from_pem(pair).ok())
                .ok_or_else(|| {
                    Error::Other(format!(
                        "Secret {ns}/{name} is not a usable CA; delete it to have it made again"
                    ))
                })
        };
        let bundle = |m: &ConfigMap| {
            m.data
                .as_ref()
                .and_then(|d| d.get(BUNDLE_KEY))
                .cloned()
                .unwrap_or_default()
        };
        let pki = Arc::new(UploadPki {
            server_ca: ca(&server)?,
            client_ca: ca(&clients)?,
            server_bundle: bundle(&server_map),
            client_bundle: bundle(&client_map),
        });
        *current = Some((version, pki.clone()));
        Ok(pki)
    }
}

/// Make what the upload path's certificates lack (the operator, when there is one, made them
/// already and rotates them) and the token signing key.
pub async fn ensure_pki(client: &kube::Client, ns: &str) -> Result<(), Error> {
    certs::Pass {
        client,
        ns,
        lifetimes: &certs::unmanaged(),
        owner: None,
        mode: certs::Mode::Missing,
        manager: "cdi-controller",
        report: None,
    }
    .run()
    .await?;
    ensure_signing_key(&Api::namespaced(client.clone(), ns)).await
}

/// The token signing key pair, made when missing.
async fn ensure_signing_key(secrets: &Api<Secret>) -> Result<(), Error> {
    if secrets.get_opt(SIGNING_KEY).await?.is_some() {
        return Ok(());
    }
    let (private, public) =
        cdi_pki::token::generate_key().map_err(|e| Error::Other(e.to_string()))?;
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(SIGNING_KEY.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (SIGNING_KEY_PRIVATE.into(), ByteString(private.into_bytes())),
            (SIGNING_KEY_PUBLIC.into(), ByteString(public.into_bytes())),
        ])),
        ..Default::default()
    };
    crate::objects::create(secrets, &secret).await?;
    Ok(())
}
