//! Every image qemu-img can make converts to exactly the raw bytes `qemu-img convert -O raw`
//! gives. Images are generated at test time.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use cdi_importer::ImportError;
use cdi_importer::convert::{Progress, Tuning};
use cdi_importer::import::{ImportOptions, ImportReport, SizeSpec, TargetSpec, import_file};
use cdi_importer::probe::{Compression, Format};

const MIB: u64 = 1 << 20;

use cdi_testkit::images::{assert_same as same, qemu_img};

fn source_raw(path: &Path, size: u64) {
    std::fs::write(path, cdi_testkit::images::pattern(size)).unwrap();
}

struct Scenario {
    dir: tempfile::TempDir,
}

impl Scenario {
    fn new() -> Self {
        Scenario {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn options(&self, target: &str) -> ImportOptions {
        ImportOptions {
            target: TargetSpec::File(self.path(target)),
            size: None,
            overhead: "0.06".parse().unwrap(),
            preallocate: false,
            checksum: None,
            scratch_dir: self.path("scratch"),
            scratch_mounted: false,
            // Small requests so that coalescing and windows are exercised on small images.
            tuning: Tuning {
                request_bytes: MIB,
                parallel: 3,
                max_gap: 64 * 1024,
                ..Tuning::default()
            },
        }
    }

    async fn import(&self, src: &str, target: &str) -> Result<ImportReport, ImportError> {
        import_file(
            &self.path(src),
            &self.options(target),
            Arc::new(Progress::default()),
        )
        .await
    }

    /// qemu-img's own raw conversion of `image`.
    fn oracle(&self, image: &str, format: &str) -> Vec<u8> {
        cdi_testkit::images::oracle(&self.path(image), format)
    }

    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path(name)).unwrap()
    }
}

#[tokio::test]
async fn qcow2_variants_match_qemu_img() {
    let s = Scenario::new();
    // 24 MiB + 1536 bytes: not a multiple of any cluster size.
    source_raw(&s.path("src.raw"), 24 * MIB + 1536);
    let src = s.path("src.raw");
    let variants: &[(&str, &[&str])] = &[
        ("v3.qcow2", &["-o", "compat=1.1"]),
        ("v2.qcow2", &["-o", "compat=0.10"]),
        ("zlib.qcow2", &["-c"]),
        ("zstd.qcow2", &["-c", "-o", "compression_type=zstd"]),
        ("c512.qcow2", &["-o", "cluster_size=512"]),
        ("c2m.qcow2", &["-o", "cluster_size=2M"]),
        ("c4k-zlib.qcow2", &["-c", "-o", "cluster_size=4096"]),
        ("prealloc.qcow2", &["-o", "preallocation=metadata"]),
    ];
    for (name, opts) in variants {
        let mut args = vec!["convert", "-f", "raw", "-O", "qcow2"];
        args.extend_from_slice(opts);
        args.push(src.to_str().unwrap());
        let dst = s.path(name);
        args.push(dst.to_str().unwrap());
        qemu_img(&args);
        let out = format!("{name}.raw");
        let report = s
            .import(name, &out)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(report.format, Format::Qcow2, "{name}");
        assert_eq!(report.virtual_size, 24 * MIB + 1536, "{name}");
        same(&s.read(&out), &s.oracle(name, "qcow2"), name);
    }
}

