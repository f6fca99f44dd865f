//! The importer's memory under a pod's limit (docs/importing.md#bounded-page-cache): the page cache counts against a memory
//! cgroup, and dirty pages a slow disk has not taken cannot be dropped, so an unpaced writer
//! grows the cache until the pod is OOM-killed. A 4 GiB import into a throttled disk inside a
//! memory cgroup of 256 MiB, for real: a child cgroup (v1 or v2, whichever the machine has) with
//! the memory limit and a write throttle on the disk under the target.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use cdi_testkit::{Behaviour, FileServer, generated};

const MIB: u64 = 1 << 20;
const IMAGE: u64 = 4 << 30;
const LIMIT: u64 = 256 * MIB;
/// The slow disk: well below what the importer produces on loopback.
const DISK_BPS: u64 = 128 * MIB;

/// A child cgroup the importer runs in.
enum Cgroup {
    V1 {
        memory: PathBuf,
        blkio: Option<PathBuf>,
    },
    V2(PathBuf),
}

/// The whole disk (`major:minor`) holding `path`: throttles apply to disks, not partitions.
fn disk_of(path: &Path) -> Option<String> {
    let dev = std::fs::metadata(path).ok()?.dev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if !sys.exists() {
        return None;
    }
    if sys.join("partition").exists() {
        let parent = sys.canonicalize().ok()?.parent()?.join("dev");
        return Some(std::fs::read_to_string(parent).ok()?.trim().to_string());
    }
    Some(format!("{major}:{minor}"))
}

impl Cgroup {
    /// A cgroup limited to `limit` bytes, writing to `disk` at `bps` when it can be throttled.
    fn create(name: &str, limit: u64, disk: Option<&str>, bps: u64) -> Result<Cgroup, String> {
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
        if v2.exists() {
            let controllers = std::fs::read_to_string(v2).unwrap_or_default();
            if !controllers.contains("memory") {
                return Err("cgroup v2 without the memory controller".into());
            }
            let _ = std::fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+memory +io");
            let dir = PathBuf::from("/sys/fs/cgroup").join(name);
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            std::fs::write(dir.join("memory.max"), limit.to_string())
                .map_err(|e| format!("memory.max: {e}"))?;
            if let Some(d) = disk {
                std::fs::write(dir.join("io.max"), format!("{d} wbps={bps}"))
                    .map_err(|e| format!("io.max: {e}"))?;
            }
            return Ok(Cgroup::V2(dir));
        }
        let memory = PathBuf::from("/sys/fs/cgroup/memory").join(name);
        std::fs::create_dir_all(&memory).map_err(|e| format!("{}: {e}", memory.display()))?;
        std::fs::write(memory.join("memory.limit_in_bytes"), limit.to_string())
            .map_err(|e| format!("memory.limit_in_bytes: {e}"))?;
        let blkio = match disk {
            None => None,
            Some(d) => {
                let dir = PathBuf::from("/sys/fs/cgroup/blkio").join(name);
                std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                std::fs::write(
                    dir.join("blkio.throttle.write_bps_device"),
                    format!("{d} {bps}"),
                )
                .map_err(|e| format!("blkio.throttle.write_bps_device: {e}"))?;
                Some(dir)
            }
        };
        Ok(Cgroup::V1 { memory, blkio })
    }

    fn dirs(&self) -> Vec<&Path> {
        match self {
            Cgroup::V1 { memory, blkio } => std::iter::once(memory.as_path())
                .chain(blkio.as_deref())
                .collect(),
            Cgroup::V2(dir) => vec![dir.as_path()],
        }
    }

    /// `program args…` started inside the cgroup (the shell joins it, then becomes the program).
    fn command(&self, program: &Path, args: &[&str]) -> Command {
        let joins: Vec<String> = self
            .dirs()
            .iter()
            .map(|d| format!("echo $$ > {}/cgroup.procs;", d.display()))
            .collect();
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("{} exec \"$0\" \"$@\"", joins.join(" ")))
            .arg(program)
            .args(args);
        cmd
    }

    fn read(&self, file: &str) -> String {
        let dir = self.dirs()[0];
        std::fs::read_to_string(dir.join(file)).unwrap_or_default()
    }

    /// The highest memory use seen, page cache included.
    fn peak(&self) -> Option<u64> {
        let file = match self {
            Cgroup::V1 { .. } => "memory.max_usage_in_bytes",
            Cgroup::V2(_) => "memory.peak",
        };
        self.read(file).trim().parse().ok()
    }

    fn oom_kills(&self) -> u64 {
        let file = match self {
            Cgroup::V1 { .. } => "memory.oom_control",
            Cgroup::V2(_) => "memory.events",
        };
        self.read(file)
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for d in self.dirs() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_4gib_import_into_a_slow_disk_stays_within_256mib() {
    let dir = tempfile::tempdir().unwrap();
    // A full disk would fail the import for a reason this test is not about: say so first.
    let fs = rustix::fs::statvfs(dir.path()).unwrap();
    let free = fs.f_bavail * fs.f_frsize;
    assert!(
        free > IMAGE + (1 << 30),
        "this test writes a 4 GiB image into {} and needs 5 GiB free there; {} MiB are",
        dir.path().display(),
        free / MIB
    );
    let disk = disk_of(dir.path());
    let name = format!("cdi-rs-memory-{}", std::process::id());
    let cgroup = match Cgroup::create(&name, LIMIT, disk.as_deref(), DISK_BPS) {
        Ok(c) => c,
        Err(why) => {
            eprintln!("skipped: no writable memory cgroup on this machine ({why})");
            return;
        }
    };
    if disk.is_none() {
        eprintln!(
            "note: {} is not on a block device that can be throttled; the disk is not slowed",
            dir.path().display()
        );
    }
    let server = FileServer::start(None).await;
    server.add_generated(
        "/big.raw",
        IMAGE,
        Behaviour {
            ranges: true,
            ..Default::default()
        },
    );
    let dest = dir.path().join("disk.img");
    let url = server.url("/big.raw");
    let start = Instant::now();
    let mut child = cgroup
        .command(
            Path::new(env!("CARGO_BIN_EXE_cdi")),
            &["import", "--source", &url, dest.to_str().unwrap()],
        )
        .spawn()
        .unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    let took = start.elapsed().as_secs_f64();
    let peak = cgroup.peak();
    let kills = cgroup.oom_kills();
    eprintln!(
        "4 GiB import, disk throttled to {} MiB/s: {took:.1} s, cgroup peak {} MiB of a {} MiB limit, {kills} OOM kills",
        DISK_BPS / MIB,
        peak.map_or("?".into(), |p| (p / MIB).to_string()),
        LIMIT / MIB
    );
    assert_eq!(kills, 0, "the importer was OOM-killed");
    assert!(status.success(), "{status}");
    // Paced, the cache never even nears the limit.
    if let Some(p) = peak {
        assert!(p < 160 * MIB, "peak {} MiB", p / MIB);
    }
    // The bytes are the image's: every 4 KiB block carries its index (sampled, and the end).
    let out = std::fs::File::open(&dest).unwrap();
    assert_eq!(out.metadata().unwrap().len(), IMAGE);
    let mut offsets: Vec<u64> = (0..IMAGE).step_by(7 * MIB as usize + 4096).collect();
    offsets.push(IMAGE - 4096);
    for offset in offsets {
        let mut buf = vec![0u8; 4096];
        std::os::unix::fs::FileExt::read_exact_at(&out, &mut buf, offset).unwrap();
        assert!(buf == generated(offset, 4096), "block at {offset} differs");
    }
}
