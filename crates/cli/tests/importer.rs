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

/// `cdi importer` for the S3 object at `url`, signing with `key` and `secret`.
async fn s3_import(pod: &Pod, url: &str, key: &str, secret: &str) -> Outcome {
    pod.run(&[
        ("IMPORTER_SOURCE", "s3"),
        ("IMPORTER_ENDPOINT", url),
        ("IMPORTER_ACCESS_KEY_ID", key),
        ("IMPORTER_SECRET_KEY", secret),
        ("IMPORTER_CONTENTTYPE", "kubevirt"),
        ("IMPORTER_IMAGE_SIZE", "64Mi"),
        ("FILESYSTEM_OVERHEAD", "0.06"),
    ])
    .await
}

/// An object of a real S3-compatible server (moto, its IAM on): a qcow2 streams into the volume
/// by SigV4-signed range requests (no scratch asked for), byte-equal to qemu-img's conversion; a
/// request signed with the wrong secret is refused and the import says so, leaving no image.
#[tokio::test(flavor = "multi_thread")]
async fn s3_objects_import_by_signed_range_requests() {
    let pod = Pod::new();
    let (qcow2, expected) = qcow2_of(pod.dir.path(), &pattern(8 * MIB));
    let s3 = tokio::task::spawn_blocking(cdi_testkit::s3::S3Server::start)
        .await
        .unwrap();
    s3.put("images", "fedora/disk 1.qcow2", &qcow2);
    let url = s3.url("images", "fedora/disk%201.qcow2");
    let out = s3_import(&pod, &url, &s3.access_key, &s3.secret_key).await;
    assert!(out.ok, "{}", out.stderr);
    let message: serde_json::Value = serde_json::from_str(&out.termination).unwrap();
    assert_eq!(
        message,
        serde_json::json!({"preallocationApplied": false, "message": "Import Complete"})
    );
    let disk = std::fs::read(pod.data().join("disk.img")).unwrap();
    assert_same(&disk[..expected.len()], &expected, "image data");

    let refused = Pod::new();
    let out = s3_import(&refused, &url, &s3.access_key, "not-the-secret").await;
    assert!(!out.ok);
    let said = cdi_api::TerminationMessage::parse(&out.termination)
        .message
        .unwrap_or_default();
    assert!(
        said.contains("HTTP 403") && said.contains("/images/fedora/disk%201.qcow2"),
        "{said}"
    );
    assert!(!said.contains("not-the-secret") && !out.stderr.contains("not-the-secret"));
    assert!(!refused.data().join("disk.img").exists());
}