#[tokio::test]
async fn zero_clusters_and_discarded_ranges() {
    let s = Scenario::new();
    source_raw(&s.path("src.raw"), 16 * MIB);
    qemu_img(&[
        "convert",
        "-f",
        "raw",
        "-O",
        "qcow2",
        s.path("src.raw").to_str().unwrap(),
        s.path("z.qcow2").to_str().unwrap(),
    ]);
    let out = Command::new("qemu-io")
        .args([
            "-f",
            "qcow2",
            "-c",
            "write -z 1M 3M",
            "-c",
            "discard 8M 2M",
            "-c",
            "write -P 0x11 12M 64k",
        ])
        .arg(s.path("z.qcow2"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.import("z.qcow2", "z.raw").await.unwrap();
    same(
        &s.read("z.raw"),
        &s.oracle("z.qcow2", "qcow2"),
        "zero clusters",
    );
}

#[tokio::test]
async fn raw_and_compressed_streams() {
    let s = Scenario::new();
    source_raw(&s.path("src.raw"), 9 * MIB + 512);
    let raw = s.read("src.raw");
    let report = s.import("src.raw", "copy.raw").await.unwrap();
    assert_eq!((report.format, report.compression), (Format::Raw, None));
    same(&s.read("copy.raw"), &raw, "raw");
    assert!(report.holes > 0, "zero runs are left as holes");
    // Not whole sectors: grown to the next 512 bytes, as qemu-img does.
    std::fs::write(s.path("odd.raw"), &raw[..1000]).unwrap();
    s.import("odd.raw", "odd.out").await.unwrap();
    same(
        &s.read("odd.out"),
        &s.oracle("odd.raw", "raw"),
        "1000-byte raw",
    );
    assert_eq!(s.read("odd.out").len(), 1024);

    let gz = {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut e, &raw).unwrap();
        e.finish().unwrap()
    };
    std::fs::write(s.path("src.raw.gz"), gz).unwrap();
    std::fs::write(
        s.path("src.raw.zst"),
        zstd::bulk::compress(&raw, 3).unwrap(),
    )
    .unwrap();
    let xz = {
        let mut e = liblzma::write::XzEncoder::new(Vec::new(), 1);
        std::io::Write::write_all(&mut e, &raw).unwrap();
        e.finish().unwrap()
    };
    std::fs::write(s.path("src.raw.xz"), xz).unwrap();
    for (name, compression) in [
        ("src.raw.gz", Compression::Gzip),
        ("src.raw.zst", Compression::Zstd),
        ("src.raw.xz", Compression::Xz),
    ] {
        let report = s
            .import(name, "out.raw")
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            (report.format, report.compression, report.scratch_used),
            (Format::Raw, Some(compression), false),
            "{name}"
        );
        same(&s.read("out.raw"), &raw, name);
    }

    // A compressed qcow2 converts as it is decompressed, without scratch.
    qemu_img(&[
        "convert",
        "-f",
        "raw",
        "-O",
        "qcow2",
        s.path("src.raw").to_str().unwrap(),
        s.path("img.qcow2").to_str().unwrap(),
    ]);
    let mut e = liblzma::write::XzEncoder::new(Vec::new(), 1);
    std::io::Write::write_all(&mut e, &s.read("img.qcow2")).unwrap();
    std::fs::write(s.path("img.qcow2.xz"), e.finish().unwrap()).unwrap();
    let report = s.import("img.qcow2.xz", "q.raw").await.unwrap();
    assert_eq!(
        (report.format, report.compression, report.scratch_used),
        (Format::Qcow2, Some(Compression::Xz), false)
    );
    same(&s.read("q.raw"), &raw, "qcow2.xz");
    assert!(
        !s.path("scratch/cdi-scratch.img").exists(),
        "scratch is removed"
    );
}

#[tokio::test]
async fn other_formats_through_qemu_img() {
    let s = Scenario::new();
    source_raw(&s.path("src.raw"), 8 * MIB);
    let raw = s.read("src.raw");
    for (name, format, opts) in [
        ("img.vmdk", "vmdk", "subformat=monolithicSparse"),
        ("stream.vmdk", "vmdk", "subformat=streamOptimized"),
        ("img.vhdx", "vhdx", "subformat=dynamic"),
        ("img.vdi", "vdi", "static=off"),
        ("img.vhd", "vpc", "subformat=dynamic"),
        ("fixed.vhd", "vpc", "subformat=fixed"),
    ] {
        qemu_img(&[
            "convert",
            "-f",
            "raw",
            "-O",
            format,
            "-o",
            opts,
            s.path("src.raw").to_str().unwrap(),
            s.path(name).to_str().unwrap(),
        ]);
        let out = format!("{name}.raw");
        let report = s
            .import(name, &out)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(report.format.name(), format, "{name}");
        // vpc rounds sizes to its geometry; compare with qemu-img's own conversion.
        same(&s.read(&out), &s.oracle(name, format), name);
        assert_eq!(
            &s.read(&out)[..raw.len().min(4 * MIB as usize)],
            &raw[..raw.len().min(4 * MIB as usize)],
            "{name}"
        );
    }
}

