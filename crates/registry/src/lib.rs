//! The registry side of a containerDisk: what the importer (which reads the image's layers) and
//! the controller (which polls a DataImportCron's image for its digest) both need, and no more.
//! An [`Image`] is a `docker://host/repo[:tag|@digest]` reference with the credentials, extra
//! CAs, insecure flag and architecture to reach it; [`Image::connect`] gives a [`Connection`]
//! that reads the digest, the image manifest (the architecture's entry of an index) and small
//! blobs. Layers are the importer's business: it streams them with the same client.
//!
//! The protocol (token and basic authentication, manifests, indexes) is oci-client's, re-exported
//! so that its users build against the same version.

mod error;

use std::time::Duration;

pub use oci_client;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::manifest::{
    ImageIndexEntry, OciDescriptor, OciImageIndex, OciImageManifest, OciManifest,
};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

pub use error::{Error, chain};

/// A registry image and how to reach it.
pub struct Image {
    /// `docker://…` as given (never holds credentials: those come from a Secret).
    url: String,
    reference: Reference,
    auth: RegistryAuth,
    ca_certs_pem: Vec<Vec<u8>>,
    /// Upstream's INSECURE_TLS: the registry is listed in CDIConfig's insecureRegistries, so
    /// its certificate is not checked, and plain HTTP is used when it speaks no TLS.
    insecure: bool,
    /// The architecture to pick from an index, in the registry's terms (`amd64`, `arm64`, …);
    /// this machine's when not given.
    architecture: Option<String>,
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the credentials.
        f.debug_struct("Image")
            .field("url", &self.url)
            .field("insecure", &self.insecure)
            .field("architecture", &self.architecture)
            .finish_non_exhaustive()
    }
}

/// The registry's name for this machine's architecture (Go's GOARCH).
pub fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        "x86" => "386",
        other => other,
    }
}

