//! The upload server over real TLS on 127.0.0.1: who may upload, each endpoint, one upload at a
//! time, a broken upload sent again, the deadline. Images are checked against qemu-img.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use cdi_importer::pod::PodPaths;
use cdi_pki::ca::{self as pki, Ca, KeyPair};
use cdi_testkit::images;
use cdi_upload::server::{self, Config, RunResult, Tls};

const MIB: u64 = 1 << 20;

struct Fixture {
    dir: tempfile::TempDir,
    server_ca: Ca,
    client_ca: Ca,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture {
            dir: tempfile::tempdir().unwrap(),
            server_ca: Ca::generate("server-signer", pki::CA_LIFETIME).unwrap(),
            client_ca: Ca::generate("client-signer", pki::CA_LIFETIME).unwrap(),
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn disk(&self) -> Vec<u8> {
        std::fs::read(self.data().join("disk.img")).unwrap()
    }

    /// Start a server for a 64 MiB claim, without scratch space as the controller starts the
    /// first one; its address and the task that ends with its result.
    async fn start(
        &self,
        deadline: Option<SystemTime>,
    ) -> (
        String,
        tokio::task::JoinHandle<Result<RunResult, server::ServerError>>,
    ) {
        self.start_with(deadline, false).await
    }

    async fn start_with(
        &self,
        deadline: Option<SystemTime>,
        scratch: bool,
    ) -> (
        String,
        tokio::task::JoinHandle<Result<RunResult, server::ServerError>>,
    ) {
        std::fs::create_dir_all(self.data()).unwrap();
        if scratch {
            std::fs::create_dir_all(self.dir.path().join("scratch")).unwrap();
        }
        let cert = self
            .server_ca
            .server_cert(&["127.0.0.1".into()], pki::SERVER_LIFETIME)
            .unwrap();
        let config = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            tls: Tls {
                cert_pem: cert.cert_pem.into_bytes(),
                key_pem: cert.key_pem.into_bytes(),
                client_ca_pem: Some(self.client_ca.pair.cert_pem.clone().into_bytes()),
            },
            client_name: server::UPLOAD_CLIENT_NAME.into(),
            image_size: Some(64 * MIB),
            overhead: cdi_core::Overhead::ZERO,
            preallocation: false,
            deadline,
            paths: PodPaths {
                data_dir: self.data(),
                block_device: self.dir.path().join("no-block-device"),
                scratch_dir: self.dir.path().join("scratch"),
                termination_log: self.dir.path().join("termination-log"),
                data_capacity: Some(64 * MIB),
                ..PodPaths::default()
            },
        };
        let listener = tokio::net::TcpListener::bind(config.listen).await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        (url, tokio::spawn(server::run(config, listener)))
    }

    /// A client trusting the server's CA, with a certificate for `name` when given.
    fn client(&self, name: Option<&str>) -> reqwest::Client {
        let mut b = reqwest::Client::builder().add_root_certificate(
            reqwest::Certificate::from_pem(self.server_ca.pair.cert_pem.as_bytes()).unwrap(),
        );
        if let Some(name) = name {
            let KeyPair { cert_pem, key_pem } = self
                .client_ca
                .client_cert(name, pki::CLIENT_LIFETIME)
                .unwrap();
            let identity = reqwest::Identity::from_pem(format!("{cert_pem}{key_pem}").as_bytes());
            b = b.identity(identity.unwrap());
        }
        b.build().unwrap()
    }

    fn proxy(&self) -> reqwest::Client {
        self.client(Some(server::UPLOAD_CLIENT_NAME))
    }
}

fn assert_image(disk: &[u8], raw: &[u8], what: &str) {
    images::assert_same(&disk[..raw.len()], raw, what);
    assert!(
        disk[raw.len()..].iter().all(|b| *b == 0),
        "{what}: zeros after the image"
    );
}

fn qcow2_of(dir: &Path, raw: &[u8]) -> Vec<u8> {
    let src = dir.join("src.raw");
    let dst = dir.join("src.qcow2");
    std::fs::write(&src, raw).unwrap();
    images::convert(&src, "qcow2", &[], &dst);
    let oracle = images::oracle(&dst, "qcow2");
    assert_eq!(oracle, raw, "qemu-img round trip");
    std::fs::read(dst).unwrap()
}

