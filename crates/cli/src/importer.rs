//! `cdi importer`: the importer pod's entry point. Configuration comes from upstream's
//! environment variables; the result goes to the termination log and the exit code.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use cdi_core::devpod::DevPod;
use cdi_importer::convert::Progress;
use cdi_importer::pod::{self, PodConfig, PodPaths, TerminationMessage};

#[derive(clap::Args)]
pub struct ImporterArgs {
    /// The filesystem volume's mount point.
    #[arg(long, default_value = "/data")]
    data_dir: PathBuf,
    /// The block volume's device (the volume is Block when it exists).
    #[arg(long, default_value = "/dev/cdi-block-volume")]
    block_device: PathBuf,
    #[arg(long, default_value = "/scratch")]
    scratch_dir: PathBuf,
    #[arg(long, default_value = "/dev/termination-log")]
    termination_log: PathBuf,
    /// Mounted secrets holding extra HTTP headers.
    #[arg(long, default_value = "/extraheaders")]
    extra_headers_dir: PathBuf,
    /// Log verbosity as upstream's importer takes it (`-v=1`); 3 and above log debug detail.
    #[arg(short = 'v', value_name = "LEVEL", default_value_t = 1)]
    verbosity: u32,
    /// Where the progress metric is served over HTTPS.
    #[arg(long, env = "CDI_METRICS_ADDR", default_value = "0.0.0.0:8443")]
    metrics_addr: SocketAddr,
}

pub fn run(args: &ImporterArgs) -> ExitCode {
    crate::pod_logging(args.verbosity);
    // Run by the `cdi dev` kubelet, the pod is a directory and has an address of its own.
    let devpod = match DevPod::from_env(|k| std::env::var(k).ok()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let paths = PodPaths {
        data_dir: args.data_dir.clone(),
        block_device: args.block_device.clone(),
        scratch_dir: args.scratch_dir.clone(),
        termination_log: args.termination_log.clone(),
        extra_headers_dir: args.extra_headers_dir.clone(),
        root: None,
        data_capacity: devpod.capacity(&args.data_dir),
    }
    .in_root(devpod.root.clone());
    // Every end is said in the termination message, with its reason. A failure that running
    // again cannot mend (a refused image, a checksum mismatch) exits 0, as upstream does for
    // checksums: kubelet does not restart the pod, and the controller fails the DataVolume.
    // Under `cdi dev` the pod's files live below a directory of the host; what the pod says
    // names them as the container sees them (/data/disk.img).
    let root = devpod
        .root
        .as_ref()
        .map(|r| r.display().to_string())
        .filter(|r| !r.is_empty() && r != "/");
    let end = |mut message: TerminationMessage| {
        if let (Some(root), Some(text)) = (&root, message.message.as_mut()) {
            *text = text.replace(root.trim_end_matches('/'), "");
        }
        if let Some(text) = message
            .message
            .as_deref()
            .filter(|_| message.reason.is_some())
        {
            eprintln!("error: {text}");
        }
        if let Err(e) = pod::write_termination_message(&paths.termination_log, &message) {
            eprintln!("error: writing {}: {e}", paths.termination_log.display());
            return ExitCode::FAILURE;
        }
        match message.reason {
            Some(reason) if !reason.is_fatal() => ExitCode::FAILURE,
            _ => ExitCode::SUCCESS,
        }
    };
    let fail =
        |e: cdi_importer::ImportError| end(TerminationMessage::failed(e.reason(), &e.to_string()));
    let env: HashMap<String, String> = std::env::vars().collect();
    let config = match PodConfig::from_env(&env, &paths) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => return fail(cdi_importer::ImportError::io("starting the runtime", e)),
    };
    let progress = Arc::new(Progress::default());
    let result = runtime.block_on(async {
        let metrics = cdi_importer::metrics::serve(
            cdi_importer::metrics::IMPORT_PROGRESS,
            devpod.listen(args.metrics_addr),
            config.owner_uid.clone(),
            progress.clone(),
        )
        .await;
        if let Err(e) = &metrics {
            // Progress is a convenience; the import goes on without it.
            tracing::warn!(error = %e, "the progress metric is not served");
        }
        let result = pod::run(&config, &paths, progress).await;
        if let Ok((_, task)) = metrics {
            task.abort();
        }
        result
    });
    match result {
        Ok(message) => end(message),
        // Upstream's contract: say so and end; the controller gives the next pod a scratch claim.
        Err(e @ cdi_importer::ImportError::ScratchRequired(_)) => {
            eprintln!("{e}; asking for a scratch volume");
            end(TerminationMessage {
                scratch_space_required: Some(true),
                message: Some(e.to_string()),
                ..Default::default()
            })
        }
        Err(e) => fail(e),
    }
}