#[tokio::test]
async fn resize_to_the_usable_space_and_refuse_what_does_not_fit() {
    let s = Scenario::new();
    source_raw(&s.path("src.raw"), 8 * MIB);
    qemu_img(&[
        "convert",
        "-f",
        "raw",
        "-O",
        "qcow2",
        s.path("src.raw").to_str().unwrap(),
        s.path("img.qcow2").to_str().unwrap(),
    ]);
    let requested = 64 * MIB;
    let mut opts = s.options("disk.img");
    opts.size = Some(SizeSpec {
        requested,
        capacity: requested,
    });
    let report = import_file(&s.path("img.qcow2"), &opts, Arc::new(Progress::default()))
        .await
        .unwrap();
    let usable = cdi_core::size::usable_space(requested as i64, "0.06".parse().unwrap()) as u64;
    assert_eq!(report.final_size, usable);
    assert_eq!(std::fs::metadata(s.path("disk.img")).unwrap().len(), usable);
    same(
        &s.read("disk.img")[..8 * MIB as usize],
        &s.read("src.raw"),
        "data before the growth",
    );

    opts.size = Some(SizeSpec {
        requested: 8 * MIB,
        capacity: 8 * MIB,
    });
    let err = import_file(&s.path("img.qcow2"), &opts, Arc::new(Progress::default()))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("a larger PVC is required: image virtual size 8388608 > usable"),
        "{err}"
    );
    assert!(err.is_fatal());
    assert_eq!(
        std::fs::metadata(s.path("disk.img")).unwrap().len(),
        usable,
        "a failed import keeps the file that was there"
    );
    // The pod's own image is written in place: a failure removes it, so no partial image is
    // left claiming to be complete.
    opts.target = TargetSpec::VolumeFile(s.path("disk.img"));
    let err = import_file(&s.path("img.qcow2"), &opts, Arc::new(Progress::default()))
        .await
        .unwrap_err();
    assert!(err.is_fatal());
    assert!(!s.path("disk.img").exists());
    assert_eq!(
        std::fs::read_dir(s.dir.path()).unwrap().count(),
        2,
        "no leftovers"
    );
}

#[tokio::test]
async fn checksums() {
    let s = Scenario::new();
    source_raw(&s.path("src.raw"), 2 * MIB);
    let mut h = cdi_importer::checksum::Hasher::new(cdi_importer::checksum::Algorithm::Sha256);
    h.update(&s.read("src.raw"));
    let good = format!("sha256:{}", h.finish());
    let mut opts = s.options("disk.img");
    opts.checksum = Some(good.parse().unwrap());
    import_file(&s.path("src.raw"), &opts, Arc::new(Progress::default()))
        .await
        .unwrap();
    opts.checksum = Some("md5:00000000000000000000000000000000".parse().unwrap());
    let err = import_file(&s.path("src.raw"), &opts, Arc::new(Progress::default()))
        .await
        .unwrap_err();
    assert!(matches!(err, ImportError::ChecksumMismatch { .. }), "{err}");
    assert!(err.is_fatal());
    same(
        &s.read("disk.img"),
        &s.read("src.raw"),
        "a failed import keeps the file that was there",
    );
    opts.target = TargetSpec::VolumeFile(s.path("disk.img"));
    let err = import_file(&s.path("src.raw"), &opts, Arc::new(Progress::default()))
        .await
        .unwrap_err();
    assert!(matches!(err, ImportError::ChecksumMismatch { .. }), "{err}");
    assert!(!s.path("disk.img").exists());
}

