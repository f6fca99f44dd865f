//! Imports over real HTTP(S) from a server on 127.0.0.1 that misbehaves on purpose.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cdi_importer::ImportError;
use cdi_importer::convert::{Progress, Tuning};
use cdi_importer::http::{HttpSource, RetryPolicy};
use cdi_importer::import::{ImportOptions, ImportReport, TargetSpec, import};
use cdi_importer::probe::{Compression, Format};
use cdi_testkit::images::{assert_same, convert, oracle, pattern};
use cdi_testkit::{Behaviour, FileServer, TestCa};

const MIB: u64 = 1 << 20;

struct Fixture {
    dir: tempfile::TempDir,
    raw: Vec<u8>,
    qcow2: Vec<u8>,
    expected: Vec<u8>,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let raw = pattern(12 * MIB + 4096);
        let src = dir.path().join("src.raw");
        std::fs::write(&src, &raw).unwrap();
        let img = dir.path().join("img.qcow2");
        convert(&src, "qcow2", &["-c"], &img);
        let expected = oracle(&img, "qcow2");
        Fixture {
            qcow2: std::fs::read(&img).unwrap(),
            raw,
            expected,
            dir,
        }
    }

    fn target(&self) -> PathBuf {
        self.dir.path().join("disk.img")
    }

    fn options(&self) -> ImportOptions {
        ImportOptions {
            target: TargetSpec::File(self.target()),
            size: None,
            overhead: "0.06".parse().unwrap(),
            preallocate: false,
            checksum: None,
            scratch_dir: self.dir.path().join("scratch"),
            scratch_mounted: false,
            tuning: Tuning {
                request_bytes: MIB,
                parallel: 3,
                max_gap: 64 * 1024,
                ..Tuning::default()
            },
        }
    }

    async fn import(&self, source: HttpSource) -> Result<ImportReport, ImportError> {
        self.import_with(source, self.options()).await
    }

    async fn import_with(
        &self,
        source: HttpSource,
        opts: ImportOptions,
    ) -> Result<ImportReport, ImportError> {
        import(&source, &opts, Arc::new(Progress::default())).await
    }

    fn output(&self) -> Vec<u8> {
        std::fs::read(self.target()).unwrap()
    }

    /// A temporary image file is left beside the target.
    fn leftovers(&self) -> bool {
        std::fs::read_dir(self.dir.path()).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .contains("cdi-import")
        })
    }
}

fn quick_retry() -> RetryPolicy {
    RetryPolicy {
        retries: 4,
        backoff: Duration::from_millis(20),
        stall: Duration::from_millis(800),
        connect: Duration::from_secs(5),
    }
}

fn source(url: String) -> HttpSource {
    HttpSource {
        url,
        retry: quick_retry(),
        ..Default::default()
    }
}

fn ranged() -> Behaviour {
    Behaviour {
        ranges: true,
        ..Default::default()
    }
}

#[tokio::test]
async fn qcow2_streams_from_a_range_server_without_scratch() {
    let f = Fixture::new();
    let server = FileServer::start(None).await;
    server.add("/img.qcow2", f.qcow2.clone(), ranged());
    let report = f.import(source(server.url("/img.qcow2"))).await.unwrap();
    assert_eq!((report.format, report.scratch_used), (Format::Qcow2, false));
    assert_same(&f.output(), &f.expected, "qcow2 over ranges");
    let gets: Vec<_> = server
        .log()
        .into_iter()
        .filter(|l| l.method == "GET")
        .collect();
    assert!(
        gets.iter().all(|l| l.range.is_some() && l.status == 206),
        "only range requests: {gets:?}"
    );
    assert!(
        server.bytes_sent() <= f.qcow2.len() as u64 + 64 * 1024,
        "no byte fetched twice: {}",
        server.bytes_sent()
    );
    assert!(
        !f.dir.path().join("scratch").exists(),
        "no scratch directory was needed"
    );
}

#[tokio::test]
async fn without_range_support_raw_and_qcow2_stream_without_scratch() {
    let f = Fixture::new();
    let server = FileServer::start(None).await;
    server.add("/img.qcow2", f.qcow2.clone(), Behaviour::default());
    server.add(
        "/disk.raw",
        f.raw.clone(),
        Behaviour {
            no_head: true,
            ..Default::default()
        },
    );
    let report = f.import(source(server.url("/img.qcow2"))).await.unwrap();
    assert_eq!((report.format, report.scratch_used), (Format::Qcow2, false));
    assert_same(&f.output(), &f.expected, "qcow2 as it streams");
    let report = f.import(source(server.url("/disk.raw"))).await.unwrap();
    assert_eq!(
        (report.format, report.scratch_used, report.transferred),
        (Format::Raw, false, f.raw.len() as u64)
    );
    assert_same(&f.output(), &f.raw, "raw stream");
}

