//! `cdi image-upload`: `virtctl image-upload` with its arguments and behaviour. It creates the
//! DataVolume or PVC (or uses an existing one), waits for its upload pod, asks the token API for
//! an upload token, sends the image to the upload proxy with a progress bar (async endpoint when
//! the proxy has it, else the sync one; what may be transient tried again with back-off, the
//! token renewed after a 401), and waits until the volume is complete.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use cdi_api::UploadTokenRequest;
use cdi_api::ann;
use cdi_api::datavolume::DataVolume;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

const ASYNC_PATH: &str = "/v1beta1/upload-async";
const SYNC_PATH: &str = "/v1beta1/upload";
/// How often the command looks at the volume while it waits.
const POLL: Duration = Duration::from_secs(1);

#[derive(clap::Args)]
pub struct ImageUploadArgs {
    /// `dv` or `pvc`, then the name: what to upload into.
    #[arg(value_name = "dv|pvc NAME", num_args = 0..=2)]
    target: Vec<String>,
    /// The namespace (default: the kubeconfig context's).
    #[arg(short, long)]
    namespace: Option<String>,
    /// The size of the DataVolume/PVC to create (ex. 10Gi, 500Mi).
    #[arg(long)]
    size: Option<String>,
    /// The storage class for the PVC.
    #[arg(long)]
    storage_class: Option<String>,
    /// The access mode for the PVC.
    #[arg(long)]
    access_mode: Option<String>,
    /// The VolumeMode (block/filesystem) of the PVC; default is the StorageProfile's, and
    /// filesystem for an archive.
    #[arg(long)]
    volume_mode: Option<String>,
    /// Path to the local VM image.
    #[arg(long)]
    image_path: Option<PathBuf>,
    /// Path to the local archive.
    #[arg(long)]
    archive_path: Option<PathBuf>,
    /// Don't attempt to create a new DataVolume/PVC.
    #[arg(long)]
    no_create: bool,
    /// Allow insecure server connections when using HTTPS.
    #[arg(long)]
    insecure: bool,
    /// The URL of the cdi-upload proxy service.
    #[arg(long = "uploadproxy-url")]
    uploadproxy_url: Option<String>,
    /// Seconds each wait may take: for the upload pod to be ready, and for processing after
    /// the upload.
    #[arg(long, default_value_t = 300)]
    wait_secs: u64,
    /// How many times an upload is sent in all when the failure may be transient (backing
    /// off 1, 2, 4, … seconds); a refusal with a reason is not sent again.
    #[arg(long, default_value_t = 5)]
    retry: u32,
    /// Force bind the PVC, ignoring the WaitForFirstConsumer logic.
    #[arg(long)]
    force_bind: bool,
    /// Create a DataSource pointing to the created DataVolume/PVC.
    #[arg(long)]
    datasource: bool,
    /// The default instance type to associate with the image.
    #[arg(long)]
    default_instancetype: Option<String>,
    #[arg(long)]
    default_instancetype_kind: Option<String>,
    /// The default preference to associate with the image.
    #[arg(long)]
    default_preference: Option<String>,
    #[arg(long)]
    default_preference_kind: Option<String>,
}

/// The checked arguments.
struct Plan {
    create_pvc: bool,
    name: String,
    image: PathBuf,
    archive: bool,
    volume_mode: Option<&'static str>,
}

fn plan(a: &ImageUploadArgs) -> anyhow::Result<Plan> {
    let volume_mode = match a.volume_mode.as_deref() {
        None | Some("") => None,
        Some("block") => Some("Block"),
        Some("filesystem") => Some("Filesystem"),
        Some(other) => {
            bail!("Invalid volume mode '{other}'. Valid values are 'block' and 'filesystem'.")
        }
    };
    let (image, archive) = match (&a.image_path, &a.archive_path) {
        (None, None) => bail!("either image-path or archive-path must be provided"),
        (Some(_), Some(_)) => {
            bail!("cannot handle both image-path and archive-path, provide only one")
        }
        (Some(i), None) => (i.clone(), false),
        (None, Some(p)) => {
            if volume_mode == Some("Block") {
                bail!("In archive upload the volume mode should always be filesystem");
            }
            (p.clone(), true)
        }
    };
    let [kind, name] = a.target.as_slice() else {
        bail!("expecting two args");
    };
    let create_pvc = match kind.to_ascii_lowercase().as_str() {
        "dv" => false,
        "pvc" => true,
        other => bail!("invalid resource type {other}"),
    };
    if a.default_instancetype.is_none() && a.default_instancetype_kind.is_some() {
        bail!("--default-instancetype must be provided with --default-instancetype-kind");
    }
    if a.default_preference.is_none() && a.default_preference_kind.is_some() {
        bail!("--default-preference must be provided with --default-preference-kind");
    }
    if (a.default_instancetype.is_some() || a.default_preference.is_some()) && a.no_create {
        bail!("--default-instancetype and --default-preference cannot be used with --no-create");
    }
    if a.access_mode.as_deref() == Some("ReadOnlyMany") {
        bail!(
            "cannot upload to a readonly volume, use either ReadWriteOnce or ReadWriteMany if supported"
        );
    }
    Ok(Plan {
        create_pvc,
        name: name.clone(),
        image,
        archive,
        volume_mode,
    })
}

