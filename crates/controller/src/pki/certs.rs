//! The certificates of CDI's own endpoints, under upstream's names: four CAs (Secrets
//! `cdi-apiserver-signer`, `cdi-uploadproxy-signer`, `cdi-uploadserver-signer`,
//! `cdi-uploadserver-client-signer`), each published in a bundle ConfigMap that keeps older CAs
//! until they expire, and the certificates they sign for `cdi apiserver`, the upload proxy and
//! the proxy's client identity. The operator makes them and makes again what cdi-upload's
//! `rotation` says is due, so nothing expires under a running install; a controller run without
//! an operator makes what is missing and leaves the rest.

use std::collections::BTreeMap;
use std::time::SystemTime;

use cdi_core::upload;
use cdi_pki::ca::{Ca, KeyPair};
use cdi_pki::rotation::{self, Lifetime, Lifetimes, Validity};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::pki::names::{
    API_CERT, API_SERVICE, API_SIGNER, API_SIGNER_BUNDLE, BUNDLE_KEY, CLIENT_CERT, CLIENT_SIGNER,
    CLIENT_SIGNER_BUNDLE, PROXY_CERT, PROXY_SERVICE, PROXY_SIGNER, PROXY_SIGNER_BUNDLE,
    SERVER_SIGNER, SERVER_SIGNER_BUNDLE,
};
use crate::runtime::error::Error;

/// What a pass does with certificates that exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Leave them: only what is missing is made (the controller without an operator).
    Missing,
    /// Make again what is due (the operator).
    Rotate,
}