#[tokio::test]
async fn dangerous_images_are_refused_before_anything_is_written() {
    let s = Scenario::new();
    source_raw(&s.path("base.raw"), MIB);
    let base = s.path("base.raw");
    qemu_img(&[
        "create",
        "-f",
        "qcow2",
        "-F",
        "raw",
        "-b",
        base.to_str().unwrap(),
        s.path("overlay.qcow2").to_str().unwrap(),
    ]);
    let err = s
        .import("overlay.qcow2", "o.raw")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("backing file") && err.contains("base.raw"),
        "{err}"
    );
    assert!(!s.path("o.raw").exists());

    qemu_img(&[
        "create",
        "-f",
        "qcow2",
        "-o",
        &format!("data_file={}", s.path("data.bin").display()),
        s.path("ext.qcow2").to_str().unwrap(),
        "1M",
    ]);
    let err = s
        .import("ext.qcow2", "e.raw")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("external data file"), "{err}");

    qemu_img(&[
        "create",
        "-f",
        "qcow2",
        "-o",
        "encrypt.format=luks,encrypt.key-secret=sec0",
        "--object",
        "secret,id=sec0,data=pw",
        s.path("enc.qcow2").to_str().unwrap(),
        "1M",
    ]);
    let err = s
        .import("enc.qcow2", "c.raw")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("encrypted"), "{err}");

    qemu_img(&[
        "create",
        "-f",
        "vmdk",
        "-o",
        "subformat=twoGbMaxExtentSparse",
        s.path("split.vmdk").to_str().unwrap(),
        "3G",
    ]);
    let err = s
        .import("split.vmdk", "v.raw")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("another file"), "{err}");

    // A truncated qcow2: tables point past the end.
    qemu_img(&[
        "convert",
        "-f",
        "raw",
        "-O",
        "qcow2",
        base.to_str().unwrap(),
        s.path("t.qcow2").to_str().unwrap(),
    ]);
    let full = s.read("t.qcow2");
    std::fs::write(s.path("t.qcow2"), &full[..3 * 65536]).unwrap();
    let err = s.import("t.qcow2", "t.raw").await.unwrap_err().to_string();
    assert!(
        err.contains("outside the") || err.contains("cut short"),
        "{err}"
    );
    assert!(!s.path("t.raw").exists());
}

#[tokio::test]
async fn iso_images_are_copied_as_raw() {
    let s = Scenario::new();
    let mut iso = cdi_testkit::images::pattern(4 * MIB);
    iso[0x8001..0x8006].copy_from_slice(b"CD001");
    std::fs::write(s.path("cd.iso"), &iso).unwrap();
    let report = s.import("cd.iso", "cd.raw").await.unwrap();
    assert_eq!(report.format, Format::Iso);
    same(&s.read("cd.raw"), &iso, "iso");
}

#[test]
fn written_qcow2_images_read_back_in_qemu_img() {
    let s = Scenario::new();
    // Data, a zero run, data at the end of a partial cluster.
    let mut raw = cdi_testkit::images::pattern(3 * MIB + 4321);
    raw[MIB as usize..2 * MIB as usize].fill(0);
    std::fs::write(s.path("src.raw"), &raw).unwrap();
    std::fs::write(
        s.path("made.qcow2"),
        cdi_importer::qcow2_write::from_raw(&raw),
    )
    .unwrap();
    let check = Command::new("qemu-img")
        .args(["check", "-f", "qcow2"])
        .arg(s.path("made.qcow2"))
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    // The size rounds up to whole sectors, as qemu-img's own images do.
    let mut expected = raw.clone();
    expected.resize(raw.len().div_ceil(512) * 512, 0);
    same(
        &s.oracle("made.qcow2", "qcow2"),
        &expected,
        "qemu-img's reading of the written image",
    );
}
