//! qcow2 images read once, in order (as an upload or a download without ranges arrives), convert
//! without scratch space to exactly what `qemu-img convert -O raw` gives; layouts that do not
//! stream go through scratch: in a pod by asking for it, elsewhere by reading the source again.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use cdi_importer::ImportError;
use cdi_importer::convert::{Progress, Tuning};
use cdi_importer::import::{ImportOptions, ImportReport, TargetSpec, import, import_file};
use cdi_importer::probe::Format;
use cdi_importer::sources::stream;
use cdi_testkit::images::{assert_same, oracle, pattern, qemu_img};

const MIB: u64 = 1 << 20;

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

    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path(name)).unwrap()
    }

    /// Options as a pod's: scratch only when `self/scratch` exists.
    fn options(&self, target: &str, hold: u64) -> ImportOptions {
        ImportOptions {
            target: TargetSpec::VolumeFile(self.path(target)),
            size: None,
            overhead: "0".parse().unwrap(),
            preallocate: false,
            checksum: None,
            scratch_dir: self.path("scratch"),
            scratch_mounted: true,
            tuning: Tuning {
                stream_hold: hold,
                ..Tuning::default()
            },
        }
    }

    /// Import `image` as an upload arrives: in chunks of `chunk` bytes, read once.
    async fn stream(
        &self,
        image: &str,
        target: &str,
        hold: u64,
    ) -> Result<ImportReport, ImportError> {
        let bytes = Bytes::from(self.read(image));
        let (feeder, source, _) = stream::channel("the upload", Some(bytes.len() as u64), 4);
        // An odd chunk size: cluster and block boundaries fall inside chunks.
        tokio::spawn(async move {
            for at in (0..bytes.len()).step_by(100_003) {
                let chunk = bytes.slice(at..(at + 100_003).min(bytes.len()));
                if feeder.send(Ok(chunk)).await.is_err() {
                    return;
                }
            }
        });
        let opts = self.options(target, hold);
        import(&source, &opts, Arc::new(Progress::default())).await
    }

    fn qcow2(&self, name: &str, opts: &[&str]) {
        let mut args = vec!["convert", "-f", "raw", "-O", "qcow2"];
        args.extend_from_slice(opts);
        let (src, dst) = (self.path("src.raw"), self.path(name));
        args.push(src.to_str().unwrap());
        args.push(dst.to_str().unwrap());
        qemu_img(&args);
    }
}

fn qemu_io(image: &Path, commands: &[&str]) {
    let mut cmd = std::process::Command::new("qemu-io");
    cmd.args(["-f", "qcow2"]);
    for c in commands {
        cmd.args(["-c", c]);
    }
    let out = cmd.arg(image).output().unwrap();
    assert!(
        out.status.success(),
        "qemu-io: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_layout_qemu_writes_streams_without_scratch() {
    let s = Scenario::new();
    // Not a multiple of any cluster size.
    std::fs::write(s.path("src.raw"), pattern(12 * MIB + 1536)).unwrap();
    let variants: &[(&str, &[&str])] = &[
        ("v3.qcow2", &["-o", "compat=1.1"]),
        ("v2.qcow2", &["-o", "compat=0.10"]),
        ("zlib.qcow2", &["-c"]),
        ("zstd.qcow2", &["-c", "-o", "compression_type=zstd"]),
        ("c512.qcow2", &["-o", "cluster_size=512"]),
        ("c2m.qcow2", &["-o", "cluster_size=2M"]),
        // Packed compressed clusters: some begin in a cluster before their L2 table.
        ("c4k-zlib.qcow2", &["-c", "-o", "cluster_size=4096"]),
        ("prealloc.qcow2", &["-o", "preallocation=metadata"]),
    ];
    for (name, opts) in variants {
        s.qcow2(name, opts);
        // Less than the image: what arrives before its table is let go as it is placed.
        let report = s
            .stream(name, "out.img", 2 * MIB)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            (report.format, report.scratch_used),
            (Format::Qcow2, false),
            "{name}"
        );
        assert_same(&s.read("out.img"), &oracle(&s.path(name), "qcow2"), name);
    }
    assert!(!s.path("scratch").exists(), "no scratch was asked for");
}