impl Image {
    /// The image `url` names (`docker://…`), read with `credentials` (user, password) when
    /// given; nothing is reached yet.
    pub fn new(
        url: &str,
        credentials: Option<(String, String)>,
        ca_certs_pem: Vec<Vec<u8>>,
        insecure: bool,
        architecture: Option<String>,
    ) -> Result<Image, Error> {
        let name = url.strip_prefix("docker://").ok_or_else(|| {
            Error::Reference(format!(
                "{url}: a registry image is docker://host/repository:tag (or @sha256:…)"
            ))
        })?;
        let reference: Reference = name
            .parse()
            .map_err(|e| Error::Reference(format!("{url} does not name a registry image: {e}")))?;
        let auth = match credentials {
            Some((user, password)) => RegistryAuth::Basic(user, password),
            None => RegistryAuth::Anonymous,
        };
        Ok(Image {
            url: url.to_string(),
            reference,
            auth,
            ca_certs_pem,
            insecure,
            architecture: architecture.filter(|a| !a.is_empty()),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn reference(&self) -> &Reference {
        &self.reference
    }

    /// The architecture asked for, if one was.
    pub fn architecture(&self) -> Option<&str> {
        self.architecture.as_deref()
    }

    /// The architecture an index's entry is chosen by: the one asked for, else this machine's.
    pub fn wanted_architecture(&self) -> &str {
        self.architecture.as_deref().unwrap_or(host_architecture())
    }

    /// A client for the registry; with `insecure`, plain HTTP when the registry speaks no TLS.
    pub async fn connect(&self) -> Result<Connection, Error> {
        let registry = self.reference.resolve_registry().to_string();
        let mut config = ClientConfig {
            extra_root_certificates: self
                .ca_certs_pem
                .iter()
                .map(|pem| Certificate {
                    encoding: CertificateEncoding::Pem,
                    data: pem.clone(),
                })
                .collect(),
            connect_timeout: Some(Duration::from_secs(30)),
            read_timeout: Some(Duration::from_secs(60)),
            ..Default::default()
        };
        if self.insecure {
            config.accept_invalid_certificates = true;
            if !speaks_tls(&registry).await {
                config.protocol = ClientProtocol::Http;
            }
        }
        Ok(Connection {
            client: Client::new(config),
            reference: self.reference.clone(),
            auth: self.auth.clone(),
            url: self.url.clone(),
            wanted: self.wanted_architecture().to_string(),
        })
    }

    /// The digest of what the URL names (an index's own, for a multi-architecture image), as
    /// upstream's poller reads it to see whether the image changed.
    pub async fn digest(&self) -> Result<String, Error> {
        self.connect().await?.digest().await
    }
}

/// A registry reached for one image (cheap to clone: the client shares its tokens).
#[derive(Clone)]
pub struct Connection {
    client: Client,
    reference: Reference,
    auth: RegistryAuth,
    url: String,
    wanted: String,
}

impl Connection {
    /// The client, for what this crate does not do (streaming layers): it holds the tokens
    /// the manifest's pull obtained.
    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn reference(&self) -> &Reference {
        &self.reference
    }

    /// See [`Image::digest`].
    pub async fn digest(&self) -> Result<String, Error> {
        self.client
            .fetch_manifest_digest(&self.reference, &self.auth)
            .await
            .map_err(|e| error::pull_failed(&self.url, e))
    }

    /// The image manifest for the wanted architecture: the one the URL names, or the
    /// architecture's entry of the index it names.
    pub async fn manifest(&self) -> Result<OciImageManifest, Error> {
        let (manifest, _) = self
            .client
            .pull_manifest(&self.reference, &self.auth)
            .await
            .map_err(|e| error::pull_failed(&self.url, e))?;
        let index = match manifest {
            OciManifest::Image(image) => return Ok(image),
            OciManifest::ImageIndex(index) => index,
        };
        let entry = choose(&index, &self.url, &self.wanted)?;
        let pinned = self.reference.clone_with_digest(entry.digest.clone());
        match self.client.pull_manifest(&pinned, &self.auth).await {
            Ok((OciManifest::Image(image), _)) => Ok(image),
            Ok((OciManifest::ImageIndex(_), _)) => Err(Error::Unsupported(format!(
                "{}: the index's linux/{} entry is another index",
                self.url, self.wanted
            ))),
            Err(e) => Err(error::pull_failed(&self.url, e)),
        }
    }

    /// A blob read whole into memory: for small ones, such as an image's config.
    pub async fn blob(&self, descriptor: &OciDescriptor) -> Result<Vec<u8>, Error> {
        let mut raw = Vec::new();
        self.client
            .pull_blob(&self.reference, descriptor, &mut raw)
            .await
            .map_err(|e| error::pull_failed(&self.url, e))?;
        Ok(raw)
    }
}

/// The entry of `index` for linux on the `wanted` architecture; `url` names the image in the
/// error. (An oci-archive's index is chosen from the same way.)
pub fn choose<'a>(
    index: &'a OciImageIndex,
    url: &str,
    wanted: &str,
) -> Result<&'a ImageIndexEntry, Error> {
    let entry = index.manifests.iter().find(|m| {
        m.platform
            .as_ref()
            .is_some_and(|p| p.architecture.to_string() == wanted && p.os.to_string() == "linux")
    });
    entry.ok_or_else(|| {
        let offered: Vec<String> = index
            .manifests
            .iter()
            .filter_map(|m| m.platform.as_ref())
            .map(|p| format!("{}/{}", p.os, p.architecture))
            .collect();
        // Upstream's words (containers/image's), then what there is.
        Error::Unsupported(format!(
            "{url}: Error retrieving image: choosing image instance: no image found in image \
             index for architecture {wanted:?}, variant \"\", OS \"linux\" (it has {}); \
             name one of its architectures in the DataVolume's \
             spec.source.registry.platform.architecture",
            if offered.is_empty() {
                "none named".to_string()
            } else {
                offered.join(", ")
            }
        ))
    })
}

/// Whether a TLS handshake with `host` (host:port, 443 by default) succeeds, certificate
/// unchecked: containers/image tries TLS first for an insecure registry and falls back to HTTP.
pub async fn speaks_tls(host: &str) -> bool {
    let Ok(client) = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(10))
        .build()
    else {
        return false;
    };
    client
        .get(format!("https://{host}/v2/"))
        .send()
        .await
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_urls_are_docker_references() {
        let image = Image::new(
            "docker://127.0.0.1:5000/vm/disk:v1",
            None,
            vec![],
            false,
            Some(String::new()),
        )
        .unwrap();
        assert_eq!(image.reference().registry(), "127.0.0.1:5000");
        assert_eq!(image.reference().repository(), "vm/disk");
        assert_eq!(image.reference().tag(), Some("v1"));
        // An empty architecture is none asked for.
        assert_eq!(image.architecture(), None);
        assert_eq!(image.wanted_architecture(), host_architecture());
        let pinned = Image::new(
            "docker://quay.io/containerdisks/fedora@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            Some(("user".into(), "secret".into())),
            vec![],
            false,
            Some("arm64".into()),
        )
        .unwrap();
        assert!(pinned.reference().digest().is_some());
        assert_eq!(pinned.wanted_architecture(), "arm64");
        assert!(!format!("{pinned:?}").contains("secret"));
        let err = Image::new("http://x/y", None, vec![], false, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "http://x/y: a registry image is docker://host/repository:tag (or @sha256:…)"
        );
        let err = Image::new("docker://Bad/Name", None, vec![], false, None).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("docker://Bad/Name does not name a registry image: "),
            "{err}"
        );
    }

    #[test]
    fn an_index_entry_is_chosen_by_architecture_on_linux() {
        let index: OciImageIndex = index();
        let url = "docker://r/i:1";
        assert_eq!(choose(&index, url, "arm64").unwrap().digest, "sha256:b");
        // amd64 is there only for windows.
        let err = choose(&index, url, "amd64").unwrap_err();
        assert_eq!(
            err.to_string(),
            "docker://r/i:1: Error retrieving image: choosing image instance: no image found in \
             image index for architecture \"amd64\", variant \"\", OS \"linux\" (it has \
             windows/amd64, linux/arm64); name one of its architectures in the DataVolume's \
             spec.source.registry.platform.architecture"
        );
    }

    /// An index with a windows/amd64 and a linux/arm64 entry.
    fn index() -> OciImageIndex {
        let entry = |digest: &str, os: &str, arch: &str| {
            serde_json::json!({
                "mediaType": oci_client::manifest::OCI_IMAGE_MEDIA_TYPE,
                "digest": digest,
                "size": 1,
                "platform": {"architecture": arch, "os": os},
            })
        };
        serde_json::from_value(serde_json::json!({
            "schemaVersion": 2,
            "manifests": [entry("sha256:a", "windows", "amd64"), entry("sha256:b", "linux", "arm64")],
        }))
        .unwrap()
    }
}