fn instancetype_labels(a: &ImageUploadArgs) -> serde_json::Map<String, serde_json::Value> {
    [
        (
            cdi_api::label::DEFAULT_INSTANCETYPE,
            &a.default_instancetype,
        ),
        (
            cdi_api::label::DEFAULT_INSTANCETYPE_KIND,
            &a.default_instancetype_kind,
        ),
        (cdi_api::label::DEFAULT_PREFERENCE, &a.default_preference),
        (
            cdi_api::label::DEFAULT_PREFERENCE_KIND,
            &a.default_preference_kind,
        ),
    ]
    .into_iter()
    .filter_map(|(k, v)| Some((k.to_string(), json!(v.as_ref()?))))
    .collect()
}

pub fn run(args: &ImageUploadArgs) -> anyhow::Result<()> {
    let plan = plan(args)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    runtime.block_on(upload(args, &plan))
}

struct Ctx<'a> {
    client: kube::Client,
    ns: String,
    args: &'a ImageUploadArgs,
    plan: &'a Plan,
}

/// The image's length, checked before anything is created: a regular file or a block device
/// (read to its end) with at least one byte. A directory, a character device (`/dev/zero` has
/// no end) or a pipe is refused, and so is an empty file: no data is not an image.
fn image_length(path: &std::path::Path) -> anyhow::Result<u64> {
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::FileTypeExt;
    let shown = path.display();
    let kind = std::fs::metadata(path)
        .with_context(|| format!("open {shown}"))?
        .file_type();
    if kind.is_dir() {
        bail!("{shown} is a directory: give the path of a disk image file or a block device");
    }
    if kind.is_char_device() {
        bail!(
            "{shown} is a character device, which has no end: give a disk image file or a block device"
        );
    }
    if kind.is_fifo() || kind.is_socket() {
        bail!(
            "{shown} is a pipe or a socket, whose length is not known: give a disk image file or a block device"
        );
    }
    // Opened (not only looked at), so that an unreadable file is said now.
    let mut file = std::fs::File::open(path).with_context(|| format!("open {shown}"))?;
    let length = file
        .seek(SeekFrom::End(0))
        .with_context(|| format!("reading the size of {shown}"))?;
    if length == 0 {
        bail!("{shown} is empty: no data is not an image");
    }
    Ok(length)
}