/// A resize past what the L1 table holds moves it to the end of the file, after the data it
/// places: the data is held until the table arrives, within the budget; past it, the image needs
/// scratch, and a pod given scratch converts it from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_l1_table_after_the_data_is_held_for_then_needs_scratch() {
    let s = Scenario::new();
    std::fs::write(s.path("src.raw"), pattern(6 * MIB)).unwrap();
    // Small clusters: an L1 entry maps 2 MiB, so growing to 16 MiB needs a larger table.
    s.qcow2("moved.qcow2", &["-o", "cluster_size=4096"]);
    qemu_img(&["resize", s.path("moved.qcow2").to_str().unwrap(), "16M"]);
    qemu_io(&s.path("moved.qcow2"), &["write -P 0x5a 15M 128k"]);
    let image = s.read("moved.qcow2");
    let l1_offset = be64(&image, 40);
    assert!(
        l1_offset > image.len() as u64 / 2,
        "the L1 table moved to the end ({l1_offset} of {})",
        image.len()
    );
    let expected = oracle(&s.path("moved.qcow2"), "qcow2");

    let report = s.stream("moved.qcow2", "out.img", 64 * MIB).await.unwrap();
    assert!(!report.scratch_used);
    assert_same(&s.read("out.img"), &expected, "held until the L1 table");

    let err = s
        .stream("moved.qcow2", "out.img", 2 * MIB)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ImportError::ScratchRequired(why) if why.contains("more than 2 MiB")),
        "{err}"
    );
    assert!(!s.path("out.img").exists(), "nothing is left behind");

    std::fs::create_dir(s.path("scratch")).unwrap();
    let report = s.stream("moved.qcow2", "out.img", 2 * MIB).await.unwrap();
    assert!(report.scratch_used);
    assert_same(&s.read("out.img"), &expected, "through scratch");
}

/// Outside a pod a source that can be read again is: a compressed local image whose layout does
/// not stream is read a second time through scratch, and the result is the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elsewhere_the_source_is_read_again_through_scratch() {
    let s = Scenario::new();
    std::fs::write(s.path("src.raw"), pattern(6 * MIB)).unwrap();
    s.qcow2("moved.qcow2", &["-o", "cluster_size=4096"]);
    qemu_img(&["resize", s.path("moved.qcow2").to_str().unwrap(), "16M"]);
    let expected = oracle(&s.path("moved.qcow2"), "qcow2");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &s.read("moved.qcow2")).unwrap();
    std::fs::write(s.path("moved.qcow2.gz"), gz.finish().unwrap()).unwrap();
    for (hold, spooled) in [(64 * MIB, false), (MIB, true)] {
        let opts = ImportOptions {
            target: TargetSpec::File(s.path("out.img")),
            scratch_mounted: false,
            ..s.options("out.img", hold)
        };
        let report = import_file(
            &s.path("moved.qcow2.gz"),
            &opts,
            Arc::new(Progress::default()),
        )
        .await
        .unwrap();
        assert_eq!(report.scratch_used, spooled, "hold {hold}");
        assert_same(&s.read("out.img"), &expected, "read again");
    }
}

/// An image whose table places data on bytes the stream passed as a table (here the L1 table's
/// own cluster) cannot stream; through scratch it gives what the conversion at random gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_placed_on_passed_bytes_goes_through_scratch() {
    let s = Scenario::new();
    std::fs::write(s.path("src.raw"), pattern(2 * MIB)).unwrap();
    s.qcow2("odd.qcow2", &[]);
    let mut image = s.read("odd.qcow2");
    let l1 = be64(&image, 40) as usize;
    let l2 = (be64(&image, l1) & 0x00ff_ffff_ffff_fe00) as usize;
    // Guest cluster 1 now reads the L1 table's cluster.
    image[l2 + 8..l2 + 16].copy_from_slice(&((1u64 << 63) | l1 as u64).to_be_bytes());
    std::fs::write(s.path("odd.qcow2"), &image).unwrap();
    let at_random = {
        let opts = ImportOptions {
            target: TargetSpec::File(s.path("random.img")),
            ..s.options("random.img", 64 * MIB)
        };
        import_file(&s.path("odd.qcow2"), &opts, Arc::new(Progress::default()))
            .await
            .unwrap();
        s.read("random.img")
    };
    let err = s
        .stream("odd.qcow2", "out.img", 64 * MIB)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ImportError::ScratchRequired(why) if why.contains("further back than the stream is kept")),
        "{err}"
    );
    std::fs::create_dir(s.path("scratch")).unwrap();
    s.stream("odd.qcow2", "out.img", 64 * MIB).await.unwrap();
    assert_same(&s.read("out.img"), &at_random, "as at random");
}

/// A stream that ends before the data its tables place is refused as the file would be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_stream_is_refused_as_a_cut_file() {
    let s = Scenario::new();
    std::fs::write(s.path("src.raw"), pattern(4 * MIB)).unwrap();
    s.qcow2("cut.qcow2", &[]);
    let image = s.read("cut.qcow2");
    std::fs::write(s.path("cut.qcow2"), &image[..image.len() / 2]).unwrap();
    let err = s
        .stream("cut.qcow2", "out.img", 64 * MIB)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("lies outside the"), "{err}");
    assert!(!s.path("out.img").exists());
}

