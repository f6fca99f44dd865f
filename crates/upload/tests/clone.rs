//! A host-assisted clone's data path over real TLS on 127.0.0.1: `cdi cloner`'s sender packs a
//! source volume (a directory, or a file standing for a device) and an upload server writes it
//! onto a target volume of either mode. The bytes arrive as they were (a disk image is never
//! converted), holes stay holes, and only the clone's own client certificate is accepted.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cdi_importer::convert::Progress;
use cdi_importer::pod::PodPaths;
use cdi_pki::ca::{self as pki, Ca};
use cdi_upload::cloner::{self, CloneSource, ClonerConfig, ClonerError};
use cdi_upload::server::{self, Config, Tls};

const MIB: u64 = 1 << 20;
/// The clone's client name, as the upload controller makes it for a clone target.
const CLIENT: &str = "src-ns/golden-dst-ns/tmp-pvc-1234";

/// A sparse disk image of `len` bytes whose first bytes look like a qcow2 header (a clone copies
/// them; an upload would convert them) and with data at a few places.
fn disk_image(path: &Path, len: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; len as usize];
    bytes[..4].copy_from_slice(b"QFI\xfb");
    for (i, at) in [MIB, 7 * MIB + 5, len - 100].into_iter().enumerate() {
        bytes[at as usize..at as usize + 100].fill(i as u8 + 1);
    }
    let f = std::fs::File::create(path).unwrap();
    f.set_len(len).unwrap();
    use std::os::unix::fs::FileExt;
    for (at, chunk) in bytes.chunks(4096).enumerate() {
        if chunk.iter().any(|b| *b != 0) {
            f.write_all_at(chunk, at as u64 * 4096).unwrap();
        }
    }
    bytes
}

fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

struct Clone {
    dir: tempfile::TempDir,
    server_ca: Ca,
    client_ca: Ca,
}