#[tokio::test]
async fn redirects_auth_and_extra_headers() {
    let f = Fixture::new();
    let server = FileServer::start(None).await;
    let guarded = Behaviour {
        ranges: true,
        basic_auth: Some(("user".into(), "s3cret".into())),
        required_headers: vec![("X-Token".into(), "abc".into())],
        ..Default::default()
    };
    server.add("/img.qcow2", f.qcow2.clone(), guarded);
    server.redirect("/latest", "/img.qcow2");
    let mut src = source(server.url("/latest"));
    src.basic_auth = Some(("user".into(), "s3cret".into()));
    src.headers = vec![("X-Token".into(), "abc".into())];
    f.import(src.clone()).await.unwrap();
    assert_same(&f.output(), &f.expected, "redirected, authenticated");

    src.basic_auth = Some(("user".into(), "wrong".into()));
    let err = f.import(src).await.unwrap_err().to_string();
    assert!(err.contains("401"), "{err}");
    assert!(
        !err.contains("wrong") && !err.contains("abc"),
        "no secret in the message: {err}"
    );
    assert_same(&f.output(), &f.expected, "a failed import keeps the image");
    assert!(!f.leftovers());
}

#[tokio::test]
async fn a_dropped_connection_resumes_with_a_range_request() {
    let f = Fixture::new();
    let server = FileServer::start(None).await;
    // The first twelve GETs (after the probe) break after 100 KiB: more breaks than the retry
    // budget, but each one after progress, which renews it.
    server.add(
        "/disk.raw",
        f.raw.clone(),
        Behaviour {
            ranges: true,
            drop_after: Some((100 * 1024, 12)),
            ..Default::default()
        },
    );
    let mut opts = f.options();
    opts.tuning.parallel = 1;
    f.import_with(source(server.url("/disk.raw")), opts)
        .await
        .unwrap();
    assert_same(&f.output(), &f.raw, "resumed raw");
    let resumed = server
        .log()
        .iter()
        .filter(|l| {
            l.range
                .as_deref()
                .is_some_and(|r| r.starts_with("bytes=102400-"))
        })
        .count();
    assert!(
        resumed >= 1,
        "resumed from the last good byte: {:?}",
        server.log()
    );
    assert!(
        server.bytes_sent() < f.raw.len() as u64 + 400 * 1024,
        "no restart from zero: {}",
        server.bytes_sent()
    );
}

/// A server that keeps no connection alive but does not say so: the next request on the reused
/// connection fails before any answer, and is sent again on a new one.
#[tokio::test]
async fn a_kept_alive_connection_the_server_drops_is_tried_again() {
    let f = Fixture::new();
    let server = FileServer::start(None).await;
    server.add(
        "/disk.qcow2",
        f.qcow2.clone(),
        Behaviour {
            ranges: true,
            close_silently: true,
            ..Default::default()
        },
    );
    f.import(source(server.url("/disk.qcow2"))).await.unwrap();
    assert_same(
        &f.output(),
        &f.expected,
        "through dropped keep-alive connections",
    );
}

/// An empty file answers the one-byte probe with 416 `bytes */0`: an empty image, as the same
/// file imported locally.
#[tokio::test]
async fn an_empty_file_is_an_empty_image() {
    let f = Fixture::new();
    let server = FileServer::start(None).await;
    server.add("/empty.raw", Vec::new(), ranged());
    f.import(source(server.url("/empty.raw"))).await.unwrap();
    assert!(f.output().is_empty());
}

/// A raw stream longer than the target holds is stopped at the limit; the message says the image
/// is larger, not how far it was read.
#[tokio::test]
async fn a_raw_stream_past_the_target_is_too_large() {
    let f = Fixture::new();
    let server = FileServer::start(None).await;
    server.add("/disk.raw", f.raw.clone(), Behaviour::default());
    let mut opts = f.options();
    opts.size = Some(cdi_importer::import::SizeSpec {
        requested: 4 * MIB,
        capacity: 4 * MIB,
    });
    let err = f
        .import_with(source(server.url("/disk.raw")), opts)
        .await
        .unwrap_err();
    assert!(err.is_fatal());
    assert!(
        err.to_string()
            .starts_with("a larger PVC is required: the image is larger than the usable"),
        "{err}"
    );
    assert!(!f.target().exists());
}

