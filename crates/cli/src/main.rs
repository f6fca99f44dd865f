//! `cdi`: one binary for every cdi-rs component. Argument parsing and wiring only; the work is
//! done by the library crates.

mod apiserver;
mod cloner;
mod controller;
#[cfg(feature = "dev")]
mod demo;
#[cfg(feature = "dev")]
mod demo_clone;
#[cfg(feature = "dev")]
mod demo_image;
#[cfg(feature = "dev")]
mod dev;
mod doctor;
mod image_upload;
mod import;
mod importer;
mod install;
#[cfg(feature = "dev")]
mod launcher;
mod size;
#[cfg(feature = "dev")]
mod timeline;
mod upload_proxy;
mod upload_server;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cdi",
    version,
    about = "cdi-rs: KubeVirt's Containerized Data Importer, in Rust"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions of the cdi.kubevirt.io kinds (apiextensions.k8s.io/v1).
    Crds {
        /// Write one file per CRD into this directory instead of printing them.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
    /// Show the PVC request and the disk image size a DataVolume of this size gets.
    Size(size::SizeArgs),
    /// Import a disk image into a raw disk image file or block device, as the importer pod does.
    Import(import::ImportArgs),
    /// Upload a local disk image (or archive) into a new or existing DataVolume or PVC through
    /// the upload proxy, as `virtctl image-upload` does.
    ImageUpload(image_upload::ImageUploadArgs),
    /// Why a DataVolume is not progressing, and what to do: reads it, its claims, class,
    /// profile, CDIConfig, pods, nodes and events. Without a name, every DataVolume of the
    /// namespace that has not succeeded, one line each.
    Doctor(doctor::DoctorArgs),
    /// The embedded development cluster.
    #[cfg(feature = "dev")]
    #[command(subcommand)]
    Dev(dev::DevCommand),
    /// The importer pod's entry point: reads upstream's IMPORTER_* environment, writes the
    /// volume and the termination message.
    Importer(importer::ImporterArgs),
    /// The upload pod's entry point: takes one upload over mutual TLS from the upload proxy,
    /// writes the volume and the termination message.
    UploadServer(upload_server::UploadServerArgs),
    /// The upload proxy: checks upload tokens and streams each upload to its claim's upload
    /// pod over mutual TLS.
    UploadProxy(upload_proxy::UploadProxyArgs),
    /// The clone source pod's entry point: sends a volume to the clone target's upload server
    /// over mutual TLS (a host-assisted clone).
    Cloner(cloner::ClonerArgs),
    /// The aggregated API of upload.cdi.kubevirt.io: UploadTokenRequests answered with an
    /// upload token for callers allowed to create them.
    Apiserver(apiserver::ApiServerArgs),
    #[cfg(feature = "dev")]
    /// The WaitForFirstConsumer story on an embedded three-node cluster: a VM whose disk
    /// is imported on the node the VM must run on; prints the timeline, exits 0 when it worked.
    Demo(demo::DemoArgs),
    /// Install CDI on the cluster of the current kubeconfig as a cluster admin would: the
    /// operator's manifests, then a CDI resource, waiting until it is Deployed; or print them.
    Install(install::InstallArgs),
    /// The operator: keeps the installation a CDI resource asks for (components, RBAC, CRDs)
    /// and reports it in the resource's status. Its release comes from its environment.
    Operator(install::OperatorArgs),
    /// The CDI controllers (CDIConfig, StorageProfile, DataVolume import, importer pods) against
    /// the cluster of the current kubeconfig, leader-elected.
    Controller(controller::ControllerArgs),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        // The pod entry point reports through its termination message and exit code itself.
        Command::Importer(args) => return importer::run(&args),
        Command::UploadServer(args) => return upload_server::run(&args),
        Command::Cloner(args) => return cloner::run(&args),
        Command::Crds { out_dir } => crds(out_dir),
        Command::Size(args) => size::run(&args),
        Command::Import(args) => import::run(&args),
        Command::ImageUpload(args) => image_upload::run(&args),
        #[cfg(feature = "dev")]
        Command::Dev(command) => dev::run(&command),
        Command::Doctor(args) => doctor::run(&args),
        Command::Controller(args) => controller::run(&args),
        Command::Install(args) => install::run(&args),
        Command::Operator(args) => install::operator(&args),
        Command::UploadProxy(args) => upload_proxy::run(&args),
        Command::Apiserver(args) => apiserver::run(&args),
        #[cfg(feature = "dev")]
        Command::Demo(args) => demo::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", said(&err));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes in one line, each said once: the API server's refusal by its
/// message alone (kube's own text repeats it with a dump of the whole Status), and a cause
/// whose words its context already holds left out.
fn said(err: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in err.chain() {
        let (text, last) = match cause.downcast_ref::<kube::Error>() {
            Some(kube::Error::Api(status)) => (status.message.clone(), true),
            _ => (cause.to_string(), false),
        };
        let text = text.trim().to_string();
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        if last {
            break;
        }
    }
    parts.join(": ")
}

/// A client of the kubeconfig's cluster, and the namespace to work in: `namespace`, else the
/// kubeconfig context's.
async fn client_in(namespace: Option<&str>) -> anyhow::Result<(kube::Client, String)> {
    let client = kube::Client::try_default()
        .await
        .context("connecting to the cluster (set KUBECONFIG)")?;
    let ns = namespace.map_or_else(|| client.default_namespace().to_string(), String::from);
    Ok((client, ns))
}

/// Logging for a pod's program: to stderr (the pod's log), debug detail from `-v=3` on.
fn pod_logging(verbosity: u32) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| if verbosity >= 3 { "debug" } else { "info" }.into()),
        )
        .with_writer(std::io::stderr)
        // Colours only for a terminal: a pod's log is a file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn crds(out_dir: Option<PathBuf>) -> anyhow::Result<()> {
    let rendered = cdi_api::crd::rendered();
    match out_dir {
        None => {
            let all: Vec<String> = rendered.into_iter().map(|(_, yaml)| yaml).collect();
            let text = format!("---\n{}", all.join("---\n"));
            // A closed pipe (`cdi crds | head`) is the reader's choice, not an error.
            if let Err(e) = std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes())
                && e.kind() != std::io::ErrorKind::BrokenPipe
            {
                return Err(e.into());
            }
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for (name, yaml) in rendered {
                let path = dir.join(name);
                std::fs::write(&path, yaml)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn dev_and_demo_are_commands_only_with_the_dev_feature() {
        use clap::CommandFactory;
        let cli = super::Cli::command();
        let names: Vec<&str> = cli.get_subcommands().map(|c| c.get_name()).collect();
        for name in ["dev", "demo"] {
            assert_eq!(
                names.contains(&name),
                cfg!(feature = "dev"),
                "{name} in {names:?}"
            );
        }
        assert!(names.contains(&"importer") && names.contains(&"controller"));
    }

    #[test]
    fn api_errors_are_said_once_without_the_status_dump() {
        let status = kube::core::Status::failure(
            "datavolumes.cdi.kubevirt.io \"disk\" already exists",
            "AlreadyExists",
        )
        .with_code(409);
        let err = anyhow::Error::new(kube::Error::Api(Box::new(status)))
            .context("creating DataVolume ns/disk");
        assert_eq!(
            super::said(&err),
            "creating DataVolume ns/disk: datavolumes.cdi.kubevirt.io \"disk\" already exists"
        );
        let io = anyhow::Error::new(std::io::Error::other("no such file"))
            .context("open disk.img: no such file");
        assert_eq!(super::said(&io), "open disk.img: no such file");
    }
}