impl Clone {
    fn new() -> Clone {
        Clone {
            dir: tempfile::tempdir().unwrap(),
            server_ca: Ca::generate("server-signer", pki::CA_LIFETIME).unwrap(),
            client_ca: Ca::generate("client-signer", pki::CA_LIFETIME).unwrap(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Run an upload server onto `target` (a directory, or a device file when `block`) and send
    /// `source` to `path` with a certificate for `client`; the cloner's result and the server's
    /// termination message.
    async fn run(
        &self,
        source: CloneSource,
        target_block: bool,
        client: &str,
        path: &str,
    ) -> (Result<(), ClonerError>, Option<String>) {
        std::fs::create_dir_all(self.path("data")).unwrap();
        let cert = self
            .server_ca
            .server_cert(&["localhost".into()], pki::SERVER_LIFETIME)
            .unwrap();
        let config = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            tls: Tls {
                cert_pem: cert.cert_pem.into_bytes(),
                key_pem: cert.key_pem.into_bytes(),
                client_ca_pem: Some(self.client_ca.pair.cert_pem.clone().into_bytes()),
            },
            client_name: CLIENT.into(),
            image_size: Some(64 * MIB),
            overhead: cdi_core::Overhead::ZERO,
            preallocation: false,
            deadline: None,
            paths: PodPaths {
                data_dir: self.path("data"),
                block_device: if target_block {
                    self.path("target-device")
                } else {
                    self.path("no-device")
                },
                scratch_dir: self.path("scratch"),
                termination_log: self.path("termination-log"),
                data_capacity: Some(64 * MIB),
                ..PodPaths::default()
            },
        };
        let listener = tokio::net::TcpListener::bind(config.listen).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(server::run(config, listener));
        let pair = self
            .client_ca
            .client_cert(client, pki::CLIENT_LIFETIME)
            .unwrap();
        let sender = ClonerConfig {
            url: format!("https://localhost:{port}{path}"),
            client_cert_pem: pair.cert_pem,
            client_key_pem: pair.key_pem,
            server_ca_pem: self.server_ca.pair.cert_pem.clone(),
            owner_uid: "1234".into(),
            preallocation: false,
            source,
        };
        let progress = Arc::new(Progress::default());
        let sent = cloner::send(&sender, progress.clone()).await;
        if sent.is_ok() {
            assert_eq!(
                progress.done.load(std::sync::atomic::Ordering::Relaxed),
                progress.total.load(std::sync::atomic::Ordering::Relaxed),
                "the progress ends at its whole"
            );
            let result = server.await.unwrap().unwrap();
            return (sent, Some(result.termination_message().to_json()));
        }
        server.abort();
        (sent, None)
    }
}

const COMPLETE: &str = r#"{"preallocationApplied":false,"message":"Clone Complete"}"#;

#[tokio::test]
async fn filesystem_to_filesystem_copies_the_tree_and_keeps_holes() {
    let c = Clone::new();
    let src = c.path("source");
    std::fs::create_dir_all(src.join("lost+found")).unwrap();
    std::fs::create_dir_all(src.join("extra")).unwrap();
    std::fs::write(src.join("extra/notes"), b"kept").unwrap();
    let image = disk_image(&src.join("disk.img"), 48 * MIB);
    let (sent, message) = c
        .run(
            CloneSource::Filesystem(src.clone()),
            false,
            CLIENT,
            "/v1beta1/upload",
        )
        .await;
    sent.unwrap();
    assert_eq!(message.as_deref(), Some(COMPLETE));
    let disk = c.path("data/disk.img");
    assert!(std::fs::read(&disk).unwrap() == image, "disk.img differs");
    assert!(
        allocated(&disk) < 4 * MIB,
        "{} bytes allocated",
        allocated(&disk)
    );
    assert_eq!(std::fs::read(c.path("data/extra/notes")).unwrap(), b"kept");
    assert!(!c.path("data/lost+found").exists());
}

#[tokio::test]
async fn filesystem_to_block_takes_the_disk_image() {
    let c = Clone::new();
    let src = c.path("source");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("README"), b"not the image").unwrap();
    let image = disk_image(&src.join("disk.img"), 40 * MIB);
    // The target device held something else: every byte of the image is written over it.
    std::fs::write(c.path("target-device"), vec![0xAAu8; 64 * MIB as usize]).unwrap();
    let (sent, message) = c
        .run(
            CloneSource::Filesystem(src),
            true,
            CLIENT,
            "/v1beta1/upload",
        )
        .await;
    sent.unwrap();
    assert_eq!(message.as_deref(), Some(COMPLETE));
    let device = std::fs::read(c.path("target-device")).unwrap();
    assert!(
        device[..image.len()] == image[..],
        "the device's first bytes are the image"
    );
}

#[tokio::test]
async fn block_to_filesystem_and_block_to_block_copy_the_device() {
    let c = Clone::new();
    let device = c.path("source-device");
    let image = disk_image(&device, 32 * MIB);
    let (sent, message) = c
        .run(
            CloneSource::Block(device.clone()),
            false,
            CLIENT,
            "/v1alpha1/upload",
        )
        .await;
    sent.unwrap();
    assert_eq!(message.as_deref(), Some(COMPLETE));
    let disk = c.path("data/disk.img");
    assert!(std::fs::read(&disk).unwrap() == image, "disk.img differs");
    assert!(allocated(&disk) < 4 * MIB, "zeros are left as holes");

    let c = Clone::new();
    std::fs::write(c.path("target-device"), vec![0xAAu8; 32 * MIB as usize]).unwrap();
    let (sent, _) = c
        .run(CloneSource::Block(device), true, CLIENT, "/v1beta1/upload")
        .await;
    sent.unwrap();
    assert!(std::fs::read(c.path("target-device")).unwrap() == image);
}

#[tokio::test]
async fn a_block_source_whose_tail_is_zero_keeps_its_whole_size_on_a_filesystem() {
    // A 48 MiB device with data in its first 10 MiB only: the disk.img is the device's size
    // (holes where it is zero), not the 10 MiB up to its last non-zero byte.
    let c = Clone::new();
    let device = c.path("source-device");
    let f = std::fs::File::create(&device).unwrap();
    f.set_len(48 * MIB).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&vec![0x5Au8; 10 * MIB as usize], 0).unwrap();
    let (sent, message) = c
        .run(CloneSource::Block(device), false, CLIENT, "/v1beta1/upload")
        .await;
    sent.unwrap();
    assert_eq!(message.as_deref(), Some(COMPLETE));
    let disk = c.path("data/disk.img");
    assert_eq!(std::fs::metadata(&disk).unwrap().len(), 48 * MIB);
    assert!(allocated(&disk) < 12 * MIB, "the zero tail is a hole");
}

#[tokio::test]
async fn only_the_clones_certificate_and_the_sync_endpoint_take_a_clone() {
    let c = Clone::new();
    let src = c.path("source");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("disk.img"), b"data").unwrap();
    let source = CloneSource::Filesystem(src);
    let (sent, _) = c
        .run(
            source.clone(),
            false,
            server::UPLOAD_CLIENT_NAME,
            "/v1beta1/upload",
        )
        .await;
    assert!(
        matches!(sent, Err(ClonerError::Refused { status: 401, .. })),
        "the upload proxy's certificate is not the clone's: {sent:?}"
    );
    let (sent, _) = c.run(source, false, CLIENT, "/v1beta1/upload-async").await;
    match sent {
        Err(ClonerError::Refused {
            status: 400, body, ..
        }) => {
            assert!(body.contains("async clone not supported"), "{body}")
        }
        other => panic!("{other:?}"),
    }
    assert!(!c.path("data/disk.img").exists(), "nothing was written");

    // A disk.img that is a link holds no image: a Block target refuses it.
    let c = Clone::new();
    let src = c.path("source");
    std::fs::create_dir_all(&src).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", src.join("disk.img")).unwrap();
    std::fs::write(c.path("target-device"), vec![0u8; MIB as usize]).unwrap();
    let (sent, _) = c
        .run(
            CloneSource::Filesystem(src),
            true,
            CLIENT,
            "/v1beta1/upload",
        )
        .await;
    match sent {
        Err(ClonerError::Refused {
            status: 400, body, ..
        }) => {
            assert!(body.contains("has no disk.img"), "{body}")
        }
        other => panic!("{other:?}"),
    }
}