async fn upload(args: &ImageUploadArgs, plan: &Plan) -> anyhow::Result<()> {
    let length = image_length(&plan.image)?;
    let (client, ns) = crate::client_in(args.namespace.as_deref()).await?;
    let c = Ctx {
        client,
        ns,
        args,
        plan,
    };
    match existing_target(&c).await? {
        Some(claim) => {
            ensure_upload_target(&c, claim).await?;
            println!("Using existing PVC {}/{}", c.ns, plan.name);
        }
        None => {
            if args.size.is_none() {
                bail!("when creating a resource, the size must be specified");
            }
            let kind = if plan.create_pvc {
                "PersistentVolumeClaim"
            } else {
                "DataVolume"
            };
            let created = if plan.create_pvc {
                create_pvc(&c).await
            } else {
                create_data_volume(&c).await
            };
            match created {
                Ok(()) => println!("{kind} {}/{} created", c.ns, plan.name),
                // Another upload made it first: it is this one's target as it is theirs (a
                // DataVolume's claim may not be made yet: the wait below is for its pod).
                Err(e) if already_exists(&e) => {
                    println!("{kind} {}/{} was created meanwhile", c.ns, plan.name);
                    if plan.create_pvc {
                        if let Some(claim) = existing_target(&c).await? {
                            ensure_upload_target(&c, claim).await?;
                        }
                    } else {
                        same_upload(&c).await?;
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
    if plan.create_pvc {
        wait_server_ready(&c).await?;
    } else {
        wait_dv_upload_ready(&c).await?;
    }
    let (url, ca) = proxy_url(&c).await?;
    println!("Uploading data to {url}");
    let token = upload_token(&c).await?;
    let restarts = send(&c, &url, ca.as_deref(), token, length).await?;
    if args.datasource {
        data_source(&c).await?;
    }
    println!(
        "Uploading data completed successfully, waiting for processing to complete, you can hit ctrl-c without interrupting the progress"
    );
    wait_processing(&c, restarts).await?;
    println!("Uploading {} completed successfully", plan.image.display());
    Ok(())
}

/// The DataVolume another client made first takes this upload too when it is one.
async fn same_upload(c: &Ctx<'_>) -> anyhow::Result<()> {
    let dv = Api::<DataVolume>::namespaced(c.client.clone(), &c.ns)
        .get(&c.plan.name)
        .await?;
    takes_upload(c, &dv)
}

/// An existing DataVolume takes this upload: its source is an upload (an import or a clone of
/// the name never gets an upload pod, and its claim must not get a second writer) of the same
/// content type.
fn takes_upload(c: &Ctx<'_>, dv: &DataVolume) -> anyhow::Result<()> {
    let (ns, name) = (&c.ns, &c.plan.name);
    if dv
        .spec
        .source
        .as_ref()
        .and_then(|s| s.upload.as_ref())
        .is_none()
    {
        bail!("DataVolume {ns}/{name} is not an upload target: it is filled from another source");
    }
    let archive = dv.spec.content_type.as_ref().map(|t| t.as_str()) == Some("archive");
    if archive != c.plan.archive {
        bail!(
            "DataVolume {ns}/{name} exists with another content type ({}): choose another name",
            if archive { "archive" } else { "kubevirt" }
        );
    }
    Ok(())
}

fn already_exists(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        matches!(cause.downcast_ref::<kube::Error>(),
            Some(kube::Error::Api(s)) if s.reason == "AlreadyExists")
    })
}

/// The refusal of an upload into a volume whose one upload is done.
fn already_uploaded(c: &Ctx<'_>, kind: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{kind} {}/{} already uploaded: it takes one upload (delete it to upload again)",
        c.ns,
        c.plan.name
    )
}

/// The claim to upload into when it exists, checked as virtctl checks it; `None` when it is to
/// be created.
async fn existing_target(c: &Ctx<'_>) -> anyhow::Result<Option<PersistentVolumeClaim>> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), &c.ns);
    let name = &c.plan.name;
    let Some(mut claim) = claims.get_opt(name).await? else {
        println!("PVC {}/{name} not found ", c.ns);
        if c.args.no_create {
            bail!("persistentvolumeclaims \"{name}\" not found");
        }
        return Ok(None);
    };
    if !c.plan.create_pvc {
        let dvs: Api<DataVolume> = Api::namespaced(c.client.clone(), &c.ns);
        let Some(dv) = dvs.get_opt(name).await? else {
            let anns = claim.metadata.annotations.clone().unwrap_or_default();
            if anns.get(ann::DELETE_AFTER_COMPLETION).map(String::as_str) == Some("true")
                && anns.get(ann::POD_PHASE).map(String::as_str) == Some("Succeeded")
            {
                bail!(
                    "DataVolume already garbage-collected: Assuming PVC {}/{name} is successfully populated",
                    c.ns
                );
            }
            bail!(
                "No DataVolume is associated with the existing PVC {}/{name}",
                c.ns
            );
        };
        takes_upload(c, &dv)?;
        let dv_anns = dv.metadata.annotations.clone().unwrap_or_default();
        if dv_anns.get(ann::USE_POPULATOR).map(String::as_str) == Some("true") {
            if claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound") {
                bail!("PVC {name} already successfully populated");
            }
            let prime = claim
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ann::PVC_PRIME_NAME).cloned())
                .with_context(|| {
                    format!("Unable to get PVC Prime name from PVC {}/{name}", c.ns)
                })?;
            claim = claims
                .get_opt(&prime)
                .await?
                .with_context(|| format!("Unable to get PVC Prime {}/{name}", c.ns))?;
        }
    }
    let anns = claim.metadata.annotations.clone().unwrap_or_default();
    if anns.get(ann::POD_PHASE).map(String::as_str) == Some("Succeeded") {
        bail!("PVC {name} already successfully imported/cloned/updated");
    }
    if !c.args.no_create && !anns.contains_key(ann::UPLOAD_REQUEST) {
        bail!("PVC {name} not available for upload");
    }
    if c.plan.archive && anns.get(ann::CONTENT_TYPE).map(String::as_str) != Some("archive") {
        bail!("PVC {name} doesn't have archive contentType annotation");
    }
    Ok(Some(claim))
}

/// An existing claim becomes an upload target (virtctl's `ensurePVCSupportsUpload`).
async fn ensure_upload_target(c: &Ctx<'_>, claim: PersistentVolumeClaim) -> anyhow::Result<()> {
    let has = claim
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ann::UPLOAD_REQUEST));
    if !has {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), &c.ns);
        let name = claim.metadata.name.clone().unwrap_or_default();
        let patch = json!({"metadata": {"annotations": {ann::UPLOAD_REQUEST: ""}}});
        claims
            .patch(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await?;
    }
    Ok(())
}

async fn check_class(c: &Ctx<'_>) -> anyhow::Result<()> {
    if let Some(class) = &c.args.storage_class {
        Api::<StorageClass>::all(c.client.clone())
            .get(class)
            .await
            .with_context(|| format!("storage class {class}"))?;
    }
    Ok(())
}

