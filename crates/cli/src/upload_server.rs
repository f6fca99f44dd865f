//! `cdi upload-server`: the upload pod's entry point. Configuration comes from upstream's
//! environment (TLS files, CLIENT_NAME, UPLOAD_IMAGE_SIZE, …); the result goes to the
//! termination log and the exit code.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use cdi_core::devpod::DevPod;
use cdi_importer::pod::{self, PodPaths};
use cdi_upload::server::{self, Config};

#[derive(clap::Args)]
pub struct UploadServerArgs {
    /// The filesystem volume's mount point.
    #[arg(long, default_value = "/data")]
    data_dir: PathBuf,
    /// The block volume's device (upstream's DESTINATION; the volume is Block when it exists).
    #[arg(long, env = "DESTINATION", default_value = "/dev/cdi-block-volume")]
    block_device: PathBuf,
    #[arg(long, default_value = "/scratch")]
    scratch_dir: PathBuf,
    #[arg(long, default_value = "/dev/termination-log")]
    termination_log: PathBuf,
    /// Log verbosity as upstream's upload server takes it (`-v=1`); 3 and above log debug detail.
    #[arg(short = 'v', value_name = "LEVEL", default_value_t = 1)]
    verbosity: u32,
}

pub fn run(args: &UploadServerArgs) -> ExitCode {
    crate::pod_logging(args.verbosity);
    match serve(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: &UploadServerArgs) -> anyhow::Result<ExitCode> {
    // Run by the `cdi dev` kubelet, the pod is a directory and has an address of its own.
    let devpod = DevPod::from_env(|k| std::env::var(k).ok()).map_err(anyhow::Error::msg)?;
    let paths = PodPaths {
        data_dir: args.data_dir.clone(),
        block_device: args.block_device.clone(),
        scratch_dir: args.scratch_dir.clone(),
        termination_log: args.termination_log.clone(),
        data_capacity: devpod.capacity(&args.data_dir),
        ..PodPaths::default()
    }
    .in_root(devpod.root.clone());
    let env: HashMap<String, String> = std::env::vars().collect();
    let mut config = Config::from_env(&env, paths.clone())?;
    config.listen = devpod.listen(config.listen);
    let runtime = tokio::runtime::Runtime::new()?;
    let result = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| anyhow::anyhow!("listening on {}: {e}", config.listen))?;
        tracing::info!(address = %config.listen, "upload server listening");
        anyhow::Ok(server::run(config, listener).await)
    })?;
    let result = match result {
        Ok(r) => r,
        Err(e @ server::ServerError::Upload(_)) => {
            // Said in one line where the controller reads it (the claim's Running condition,
            // and the uploader waiting for processing), not as the log's tail.
            let said = cdi_api::TerminationMessage {
                message: Some(e.to_string()),
                ..Default::default()
            };
            pod::write_termination_message(&paths.termination_log, &said)?;
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    };
    pod::write_termination_message(&paths.termination_log, &result.termination_message())?;
    tracing::info!(
        deadline_passed = result.deadline_passed,
        "upload server done"
    );
    Ok(ExitCode::SUCCESS)
}