#[tokio::test]
async fn only_the_proxy_may_upload_then_a_sync_raw_upload() {
    let f = Fixture::new();
    let (url, done) = f.start(None).await;
    let anyone = f.client(None);
    let health = anyone.get(format!("{url}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.text().await.unwrap(), "OK");
    let post = |c: &reqwest::Client, path: &str| c.post(format!("{url}{path}")).body("x");
    let no_cert = post(&anyone, "/v1beta1/upload").send().await.unwrap();
    assert_eq!(no_cert.status(), 401);
    let stranger = f.client(Some("someone-else"));
    let wrong_name = post(&stranger, "/v1beta1/upload").send().await.unwrap();
    assert_eq!(wrong_name.status(), 401);
    let proxy = f.proxy();
    let get = proxy.get(format!("{url}/v1beta1/upload")).send().await;
    assert_eq!(get.unwrap().status(), 404);
    let head = proxy
        .head(format!("{url}/v1beta1/upload-async"))
        .send()
        .await;
    assert_eq!(head.unwrap().status(), 200);
    assert_eq!(
        post(&proxy, "/v1beta1/nothing")
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    assert!(!f.data().join("disk.img").exists(), "nothing was written");

    let raw = images::pattern(5 * MIB + 512);
    let r = proxy
        .post(format!("{url}/v1alpha1/upload"))
        .body(raw.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let result = done.await.unwrap().unwrap();
    assert!(!result.deadline_passed);
    let disk = f.disk();
    assert_eq!(disk.len() as u64, 64 * MIB, "resized to the claim");
    assert_image(&disk, &raw, "raw upload");
}

#[tokio::test]
async fn async_qcow2_is_answered_once_taken_in_and_finished_after() {
    let f = Fixture::new();
    let raw = images::pattern(6 * MIB);
    let qcow2 = qcow2_of(f.dir.path(), &raw);
    let (url, done) = f.start(None).await;
    let r = f
        .proxy()
        .post(format!("{url}/v1beta1/upload-async"))
        .body(qcow2)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    // The server ends when the image is complete.
    let result = done.await.unwrap().unwrap();
    assert!(!result.deadline_passed && !result.scratch_required);
    assert_image(&f.disk(), &raw, "async qcow2 upload");
    assert!(
        !f.dir.path().join("scratch").exists(),
        "the qcow2 image streamed without scratch space"
    );
}

/// An image that converts only from a copy (VMDK) ends a server without scratch space: the
/// client is told to send it again, nothing is written, and the termination message asks for
/// scratch; the next server, given it, takes the same upload.
#[tokio::test]
async fn an_image_that_needs_scratch_ends_a_server_without_it() {
    let f = Fixture::new();
    let raw = images::pattern(3 * MIB);
    let src = f.dir.path().join("src.raw");
    std::fs::write(&src, &raw).unwrap();
    let vmdk = f.dir.path().join("src.vmdk");
    images::convert(&src, "vmdk", &[], &vmdk);
    let vmdk = std::fs::read(vmdk).unwrap();
    let (url, done) = f.start(None).await;
    let r = f
        .proxy()
        .post(format!("{url}/v1beta1/upload"))
        .body(vmdk.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let text = r.text().await.unwrap();
    assert!(text.contains("send the upload again"), "{text}");
    let result = done.await.unwrap().unwrap();
    assert!(result.scratch_required && !result.deadline_passed);
    let said = result.termination_message();
    assert_eq!(said.scratch_space_required, Some(true));
    assert!(!f.data().join("disk.img").exists(), "nothing was written");

    let (url, done) = f.start_with(None, true).await;
    let r = f
        .proxy()
        .post(format!("{url}/v1beta1/upload"))
        .body(vmdk)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert!(!done.await.unwrap().unwrap().scratch_required);
    assert_image(&f.disk(), &raw, "through scratch");
}

#[tokio::test]
async fn a_multipart_form_upload_takes_the_file_part() {
    let f = Fixture::new();
    let raw = images::pattern(3 * MIB);
    let (url, done) = f.start(None).await;
    let boundary = "cdi-rs-test-boundary";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nignored\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"disk.raw\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(&raw);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let r = f
        .proxy()
        .post(format!("{url}/v1beta1/upload-form"))
        .header(
            "Content-Type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    done.await.unwrap().unwrap();
    assert_image(&f.disk(), &raw, "form upload");
}

#[tokio::test]
async fn one_upload_at_a_time_and_a_broken_one_can_be_sent_again() {
    let f = Fixture::new();
    let raw = images::pattern(4 * MIB);
    let (url, done) = f.start(None).await;
    let proxy = f.proxy();
    // A client that sends half the image, then breaks off.
    let (tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    let mut tx = tx;
    let first = tokio::spawn({
        let proxy = proxy.clone();
        let url = url.clone();
        async move {
            proxy
                .post(format!("{url}/v1beta1/upload"))
                .header("Content-Length", raw_len())
                .body(reqwest::Body::wrap_stream(rx))
                .send()
                .await
        }
    });
    use futures::SinkExt;
    tx.send(Ok(Bytes::copy_from_slice(&raw[..2 * MIB as usize])))
        .await
        .unwrap();
    // The first upload holds the server (its image file is made once it started): a second is
    // refused while it runs.
    let disk = f.data().join("disk.img");
    for _ in 0..300 {
        if disk.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(disk.exists(), "the first upload started");
    let second = proxy
        .post(format!("{url}/v1beta1/upload"))
        .body(raw.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 503);
    assert!(
        second.text().await.unwrap().contains("another upload"),
        "a concurrent upload is told why"
    );
    tx.send(Err(std::io::Error::other("client gave up")))
        .await
        .unwrap();
    drop(tx);
    assert!(
        first.await.unwrap().is_err(),
        "the broken upload is not answered as a success"
    );
    // Nothing half-written stays behind, and the server takes the upload again.
    let again = wait_accepting(&proxy, &url, &raw).await;
    assert_eq!(again, 200);
    done.await.unwrap().unwrap();
    assert_image(&f.disk(), &raw, "upload sent again");
}

fn raw_len() -> String {
    (4 * MIB).to_string()
}

/// Post `raw` until the server no longer answers 503 (the broken upload is still being wound
/// down); the status it answered.
async fn wait_accepting(proxy: &reqwest::Client, url: &str, raw: &[u8]) -> u16 {
    for _ in 0..300 {
        let r = proxy
            .post(format!("{url}/v1beta1/upload"))
            .body(raw.to_vec())
            .send()
            .await
            .unwrap();
        if r.status() != 503 {
            return r.status().as_u16();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the server stayed busy after the broken upload");
}

#[tokio::test]
async fn an_unused_server_ends_at_its_deadline() {
    let f = Fixture::new();
    let (_, done) = f
        .start(Some(SystemTime::now() + Duration::from_secs(1)))
        .await;
    let result = done.await.unwrap().unwrap();
    assert!(result.deadline_passed);
    assert_eq!(
        result.termination_message().to_json(),
        r#"{"message":"Deadline Passed","deadlinePassed":true}"#
    );
}

#[tokio::test]
async fn no_data_is_not_an_image_and_a_refused_image_is_the_clients_to_mend() {
    let f = Fixture::new();
    let raw = images::pattern(4 * MIB);
    let (url, done) = f.start(None).await;
    let proxy = f.proxy();
    // An empty body, sync or async, is refused before anything is written, and the volume
    // keeps its one upload.
    for path in ["/v1beta1/upload", "/v1beta1/upload-async"] {
        let r = proxy
            .post(format!("{url}{path}"))
            .body(Vec::<u8>::new())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{path}");
        assert_eq!(r.text().await.unwrap(), server::EMPTY_UPLOAD);
        assert!(
            !f.data().join("disk.img").exists(),
            "{path}: nothing written"
        );
    }
    // A damaged qcow2 (its L1 table at an offset that is not cluster-aligned) is refused with
    // the reason, as a 4xx: sending it again would not mend it.
    let mut qcow2 = qcow2_of(f.dir.path(), &raw);
    qcow2[40..48].copy_from_slice(&0x201u64.to_be_bytes());
    let r = proxy
        .post(format!("{url}/v1beta1/upload"))
        .body(qcow2)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let said = r.text().await.unwrap();
    assert!(said.starts_with("Saving stream failed: "), "{said}");
    // Not an upload: a PUT is told so, not answered with an empty 404.
    let r = proxy
        .put(format!("{url}/v1beta1/upload"))
        .body(raw.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.text().await.unwrap().contains("POST"));
    // After all the refusals the server still takes the image, and ends with it.
    let r = proxy
        .post(format!("{url}/v1beta1/upload"))
        .body(raw.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let result = done.await.unwrap().unwrap();
    assert!(!result.deadline_passed);
    assert_image(&f.disk(), &raw, "the upload after the refusals");
}