/// A VMDK from a server without ranges must be copied to scratch first (qemu-img converts it
/// from a file): without a scratch volume the importer asks for one (upstream's contract: exit
/// 0, `scratchSpaceRequired`) and writes nothing; given one, it imports. A qcow2 from the same
/// server streams without.
#[tokio::test(flavor = "multi_thread")]
async fn scratch_space_is_asked_for_when_needed() {
    let pod = Pod::new();
    let (qcow2, expected) = qcow2_of(pod.dir.path(), &pattern(4 * MIB));
    let vmdk = pod.dir.path().join("src.vmdk");
    convert(&pod.dir.path().join("src.raw"), "vmdk", &[], &vmdk);
    let server = FileServer::start(None).await;
    server.add("/disk.qcow2", qcow2, Behaviour::default());
    server.add(
        "/disk.vmdk",
        std::fs::read(&vmdk).unwrap(),
        Behaviour::default(),
    );
    let streamed = server.url("/disk.qcow2");
    let env = [
        ("IMPORTER_SOURCE", "http"),
        ("IMPORTER_ENDPOINT", streamed.as_str()),
        ("IMPORTER_IMAGE_SIZE", "64Mi"),
    ];
    let out = pod.run(&env).await;
    assert!(out.ok, "{}", out.stderr);
    let said = cdi_api::TerminationMessage::parse(&out.termination);
    assert_eq!(said.message.as_deref(), Some("Import Complete"));
    let disk = std::fs::read(pod.data().join("disk.img")).unwrap();
    assert_same(&disk[..expected.len()], &expected, "qcow2 as it streams");
    std::fs::remove_file(pod.data().join("disk.img")).unwrap();

    let url = server.url("/disk.vmdk");
    let env = [
        ("IMPORTER_SOURCE", "http"),
        ("IMPORTER_ENDPOINT", url.as_str()),
        ("IMPORTER_IMAGE_SIZE", "64Mi"),
    ];
    let out = pod.run(&env).await;
    assert!(out.ok, "{}", out.stderr);
    let said = cdi_api::TerminationMessage::parse(&out.termination);
    assert_eq!(
        said.scratch_space_required,
        Some(true),
        "{}",
        out.termination
    );
    assert_eq!(said.reason, None);
    assert!(!pod.data().join("disk.img").exists());
    assert!(
        !pod.path("scratch").exists(),
        "no scratch made on the container's own disk"
    );

    std::fs::create_dir(pod.path("scratch")).unwrap();
    let out = pod.run(&env).await;
    assert!(out.ok, "{}", out.stderr);
    let said = cdi_api::TerminationMessage::parse(&out.termination);
    assert_eq!(said.message.as_deref(), Some("Import Complete"));
    assert_eq!(said.scratch_space_required, None);
    let disk = std::fs::read(pod.data().join("disk.img")).unwrap();
    assert_same(
        &disk[..expected.len()],
        &expected,
        "image data through scratch",
    );
    assert_eq!(
        std::fs::read_dir(pod.path("scratch")).unwrap().count(),
        0,
        "the scratch copy is removed"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_write_their_cause_and_reason() {
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
    // Retried (a 404 may be a file not yet published): the pod exits 1 and is restarted.
    assert!(!out.ok);
    let said = cdi_api::TerminationMessage::parse(&out.termination);
    assert_eq!(said.reason, Some(cdi_api::FailureReason::SourceRefused));
    let message = said.message.unwrap();
    assert!(
        message.starts_with("Unable to process data: ")
            && message.contains("HTTP 404")
            && message.contains("/missing.img"),
        "{message}"
    );
    assert!(!out.termination.contains('\n'));
    assert!(!pod.data().join("disk.img").exists());

    let out = pod
        .run(&[
            ("IMPORTER_SOURCE", "s3"),
            ("IMPORTER_ENDPOINT", "http://127.0.0.1:1/b/k"),
        ])
        .await;
    // A pod that cannot run as configured fails for good: no restart, the reason says why.
    assert!(out.ok, "{}", out.stderr);
    let said = cdi_api::TerminationMessage::parse(&out.termination);
    assert_eq!(said.reason, Some(cdi_api::FailureReason::Misconfigured));
    assert!(
        said.message
            .unwrap_or_default()
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
    let said = cdi_api::TerminationMessage::parse(&out.termination);
    assert_eq!(said.reason, Some(cdi_api::FailureReason::Misconfigured));
    assert!(
        said.message
            .unwrap_or_default()
            .contains("PREALLOCATION=\"maybe\" is not a boolean"),
        "{}",
        out.termination
    );
}

/// Run by the `cdi dev` kubelet, the pod's files are under a host directory; what the importer
/// says names them as the container sees them.
#[tokio::test(flavor = "multi_thread")]
async fn messages_name_paths_as_the_container_sees_them() {
    let root = tempfile::tempdir().unwrap();
    for dir in ["data/disk.img", "dev", "scratch"] {
        std::fs::create_dir_all(root.path().join(dir)).unwrap();
    }
    let out = tokio::task::spawn_blocking({
        let root = root.path().to_path_buf();
        move || {
            Command::new(env!("CARGO_BIN_EXE_cdi"))
                .args([
                    "importer",
                    "--data-dir",
                    "/data",
                    "--scratch-dir",
                    "/scratch",
                ])
                .args(["--block-device", "/dev/cdi-block-volume"])
                .args(["--termination-log", "/dev/termination-log"])
                .args(["--extra-headers-dir", "/extraheaders"])
                .env_clear()
                .env("CDI_POD_ROOT", &root)
                .env("CDI_METRICS_ADDR", "127.0.0.1:0")
                .env("IMPORTER_SOURCE", "none")
                .env("IMPORTER_IMAGE_SIZE", "1Mi")
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(!out.status.success());
    let said = std::fs::read_to_string(root.path().join("dev/termination-log")).unwrap();
    let message = cdi_api::TerminationMessage::parse(&said).message.unwrap();
    assert!(message.contains("creating /data/disk.img: "), "{message}");
    let host = root.path().display().to_string();
    assert!(!said.contains(&host), "{said}");
    assert!(!String::from_utf8_lossy(&out.stderr).contains(&host));
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
    let said = cdi_api::TerminationMessage::parse(&out.termination);
    assert_eq!(said.reason, Some(cdi_api::FailureReason::ChecksumMismatch));
    let text = said.message.unwrap();
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

    // A member that would land outside the volume: the archive is refused (it used to be
    // skipped silently, the import "complete" without it), and nothing of it stays.
    let hostile = Pod::new();
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(content.len() as u64);
    header.set_mode(0o644);
    builder
        .append_data(&mut header.clone(), "kept.txt", &content[..])
        .unwrap();
    let name = b"../escaped.txt";
    header.as_old_mut().name[..name.len()].copy_from_slice(name);
    header.set_cksum();
    builder.append(&header, &content[..]).unwrap();
    server.add(
        "/hostile.tar",
        builder.into_inner().unwrap(),
        Behaviour::default(),
    );
    let url = server.url("/hostile.tar");
    let out = hostile
        .run(&[
            ("IMPORTER_SOURCE", "http"),
            ("IMPORTER_ENDPOINT", &url),
            ("IMPORTER_CONTENTTYPE", "archive"),
        ])
        .await;
    // Refused for good: exit 0 (kubelet does not restart it), the reason says it is fatal.
    assert!(out.ok, "{}", out.stderr);
    let said = cdi_api::TerminationMessage::parse(&out.termination);
    assert!(said.is_fatal(), "{}", out.termination);
    assert!(
        said.message.unwrap_or_default().contains(
            "the archive's member \"../escaped.txt\" would be written outside the volume"
        ),
        "{}",
        out.termination
    );
    assert!(!hostile.data().join("kept.txt").exists());

    // A disk image is not an archive: said as such, for good.
    let (qcow2, _) = qcow2_of(hostile.dir.path(), &pattern(MIB));
    server.add("/disk.qcow2", qcow2, Behaviour::default());
    let url = server.url("/disk.qcow2");
    let out = hostile
        .run(&[
            ("IMPORTER_SOURCE", "http"),
            ("IMPORTER_ENDPOINT", &url),
            ("IMPORTER_CONTENTTYPE", "archive"),
        ])
        .await;
    let said = cdi_api::TerminationMessage::parse(&out.termination);
    assert!(said.is_fatal(), "{}", out.termination);
    assert!(
        said.message
            .unwrap_or_default()
            .contains("contentType archive needs a tar archive, and this is a qcow2 image"),
        "{}",
        out.termination
    );
    assert!(!hostile.data().join("../escaped.txt").exists());
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

// `cdi import`: a failed import leaves DEST as it was; the source is never its own target.

/// What a `cdi import` run did.
struct Run {
    ok: bool,
    stderr: String,
}

async fn cdi_import(args: Vec<String>) -> Run {
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_cdi"))
            .arg("import")
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    Run {
        ok: out.status.success(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// A URL nothing listens on: a port just bound and released.
fn refusing_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}/disk.qcow2")
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_imports_leave_dest_as_it_was() {
    let work = tempfile::tempdir().unwrap();
    let (qcow2, _) = qcow2_of(work.path(), &pattern(8 * MIB));
    let server = FileServer::start(None).await;
    let ranges = Behaviour {
        ranges: true,
        ..Default::default()
    };
    server.add("/disk.qcow2", qcow2.clone(), ranges.clone());
    // Cut short: the data clusters at the end of the file are missing.
    server.add("/cut.qcow2", qcow2[..qcow2.len() / 2].to_vec(), ranges);
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "404",
            args(&["--source", &server.url("/missing.qcow2")]),
            "HTTP 404",
        ),
        (
            "refused connection",
            args(&["--source", &refusing_url()]),
            "refused",
        ),
        (
            "truncated image",
            args(&["--source", &server.url("/cut.qcow2")]),
            "outside the",
        ),
        (
            "checksum mismatch",
            args(&[
                "--source",
                &server.url("/disk.qcow2"),
                "--checksum",
                "md5:0123456789abcdef0123456789abcdef",
            ]),
            "checksum mismatch",
        ),
        (
            "--size too small",
            args(&["--source", &server.url("/disk.qcow2"), "--size", "1Mi"]),
            "a larger PVC is required",
        ),
    ];
    for (kind, source, cause) in cases {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("pre.img");
        let precious = b"precious\n".repeat(1000);
        std::fs::write(&dest, &precious).unwrap();
        let mut run_args = source.clone();
        run_args.push(dest.to_str().unwrap().into());
        let run = cdi_import(run_args).await;
        assert!(!run.ok, "{kind}: the import succeeded");
        assert!(run.stderr.contains(cause), "{kind}: {}", run.stderr);
        assert!(
            std::fs::read(&dest).unwrap() == precious,
            "{kind}: DEST was changed"
        );
        assert_eq!(listing(dir.path()), ["pre.img"], "{kind}: leftovers");

        // A DEST that was not there is not there afterwards either.
        let new = dir.path().join("new.img");
        let mut run_args = source;
        run_args.push(new.to_str().unwrap().into());
        let run = cdi_import(run_args).await;
        assert!(
            !run.ok && run.stderr.contains(cause),
            "{kind}: {}",
            run.stderr
        );
        assert_eq!(listing(dir.path()), ["pre.img"], "{kind}: leftovers");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_successful_import_replaces_dest_through_its_link() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(3 * MIB);
    let raw = dir.path().join("src.raw");
    std::fs::write(&raw, &data).unwrap();
    let real = dir.path().join("real.img");
    std::fs::write(&real, b"old contents").unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = dir.path().join("link.img");
    std::os::unix::fs::symlink("real.img", &link).unwrap();
    let run = cdi_import(args(&[
        "--source",
        raw.to_str().unwrap(),
        link.to_str().unwrap(),
    ]))
    .await;
    assert!(run.ok, "{}", run.stderr);
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    assert_same(&std::fs::read(&real).unwrap(), &data, "the replaced image");
    let mode = std::fs::metadata(&real).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the file keeps its permissions");
    assert_eq!(listing(dir.path()), ["link.img", "real.img", "src.raw"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_source_is_never_its_own_destination() {
    let dir = tempfile::tempdir().unwrap();
    let (image, _) = qcow2_of(dir.path(), &pattern(2 * MIB));
    let src = dir.path().join("src.qcow2");
    std::os::unix::fs::symlink("src.qcow2", dir.path().join("link.qcow2")).unwrap();
    std::fs::hard_link(&src, dir.path().join("hard.qcow2")).unwrap();
    let before = listing(dir.path());
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let cases = [
        (
            "the same path",
            path("src.qcow2"),
            path("src.qcow2"),
            vec![],
        ),
        (
            "DEST a link to it",
            path("src.qcow2"),
            path("link.qcow2"),
            vec![],
        ),
        (
            "the source a link",
            path("link.qcow2"),
            path("src.qcow2"),
            vec![],
        ),
        ("a hard link", path("src.qcow2"), path("hard.qcow2"), vec![]),
        (
            "in place with --block",
            path("src.qcow2"),
            path("link.qcow2"),
            vec!["--block".to_string()],
        ),
    ];
    for (what, source, dest, extra) in cases {
        let mut run_args = args(&["--source", &source]);
        run_args.extend(extra);
        run_args.push(dest.clone());
        let run = cdi_import(run_args).await;
        assert!(!run.ok, "{what}: the import succeeded");
        assert!(
            run.stderr
                .contains(&format!("{source} and {dest} are the same file")),
            "{what}: {}",
            run.stderr
        );
        assert!(
            std::fs::read(&src).unwrap() == image,
            "{what}: the source changed"
        );
        assert_eq!(listing(dir.path()), before, "{what}: leftovers");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn error_messages_name_each_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("disk.img");
    let missing = dir.path().join("nosuch.qcow2");
    let run = cdi_import(args(&[
        "--source",
        missing.to_str().unwrap(),
        dest.to_str().unwrap(),
    ]))
    .await;
    assert!(!run.ok);
    assert_eq!(
        run.stderr.matches("No such file or directory").count(),
        1,
        "{}",
        run.stderr
    );

    let base = dir.path().join("base.qcow2");
    cdi_testkit::images::qemu_img(&["create", "-f", "qcow2", base.to_str().unwrap(), "1M"]);
    let overlay = dir.path().join("overlay.qcow2");
    cdi_testkit::images::qemu_img(&[
        "create",
        "-f",
        "qcow2",
        "-b",
        base.to_str().unwrap(),
        "-F",
        "qcow2",
        overlay.to_str().unwrap(),
    ]);
    let run = cdi_import(args(&[
        "--source",
        overlay.to_str().unwrap(),
        dest.to_str().unwrap(),
    ]))
    .await;
    assert!(!run.ok);
    assert!(
        run.stderr.contains("invalid qcow2 image: "),
        "{}",
        run.stderr
    );
    assert_eq!(
        run.stderr.matches("has a backing file").count(),
        1,
        "{}",
        run.stderr
    );
    assert_eq!(listing(dir.path()), ["base.qcow2", "overlay.qcow2"]);

    let nowhere = dir.path().join("nosuch/disk.img");
    let run = cdi_import(args(&[
        "--source",
        base.to_str().unwrap(),
        nowhere.to_str().unwrap(),
    ]))
    .await;
    assert!(!run.ok);
    let missing_dir = dir.path().join("nosuch");
    assert!(
        run.stderr.contains(&format!(
            "the directory {} does not exist",
            missing_dir.display()
        )),
        "{}",
        run.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn qcow2_images_past_64_pib_meet_the_size_check() {
    const VIRTUAL: u64 = 100 << 50;
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("huge.qcow2");
    // 2 MiB clusters: the L1 table of 100 PiB fits qemu's limit (a few MiB of file).
    cdi_testkit::images::qemu_img(&[
        "create",
        "-f",
        "qcow2",
        "-o",
        "cluster_size=2M",
        image.to_str().unwrap(),
        "100P",
    ]);
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("disk.img");
    let run = cdi_import(args(&[
        "--source",
        image.to_str().unwrap(),
        "--size",
        "10Gi",
        dest.to_str().unwrap(),
    ]))
    .await;
    assert!(!run.ok);
    assert!(
        run.stderr.contains(&format!(
            "a larger PVC is required: image virtual size {VIRTUAL} > usable"
        )),
        "{}",
        run.stderr
    );
    assert!(listing(out.path()).is_empty(), "{:?}", listing(out.path()));

    // Without --size the disk is the image's size: whether that works is the filesystem's call.
    let probe = out.path().join("probe");
    let fits = std::fs::File::create(&probe).unwrap().set_len(VIRTUAL);
    std::fs::remove_file(&probe).unwrap();
    let run = cdi_import(args(&[
        "--source",
        image.to_str().unwrap(),
        dest.to_str().unwrap(),
    ]))
    .await;
    match fits {
        Ok(()) => {
            assert!(run.ok, "{}", run.stderr);
            assert_eq!(std::fs::metadata(&dest).unwrap().len(), VIRTUAL);
            assert_eq!(listing(out.path()), ["disk.img"]);
        }
        Err(e) => {
            assert!(!run.ok);
            let cause = e.to_string();
            assert!(
                run.stderr.contains(&format!(
                    "resizing {} to {VIRTUAL} bytes: {cause}",
                    dest.display()
                )),
                "{}",
                run.stderr
            );
            assert_eq!(run.stderr.matches(&cause).count(), 1, "{}", run.stderr);
            assert!(listing(out.path()).is_empty(), "{:?}", listing(out.path()));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_import_leaves_dest_as_it_was() {
    use rustix::process::Signal;
    // SIGHUP: the terminal closed.
    for (signal, name) in [(Signal::INT, "SIGINT"), (Signal::HUP, "SIGHUP")] {
        interrupt_an_import(signal, name).await;
    }
}

async fn interrupt_an_import(signal: rustix::process::Signal, name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("pre.img");
    std::fs::write(&dest, b"precious\n").unwrap();
    let server = FileServer::start(None).await;
    server.add(
        "/disk.raw",
        pattern(8 * MIB),
        Behaviour {
            ranges: true,
            // Long enough that only the signal ends the import.
            stall_after: Some((MIB, std::time::Duration::from_secs(600))),
            ..Default::default()
        },
    );
    let child = Command::new(env!("CARGO_BIN_EXE_cdi"))
        .args(["import", "--source", &server.url("/disk.raw")])
        .arg(&dest)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the import is writing: its temporary file grown to the image size (or, were it
    // written in place, DEST changed).
    let started = std::time::Instant::now();
    let temp = loop {
        let temp = listing(dir.path()).into_iter().find(|n| n != "pre.img");
        let sized = temp
            .as_ref()
            .and_then(|t| std::fs::metadata(dir.path().join(t)).ok())
            .is_some_and(|m| m.len() > 0);
        if sized || std::fs::read(&dest).unwrap_or_default() != b"precious\n" {
            break temp;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the import did not start"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, signal).unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("interrupted by {name}")),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&dest).unwrap(), b"precious\n");
    assert!(
        temp.is_some_and(|t| t.starts_with(".pre.img.cdi-import-")),
        "written beside DEST"
    );
    assert_eq!(listing(dir.path()), ["pre.img"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn sources_that_are_not_files_or_block_devices_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let dest = dir.path().join("pre.img");
    std::fs::write(&dest, b"precious\n").unwrap();
    let before = listing(dir.path());
    // /dev/zero first: before the fix, opening the FIFO blocked for want of a writer.
    for source in [PathBuf::from("/dev/zero"), dir.path().into(), fifo.clone()] {
        let run = cdi_import(args(&[
            "--source",
            source.to_str().unwrap(),
            dest.to_str().unwrap(),
        ]))
        .await;
        assert!(!run.ok, "{}: the import succeeded", source.display());
        assert!(
            run.stderr.contains(&format!(
                "{} is not a regular file or block device",
                source.display()
            )),
            "{}",
            run.stderr
        );
        assert_eq!(std::fs::read(&dest).unwrap(), b"precious\n");
        assert_eq!(
            listing(dir.path()),
            before,
            "{}: leftovers",
            source.display()
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_block_device_source_is_read_to_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(3 * MIB);
    let backing = dir.path().join("backing.raw");
    std::fs::write(&backing, &data).unwrap();
    let attach = Command::new("losetup")
        .args(["--find", "--show"])
        .arg(&backing)
        .output();
    let device = match attach {
        Ok(out) if out.status.success() => {
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        }
        Ok(out) => {
            eprintln!(
                "skipped: losetup cannot attach a loop device here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return;
        }
        Err(e) => {
            eprintln!("skipped: losetup cannot run here: {e}");
            return;
        }
    };
    let dest = dir.path().join("disk.img");
    let run = cdi_import(args(&["--source", &device, dest.to_str().unwrap()])).await;
    let _ = Command::new("losetup").args(["-d", &device]).status();
    assert!(run.ok, "{}", run.stderr);
    assert_same(&std::fs::read(&dest).unwrap(), &data, "the device's image");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_scratch_file_never_follows_a_planted_link() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let (_, expected) = qcow2_of(dir.path(), &pattern(2 * MIB));
    // A compressed VMDK is spooled to scratch before conversion.
    let vmdk = dir.path().join("src.vmdk");
    convert(&dir.path().join("src.raw"), "vmdk", &[], &vmdk);
    let source = dir.path().join("src.vmdk.gz");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&std::fs::read(&vmdk).unwrap()).unwrap();
    std::fs::write(&source, gz.finish().unwrap()).unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"victim\n").unwrap();
    // A link at each name the pid-based scheme would give the next few thousand processes.
    let scratch = dir.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for pid in last + 1..last + 5000 {
        std::os::unix::fs::symlink(&victim, scratch.join(format!("cdi-scratch-{pid}.img")))
            .unwrap();
    }
    let planted = listing(&scratch);
    let dest = dir.path().join("disk.img");
    let run = cdi_import(args(&[
        "--source",
        source.to_str().unwrap(),
        "--scratch-dir",
        scratch.to_str().unwrap(),
        dest.to_str().unwrap(),
    ]))
    .await;
    assert!(run.ok, "{}", run.stderr);
    assert!(
        std::fs::read(&victim).unwrap() == b"victim\n",
        "a planted link was followed: its target was overwritten"
    );
    assert_same(&std::fs::read(&dest).unwrap(), &expected, "the image");
    assert_eq!(listing(&scratch), planted, "the scratch file is removed");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replaced_dest_keeps_its_owner_and_mode() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: only root can give DEST to another owner");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(MIB);
    let raw = dir.path().join("src.raw");
    std::fs::write(&raw, &data).unwrap();
    let dest = dir.path().join("disk.img");
    std::fs::write(&dest, b"old").unwrap();
    std::os::unix::fs::chown(&dest, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o600)).unwrap();
    let run = cdi_import(args(&[
        "--source",
        raw.to_str().unwrap(),
        dest.to_str().unwrap(),
    ]))
    .await;
    assert!(run.ok, "{}", run.stderr);
    let m = std::fs::metadata(&dest).unwrap();
    assert_eq!((m.uid(), m.gid()), (65534, 65534), "the owner is kept");
    assert_eq!(m.permissions().mode() & 0o7777, 0o600, "the mode is kept");
    assert_same(&std::fs::read(&dest).unwrap(), &data, "the image");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dangling_link_is_written_through_and_stays_a_link() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(MIB);
    let raw = dir.path().join("src.raw");
    std::fs::write(&raw, &data).unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    // A chain: the second link is relative to its own directory.
    let link = dir.path().join("link.img");
    std::os::unix::fs::symlink("sub/next", &link).unwrap();
    std::os::unix::fs::symlink("new.img", dir.path().join("sub/next")).unwrap();
    let run = cdi_import(args(&[
        "--source",
        raw.to_str().unwrap(),
        link.to_str().unwrap(),
    ]))
    .await;
    assert!(run.ok, "{}", run.stderr);
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    assert!(
        std::fs::symlink_metadata(dir.path().join("sub/next"))
            .unwrap()
            .is_symlink()
    );
    let image = std::fs::read(dir.path().join("sub/new.img")).unwrap();
    assert_same(&image, &data, "the image at the link's end");
    assert_eq!(listing(&dir.path().join("sub")), ["new.img", "next"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dest_name_of_250_bytes_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(MIB);
    let raw = dir.path().join("src.raw");
    std::fs::write(&raw, &data).unwrap();
    let name = format!("{}.img", "d".repeat(246));
    assert_eq!(name.len(), 250);
    let dest = dir.path().join(&name);
    std::fs::write(&dest, b"old").unwrap();
    let run = cdi_import(args(&[
        "--source",
        raw.to_str().unwrap(),
        dest.to_str().unwrap(),
    ]))
    .await;
    assert!(run.ok, "{}", run.stderr);
    assert_same(&std::fs::read(&dest).unwrap(), &data, "the image");
    assert_eq!(listing(dir.path()), [name, "src.raw".to_string()]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dest_that_cannot_be_a_file_is_refused_before_importing() {
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("src.raw");
    std::fs::write(&raw, pattern(MIB)).unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"precious\n").unwrap();
    let before = listing(dir.path());
    let path = |p: &str| format!("{}/{p}", dir.path().display());
    let cases = [
        (path("newf/"), "ends in '/'".to_string()),
        (path("file/"), "ends in '/'".to_string()),
        (
            path("file/x"),
            format!("{} is not a directory", file.display()),
        ),
    ];
    for (dest, cause) in cases {
        let run = cdi_import(args(&["--source", raw.to_str().unwrap(), &dest])).await;
        assert!(!run.ok, "{dest}: the import succeeded");
        assert!(run.stderr.contains(&cause), "{dest}: {}", run.stderr);
        assert!(!run.stderr.contains("renaming"), "{dest}: {}", run.stderr);
        assert_eq!(std::fs::read(&file).unwrap(), b"precious\n");
        assert_eq!(listing(dir.path()), before, "{dest}: leftovers");
    }
}

/// `cdi importer` for the registry image at `url`, with `extra` settings.
async fn registry_import(pod: &Pod, url: &str, extra: &[(&str, &str)]) -> Outcome {
    let mut env = vec![
        ("IMPORTER_SOURCE", "registry"),
        ("IMPORTER_ENDPOINT", url),
        ("IMPORTER_CONTENTTYPE", "kubevirt"),
        ("IMPORTER_IMAGE_SIZE", "64Mi"),
        ("FILESYSTEM_OVERHEAD", "0.06"),
    ];
    env.extend_from_slice(extra);
    pod.run(&env).await
}

/// What a failed import said (a refused image exits 0 with a fatal reason, as upstream's
/// importer does for what no retry mends).
fn failure(out: &Outcome, what: &str) -> String {
    let said = cdi_api::TerminationMessage::parse(&out.termination);
    assert!(
        !out.ok || said.is_fatal(),
        "{what}: the import should have failed: {}",
        out.stderr
    );
    said.message.unwrap_or_default()
}

/// Images in a real registry (Debian's docker-registry, plain HTTP, listed as insecure), built
/// at test time and pushed by skopeo: each imports byte-equal to qemu-img's conversion of its
/// disk, or fails saying what is wrong with the image.
#[tokio::test(flavor = "multi_thread")]
async fn registry_images_import_their_one_disk() {
    use cdi_testkit::oci::{Entry, Image, Layer, Layout};
    let work = tempfile::tempdir().unwrap();
    let (qcow2, expected) = qcow2_of(work.path(), &pattern(6 * MIB));
    let raw = pattern(3 * MIB + 512);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &raw).unwrap();
    let raw_gz = gz.finish().unwrap();

    let mut layout = Layout::new(&work.path().join("layout"));
    let mut tag = |name: &str, image: &Image| {
        let d = layout.add_image(image);
        layout.tag(name, &d);
    };
    let mut labelled = Image::new(vec![Layer::disk("fedora.qcow2", qcow2.clone())]);
    labelled.env = vec![
        "PATH=/bin".into(),
        "INSTANCETYPE_KUBEVIRT_IO_DEFAULT_INSTANCETYPE=u1.small".into(),
        "INSTANCETYPE_KUBEVIRT_IO_DEFAULT_PREFERENCE=fedora".into(),
    ];
    tag("qcow2", &labelled);
    // An uncompressed layer; the disk's path as some builders write it.
    tag(
        "raw",
        &Image::new(vec![Layer::tar(vec![
            Entry::Dir("./disk".into()),
            Entry::File("./disk/disk.img".into(), raw.clone()),
        ])]),
    );
    tag(
        "gz",
        &Image::new(vec![Layer::disk("disk.img.gz", raw_gz.clone())]),
    );
    // The disk in a lower layer beside a stale one that the layer above removes, and a
    // base layer below with a disk the middle layer's opaque directory hides.
    tag(
        "whiteout",
        &Image::new(vec![
            Layer::disk("base.raw", pattern(MIB)),
            Layer::gzip(vec![
                Entry::Opaque("disk".into()),
                Entry::File("disk/disk.qcow2".into(), qcow2.clone()),
                Entry::File("disk/stale.raw".into(), pattern(MIB)),
            ]),
            Layer::gzip(vec![
                Entry::Whiteout("disk/stale.raw".into()),
                Entry::File("etc/motd".into(), b"hello".to_vec()),
            ]),
        ]),
    );
    tag(
        "empty",
        &Image::new(vec![Layer::gzip(vec![Entry::File(
            "etc/motd".into(),
            b"no disk".to_vec(),
        )])]),
    );
    tag(
        "two",
        &Image::new(vec![Layer::gzip(vec![
            Entry::File("disk/a.qcow2".into(), qcow2.clone()),
            Entry::File("disk/b.raw".into(), pattern(MIB)),
        ])]),
    );
    let mut bootc = Image::new(vec![Layer::disk("disk.img", pattern(MIB))]);
    bootc.labels.insert("containers.bootc".into(), "1".into());
    tag("bootc", &bootc);
    let mut arm = Image::new(vec![Layer::disk("disk.img", raw.clone())]);
    arm.architecture = "arm64".into();
    tag("arm-only", &arm);
    // An index of this machine's architecture (the qcow2) and another (the raw disk).
    let host = cdi_importer::sources::registry::host_architecture();
    let other = if host == "arm64" { "amd64" } else { "arm64" };
    let ours = layout.add_image(&Image::new(vec![Layer::disk("disk.qcow2", qcow2.clone())]));
    let mut theirs = Image::new(vec![Layer::disk("disk.img", raw.clone())]);
    theirs.architecture = other.into();
    let theirs = layout.add_image(&theirs);
    let index = layout.add_index(&[(ours, host), (theirs, other)]);
    layout.tag("multi", &index);

    let registry =
        tokio::task::spawn_blocking(|| cdi_testkit::registry::Registry::start(Default::default()))
            .await
            .unwrap();
    for name in [
        "qcow2", "raw", "gz", "whiteout", "empty", "two", "bootc", "arm-only", "multi",
    ] {
        registry.push(&layout.dir, name, &format!("vm/disk:{name}"));
    }
    let insecure = [("INSECURE_TLS", "true")];
    let image = |pod: &Pod| std::fs::read(pod.data().join("disk.img")).unwrap();

    let pod = Pod::new();
    let out = registry_import(&pod, &registry.url("vm/disk:qcow2"), &insecure).await;
    assert!(out.ok, "{}", out.stderr);
    let message: serde_json::Value = serde_json::from_str(&out.termination).unwrap();
    assert_eq!(
        message,
        serde_json::json!({
            "preallocationApplied": false,
            "message": "Import Complete",
            "labels": {
                "instancetype.kubevirt.io/default-instancetype": "u1.small",
                "instancetype.kubevirt.io/default-preference": "fedora",
            },
        })
    );
    assert_same(&image(&pod)[..expected.len()], &expected, "qcow2 image");

    for (name, want) in [("raw", &raw), ("gz", &raw)] {
        let pod = Pod::new();
        let out = registry_import(&pod, &registry.url(&format!("vm/disk:{name}")), &insecure).await;
        assert!(out.ok, "{name}: {}", out.stderr);
        assert_same(&image(&pod)[..want.len()], want, name);
    }
    let pod = Pod::new();
    let out = registry_import(&pod, &registry.url("vm/disk:whiteout"), &insecure).await;
    assert!(out.ok, "{}", out.stderr);
    assert_same(&image(&pod)[..expected.len()], &expected, "whiteout image");

    // An index: this machine's architecture unless another is asked for.
    let pod = Pod::new();
    let out = registry_import(&pod, &registry.url("vm/disk:multi"), &insecure).await;
    assert!(out.ok, "{}", out.stderr);
    assert_same(
        &image(&pod)[..expected.len()],
        &expected,
        "this machine's image of the index",
    );
    let pod = Pod::new();
    let asked = [
        ("INSECURE_TLS", "true"),
        ("IMPORTER_REGISTRY_IMAGE_ARCHITECTURE", other),
    ];
    let out = registry_import(&pod, &registry.url("vm/disk:multi"), &asked).await;
    assert!(out.ok, "{}", out.stderr);
    assert_same(
        &image(&pod)[..raw.len()],
        &raw,
        "the other image of the index",
    );
    let listed = format!(
        "no image found in image index for architecture \"s390x\", variant \"\", OS \"linux\" (it has linux/{host}, linux/{other})"
    );

    let s390x = [
        ("INSECURE_TLS", "true"),
        ("IMPORTER_REGISTRY_IMAGE_ARCHITECTURE", "s390x"),
    ];
    let refusals = [
        (
            "empty",
            &insecure[..],
            "Failed to find VM disk image file in the container image",
        ),
        (
            "two",
            &insecure[..],
            "image directory contains more than one file (disk/a.qcow2 and disk/b.raw)",
        ),
        ("bootc", &insecure[..], "bootc image detected"),
        (
            "arm-only",
            &s390x[..],
            "manifest image architecture: \"arm64\" doesn't match requested architecture: \"s390x\"",
        ),
        ("multi", &s390x[..], listed.as_str()),
        ("missing", &insecure[..], "failed to pull image"),
    ];
    for (name, env, want) in refusals {
        let pod = Pod::new();
        let out = registry_import(&pod, &registry.url(&format!("vm/disk:{name}")), env).await;
        let said = failure(&out, name);
        assert!(said.contains(want), "{name}: {said}");
        assert!(
            !pod.data().join("disk.img").exists(),
            "{name}: no image left"
        );
    }
}

/// A registry with TLS and basic authentication: the certConfigMap's CA and the Secret's
/// credentials reach it; without the credentials, with a wrong password, or without the CA,
/// the import fails saying so, and never prints the password.
#[tokio::test(flavor = "multi_thread")]
async fn registries_with_tls_and_credentials() {
    use cdi_testkit::oci::{Image, Layer, Layout};
    let work = tempfile::tempdir().unwrap();
    let (qcow2, expected) = qcow2_of(work.path(), &pattern(4 * MIB));
    let mut layout = Layout::new(&work.path().join("layout"));
    let d = layout.add_image(&Image::new(vec![Layer::disk("disk.qcow2", qcow2)]));
    layout.tag("v1", &d);
    let registry = tokio::task::spawn_blocking(|| {
        cdi_testkit::registry::Registry::start(cdi_testkit::registry::Options {
            tls: true,
            auth: Some(("cdi".into(), "s3cret-pass".into())),
        })
    })
    .await
    .unwrap();
    registry.push(&layout.dir, "v1", "private/disk:v1");
    let certs = work.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let ca = &registry.ca.as_ref().unwrap().ca_pem;
    std::fs::write(certs.join("ca.pem"), ca).unwrap();
    let certs = certs.to_str().unwrap();
    let url = registry.url("private/disk:v1");

    let pod = Pod::new();
    let good = [
        ("IMPORTER_CERT_DIR", certs),
        ("IMPORTER_ACCESS_KEY_ID", "cdi"),
        ("IMPORTER_SECRET_KEY", "s3cret-pass"),
    ];
    let out = registry_import(&pod, &url, &good).await;
    assert!(out.ok, "{}", out.stderr);
    let disk = std::fs::read(pod.data().join("disk.img")).unwrap();
    assert_same(&disk[..expected.len()], &expected, "image data");

    // Insecure: the certificate goes unchecked.
    let pod = Pod::new();
    let insecure = [
        ("INSECURE_TLS", "true"),
        ("IMPORTER_ACCESS_KEY_ID", "cdi"),
        ("IMPORTER_SECRET_KEY", "s3cret-pass"),
    ];
    let out = registry_import(&pod, &url, &insecure).await;
    assert!(out.ok, "{}", out.stderr);

    let wrong = [
        ("IMPORTER_CERT_DIR", certs),
        ("IMPORTER_ACCESS_KEY_ID", "cdi"),
        ("IMPORTER_SECRET_KEY", "not-the-pass"),
    ];
    let anonymous = [("IMPORTER_CERT_DIR", certs)];
    let unknown_ca = [
        ("IMPORTER_ACCESS_KEY_ID", "cdi"),
        ("IMPORTER_SECRET_KEY", "s3cret-pass"),
    ];
    for (what, env, want) in [
        ("wrong password", &wrong[..], "failed to pull image"),
        ("no credentials", &anonymous[..], "failed to pull image"),
        ("unknown CA", &unknown_ca[..], "certificate"),
    ] {
        let pod = Pod::new();
        let out = registry_import(&pod, &url, env).await;
        let said = failure(&out, what);
        assert!(said.contains(want) && said.contains(&url), "{what}: {said}");
        assert!(!said.contains("s3cret-pass") && !out.stderr.contains("s3cret-pass"));
        assert!(
            !pod.data().join("disk.img").exists(),
            "{what}: no image left"
        );
    }
}

async fn gcs_import(pod: &Pod, url: &str, credentials: Option<String>) -> Outcome {
    let mut env = vec![
        ("IMPORTER_SOURCE", "gcs"),
        ("IMPORTER_ENDPOINT", url),
        ("IMPORTER_IMAGE_SIZE", "64Mi"),
    ];
    if let Some(file) = &credentials {
        env.push(("GOOGLE_APPLICATION_CREDENTIALS", file));
    }
    pod.run(&env).await
}

/// `source.gcs` against a GCS emulator on 127.0.0.1 behind Google's token flow: with the
/// Secret's service-account key the importer buys a token and reads the private object by range
/// (qcow2 converts with no scratch space: this pod has none); a public object needs no key. No
/// key, a key the token endpoint does not know, or a key file that is not one each fail saying
/// so, without printing the key.
#[tokio::test(flavor = "multi_thread")]
async fn gcs_objects_import_with_a_service_account_key() {
    use cdi_testkit::gcs::{GcsServer, ServiceAccountKey};
    let work = tempfile::tempdir().unwrap();
    let (qcow2, expected) = qcow2_of(work.path(), &pattern(6 * MIB));
    let gcs = GcsServer::start().await;
    gcs.put("images", "fedora/disk.qcow2", &qcow2).await;
    gcs.put("public-images", "disk.qcow2", &qcow2).await;
    let private = gcs.url("images", "fedora/disk.qcow2");
    let email = "importer@cdi-test.iam.gserviceaccount.com";
    let key = |pod: &Pod, json: &str| {
        let file = pod.path("google/credentials.json");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, json).unwrap();
        file.to_string_lossy().into_owned()
    };
    let pod = Pod::new();
    let trusted = gcs.service_account(email);
    let out = gcs_import(&pod, &private, Some(key(&pod, &trusted.json))).await;
    assert!(out.ok, "{}", out.stderr);
    let disk = std::fs::read(pod.data().join("disk.img")).unwrap();
    assert_same(
        &disk[..expected.len()],
        &expected,
        "the private object's image",
    );
    assert_eq!(
        gcs.tokens_granted(),
        1,
        "one token serves every range request"
    );

    let pod = Pod::new();
    let out = gcs_import(&pod, &gcs.url("public-images", "disk.qcow2"), None).await;
    assert!(out.ok, "{}", out.stderr);
    let disk = std::fs::read(pod.data().join("disk.img")).unwrap();
    assert_same(
        &disk[..expected.len()],
        &expected,
        "the public object's image",
    );

    let stranger = ServiceAccountKey::generate(email, gcs.token_uri());
    for (what, json, want) in [
        ("no key", None, "HTTP 401"),
        (
            "a key the token endpoint does not know",
            Some(stranger.json.as_str()),
            "Invalid JWT Signature",
        ),
        (
            "not a key",
            Some("{\"type\": \"service_account\""),
            "is not a JSON key",
        ),
    ] {
        let pod = Pod::new();
        let file = json.map(|j| key(&pod, j));
        let refused = gcs.refused();
        let out = gcs_import(&pod, &private, file).await;
        let said = failure(&out, what);
        assert!(said.contains(want), "{what}: {said}");
        if json.is_some() {
            assert!(
                said.contains("credentials.json") || said.contains(email),
                "{what}: {said}"
            );
            assert_eq!(
                gcs.refused(),
                refused,
                "{what}: no object request without a token"
            );
        }
        assert!(!said.contains("PRIVATE KEY") && !out.stderr.contains("PRIVATE KEY"));
        assert!(
            !pod.data().join("disk.img").exists(),
            "{what}: no image left"
        );
    }
}

/// `oci-archive:` images served over HTTP, read in place by range requests: a layered image
/// (the disk below a whiteout, env labels) and an index of architectures import byte-equal to
/// qemu-img's conversion; `oci-archive://host/…` is reached like an insecure registry (plain
/// HTTP when it speaks no TLS); a server without ranges, an archive of two images, and a file
/// that is no archive are refused saying so.
#[tokio::test(flavor = "multi_thread")]
async fn oci_archives_served_over_http_import_their_one_disk() {
    use cdi_testkit::oci::{Entry, Image, Layer, Layout};
    let work = tempfile::tempdir().unwrap();
    let (qcow2, expected) = qcow2_of(work.path(), &pattern(5 * MIB));
    let raw = pattern(2 * MIB);
    let archive_of = |name: &str, build: &dyn Fn(&mut Layout)| {
        let mut layout = Layout::new(&work.path().join(name));
        build(&mut layout);
        layout.archive()
    };
    let layered = archive_of("layered", &|layout| {
        let mut image = Image::new(vec![
            Layer::gzip(vec![
                Entry::File("disk/disk.qcow2".into(), qcow2.clone()),
                Entry::File("disk/stale.raw".into(), pattern(MIB)),
            ]),
            Layer::gzip(vec![Entry::Whiteout("disk/stale.raw".into())]),
        ]);
        image.env = vec!["INSTANCETYPE_KUBEVIRT_IO_DEFAULT_PREFERENCE=fedora".into()];
        let d = layout.add_image(&image);
        layout.tag("latest", &d);
    });
    let host = cdi_importer::sources::registry::host_architecture();
    let other = if host == "arm64" { "amd64" } else { "arm64" };
    let multi = archive_of("multi", &|layout| {
        let ours = layout.add_image(&Image::new(vec![Layer::disk("disk.qcow2", qcow2.clone())]));
        let mut theirs = Image::new(vec![Layer::disk("disk.img", raw.clone())]);
        theirs.architecture = other.into();
        let theirs = layout.add_image(&theirs);
        let index = layout.add_index(&[(ours, host), (theirs, other)]);
        layout.tag("latest", &index);
    });
    let two = archive_of("two", &|layout| {
        let a = layout.add_image(&Image::new(vec![Layer::disk("a.img", raw.clone())]));
        let b = layout.add_image(&Image::new(vec![Layer::disk("b.img", raw.clone())]));
        layout.tag("a", &a);
        layout.tag("b", &b);
    });
    let server = FileServer::start(None).await;
    let ranges = Behaviour {
        ranges: true,
        ..Default::default()
    };
    server.add("/layered.tar", layered.clone(), ranges.clone());
    server.add("/multi.tar", multi, ranges.clone());
    server.add("/two.tar", two, ranges.clone());
    server.add("/plain.tar", layered, Behaviour::default());
    server.add("/not.tar", pattern(64 * 1024), ranges);
    let url = |path: &str| format!("oci-archive:{}", server.url(path));
    let image = |pod: &Pod| std::fs::read(pod.data().join("disk.img")).unwrap();

    let pod = Pod::new();
    let out = registry_import(&pod, &url("/layered.tar"), &[]).await;
    assert!(out.ok, "{}", out.stderr);
    assert_same(
        &image(&pod)[..expected.len()],
        &expected,
        "the layered archive",
    );
    let said: serde_json::Value = serde_json::from_str(&out.termination).unwrap();
    assert_eq!(
        said["labels"]["instancetype.kubevirt.io/default-preference"],
        "fedora"
    );
    // Read in place: the layer's bytes once, plus headers and the small documents.
    let fetched: u64 = server
        .log()
        .iter()
        .filter(|l| l.path == "/layered.tar")
        .map(|l| l.sent)
        .sum();
    assert!(
        fetched < qcow2.len() as u64 + 2 * MIB,
        "{fetched} bytes fetched for a {}-byte disk",
        qcow2.len()
    );

    let pod = Pod::new();
    let out = registry_import(&pod, &url("/multi.tar"), &[]).await;
    assert!(out.ok, "{}", out.stderr);
    assert_same(
        &image(&pod)[..expected.len()],
        &expected,
        "this machine's architecture",
    );
    let pod = Pod::new();
    let out = registry_import(
        &pod,
        &url("/multi.tar"),
        &[("IMPORTER_REGISTRY_IMAGE_ARCHITECTURE", other)],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_same(&image(&pod)[..raw.len()], &raw, "the other architecture");

    // `oci-archive://host/…` on an insecure host without TLS: plain HTTP.
    let pod = Pod::new();
    let bare = url("/layered.tar").replace("oci-archive:http://", "oci-archive://");
    let out = registry_import(&pod, &bare, &[("INSECURE_TLS", "true")]).await;
    assert!(out.ok, "{}", out.stderr);
    assert_same(&image(&pod)[..expected.len()], &expected, "oci-archive://");

    for (what, at, want) in [
        (
            "no ranges",
            url("/plain.tar"),
            "does not answer range requests",
        ),
        ("two images", url("/two.tar"), "holds 2 images (a, b)"),
        ("not an archive", url("/not.tar"), "not an oci-archive"),
        (
            "a path in the pod",
            "oci-archive:/images/disk.tar".into(),
            "nothing puts files there",
        ),
    ] {
        let pod = Pod::new();
        let out = registry_import(&pod, &at, &[]).await;
        let said = failure(&out, what);
        assert!(said.contains(want), "{what}: {said}");
        assert!(
            !pod.data().join("disk.img").exists(),
            "{what}: no image left"
        );
    }
}