/// A compressed cluster stored from the end of a cluster held before its table, over the table's
/// own cluster and into the next: its bytes are read once each, in order, as at random. (Raw
/// deflate in stored blocks, so the output is the input's bytes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_cluster_across_its_own_table_reads_each_byte_once() {
    const CS: usize = 1 << 16;
    let s = Scenario::new();
    let mut image = vec![0u8; 6 * CS];
    // v3 header: 64 KiB clusters, a 64 KiB disk, the L1 table in cluster 1.
    image[..4].copy_from_slice(b"QFI\xfb");
    image[4..8].copy_from_slice(&3u32.to_be_bytes());
    image[20..24].copy_from_slice(&16u32.to_be_bytes());
    image[24..32].copy_from_slice(&(CS as u64).to_be_bytes());
    image[36..40].copy_from_slice(&1u32.to_be_bytes());
    image[40..48].copy_from_slice(&(CS as u64).to_be_bytes());
    image[96..100].copy_from_slice(&4u32.to_be_bytes());
    image[100..104].copy_from_slice(&104u32.to_be_bytes());
    // The L2 table in cluster 4; cluster 2 and 3 arrive before anything places them.
    image[CS..CS + 8].copy_from_slice(&(4 * CS as u64).to_be_bytes());
    let host = 3 * CS + CS - 6;
    // 256 sectors stored: from the end of cluster 3 into cluster 5.
    let entry = (1u64 << 62) | (255u64 << 54) | host as u64;
    image[4 * CS..4 * CS + 8].copy_from_slice(&entry.to_be_bytes());
    // Stored block 1 (65535 bytes, not final), its payload runs to 2 bytes before cluster 5;
    // stored block 2 (1 byte, final) straddles clusters 4 and 5.
    image[host] = 0;
    image[host + 1..host + 5].copy_from_slice(&[0xff, 0xff, 0x00, 0x00]);
    for (i, b) in image[3 * CS..host].iter_mut().enumerate() {
        *b = i as u8;
    }
    let second = host + 5 + 65535;
    assert_eq!(second, 5 * CS - 2);
    image[second..second + 5].copy_from_slice(&[0x01, 0x01, 0x00, 0xfe, 0xff]);
    image[second + 5] = 0x77;
    image[second + 6..].fill(0x99);
    std::fs::write(s.path("across.qcow2"), &image).unwrap();
    let mut expected = image[host + 5..second].to_vec();
    expected.push(0x77);

    let opts = ImportOptions {
        target: TargetSpec::File(s.path("random.img")),
        ..s.options("random.img", 64 * MIB)
    };
    import_file(
        &s.path("across.qcow2"),
        &opts,
        Arc::new(Progress::default()),
    )
    .await
    .unwrap();
    assert_same(&s.read("random.img"), &expected, "at random");
    let report = s.stream("across.qcow2", "out.img", 64 * MIB).await.unwrap();
    assert!(!report.scratch_used);
    assert_same(&s.read("out.img"), &expected, "as it streams");
}

/// One L2 table named by every L1 entry, all its entries naming one cluster still to come: what
/// is awaited is counted table by table, and past the budget the image goes through scratch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_named_over_and_over_stays_within_the_budget() {
    const CS: usize = 1 << 16;
    let s = Scenario::new();
    let mut image = vec![0u8; 5 * CS];
    // A 32 GiB disk: 64 L1 entries of 512 MiB each.
    image[..4].copy_from_slice(b"QFI\xfb");
    image[4..8].copy_from_slice(&3u32.to_be_bytes());
    image[20..24].copy_from_slice(&16u32.to_be_bytes());
    image[24..32].copy_from_slice(&(32u64 << 30).to_be_bytes());
    image[36..40].copy_from_slice(&64u32.to_be_bytes());
    image[40..48].copy_from_slice(&(CS as u64).to_be_bytes());
    image[96..100].copy_from_slice(&4u32.to_be_bytes());
    image[100..104].copy_from_slice(&104u32.to_be_bytes());
    for i in 0..64 {
        image[CS + 8 * i..CS + 8 * i + 8].copy_from_slice(&(3 * CS as u64).to_be_bytes());
    }
    for i in 0..CS / 8 {
        let at = 3 * CS + 8 * i;
        image[at..at + 8].copy_from_slice(&((1u64 << 63) | (4 * CS as u64)).to_be_bytes());
    }
    std::fs::write(s.path("named.qcow2"), &image).unwrap();
    let err = s.stream("named.qcow2", "out.img", MIB).await.unwrap_err();
    assert!(
        matches!(&err, ImportError::ScratchRequired(why) if why.contains("more than 1 MiB")),
        "{err}"
    );
}
