//! `cdi import`: the importer outside Kubernetes, from a local image to a file or block device.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use cdi_core::Quantity;
use cdi_core::size::{self, ClaimApi, Overhead, VolumeMode};
use cdi_importer::convert::{Progress, Tuning};
use cdi_importer::import::{ImportOptions, ImportReport, SizeSpec, TargetSpec, import};
use cdi_importer::sources::{FileSource, HttpSource, Source};

#[derive(clap::Args)]
pub struct ImportArgs {
    /// The image to import: an http(s):// URL or a local file (raw, qcow2, vmdk, vdi, vhd, vhdx,
    /// iso; optionally gz/xz/zstd compressed).
    #[arg(long, value_name = "URL|PATH")]
    source: String,
    /// Extra HTTP header, "Name: value" (repeatable).
    #[arg(long = "header", value_name = "NAME: VALUE")]
    headers: Vec<String>,
    /// Basic auth user; the password is read from CDI_IMPORT_PASSWORD.
    #[arg(long)]
    user: Option<String>,
    /// A directory of PEM CA certificates to trust for https:// sources.
    #[arg(long, value_name = "DIR")]
    ca_dir: Option<PathBuf>,
    /// Do not verify the server's TLS certificate.
    #[arg(long)]
    insecure: bool,
    /// The DataVolume size; the image is grown to the disk size a claim of this size gets.
    /// Without it the image keeps its own virtual size.
    #[arg(long)]
    size: Option<String>,
    /// Size as `spec.storage` does: the claim is inflated by the overhead (the default).
    #[arg(long, conflicts_with = "pvc_api")]
    storage_api: bool,
    /// Size as `spec.pvc` does: the claim is the size, the disk smaller by the overhead.
    #[arg(long)]
    pvc_api: bool,
    /// Filesystem overhead of the volume.
    #[arg(long, default_value = "0.06")]
    overhead: String,
    /// Expected checksum of the source, `algorithm:hex` (md5, sha1, sha256, sha512).
    #[arg(long)]
    checksum: Option<String>,
    /// Allocate the whole image instead of leaving zero ranges as holes.
    #[arg(long)]
    preallocate: bool,
    /// DEST is a block device (its size is the disk size; old contents are zeroed). Also when
    /// DEST is a file: it is then written in place, and kept whatever happens.
    #[arg(long)]
    block: bool,
    /// Largest read request (a Kubernetes quantity); also bounds one request's decompressed size.
    #[arg(long, default_value = "2Mi")]
    request_size: String,
    /// Read requests in flight at once (default: one per core, 2 to 4).
    #[arg(long)]
    parallel: Option<usize>,
    /// Written data the page cache may hold before the writer waits for the disk (a Kubernetes
    /// quantity; the cache counts against a pod's memory limit); 0 leaves it to the kernel.
    #[arg(long, default_value = "32Mi")]
    writeback_window: String,
    /// Where the rare scratch copy goes (a vmdk, vdi, vhd or vhdx image read in order, or a qcow2
    /// one whose layout does not stream).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    scratch_dir: PathBuf,
    /// The disk image to write (`disk.img`): written to a hidden file beside it and renamed over
    /// it when complete, so a failed import leaves DEST as it was. An existing block device is
    /// written in place.
    dest: PathBuf,
}