async fn create_data_volume(c: &Ctx<'_>) -> anyhow::Result<()> {
    check_class(c).await?;
    let size = c.args.size.clone().unwrap_or_default();
    size.parse::<cdi_core::Quantity>()
        .map_err(|e| anyhow::anyhow!("validation failed for size={size}: {e}"))?;
    let mut storage = json!({"resources": {"requests": {"storage": size}}});
    if let Some(class) = &c.args.storage_class {
        storage["storageClassName"] = json!(class);
    }
    if let Some(mode) = &c.args.access_mode {
        storage["accessModes"] = json!([mode]);
    }
    if let Some(mode) = c.plan.volume_mode {
        storage["volumeMode"] = json!(mode);
    }
    let mut annotations = serde_json::Map::new();
    if c.args.force_bind {
        annotations.insert(ann::IMMEDIATE_BINDING.into(), json!(""));
    }
    let dv: DataVolume = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": c.plan.name, "namespace": c.ns, "annotations": annotations,
            "labels": instancetype_labels(c.args)},
        "spec": {"source": {"upload": {}},
            "contentType": if c.plan.archive { "archive" } else { "kubevirt" },
            "storage": storage}}))?;
    Api::<DataVolume>::namespaced(c.client.clone(), &c.ns)
        .create(&PostParams::default(), &dv)
        .await?;
    Ok(())
}

async fn create_pvc(c: &Ctx<'_>) -> anyhow::Result<()> {
    check_class(c).await?;
    let size = c.args.size.clone().unwrap_or_default();
    size.parse::<cdi_core::Quantity>()
        .map_err(|e| anyhow::anyhow!("validation failed for size={size}: {e}"))?;
    let mut annotations = serde_json::Map::new();
    annotations.insert(ann::UPLOAD_REQUEST.into(), json!(""));
    annotations.insert(
        ann::CONTENT_TYPE.into(),
        json!(if c.plan.archive {
            "archive"
        } else {
            "kubevirt"
        }),
    );
    if c.args.force_bind {
        annotations.insert(ann::IMMEDIATE_BINDING.into(), json!(""));
    }
    let mut labels = instancetype_labels(c.args);
    labels.insert(cdi_api::label::APPLY_STORAGE_PROFILE.into(), json!("true"));
    let mut spec = json!({
        "accessModes": [c.args.access_mode.clone().unwrap_or_else(|| "ReadWriteOnce".into())],
        "resources": {"requests": {"storage": size}}});
    if let Some(class) = &c.args.storage_class {
        spec["storageClassName"] = json!(class);
    }
    if let Some(mode) = c.plan.volume_mode {
        spec["volumeMode"] = json!(mode);
    }
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": c.plan.name, "namespace": c.ns,
            "annotations": annotations, "labels": labels},
        "spec": spec}))?;
    Api::<PersistentVolumeClaim>::namespaced(c.client.clone(), &c.ns)
        .create(&PostParams::default(), &claim)
        .await?;
    Ok(())
}

/// virtctl's `handleEventErrors`: a provisioning failure of the claim, or an invalid claim of
/// the DataVolume, ends the wait.
async fn event_errors(
    c: &Ctx<'_>,
    claim_uid: Option<String>,
    dv_uid: Option<String>,
) -> anyhow::Result<()> {
    let events = Api::<Event>::namespaced(c.client.clone(), &c.ns)
        .list(&ListParams::default())
        .await?;
    for e in events.items {
        let o = &e.involved_object;
        let reason = e.reason.as_deref().unwrap_or("");
        let message = e.message.as_deref().unwrap_or("");
        if o.kind.as_deref() == Some("PersistentVolumeClaim")
            && o.uid.is_some()
            && o.uid == claim_uid
            && reason == "ProvisioningFailed"
            && !message.contains("the object has been modified")
        {
            bail!("Provisioning failed: {message}");
        }
        if o.kind.as_deref() == Some("DataVolume")
            && o.uid.is_some()
            && o.uid == dv_uid
            && reason == "ErrClaimNotValid"
        {
            bail!("Claim not valid: {message}");
        }
    }
    Ok(())
}

fn timed_out(c: &Ctx<'_>) -> anyhow::Error {
    anyhow::anyhow!(
        "timed out after {} s waiting for the upload pod of {}/{} to be ready (--wait-secs)",
        c.args.wait_secs,
        c.ns,
        c.plan.name
    )
}

