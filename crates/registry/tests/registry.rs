//! The client against real registries on 127.0.0.1 (Debian's docker-registry, images pushed by
//! skopeo from layouts cdi-testkit writes): one in plain HTTP reached as an insecure registry,
//! one with TLS and basic authentication reached with its CA and credentials. Digests are the
//! pushed ones; an index's entry is chosen by architecture; failures say what upstream says.

use cdi_registry::{Error, Image};
use cdi_testkit::oci::{Descriptor, Layer, Layout};
use cdi_testkit::registry::{Options, Registry};

/// A layout with `one` (a single amd64 image) and `multi` (an index of amd64 and arm64); the
/// descriptors of the amd64 image, the arm64 image and the index.
fn layout(dir: &std::path::Path) -> (Layout, [Descriptor; 3]) {
    let mut layout = Layout::new(dir);
    let amd = layout.add_image(&cdi_testkit::oci::Image::new(vec![Layer::disk(
        "disk.img",
        vec![1; 4096],
    )]));
    let mut arm = cdi_testkit::oci::Image::new(vec![Layer::disk("disk.img", vec![2; 4096])]);
    arm.architecture = "arm64".into();
    let arm = layout.add_image(&arm);
    let index = layout.add_index(&[(amd.clone(), "amd64"), (arm.clone(), "arm64")]);
    layout.tag("one", &amd);
    layout.tag("multi", &index);
    (layout, [amd, arm, index])
}

fn status(e: &Error) -> Option<u16> {
    match e {
        Error::Pull { status, .. } => *status,
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_insecure_registry_in_plain_http() {
    let dir = tempfile::tempdir().unwrap();
    let (layout, [amd, arm, index]) = layout(&dir.path().join("layout"));
    let registry = tokio::task::spawn_blocking(|| Registry::start(Options::default()))
        .await
        .unwrap();
    registry.push(&layout.dir, "one", "vm/disk:one");
    registry.push(&layout.dir, "multi", "vm/disk:multi");
    let image = |name: &str, arch: Option<&str>| {
        Image::new(
            &registry.url(name),
            None,
            vec![],
            true,
            arch.map(str::to_string),
        )
        .unwrap()
    };

    assert_eq!(
        image("vm/disk:one", None).digest().await.unwrap(),
        amd.digest
    );
    // An index's digest is its own.
    assert_eq!(
        image("vm/disk:multi", None).digest().await.unwrap(),
        index.digest
    );
    // Its arm64 entry is the arm64 image.
    let connection = image("vm/disk:multi", Some("arm64"))
        .connect()
        .await
        .unwrap();
    let chosen = connection.manifest().await.unwrap();
    let pinned = image(&format!("vm/disk@{}", arm.digest), None)
        .connect()
        .await
        .unwrap();
    let direct = pinned.manifest().await.unwrap();
    assert_eq!(chosen.config.digest, direct.config.digest);
    assert_eq!(chosen.layers[0].digest, direct.layers[0].digest);
    let config = connection.blob(&chosen.config).await.unwrap();
    let config: serde_json::Value = serde_json::from_slice(&config).unwrap();
    assert_eq!(config["architecture"], "arm64");

    // No entry for the architecture: upstream's words, then what there is.
    let url = registry.url("vm/disk:multi");
    let err = image("vm/disk:multi", Some("s390x"))
        .connect()
        .await
        .unwrap()
        .manifest()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "{url}: Error retrieving image: choosing image instance: no image found in image \
             index for architecture \"s390x\", variant \"\", OS \"linux\" (it has linux/amd64, \
             linux/arm64); name one of its architectures in the DataVolume's \
             spec.source.registry.platform.architecture"
        )
    );

    // A tag that is not there.
    let err = image("vm/disk:none", None).digest().await.unwrap_err();
    assert_eq!(status(&err), Some(404), "{err}");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "{}: failed to pull image: ",
            registry.url("vm/disk:none")
        )) && text.ends_with("; check the image's name and tag"),
        "{text}"
    );

    // Not listed as insecure: TLS is required, and the registry speaks none.
    let err = Image::new(&url, None, vec![], false, None)
        .unwrap()
        .digest()
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with(&format!("{url}: failed to pull image: ")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_registry_with_tls_and_basic_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let (layout, [amd, _, _]) = layout(&dir.path().join("layout"));
    let registry = tokio::task::spawn_blocking(|| {
        Registry::start(Options {
            tls: true,
            auth: Some(("cdi".into(), "registry-pass".into())),
        })
    })
    .await
    .unwrap();
    registry.push(&layout.dir, "one", "vm/disk:one");
    let url = registry.url("vm/disk:one");
    let ca = registry.ca.as_ref().unwrap().ca_pem.clone().into_bytes();
    let creds = Some(("cdi".to_string(), "registry-pass".to_string()));

    let image = Image::new(&url, creds.clone(), vec![ca.clone()], false, None).unwrap();
    assert_eq!(image.digest().await.unwrap(), amd.digest);
    let connection = image.connect().await.unwrap();
    let manifest = connection.manifest().await.unwrap();
    assert_eq!(manifest.layers.len(), 1);
    assert!(!connection.blob(&manifest.config).await.unwrap().is_empty());

    // Insecure: the certificate is not checked, and TLS is still spoken.
    let insecure = Image::new(&url, creds.clone(), vec![], true, None).unwrap();
    assert_eq!(insecure.digest().await.unwrap(), amd.digest);

    // Without credentials, or with wrong ones: 401, and where to look.
    for creds in [None, Some(("cdi".to_string(), "wrong".to_string()))] {
        let err = Image::new(&url, creds, vec![ca.clone()], false, None)
            .unwrap()
            .digest()
            .await
            .unwrap_err();
        assert_eq!(status(&err), Some(401), "{err}");
        assert!(
            err.to_string().ends_with(
                "; the registry refused the credentials (or wants some): check the Secret \
                 named by spec.source.registry.secretRef (accessKeyId, secretKey)"
            ),
            "{err}"
        );
    }

    // Without the CA the certificate is not trusted.
    let err = Image::new(&url, creds, vec![], false, None)
        .unwrap()
        .digest()
        .await
        .unwrap_err();
    assert_eq!(status(&err), None, "{err}");
    assert!(
        err.to_string()
            .starts_with(&format!("{url}: failed to pull image: ")),
        "{err}"
    );
}