pub fn run(args: &ImportArgs) -> anyhow::Result<()> {
    let overhead: Overhead = args.overhead.parse()?;
    let size = match &args.size {
        None => None,
        Some(text) => {
            let bytes = text.parse::<Quantity>()?.value();
            anyhow::ensure!(bytes >= size::MIB, "--size {text} is smaller than 1Mi");
            let api = if args.pvc_api {
                ClaimApi::Pvc
            } else {
                ClaimApi::Storage
            };
            let plan = size::plan(api, VolumeMode::Filesystem, bytes, overhead).with_context(|| {
                format!("--size {text} with the overhead {overhead} is more than a claim can ask for (2^63-1 bytes)")
            })?;
            Some(SizeSpec {
                requested: plan.pvc_request as u64,
                capacity: plan.pvc_request as u64,
            })
        }
    };
    let opts = ImportOptions {
        target: if args.block {
            TargetSpec::Block(args.dest.clone())
        } else {
            TargetSpec::File(args.dest.clone())
        },
        size,
        overhead,
        preallocate: args.preallocate,
        checksum: args.checksum.as_deref().map(str::parse).transpose()?,
        scratch_dir: args.scratch_dir.clone(),
        scratch_mounted: false,
        tuning: Tuning {
            request_bytes: args
                .request_size
                .parse::<Quantity>()?
                .value()
                .max(64 * 1024) as u64,
            parallel: args.parallel.unwrap_or(Tuning::default().parallel).max(1),
            writeback_window: args.writeback_window.parse::<Quantity>()?.value().max(0) as u64,
            ..Tuning::default()
        },
    };
    let source = source(args)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    let progress = Arc::new(Progress::default());
    let bar = std::io::stderr()
        .is_terminal()
        .then(|| progress_bar(progress.clone()));
    let result = runtime.block_on(async {
        tokio::select! {
            // Polled first, so the handlers are in place before the import creates anything.
            biased;
            // Dropping the import removes the temporary file it was writing.
            signal = interrupted() => Err(anyhow::anyhow!("interrupted by {signal}")),
            r = import(source.as_ref(), &opts, progress) => r.map_err(anyhow::Error::from),
        }
    });
    // Work still running after a failure or an interrupt is abandoned, not waited for.
    runtime.shutdown_background();
    if let Some((bar, ticker)) = bar {
        bar.finish_and_clear();
        let _ = ticker.join();
    }
    let report = result
        .with_context(|| format!("importing {} into {}", source.name(), args.dest.display()))?;
    print!("{}", summary(&report));
    Ok(())
}

/// Resolves on Ctrl-C, SIGTERM or SIGHUP (the terminal closed), naming the signal; never, for a signal that cannot be caught.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let int = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let caught = |kind: SignalKind| async move {
        let received = match signal(kind) {
            Ok(mut s) => s.recv().await.is_some(),
            Err(_) => false,
        };
        if !received {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = int => "SIGINT",
        _ = caught(SignalKind::terminate()) => "SIGTERM",
        _ = caught(SignalKind::hangup()) => "SIGHUP",
    }
}

fn source(args: &ImportArgs) -> anyhow::Result<Box<dyn Source>> {
    if !(args.source.starts_with("http://") || args.source.starts_with("https://")) {
        anyhow::ensure!(
            args.headers.is_empty()
                && args.user.is_none()
                && args.ca_dir.is_none()
                && !args.insecure,
            "--header, --user, --ca-dir and --insecure apply to http(s):// sources only"
        );
        return Ok(Box::new(FileSource::new(&args.source)));
    }
    let mut headers = Vec::new();
    for h in &args.headers {
        let (name, value) = h
            .split_once(':')
            .with_context(|| format!("--header {h:?} is not \"Name: value\""))?;
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    let basic_auth = match &args.user {
        Some(user) => Some((
            user.clone(),
            std::env::var("CDI_IMPORT_PASSWORD")
                .context("--user needs the password in CDI_IMPORT_PASSWORD")?,
        )),
        None => None,
    };
    let mut ca_certs_pem = Vec::new();
    if let Some(dir) = &args.ca_dir {
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.is_file() {
                ca_certs_pem.push(
                    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
                );
            }
        }
    }
    Ok(Box::new(HttpSource {
        url: args.source.clone(),
        basic_auth,
        headers,
        ca_certs_pem,
        insecure: args.insecure,
        ..Default::default()
    }))
}

fn progress_bar(progress: Arc<Progress>) -> (indicatif::ProgressBar, std::thread::JoinHandle<()>) {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("a valid template"),
    );
    let b = bar.clone();
    // The bar follows the shared counters; the import itself never touches the terminal.
    let ticker = std::thread::spawn(move || {
        while !b.is_finished() {
            b.set_length(progress.total.load(Ordering::Relaxed));
            b.set_position(progress.done.load(Ordering::Relaxed));
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    (bar, ticker)
}

fn human(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

fn summary(r: &ImportReport) -> String {
    let format = match r.compression {
        Some(c) => format!("{} ({}-compressed)", r.format, c.name()),
        None => r.format.to_string(),
    };
    let secs = r.elapsed.as_secs_f64().max(1e-6);
    format!(
        "format:       {format}\nvirtual size: {} ({})\ndisk size:    {} ({})\ntransferred:  {}\nwritten:      {}\nholes:        {}\nscratch:      {}\ntime:         {:.2} s ({}/s)\n",
        r.virtual_size,
        human(r.virtual_size),
        r.final_size,
        human(r.final_size),
        human(r.transferred),
        human(r.written),
        human(r.holes),
        if r.scratch_used { "used" } else { "none" },
        secs,
        human((r.transferred as f64 / secs) as u64),
    )
}
