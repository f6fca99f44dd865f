//! `cdi importer` as the importer pod runs it: upstream's environment in, the volume and the
//! termination message out, against a real HTTP server on 127.0.0.1.

use std::path::{Path, PathBuf};
use std::process::Command;

use cdi_testkit::images::{assert_same, convert, oracle, pattern};
use cdi_testkit::{Behaviour, FileServer};

const MIB: u64 = 1 << 20;

struct Pod {
    dir: tempfile::TempDir,
}

struct Outcome {
    ok: bool,
    termination: String,
    stderr: String,
}

impl Pod {
    fn new() -> Pod {
        let pod = Pod {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir_all(pod.data()).unwrap();
        pod
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Run the importer with `env` (and nothing else from the test's environment).
    async fn run(&self, env: &[(&str, &str)]) -> Outcome {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cdi"));
        cmd.arg("importer")
            .arg("--data-dir")
            .arg(self.data())
            .arg("--block-device")
            .arg(self.path("block"))
            .arg("--scratch-dir")
            .arg(self.path("scratch"))
            .arg("--termination-log")
            .arg(self.path("termination-log"))
            .arg("--extra-headers-dir")
            .arg(self.path("extraheaders"))
            .env_clear()
            .env("CDI_METRICS_ADDR", "127.0.0.1:0");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap();
        Outcome {
            ok: out.status.success(),
            termination: std::fs::read_to_string(self.path("termination-log")).unwrap_or_default(),
            stderr: String::from_utf8_lossy(&out.stderr).into(),
        }
    }
}

fn qcow2_of(dir: &Path, data: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let raw = dir.join("src.raw");
    std::fs::write(&raw, data).unwrap();
    let img = dir.join("src.qcow2");
    convert(&raw, "qcow2", &[], &img);
    (std::fs::read(&img).unwrap(), oracle(&img, "qcow2"))
}

#[tokio::test(flavor = "multi_thread")]
async fn http_qcow2_into_a_filesystem_volume() {
    let pod = Pod::new();
    let (qcow2, expected) = qcow2_of(pod.dir.path(), &pattern(8 * MIB));
    let server = FileServer::start(None).await;
    server.add(
        "/disk.qcow2",
        qcow2,
        Behaviour {
            ranges: true,
            ..Default::default()
        },
    );
    let url = server.url("/disk.qcow2");
    let out = pod
        .run(&[
            ("IMPORTER_SOURCE", "http"),
            ("IMPORTER_ENDPOINT", &url),
            ("IMPORTER_CONTENTTYPE", "kubevirt"),
            ("IMPORTER_IMAGE_SIZE", "64Mi"),
            ("FILESYSTEM_OVERHEAD", "0.06"),
            ("OWNER_UID", "5e1d"),
            ("PREALLOCATION", "false"),
        ])
        .await;
    assert!(out.ok, "{}", out.stderr);
    let message: serde_json::Value = serde_json::from_str(&out.termination).unwrap();
    assert_eq!(
        message,
        serde_json::json!({"preallocationApplied": false, "message": "Import Complete"})
    );
    let disk = std::fs::read(pod.data().join("disk.img")).unwrap();
    let usable = cdi_core::size::usable_space(64 * MIB as i64, "0.06".parse().unwrap()) as usize;
    assert_eq!(disk.len(), usable, "grown to the usable space of the claim");
    assert_same(&disk[..expected.len()], &expected, "image data");
    assert!(disk[expected.len()..].iter().all(|&b| b == 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_write_a_one_line_cause() {
    let pod = Pod::new();
    let server = FileServer::start(None).await;
    let url = server.url("/missing.img");
    let out = pod
        .run(&[
            ("IMPORTER_SOURCE", "http"),
            ("IMPORTER_ENDPOINT", &url),
            ("IMPORTER_IMAGE_SIZE", "1Gi"),
        ])
        .await;
    assert!(!out.ok);
    assert!(
        out.termination.starts_with("Unable to process data: "),
        "{}",
        out.termination
    );
    assert!(
        out.termination.contains("HTTP 404") && out.termination.contains("/missing.img"),
        "{}",
        out.termination
    );
    assert!(!out.termination.contains('\n'));
    assert!(!pod.data().join("disk.img").exists());

    let out = pod
        .run(&[
            ("IMPORTER_SOURCE", "s3"),
            ("IMPORTER_ENDPOINT", "http://127.0.0.1:1/b/k"),
        ])
        .await;
    assert!(!out.ok);
    assert!(
        out.termination
            .contains("Unable to connect to s3 data source"),
        "{}",
        out.termination
    );

    let out = pod
        .run(&[
            ("IMPORTER_SOURCE", "http"),
            ("IMPORTER_ENDPOINT", &url),
            ("PREALLOCATION", "maybe"),
        ])
        .await;
    assert!(
        out.termination
            .contains("PREALLOCATION=\"maybe\" is not a boolean"),
        "{}",
        out.termination
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn checksum_mismatch_is_fatal_and_removes_the_image() {
    let pod = Pod::new();
    let server = FileServer::start(None).await;
    server.add(
        "/disk.raw",
        pattern(2 * MIB),
        Behaviour {
            ranges: true,
            ..Default::default()
        },
    );
    let url = server.url("/disk.raw");
    let out = pod
        .run(&[
            ("IMPORTER_SOURCE", "http"),
            ("IMPORTER_ENDPOINT", &url),
            ("IMPORTER_IMAGE_SIZE", "1Gi"),
            ("IMPORTER_CHECKSUM", "md5:0123456789abcdef0123456789abcdef"),
        ])
        .await;
    // As upstream: exit 0 (no restart loop) with a JSON message the controller marks fatal.
    assert!(out.ok, "{}", out.stderr);
    let message: serde_json::Value = serde_json::from_str(&out.termination).unwrap();
    let text = message["message"].as_str().unwrap();
    assert!(
        text.starts_with("Unable to process data: checksum mismatch: expected md5:0123456789abcdef0123456789abcdef"),
        "{text}"
    );
    assert!(!pod.data().join("disk.img").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn blank_images_and_block_volumes() {
    let pod = Pod::new();
    let out = pod
        .run(&[
            ("IMPORTER_SOURCE", "none"),
            ("IMPORTER_IMAGE_SIZE", "1Gi"),
            ("FILESYSTEM_OVERHEAD", "0.06"),
        ])
        .await;
    assert!(out.ok, "{}", out.stderr);
    let len = std::fs::metadata(pod.data().join("disk.img"))
        .unwrap()
        .len();
    assert_eq!(
        len,
        cdi_core::size::usable_space(1 << 30, "0.06".parse().unwrap()) as u64
    );

    // A "block device" (a file here): the image is written raw at its start, the rest zeroed.
    let block = Pod::new();
    std::fs::write(block.path("block"), vec![0xeeu8; 16 * MIB as usize]).unwrap();
    let server = FileServer::start(None).await;
    let data = pattern(4 * MIB);
    server.add(
        "/disk.raw",
        data.clone(),
        Behaviour {
            ranges: true,
            ..Default::default()
        },
    );
    let url = server.url("/disk.raw");
    let out = block
        .run(&[
            ("IMPORTER_SOURCE", "http"),
            ("IMPORTER_ENDPOINT", &url),
            ("IMPORTER_IMAGE_SIZE", "16Mi"),
        ])
        .await;
    assert!(out.ok, "{}", out.stderr);
    let device = std::fs::read(block.path("block")).unwrap();
    assert_eq!(device.len(), 16 * MIB as usize, "a device keeps its size");
    assert_same(&device[..data.len()], &data, "raw on block");
}

#[tokio::test(flavor = "multi_thread")]
async fn archives_unpack_onto_the_volume() {
    let pod = Pod::new();
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    let mut header = tar::Header::new_gnu();
    let content = b"hello from an archive\n";
    header.set_size(content.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder
        .append_data(&mut header, "dir/file.txt", &content[..])
        .unwrap();
    let tgz = builder.into_inner().unwrap().finish().unwrap();
    let server = FileServer::start(None).await;
    server.add("/data.tar.gz", tgz, Behaviour::default());
    let url = server.url("/data.tar.gz");
    let out = pod
        .run(&[
            ("IMPORTER_SOURCE", "http"),
            ("IMPORTER_ENDPOINT", &url),
            ("IMPORTER_CONTENTTYPE", "archive"),
        ])
        .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(
        std::fs::read(pod.data().join("dir/file.txt")).unwrap(),
        content
    );
    assert!(!pod.data().join("disk.img").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn extra_headers_from_env_and_mounted_secrets() {
    let pod = Pod::new();
    std::fs::create_dir_all(pod.path("extraheaders/secret-a")).unwrap();
    std::fs::write(
        pod.path("extraheaders/secret-a/header"),
        "X-Secret: s3cret\n",
    )
    .unwrap();
    let server = FileServer::start(None).await;
    let guarded = Behaviour {
        ranges: true,
        required_headers: vec![
            ("X-Plain".into(), "one".into()),
            ("X-Secret".into(), "s3cret".into()),
        ],
        basic_auth: Some(("user".into(), "pass".into())),
        ..Default::default()
    };
    server.add("/disk.raw", pattern(MIB), guarded);
    let url = server.url("/disk.raw");
    let out = pod
        .run(&[
            ("IMPORTER_SOURCE", "http"),
            ("IMPORTER_ENDPOINT", &url),
            ("IMPORTER_EXTRA_HEADER_0", "X-Plain: one"),
            ("IMPORTER_ACCESS_KEY_ID", "user"),
            ("IMPORTER_SECRET_KEY", "pass"),
        ])
        .await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        !out.stderr.contains("s3cret") && !out.stderr.contains("pass"),
        "secrets are never logged"
    );
}