async fn wait_dv_upload_ready(c: &Ctx<'_>) -> anyhow::Result<()> {
    use cdi_api::enums::DataVolumePhase as Phase;
    let dvs: Api<DataVolume> = Api::namespaced(c.client.clone(), &c.ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), &c.ns);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(c.args.wait_secs);
    let mut said = false;
    loop {
        match dvs.get_opt(&c.plan.name).await? {
            // Deleted while this waited (or by the time it looked): nothing will come.
            None => bail!(
                "DataVolume {}/{} does not exist (deleted meanwhile?)",
                c.ns,
                c.plan.name
            ),
            Some(dv) => {
                let phase = dv.status.as_ref().and_then(|s| s.phase.clone());
                if matches!(
                    phase,
                    Some(Phase::WaitForFirstConsumer | Phase::PendingPopulation)
                ) && !c.args.force_bind
                {
                    bail!(
                        "cannot upload to DataVolume in {} phase, make sure the PVC is Bound, or use force-bind flag",
                        phase.map(|p| p.as_str().to_string()).unwrap_or_default()
                    );
                }
                if phase == Some(Phase::UploadReady) {
                    if said {
                        println!("Pod now ready");
                    }
                    return Ok(());
                }
                // Another upload won: there will be no upload pod to wait for.
                if phase == Some(Phase::Succeeded) {
                    return Err(already_uploaded(c, "DataVolume"));
                }
                if phase == Some(Phase::Failed) {
                    bail!(
                        "DataVolume {}/{} failed: {}",
                        c.ns,
                        c.plan.name,
                        running_message(&dv).unwrap_or("see cdi doctor")
                    );
                }
                let claim_name = dv.status.as_ref().and_then(|s| s.claim_name.clone());
                let claim_uid = match claim_name {
                    Some(n) => claims.get_opt(&n).await?.and_then(|p| p.metadata.uid),
                    None => None,
                };
                event_errors(c, claim_uid, dv.metadata.uid.clone()).await?;
                if !said {
                    println!("Waiting for PVC {} upload pod to be ready...", c.plan.name);
                    said = true;
                }
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(timed_out(c));
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn wait_server_ready(c: &Ctx<'_>) -> anyhow::Result<()> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), &c.ns);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(c.args.wait_secs);
    let mut said = false;
    loop {
        if let Some(claim) = claims.get_opt(&c.plan.name).await? {
            if cdi_core::import::is_complete(&claim) {
                return Err(already_uploaded(c, target_kind(c)));
            }
            let ready = claim
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ann::POD_READY))
                .is_some_and(|v| v == "true");
            if ready {
                if said {
                    println!("Pod now ready");
                }
                return Ok(());
            }
            event_errors(c, claim.metadata.uid.clone(), None).await?;
            if !said {
                println!("Waiting for PVC {} upload pod to be ready...", c.plan.name);
                said = true;
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(timed_out(c));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The proxy's URL (the flag, else CDIConfig's override, else its status), with `https://` when
/// it has no scheme, and the CA CDIConfig publishes for it, if any.
async fn proxy_url(c: &Ctx<'_>) -> anyhow::Result<(String, Option<String>)> {
    let config = Api::<cdi_api::config::CDIConfig>::all(c.client.clone())
        .get_opt(cdi_api::name::CDI_CONFIG)
        .await?;
    let ca = config
        .as_ref()
        .and_then(|cfg| cfg.status.as_ref()?.upload_proxy_ca.clone())
        .filter(|ca| !ca.is_empty());
    let url = match &c.args.uploadproxy_url {
        Some(u) => u.clone(),
        None => config
            .as_ref()
            .and_then(|cfg| {
                cfg.spec
                    .upload_proxy_url_override
                    .clone()
                    .or_else(|| cfg.status.as_ref()?.upload_proxy_url.clone())
            })
            .filter(|u| !u.is_empty())
            .context("uploadproxy URL not found")?,
    };
    let url = if url.contains("://") {
        url
    } else {
        format!("https://{url}")
    };
    Ok((url, ca))
}

async fn upload_token(c: &Ctx<'_>) -> anyhow::Result<String> {
    let mut request = UploadTokenRequest::new(
        "",
        cdi_api::upload::UploadTokenRequestSpec {
            pvc_name: c.plan.name.clone(),
        },
    );
    request.metadata.name = None;
    request.metadata.generate_name = Some("token-for-cdi-".into());
    let answer = Api::<UploadTokenRequest>::namespaced(c.client.clone(), &c.ns)
        .create(&PostParams::default(), &request)
        .await
        .context("requesting an upload token")?;
    answer
        .status
        .and_then(|s| s.token)
        .context("the UploadTokenRequest was answered without a token")
}

/// `base` with `path` appended, unless it already ends with it (virtctl's
/// `ConstructUploadProxyPath`).
fn with_path(base: &str, path: &str) -> String {
    if base.contains(path) {
        return base.to_string();
    }
    format!("{}{path}", base.trim_end_matches('/'))
}

fn http_client(insecure: bool, ca: Option<&str>) -> anyhow::Result<reqwest::Client> {
    let mut b = reqwest::Client::builder();
    if insecure {
        b = b.tls_danger_accept_invalid_certs(true);
    } else if let Some(pem) = ca {
        for cert in reqwest::Certificate::from_pem_bundle(pem.as_bytes())
            .context("CDIConfig status.uploadProxyCA")?
        {
            b = b.add_root_certificate(cert);
        }
    }
    Ok(b.build()?)
}

/// The file as a request body that moves the progress bar.
async fn body(
    path: &std::path::Path,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<reqwest::Body> {
    use tokio::io::AsyncReadExt;
    let file = tokio::fs::File::open(path).await?;
    let bar = bar.clone();
    bar.set_position(0);
    let stream = futures::stream::try_unfold(file, move |mut file| {
        let bar = bar.clone();
        async move {
            let mut buf = vec![0u8; 1 << 20];
            let n = file.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(None);
            }
            buf.truncate(n);
            bar.inc(n as u64);
            Ok(Some((bytes::Bytes::from(buf), file)))
        }
    });
    Ok(reqwest::Body::wrap_stream(stream))
}

/// Send the image until the proxy takes it, a refusal ends it, or the tries run out. Returns
/// how often the upload server had restarted when the accepted try began: a restart after it is
/// the server failing to process what it took.
async fn send(
    c: &Ctx<'_>,
    url: &str,
    ca: Option<&str>,
    first_token: String,
    length: u64,
) -> anyhow::Result<i64> {
    let client = http_client(c.args.insecure, ca)?;
    let bar = progress_bar(length)?;
    println!();
    let mut token = first_token;
    let mut refreshes = 3;
    let mut last = None;
    let tries = c.args.retry.max(1);
    // A try that broke off may have been taken in all the same (its answer lost): then the
    // server busy with it, or the volume it filled, is this upload's own doing.
    let mut broke_off = false;
    let mut restarts = 0;
    for attempt in 0..tries {
        if attempt > 0 {
            tokio::time::sleep(backoff(attempt)).await;
        }
        let claim = target_claim(c).await;
        if attempt > 0 {
            // The volume filled meanwhile: by another upload, or by a try whose answer was lost.
            if claim.as_ref().is_some_and(cdi_core::import::is_complete) {
                bar.abandon();
                if broke_off {
                    say_filled_meanwhile();
                    return Ok(restarts);
                }
                return Err(already_uploaded(c, target_kind(c)));
            }
        }
        // A restart after this attempt's start is a failure the wait for processing reports.
        restarts = restarts_of(claim.as_ref(), restarts);
        let Some((code, text)) = post_image(c, &client, url, &token, length, &bar).await? else {
            bar.finish();
            println!();
            // A restart of an earlier try is counted by now (the proxy let this one
            // through once the restarted server was ready, which the same count records).
            return Ok(restarts_of(target_claim(c).await.as_ref(), restarts));
        };
        if let Some(end) = final_answer(c, code, &text, broke_off) {
            bar.abandon();
            return Err(end);
        }
        if code == 409 {
            // Filled after a try that broke off: that try's, most likely.
            bar.abandon();
            say_filled_meanwhile();
            return Ok(restarts);
        }
        broke_off |= code == 0;
        let err = try_failed(code, &text);
        if code == 401 {
            // A 401 at once is a refusal; later, the token may have expired meanwhile.
            if attempt == 0 || refreshes == 0 {
                bar.abandon();
                return Err(err.context("authentication failed"));
            }
            token = upload_token(c)
                .await
                .context("failed to get upload token")?;
            refreshes -= 1;
        } else if !retryable(code, &text) {
            // The image, or the request, was refused: sending it again changes nothing.
            bar.abandon();
            return Err(err);
        }
        if attempt + 1 < tries {
            before_next_try(c, code, &err, attempt).await?;
        }
        last = Some(err);
    }
    bar.abandon();
    let err = last.unwrap_or_else(|| anyhow::anyhow!("no attempt was made"));
    Err(err.context(format!("the upload failed {tries} times (--retry)")))
}

/// Say that the volume was filled while this upload was trying.
fn say_filled_meanwhile() {
    println!("The volume was filled meanwhile (by a try whose answer was lost, or another upload)");
}

/// The error of a failed try: its answer's code (0: it broke off) and what it said.
fn try_failed(code: u16, text: &str) -> anyhow::Error {
    match code {
        0 => anyhow::anyhow!("the upload broke off: {text}"),
        _ if text.is_empty() => anyhow::anyhow!("the upload proxy answered {code}"),
        _ => anyhow::anyhow!("the upload proxy answered {code}: {text}"),
    }
}

/// The progress bar of the upload, `length` bytes long.
fn progress_bar(length: u64) -> anyhow::Result<indicatif::ProgressBar> {
    let bar = indicatif::ProgressBar::new(length);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bytes} / {total_bytes} [{wide_bar}] {percent}% {binary_bytes_per_sec} {eta}",
        )?
        .progress_chars("=> "),
    );
    Ok(bar)
}

/// One try: post the image to the async endpoint when the proxy answers for it, else to the
/// sync one. `None` when the proxy took it; else the answer's code (0 when the try broke off)
/// and what it said, on one line.
async fn post_image(
    c: &Ctx<'_>,
    client: &reqwest::Client,
    url: &str,
    token: &str,
    length: u64,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Option<(u16, String)>> {
    let async_url = with_path(url, ASYNC_PATH);
    let head = client
        .head(&async_url)
        .bearer_auth(token)
        .send()
        .await
        .ok()
        .filter(|r| r.status() == 200);
    let target = if head.is_some() {
        async_url
    } else {
        with_path(url, SYNC_PATH)
    };
    let result = client
        .post(&target)
        .bearer_auth(token)
        .header("Content-Type", "application/octet-stream")
        .header("Content-Length", length)
        .body(body(&c.plan.image, bar).await?)
        .send()
        .await;
    Ok(match result {
        Ok(r) if r.status() == 200 => None,
        Ok(r) => {
            let code = r.status().as_u16();
            Some((
                code,
                one_line(&said_in(&r.text().await.unwrap_or_default())),
            ))
        }
        Err(e) => Some((0, one_line(&causes(&e)))),
    })
}

/// Before a try that follows a failed one: after a 503, wait for the upload server to be
/// ready again (it may be on its way out, or restarting); else say when the next try is.
async fn before_next_try(
    c: &Ctx<'_>,
    code: u16,
    err: &anyhow::Error,
    attempt: u32,
) -> anyhow::Result<()> {
    if code == 503 {
        // The server may be on its way out, or restarting (with scratch space, when the
        // image needs it): the next attempt waits for the next one.
        println!("{err:#}; waiting for the upload server to be ready again");
        if c.plan.create_pvc {
            wait_server_ready(c).await?;
        } else {
            wait_dv_upload_ready(c).await?;
        }
    } else {
        println!(
            "{err:#}; trying again in {} s",
            backoff(attempt + 1).as_secs()
        );
    }
    Ok(())
}

/// An error and its sources, each once (reqwest's own text names only the URL).
fn causes(e: &dyn std::error::Error) -> String {
    let mut said = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !said.contains(&text) {
            said = format!("{said}: {text}");
        }
        source = s.source();
    }
    said
}

/// What ends the upload at once whatever the tries left: an untrusted certificate, a volume
/// another upload fills or filled.
fn final_answer(c: &Ctx<'_>, code: u16, text: &str, broke_off: bool) -> Option<anyhow::Error> {
    let (kind, ns, name) = (target_kind(c), &c.ns, &c.plan.name);
    match code {
        0 if text.contains("certificate") => Some(anyhow::anyhow!(
            "the upload proxy's certificate is not trusted: {text} (CDIConfig's status.uploadProxyCA, or --insecure)"
        )),
        // After a try that broke off, the upload under way may be that try: wait for it.
        503 if text.contains(cdi_upload::server::BUSY) && !broke_off => Some(anyhow::anyhow!(
            "another upload into {kind} {ns}/{name} is under way: wait for it to end"
        )),
        409 if !broke_off => Some(already_uploaded(c, kind)),
        _ => None,
    }
}

/// The wait before try `attempt` (from 1): 1, 2, 4, … seconds, at most 30.
fn backoff(attempt: u32) -> Duration {
    Duration::from_secs((1u64 << attempt.saturating_sub(1).min(5)).min(30))
}

/// Whether an answer may change when the upload is sent again: no answer (the connection
/// broke), a proxy or server on its way (502, 503, 504), 408, 429, and a 500 that gives no
/// reason. A refusal that gives one (400, 413, a 500 saying why) is final.
fn retryable(code: u16, text: &str) -> bool {
    match code {
        0 | 408 | 429 | 502 | 503 | 504 => true,
        500 => text.is_empty(),
        _ => false,
    }
}

/// What an answer's body says: an API Status's message (the body a proxy in front of the wrong
/// server sends), else the text itself.
fn said_in(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| body.to_string())
}

