//! `cdi doctor`: reads what a DataVolume depends on and prints `cdi_core::doctor`'s answer.

use anyhow::Context;
use cdi_api::config::{CDI, CDIConfig};
use cdi_api::datasource::DataSource;
use cdi_api::datavolume::DataVolume;
use cdi_api::storageprofile::StorageProfile;
use cdi_core::doctor::{Diagnosis, Scene, diagnose};
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DynamicObject, ListParams};
use kube::discovery::ApiResource;

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// The DataVolume to explain; without it, every DataVolume of the namespace that has not
    /// succeeded, one line each.
    name: Option<String>,
    /// The namespace (default: the kubeconfig context's).
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// `text` for people, `json` for programs.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    output: Output,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Text,
    Json,
}

pub fn run(args: &DoctorArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    runtime.block_on(doctor(args))
}

/// Everything but the DataVolumes, read once.
struct World {
    claims: Vec<PersistentVolumeClaim>,
    volumes: Vec<PersistentVolume>,
    classes: Vec<StorageClass>,
    profiles: Vec<StorageProfile>,
    config: Option<CDIConfig>,
    cdi: Option<String>,
    pods: Vec<Pod>,
    nodes: Vec<Node>,
    events: Vec<Event>,
    data_sources: Vec<DataSource>,
}

/// A list the caller may not be allowed to read (nodes, volumes, for a namespace user): said
/// on stderr, and the answer is given from the rest.
async fn list_or_say<K>(api: Api<K>, what: &str) -> Vec<K>
where
    K: kube::Resource + Clone + for<'de> k8s_openapi::serde::Deserialize<'de> + std::fmt::Debug,
{
    match api.list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(e) => {
            eprintln!("note: cannot list {what} ({e}); the answer goes without them");
            Vec::new()
        }
    }
}

/// The namespace's DataSources, and those of other namespaces the DataVolumes' `sourceRef`s
/// name, read one by one (a namespace user may list no others).
async fn data_sources(client: &kube::Client, ns: &str, dvs: &[DynamicObject]) -> Vec<DataSource> {
    let mut found = list_or_say(
        Api::<DataSource>::namespaced(client.clone(), ns),
        "datasources",
    )
    .await;
    for o in dvs {
        let r = &o.data["spec"]["sourceRef"];
        let elsewhere = r["namespace"]
            .as_str()
            .filter(|n| !n.is_empty() && *n != ns);
        let (Some(at), Some(name)) = (elsewhere, r["name"].as_str()) else {
            continue;
        };
        let known = found.iter().any(|d| {
            d.metadata.namespace.as_deref() == Some(at) && d.metadata.name.as_deref() == Some(name)
        });
        if !known
            && let Ok(Some(d)) = Api::<DataSource>::namespaced(client.clone(), at)
                .get_opt(name)
                .await
        {
            found.push(d);
        }
    }
    found
}

async fn doctor(args: &DoctorArgs) -> anyhow::Result<()> {
    let (client, ns) = crate::client_in(args.namespace.as_deref()).await?;
    // DataVolumes are read one by one from untyped objects: one whose status does not parse
    // is reported, not a reason to answer nothing.
    let resource = ApiResource::erase::<DataVolume>(&());
    let dvs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource);
    let objects = match &args.name {
        Some(name) => vec![dvs.get_opt(name).await?.with_context(|| {
            format!("DataVolume {ns}/{name} not found (kubectl get dv -n {ns} lists them)")
        })?],
        None => dvs.list(&ListParams::default()).await?.items,
    };
    let world = World {
        claims: list_or_say(Api::namespaced(client.clone(), &ns), "claims").await,
        volumes: list_or_say(Api::all(client.clone()), "persistentvolumes").await,
        classes: list_or_say(Api::all(client.clone()), "storageclasses").await,
        profiles: list_or_say(Api::all(client.clone()), "storageprofiles").await,
        config: Api::<CDIConfig>::all(client.clone())
            .get_opt(cdi_api::name::CDI_CONFIG)
            .await
            .ok()
            .flatten(),
        cdi: list_or_say(Api::<CDI>::all(client.clone()), "CDI resources")
            .await
            .into_iter()
            .find_map(|c| c.metadata.name),
        pods: list_or_say(Api::namespaced(client.clone(), &ns), "pods").await,
        nodes: list_or_say(Api::all(client.clone()), "nodes").await,
        events: list_or_say(Api::namespaced(client.clone(), &ns), "events").await,
        data_sources: data_sources(&client, &ns, &objects).await,
    };
    let mut answers: Vec<Result<Diagnosis, String>> = Vec::new();
    for object in objects {
        let name = object.metadata.name.clone().unwrap_or_default();
        let dv = serde_json::to_value(&object)
            .and_then(serde_json::from_value::<DataVolume>)
            .map_err(|e| format!("DataVolume {ns}/{name} cannot be read: {e}"));
        answers.push(dv.map(|dv| {
            diagnose(&Scene {
                dv: &dv,
                claims: &world.claims,
                volumes: &world.volumes,
                classes: &world.classes,
                profiles: &world.profiles,
                config: world.config.as_ref(),
                cdi: world.cdi.as_deref(),
                pods: &world.pods,
                nodes: &world.nodes,
                events: &world.events,
                data_sources: &world.data_sources,
            })
        }));
    }
    if args.name.is_none() {
        answers.retain(|a| {
            a.as_ref()
                .map_or(true, |d| d.cause != cdi_core::doctor::Cause::Succeeded)
        });
    }
    print(args, &ns, &answers)
}

fn print(args: &DoctorArgs, ns: &str, answers: &[Result<Diagnosis, String>]) -> anyhow::Result<()> {
    let json = |a: &Result<Diagnosis, String>| match a {
        Ok(d) => serde_json::to_value(d).unwrap_or_default(),
        Err(e) => serde_json::json!({ "error": e }),
    };
    let text = match (args.output, &args.name) {
        (Output::Json, Some(_)) => serde_json::to_string_pretty(&json(&answers[0]))? + "\n",
        (Output::Json, None) => {
            let all: Vec<_> = answers.iter().map(json).collect();
            serde_json::to_string_pretty(&all)? + "\n"
        }
        (Output::Text, Some(_)) => match &answers[0] {
            Ok(d) => format!(
                "DataVolume {}/{}: {} ({})\ncause: {:?}\n\n{}\n",
                d.namespace, d.name, d.phase, d.progress, d.cause, d.explanation
            ),
            Err(e) => format!("{e}\n"),
        },
        (Output::Text, None) if answers.is_empty() => {
            format!("Every DataVolume in namespace {ns} has succeeded.\n")
        }
        (Output::Text, None) => answers
            .iter()
            .map(|a| match a {
                Ok(d) => format!(
                    "{}/{}  {}  {:?}: {}\n",
                    d.namespace, d.name, d.phase, d.cause, d.summary
                ),
                Err(e) => format!("{e}\n"),
            })
            .collect(),
    };
    print!("{text}");
    Ok(())
}