#[tokio::test]
async fn a_stream_resumes_too_and_a_stall_counts_as_a_break() {
    let f = Fixture::new();
    let server = FileServer::start(None).await;
    server.add(
        "/disk.raw.gz",
        {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            std::io::Write::write_all(&mut e, &f.raw).unwrap();
            e.finish().unwrap()
        },
        Behaviour {
            ranges: true,
            drop_after: Some((50 * 1024, 1)),
            stall_after: Some((300 * 1024, Duration::from_secs(5))),
            ..Default::default()
        },
    );
    let report = f.import(source(server.url("/disk.raw.gz"))).await.unwrap();
    assert_eq!(
        (report.format, report.compression),
        (Format::Raw, Some(Compression::Gzip))
    );
    assert_same(&f.output(), &f.raw, "gzip stream with a drop and a stall");
}

#[tokio::test]
async fn failures_leave_nothing_behind() {
    let f = Fixture::new();
    let server = FileServer::start(None).await;
    server.add(
        "/short.raw",
        f.raw.clone(),
        Behaviour {
            lie_content_length: Some(f.raw.len() as u64 * 2),
            ..Default::default()
        },
    );
    server.add(
        "/broken.raw",
        f.raw.clone(),
        Behaviour {
            drop_after: Some((10 * 1024, 100)),
            ..Default::default()
        },
    );

    let err = f
        .import(source(server.url("/short.raw")))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("/short.raw"), "{err}");
    assert!(
        !f.target().exists(),
        "a lying Content-Length is not a complete image"
    );

    let err = f
        .import(source(server.url("/broken.raw")))
        .await
        .unwrap_err();
    assert!(!f.target().exists(), "{err}");
    // A transfer that broke is said as such, not as damage to the image.
    assert!(
        matches!(err, ImportError::Http { status: None, .. }),
        "{err:?}"
    );

    // A redirect to a missing file names the file that is missing.
    server.redirect("/moved.raw", "/gone.raw");
    let err = f
        .import(source(server.url("/moved.raw")))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("/gone.raw") && err.contains("404"), "{err}");

    let both = HttpSource {
        basic_auth: Some(("user".into(), "pass".into())),
        headers: vec![("authorization".into(), "Bearer t".into())],
        ..source(server.url("/short.raw"))
    };
    let err = f.import(both).await.unwrap_err();
    assert!(err.is_fatal(), "{err}");
    assert!(err.to_string().contains("keep one of them"), "{err}");

    let err = f
        .import(source(server.url("/missing.qcow2")))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("/missing.qcow2") && err.contains("404"),
        "{err}"
    );
}

#[tokio::test]
async fn tls_with_a_custom_ca_or_insecure() {
    let f = Fixture::new();
    let ca = TestCa::new();
    let server = FileServer::start(Some(&ca)).await;
    server.add("/img.qcow2", f.qcow2.clone(), ranged());

    let err = f
        .import(source(server.url("/img.qcow2")))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.to_lowercase().contains("certificate"),
        "unknown CA refused: {err}"
    );

    let mut src = source(server.url("/img.qcow2"));
    src.ca_certs_pem = vec![ca.ca_pem.clone().into_bytes()];
    f.import(src).await.unwrap();
    assert_same(&f.output(), &f.expected, "TLS with the test CA");

    let mut src = source(server.url("/img.qcow2"));
    src.insecure = true;
    f.import(src).await.unwrap();
}

#[tokio::test]
async fn checksums_over_http() {
    let f = Fixture::new();
    let server = FileServer::start(None).await;
    server.add("/img.qcow2", f.qcow2.clone(), ranged());
    let mut h = cdi_importer::checksum::Hasher::new(cdi_importer::checksum::Algorithm::Sha512);
    h.update(&f.qcow2);
    let mut opts = f.options();
    opts.checksum = Some(format!("sha512:{}", h.finish()).parse().unwrap());
    let report = f
        .import_with(source(server.url("/img.qcow2")), opts.clone())
        .await
        .unwrap();
    assert_eq!(report.format, Format::Qcow2);
    assert_same(&f.output(), &f.expected, "checksummed qcow2");

    opts.checksum = Some(
        "sha1:0000000000000000000000000000000000000000"
            .parse()
            .unwrap(),
    );
    let err = f
        .import_with(source(server.url("/img.qcow2")), opts)
        .await
        .unwrap_err();
    assert!(matches!(err, ImportError::ChecksumMismatch { .. }), "{err}");
    assert!(err.is_fatal());
    assert_same(&f.output(), &f.expected, "a failed import keeps the image");
    assert!(!f.leftovers());
    // The image streamed as it was hashed: no scratch copy, none left.
    assert!(
        !f.dir
            .path()
            .join("scratch")
            .read_dir()
            .is_ok_and(|mut d| d.next().is_some())
    );
}