/// A server's text as one line of at most 300 characters, control characters left out (a body
/// of raw bytes must not reach the terminal as it is).
fn one_line(text: &str) -> String {
    let flat: String = text
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .filter(|c| !cdi_importer::error::is_deceptive(*c))
        .collect();
    match flat.char_indices().nth(300) {
        Some((at, _)) => format!("{}…", &flat[..at]),
        None => flat,
    }
}

async fn data_source(c: &Ctx<'_>) -> anyhow::Result<()> {
    use cdi_api::datasource::DataSource;
    let api: Api<DataSource> = Api::namespaced(c.client.clone(), &c.ns);
    let labels = instancetype_labels(c.args);
    let source = json!({"pvc": {"name": c.plan.name, "namespace": c.ns}});
    match api.get_opt(&c.plan.name).await? {
        Some(existing) => {
            let mut all = existing.metadata.labels.clone().unwrap_or_default();
            for (k, v) in labels {
                all.insert(k, v.as_str().unwrap_or_default().to_string());
            }
            let patch = json!({"metadata": {"labels": all}, "spec": {"source": source}});
            api.patch(
                &c.plan.name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await?;
            println!("Updated an existing DataSource {}/{}", c.ns, c.plan.name);
        }
        None => {
            let ds: DataSource = serde_json::from_value(json!({
                "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
                "metadata": {"name": c.plan.name, "namespace": c.ns, "labels": labels},
                "spec": {"source": source}}))?;
            api.create(&PostParams::default(), &ds).await?;
            println!("Created a new DataSource {}/{}", c.ns, c.plan.name);
        }
    }
    Ok(())
}

fn annotation<'a>(claim: &'a PersistentVolumeClaim, key: &str) -> Option<&'a str> {
    claim
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The DataVolume's Running condition's message, when it says something.
fn running_message(dv: &DataVolume) -> Option<&str> {
    dv.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == cdi_api::enums::DataVolumeConditionType::Running)
        .and_then(|c| c.message.as_deref())
        .filter(|m| !m.is_empty())
}