enum Target {
    /// A serving certificate for the Service of that name.
    Serving(&'static str),
    /// A client certificate for that user.
    Client(&'static str),
}

struct Chain {
    signer: &'static str,
    bundle: &'static str,
    target: Option<(&'static str, Target)>,
}

const CHAINS: [Chain; 4] = [
    Chain {
        signer: API_SIGNER,
        bundle: API_SIGNER_BUNDLE,
        target: Some((API_CERT, Target::Serving(API_SERVICE))),
    },
    Chain {
        signer: PROXY_SIGNER,
        bundle: PROXY_SIGNER_BUNDLE,
        target: Some((PROXY_CERT, Target::Serving(PROXY_SERVICE))),
    },
    // The controller signs each upload server's certificate with this one.
    Chain {
        signer: SERVER_SIGNER,
        bundle: SERVER_SIGNER_BUNDLE,
        target: None,
    },
    Chain {
        signer: CLIENT_SIGNER,
        bundle: CLIENT_SIGNER_BUNDLE,
        target: Some((CLIENT_CERT, Target::Client(upload::CLIENT_NAME))),
    },
];

/// Lifetimes when no operator rotates (a controller run on its own): long enough that a
/// development cluster never sees them end.
pub fn unmanaged() -> Lifetimes {
    let year = Lifetime {
        lifetime: cdi_pki::ca::CA_LIFETIME,
        refresh: cdi_pki::ca::CA_LIFETIME,
    };
    Lifetimes {
        ca: year,
        server: year,
        client: year,
    }
}

/// The certificate and key a `kubernetes.io/tls` Secret holds, when both are readable.
pub fn pair_of(secret: &Secret) -> Option<KeyPair> {
    let data = secret.data.as_ref()?;
    let text = |k: &str| String::from_utf8(data.get(k)?.0.clone()).ok();
    Some(KeyPair {
        cert_pem: text("tls.crt")?,
        key_pem: text("tls.key")?,
    })
}

/// One pass over the certificates of namespace `ns`.
pub struct Pass<'a> {
    pub client: &'a Client,
    pub ns: &'a str,
    pub lifetimes: &'a Lifetimes,
    /// The CDI resource that owns them (the operator's pass), so they go with it.
    pub owner: Option<&'a OwnerReference>,
    pub mode: Mode,
    /// The field manager of bundle writes.
    pub manager: &'a str,
    /// Where a certificate made (again) is told: events on the CDI resource (the operator's).
    pub report: Option<(&'a crate::events::Events, &'a cdi_api::config::CDI)>,
}

impl Pass<'_> {
    /// Make what is missing (and, rotating, what is due); when the next certificate falls due.
    pub async fn run(&self) -> Result<Option<SystemTime>, Error> {
        let mut next: Option<SystemTime> = None;
        let mut sooner = |t: Option<SystemTime>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n: SystemTime| n.min(t)));
            }
        };
        for chain in &CHAINS {
            let (ca, ca_due) = self.signer(chain.signer).await?;
            sooner(ca_due);
            let bundle = self.bundle(chain.bundle, &ca).await?;
            if let Some((name, target)) = &chain.target {
                sooner(self.target(name, target, &ca, &bundle).await?);
            }
        }
        Ok(next)
    }

    /// An event on the CDI resource (library-go's reasons and words), when there is one.
    async fn tell(&self, reason: &str, message: &str) {
        if let Some((events, cdi)) = self.report {
            events.record(cdi, false, reason, message).await;
        }
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), self.ns)
    }

    /// Secret `name` holding `pair`, annotated with its validity, the lifetimes it was made for
    /// and `extra`: created, or written over `found` (conditionally on the version read, so two
    /// writers do not both rotate).
    async fn put(
        &self,
        found: Option<&Secret>,
        name: &str,
        pair: &KeyPair,
        lifetime: &Lifetime,
        extra: &[(&'static str, String)],
    ) -> Result<(), Error> {
        let validity = Validity::of_pem(&pair.cert_pem).map_err(Error::Other)?;
        let mut annotations: BTreeMap<String, String> =
            found.map(|s| s.annotations().clone()).unwrap_or_default();
        for (k, v) in validity
            .annotations()
            .into_iter()
            .chain(extra.iter().cloned())
        {
            annotations.insert(k.into(), v);
        }
        annotations.insert(rotation::CERT_CONFIG.into(), lifetime.annotation());
        let mut meta = found.map(|s| s.metadata.clone()).unwrap_or_default();
        meta.name = Some(name.into());
        meta.annotations = Some(annotations);
        adopt(&mut meta.owner_references, self.owner);
        let secret = Secret {
            metadata: meta,
            type_: Some("kubernetes.io/tls".into()),
            data: Some(BTreeMap::from([
                (
                    "tls.crt".into(),
                    ByteString(pair.cert_pem.clone().into_bytes()),
                ),
                (
                    "tls.key".into(),
                    ByteString(pair.key_pem.clone().into_bytes()),
                ),
            ])),
            ..Default::default()
        };
        match found {
            Some(_) => {
                self.secrets()
                    .replace(name, &PostParams::default(), &secret)
                    .await?;
            }
            None => {
                self.secrets()
                    .create(&PostParams::default(), &secret)
                    .await?;
            }
        }
        Ok(())
    }

    /// Give a kept Secret its owner when it has none yet (made before the operator came).
    async fn adopt(&self, found: &Secret) -> Result<(), Error> {
        let mut owners = found.metadata.owner_references.clone();
        if !adopt(&mut owners, self.owner) {
            return Ok(());
        }
        self.secrets()
            .patch(
                &found.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"ownerReferences": owners,
                    "resourceVersion": found.resource_version()}})),
            )
            .await?;
        Ok(())
    }

    /// Why the certificate kept in `found` must be made now, if it must.
    fn why_new(
        &self,
        found: Option<&Secret>,
        due: impl FnOnce(&BTreeMap<String, String>) -> Option<String>,
    ) -> Option<String> {
        let Some(found) = found else {
            return Some("missing".into());
        };
        if pair_of(found).is_none() {
            return Some("it holds no readable tls.crt and tls.key".into());
        }
        match self.mode {
            Mode::Missing => None,
            Mode::Rotate => due(found.annotations()),
        }
    }

    /// The CA kept in Secret `name`, made (again) when missing or due; when it falls due next.
    async fn signer(&self, name: &str) -> Result<(Ca, Option<SystemTime>), Error> {
        let lifetime = &self.lifetimes.ca;
        let now = SystemTime::now();
        let found = self.secrets().get_opt(name).await?;
        let usable = found
            .as_ref()
            .and_then(pair_of)
            .and_then(|pair| Ca::from_pem(pair).ok());
        let why = self
            .why_new(found.as_ref(), |a| rotation::due(a, lifetime, now))
            .or_else(|| {
                let unusable = found.is_some() && usable.is_none();
                unusable.then(|| "it is not a usable CA".to_string())
            });
        match (why, &found, usable) {
            (None, Some(s), Some(ca)) => {
                self.adopt(s).await?;
                Ok((ca, self.due_next(s, lifetime)))
            }
            (Some(why), Some(_), _) if self.mode == Mode::Missing => Err(Error::Other(format!(
                "Secret {}/{name}: {why}; delete it to have it made again",
                self.ns
            ))),
            (why, _, _) => {
                let unix = now
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let cn = format!("{}_{name}@{unix}", self.ns);
                let ca = Ca::generate(&cn, lifetime.lifetime)
                    .map_err(|e| Error::Other(e.to_string()))?;
                self.put(found.as_ref(), name, &ca.pair, lifetime, &[])
                    .await?;
                let why = why.unwrap_or_default();
                tracing::info!(secret = %format!("{}/{name}", self.ns), %why, "made a new CA");
                self.tell(
                    "SignerUpdateRequired",
                    &format!(
                        "{name:?} in {:?} requires a new signing cert/key pair: {why}",
                        self.ns
                    ),
                )
                .await;
                Ok((ca, Some(now + lifetime.refresh)))
            }
        }
    }

    fn due_next(&self, found: &Secret, lifetime: &Lifetime) -> Option<SystemTime> {
        match self.mode {
            Mode::Missing => None,
            Mode::Rotate => rotation::next_due(found.annotations(), lifetime),
        }
    }

    /// Publish `ca` in ConfigMap `name` beside the older CAs still valid; the bundle.
    async fn bundle(&self, name: &str, ca: &Ca) -> Result<String, Error> {
        let maps: Api<ConfigMap> = Api::namespaced(self.client.clone(), self.ns);
        let found = maps.get_opt(name).await?;
        let published = found
            .as_ref()
            .and_then(|m| m.data.as_ref()?.get(BUNDLE_KEY).cloned())
            .unwrap_or_default();
        // Kept as it is: publishing is the operator's once there is a bundle.
        if self.mode == Mode::Missing && found.is_some() {
            return Ok(published);
        }
        let bundle = rotation::bundle(&published, &ca.pair.cert_pem, SystemTime::now());
        let mut owners = found.and_then(|m| m.metadata.owner_references);
        let adopted = adopt(&mut owners, self.owner);
        if bundle != published || adopted {
            let mut map = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name}, "data": {BUNDLE_KEY: bundle}});
            if let Some(owner) = self.owner {
                map["metadata"]["ownerReferences"] = json!([owner]);
            }
            maps.patch(
                name,
                &PatchParams::apply(self.manager).force(),
                &Patch::Apply(&map),
            )
            .await?;
        }
        Ok(bundle)
    }

    /// The certificate `ca` signs into Secret `name`, made (again) when missing or due; when it
    /// falls due next.
    async fn target(
        &self,
        name: &str,
        target: &Target,
        ca: &Ca,
        bundle: &str,
    ) -> Result<Option<SystemTime>, Error> {
        let now = SystemTime::now();
        let found = self.secrets().get_opt(name).await?;
        let (lifetime, hostnames) = match target {
            // Kept as it is: no need to know what it would be made for.
            Target::Serving(_) if self.mode == Mode::Missing && found.is_some() => {
                (&self.lifetimes.server, None)
            }
            Target::Serving(service) => {
                let mut names = upload::server_names(self.ns, service);
                // Its cluster IP too, when it has one (`cdi dev` hands out that address).
                let svc = Api::<Service>::namespaced(self.client.clone(), self.ns)
                    .get_opt(service)
                    .await?;
                names.extend(
                    svc.and_then(|s| s.spec?.cluster_ip)
                        .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok()),
                );
                (&self.lifetimes.server, Some(names))
            }
            Target::Client(_) => (&self.lifetimes.client, None),
        };
        let signer_start = Validity::of_pem(&ca.pair.cert_pem)
            .map(|v| v.not_before)
            .unwrap_or(now);
        let why = self.why_new(found.as_ref(), |a| {
            rotation::target_due(a, lifetime, bundle, hostnames.as_deref(), signer_start, now)
        });
        let Some(why) = why else {
            if let Some(s) = &found {
                self.adopt(s).await?;
                return Ok(self.due_next(s, lifetime));
            }
            return Ok(None);
        };
        let pair = match target {
            Target::Serving(_) => {
                ca.server_cert(hostnames.as_deref().unwrap_or(&[]), lifetime.lifetime)
            }
            Target::Client(user) => ca.client_cert(user, lifetime.lifetime),
        }
        .map_err(|e| Error::Other(e.to_string()))?;
        let issuer = rotation::common_names(&ca.pair.cert_pem)
            .into_iter()
            .next()
            .unwrap_or_default();
        let mut extra = vec![(rotation::ISSUER, issuer)];
        if let Some(names) = &hostnames {
            extra.push((rotation::HOSTNAMES, names.join(",")));
        }
        self.put(found.as_ref(), name, &pair, lifetime, &extra)
            .await?;
        tracing::info!(secret = %format!("{}/{name}", self.ns), %why, "made a new certificate");
        self.tell(
            "TargetUpdateRequired",
            &format!(
                "{name:?} in {:?} requires a new target cert/key pair: {why}",
                self.ns
            ),
        )
        .await;
        Ok(Some(now + lifetime.refresh))
    }
}

/// Add `owner` to `owners` unless it is there; whether it was added.
fn adopt(owners: &mut Option<Vec<OwnerReference>>, owner: Option<&OwnerReference>) -> bool {
    let Some(owner) = owner else { return false };
    let list = owners.get_or_insert_with(Vec::new);
    if list.iter().any(|o| o.uid == owner.uid) {
        return false;
    }
    list.push(owner.clone());
    true
}