fn target_kind(c: &Ctx<'_>) -> &'static str {
    if c.plan.create_pvc {
        "PVC"
    } else {
        "DataVolume"
    }
}

/// The target claim as it is now; `None` when it cannot be read (the tries ride that out: a
/// failed read between tries is no reason to give up).
async fn target_claim(c: &Ctx<'_>) -> Option<PersistentVolumeClaim> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), &c.ns);
    claims.get_opt(&c.plan.name).await.ok().flatten()
}

/// How often the claim's upload server restarted (the controller's count), at least `known`.
fn restarts_of(claim: Option<&PersistentVolumeClaim>, known: i64) -> i64 {
    claim
        .and_then(|claim| annotation(claim, ann::POD_RESTARTS)?.parse().ok())
        .unwrap_or(known)
        .max(known)
}

/// Why the upload server last ended, in its own words (its termination message), if the
/// caller may read its pod.
async fn server_said(c: &Ctx<'_>) -> Option<String> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.client.clone(), &c.ns);
    let pod = pods
        .get_opt(&cdi_core::upload::pod_name(&target_claim(c).await?))
        .await
        .ok()??;
    let ended = pod
        .status?
        .container_statuses?
        .into_iter()
        .find_map(|s| s.last_state?.terminated)?;
    cdi_api::TerminationMessage::parse(ended.message.as_deref()?)
        .message
        .filter(|m| !m.is_empty())
        .map(|m| one_line(&m))
}

/// Wait (at most `--wait-secs`) until the volume is complete. An upload server that failed
/// after taking the image in restarts for a new upload: its reason ends the wait.
async fn wait_processing(c: &Ctx<'_>, restarts_before: i64) -> anyhow::Result<()> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), &c.ns);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(c.args.wait_secs);
    loop {
        let claim = claims.get(&c.plan.name).await?;
        if cdi_core::import::is_complete(&claim) {
            println!("Processing completed successfully");
            return Ok(());
        }
        let running = annotation(&claim, ann::RUNNING_CONDITION_MESSAGE)
            .filter(|m| !m.is_empty())
            .map(str::to_string);
        if annotation(&claim, ann::POD_PHASE) == Some("Failed") {
            let reason = running.unwrap_or_else(|| "see cdi doctor".into());
            bail!(
                "processing the upload of {}/{} failed: {reason}",
                c.ns,
                c.plan.name
            );
        }
        if restarts_of(Some(&claim), 0) > restarts_before {
            // The running message is cleared once the server runs again: its last end says.
            let reason = match running {
                Some(r) => r,
                None => server_said(c)
                    .await
                    .unwrap_or_else(|| "its log says why".into()),
            };
            bail!(
                "the upload server of {}/{} failed to process the image: {reason}",
                c.ns,
                c.plan.name
            );
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "timed out after {} s waiting for {}/{} to be processed (--wait-secs); the upload server goes on with it",
                c.args.wait_secs,
                c.ns,
                c.plan.name
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_answers_that_may_change_are_tried_again() {
        for code in [0, 408, 429, 502, 503, 504] {
            assert!(retryable(code, "busy"), "{code}");
        }
        assert!(retryable(500, ""));
        for code in [400, 404, 409, 413, 422] {
            assert!(!retryable(code, ""), "{code}");
        }
        assert!(!retryable(500, "Saving stream failed: invalid qcow2 image"));
        let waits: Vec<u64> = (1..=8).map(|a| backoff(a).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
    }

    #[test]
    fn server_text_is_one_short_line() {
        assert_eq!(one_line("a\n  b\r\n"), "a b");
        assert_eq!(one_line("x\u{1b}[31my"), "x[31my");
        assert_eq!(one_line("a\u{202e}b\u{200b}c…"), "abc…");
        let long = "z".repeat(400);
        assert_eq!(one_line(&long).chars().count(), 301);
    }

    #[test]
    fn paths_are_added_once() {
        assert_eq!(
            with_path("https://proxy:443", SYNC_PATH),
            "https://proxy:443/v1beta1/upload"
        );
        assert_eq!(
            with_path("https://proxy/", ASYNC_PATH),
            "https://proxy/v1beta1/upload-async"
        );
        assert_eq!(
            with_path("https://proxy/v1beta1/upload", SYNC_PATH),
            "https://proxy/v1beta1/upload"
        );
    }
}
