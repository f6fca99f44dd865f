//! `cdi operator`: keeps the installation a `CDI` resource asks for (cdi-core `install`): the
//! CRDs, each component's account, RBAC, Service and Deployment, applied server-side and owned by
//! the resource; its status from the Deployments; on deletion, the components stopped, their
//! worker pods and what they registered removed, then the garbage collector takes the rest.

use crate::runtime::run::RunAs;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cdi_api::config::CDI;
use cdi_core::install::{self, Release};
use cdi_pki::rotation::Lifetimes;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::runtime::error::Error;
use crate::serve::Metrics;

/// The operator's field manager.
const MANAGER: &str = "cdi-operator";

struct Ctx {
    client: Client,
    release: Release,
    metrics: Arc<Metrics>,
    events: crate::events::Events,
}

/// The API resource of a manifest's kind (the kinds the operator writes).
fn resource_of(o: &Value) -> Result<(ApiResource, bool), Error> {
    let api_version = o["apiVersion"].as_str().unwrap_or("");
    let kind = o["kind"].as_str().unwrap_or("");
    let (plural, namespaced) = match kind {
        "Namespace" => ("namespaces", false),
        "ServiceAccount" => ("serviceaccounts", true),
        "Service" => ("services", true),
        "Secret" => ("secrets", true),
        "ConfigMap" => ("configmaps", true),
        "Deployment" => ("deployments", true),
        "Role" => ("roles", true),
        "RoleBinding" => ("rolebindings", true),
        "Lease" => ("leases", true),
        "ClusterRole" => ("clusterroles", false),
        "ClusterRoleBinding" => ("clusterrolebindings", false),
        "CustomResourceDefinition" => ("customresourcedefinitions", false),
        "MutatingWebhookConfiguration" => ("mutatingwebhookconfigurations", false),
        "ValidatingWebhookConfiguration" => ("validatingwebhookconfigurations", false),
        "APIService" => ("apiservices", false),
        "PrometheusRule" => ("prometheusrules", true),
        "ServiceMonitor" => ("servicemonitors", true),
        "VolumePopulator" => ("volumepopulators", false),
        other => return Err(Error::Other(format!("the operator does not write {other}"))),
    };
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    Ok((ApiResource::from_gvk_with_plural(&gvk, plural), namespaced))
}

fn api_for(client: &Client, o: &Value) -> Result<Api<DynamicObject>, Error> {
    let (ar, namespaced) = resource_of(o)?;
    Ok(if namespaced {
        let ns = o["metadata"]["namespace"].as_str().unwrap_or("default");
        Api::namespaced_with(client.clone(), ns, &ar)
    } else {
        Api::all_with(client.clone(), &ar)
    })
}

/// Apply `o` server-side as the operator (taking fields over from whoever wrote them).
pub async fn apply(client: &Client, o: &Value) -> Result<(), Error> {
    let name = o["metadata"]["name"].as_str().unwrap_or("");
    api_for(client, o)?
        .patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(o))
        .await
        .map_err(|e| {
            Error::Other(format!(
                "applying {} {name}: {e}",
                o["kind"].as_str().unwrap_or("")
            ))
        })?;
    Ok(())
}

/// Delete what `o` names; already gone is fine.
async fn remove(client: &Client, o: &Value, foreground: bool) -> Result<(), Error> {
    let name = o["metadata"]["name"].as_str().unwrap_or("");
    let dp = if foreground {
        DeleteParams::foreground()
    } else {
        DeleteParams::default()
    };
    match api_for(client, o)?.delete(name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// What the operator applies for `cdi`: the CRDs of the kinds (the CDI kind's own comes with the
/// operator's manifests), the components, and what the optional CRDs there call for
/// (`extensions`), all owned by the resource.
fn desired(release: &Release, cdi: &CDI, extensions: &Extensions) -> Result<Vec<Value>, String> {
    let mut all = install::crds(false);
    let mut components = install::components(release, cdi);
    if let Some(c) = &cdi.spec.customize_components {
        cdi_core::customize::apply(&mut components, c)
            .map_err(|why| format!("spec.customizeComponents: {why}"))?;
    }
    all.extend(components);
    let (rules, monitors) = (extensions.prometheus_rules, extensions.service_monitors);
    all.extend(
        install::monitoring(release)
            .into_iter()
            .filter(|o| match o["kind"].as_str() {
                Some("PrometheusRule") => rules,
                Some("ServiceMonitor") => monitors,
                _ => rules || monitors,
            }),
    );
    if extensions.volume_populators {
        all.extend(install::volume_populators(release));
    }
    Ok(install::owned(all, cdi))
}

/// Which optional CRDs the cluster has.
struct Extensions {
    prometheus_rules: bool,
    service_monitors: bool,
    volume_populators: bool,
}

impl Extensions {
    const CRDS: [&str; 3] = [
        install::PROMETHEUS_RULE_CRD,
        install::SERVICE_MONITOR_CRD,
        install::VOLUME_POPULATOR_CRD,
    ];

    async fn read(client: &Client) -> Result<Extensions, Error> {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let mut have = [false; 3];
        for (name, found) in Self::CRDS.iter().zip(have.iter_mut()) {
            *found = crds.get_opt(name).await?.is_some();
        }
        let [prometheus_rules, service_monitors, volume_populators] = have;
        Ok(Extensions {
            prometheus_rules,
            service_monitors,
            volume_populators,
        })
    }
}

/// One pass over a CDI resource: uninstall it when deleted, else (when it is the active one)
/// hold it, install the release, write its status and prune what earlier releases left.
async fn reconcile(cdi: Arc<CDI>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let client = &ctx.client;
    let api: Api<CDI> = Api::all(client.clone());
    let name = cdi.name_any();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    if cdi.metadata.deletion_timestamp.is_some() {
        if cdi.finalizers().iter().any(|f| f == install::FINALIZER) {
            release_finalizer(&ctx, &api, &cdi).await?;
        }
        return Ok(Action::await_change());
    }
    let all = api.list(&ListParams::default()).await?.items;
    if install::active(&all).is_some_and(|a| a.name_any() != name) {
        let unwanted = install::unwanted(now);
        if cdi.status.as_ref().and_then(|s| s.phase.as_ref()) != unwanted.phase.as_ref() {
            write_status(&api, &cdi, &unwanted).await?;
        }
        return Ok(Action::await_change());
    }
    let holds = cdi.finalizers().iter().any(|f| f == install::FINALIZER);
    let authority = cdi.annotations().contains_key(install::CONFIG_AUTHORITY);
    if !holds || !authority {
        take_hold(client, &api, &cdi, holds, authority).await?;
        // The change wakes the next pass.
        return Ok(Action::await_change());
    }
    // The Deployments last: their pods mount the certificates, which name the Services'
    // addresses.
    let extensions = Extensions::read(client).await?;
    let next_due = install_all(&ctx, &cdi, &extensions).await?;
    let deployments: Vec<Deployment> =
        Api::<Deployment>::namespaced(client.clone(), &ctx.release.namespace)
            .list(&ListParams::default().labels(&format!(
                "app.kubernetes.io/managed-by={}",
                install::MANAGED_BY
            )))
            .await?
            .items;
    let status = install::status(&cdi, &ctx.release, &deployments, now);
    if cdi.status.as_ref() != Some(&status) {
        write_status(&api, &cdi, &status).await?;
    }
    // Once this release runs everywhere, what an earlier one made and this one does not goes.
    if status.phase == Some(cdi_api::enums::CdiPhase::Deployed) {
        prune(client, &ctx.release, &cdi, &extensions).await?;
    }
    if let Some(ready) = install::cr_ready(Some(&status)) {
        ctx.metrics.set_cr_ready(ready);
    }
    // Back when the next certificate falls due, and at least every minute (upstream's poll).
    let until_due = next_due
        .map(|at| at.duration_since(SystemTime::now()).unwrap_or_default())
        .unwrap_or(POLL);
    Ok(Action::requeue(
        until_due.clamp(Duration::from_secs(1), POLL),
    ))
}

/// A CDI being deleted that holds the finalizer: uninstall, then drop the finalizer (only
/// from the version seen).
async fn release_finalizer(ctx: &Ctx, api: &Api<CDI>, cdi: &CDI) -> Result<(), Error> {
    let name = cdi.name_any();
    uninstall(ctx, cdi).await?;
    let rest: Vec<&String> = cdi
        .finalizers()
        .iter()
        .filter(|f| *f != install::FINALIZER)
        .collect();
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": rest,
            "resourceVersion": cdi.resource_version()}})),
    )
    .await?;
    tracing::info!(cdi = %name, "uninstalled");
    Ok(())
}

/// Add the finalizer and the CDIConfig authority annotation the CDI lacks (from the version
/// seen), moving a CDIConfig spec an admin set into `spec.config` first.
async fn take_hold(
    client: &Client,
    api: &Api<CDI>,
    cdi: &CDI,
    holds: bool,
    authority: bool,
) -> Result<(), Error> {
    let mut finalizers: Vec<String> = cdi.finalizers().to_vec();
    if !holds {
        finalizers.push(install::FINALIZER.into());
    }
    let mut patch = json!({"metadata": {"finalizers": finalizers,
        "annotations": {install::CONFIG_AUTHORITY: ""},
        "resourceVersion": cdi.resource_version()}});
    // Becoming the authority on CDIConfig must not undo what an admin set there before
    // (upstream's rule): a spec there moves into spec.config first.
    if !authority && cdi.spec.config.is_none() {
        let configs: Api<cdi_api::config::CDIConfig> = Api::all(client.clone());
        if let Some(c) = configs.get_opt(cdi_api::name::CDI_CONFIG).await?
            && c.spec != Default::default()
        {
            patch["spec"] = json!({"config": c.spec});
        }
    }
    api.patch(
        &cdi.name_any(),
        &PatchParams::default(),
        &Patch::Merge(patch),
    )
    .await?;
    Ok(())
}

/// Apply what the release wants (the Deployments last) and keep the certificates, even when
/// the rest failed; a customization that does not apply is said and nothing is applied.
/// When the next certificate falls due.
async fn install_all(
    ctx: &Ctx,
    cdi: &Arc<CDI>,
    extensions: &Extensions,
) -> Result<Option<SystemTime>, Error> {
    let client = &ctx.client;
    // The components' PriorityClass, left out when the cluster has none of that name
    // (upstream's rule): a pod naming a missing class would be refused.
    let wanted = install::priority_class(cdi);
    let mut placed = (**cdi).clone();
    placed.spec.priority_class = Api::<PriorityClass>::all(client.clone())
        .get_opt(wanted)
        .await?
        .map(|_| wanted.to_string());
    let wanted = match desired(&ctx.release, &placed, extensions) {
        Ok(w) => w,
        Err(why) => {
            // Nothing is applied: half a customization could undo what an admin relies on.
            // The certificates still are kept: they must not expire meanwhile.
            ctx.events
                .record(cdi.as_ref(), true, "InvalidCustomization", &why)
                .await;
            certificates(ctx, cdi).await?;
            return Err(Error::Other(why));
        }
    };
    let (deployments, rest): (Vec<Value>, Vec<Value>) =
        wanted.into_iter().partition(|o| o["kind"] == "Deployment");
    let mut applied = Ok(());
    for o in &rest {
        applied = apply(client, o).await;
        if applied.is_err() {
            break;
        }
    }
    // Whatever else failed, the certificates are kept (the Services they name came first).
    let next_due = certificates(ctx, cdi).await?;
    applied?;
    for o in &deployments {
        apply(client, o).await?;
    }
    Ok(next_due)
}

/// Delete what `cdi` owns that an earlier release made and this one does not (its version
/// label is another's).
async fn prune(
    client: &Client,
    release: &Release,
    cdi: &CDI,
    extensions: &Extensions,
) -> Result<(), Error> {
    let selector = install::leftover_selector(release);
    let monitoring = extensions.prometheus_rules || extensions.service_monitors;
    for (api_version, kind, ns) in
        install::leftover_kinds(release, monitoring, extensions.volume_populators)
    {
        let probe = json!({"apiVersion": api_version, "kind": kind,
            "metadata": {"namespace": ns}});
        let api = api_for(client, &probe)?;
        let found = api
            .list(&ListParams::default().labels(&selector))
            .await?
            .items;
        let owned =
            found.into_iter().filter(|o| {
                o.metadata.owner_references.iter().flatten().any(|r| {
                    r.controller == Some(true) && Some(&r.uid) == cdi.metadata.uid.as_ref()
                })
            });
        for o in owned {
            let name = o.name_any();
            match api.delete(&name, &DeleteParams::foreground()).await {
                Ok(_) => tracing::info!(%kind, %name, "deleted what this release no longer makes"),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// How often the operator looks again at an installation nothing changed.
const POLL: Duration = Duration::from_secs(60);

/// Make the installation's certificates, and again those due (`spec.certConfig`'s lifetimes;
/// upstream's defaults when it cannot be read, said in an event); when the next falls due.
async fn certificates(ctx: &Ctx, cdi: &CDI) -> Result<Option<SystemTime>, Error> {
    let lifetimes = match Lifetimes::from_spec(cdi.spec.cert_config.as_ref()) {
        Ok(l) => l,
        Err(why) => {
            ctx.events
                .record(
                    cdi,
                    true,
                    "InvalidCertConfig",
                    &format!("{why}; the default lifetimes are used until it is fixed"),
                )
                .await;
            Lifetimes::default()
        }
    };
    let owner = cdi.controller_owner_ref(&());
    crate::pki::certs::Pass {
        client: &ctx.client,
        ns: &ctx.release.namespace,
        lifetimes: &lifetimes,
        owner: owner.as_ref(),
        mode: crate::pki::certs::Mode::Rotate,
        manager: MANAGER,
        report: Some((&ctx.events, cdi)),
    }
    .run()
    .await
}

/// The CDI kind has no status subresource (upstream's): status goes with the object.
async fn write_status(
    api: &Api<CDI>,
    cdi: &CDI,
    status: &cdi_api::config::CDIStatus,
) -> Result<(), Error> {
    let patch = crate::objects::status_patch(cdi.status.as_ref(), status)?;
    api.patch(
        &cdi.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// Stop the components, clear their worker pods and Services in every namespace, and remove
/// what they made outside the resource's ownership; the rest is owned by the resource.
async fn uninstall(ctx: &Ctx, cdi: &CDI) -> Result<(), Error> {
    let client = &ctx.client;
    let ns = &ctx.release.namespace;
    let deleting = cdi_api::config::CDIStatus {
        phase: Some(cdi_api::enums::CdiPhase::Deleting),
        ..cdi.status.clone().unwrap_or_default()
    };
    write_status(&Api::all(client.clone()), cdi, &deleting).await?;
    for name in [
        install::CONTROLLER,
        install::APISERVER,
        install::UPLOAD_PROXY,
    ] {
        let d = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns}});
        remove(client, &d, true).await?;
    }
    let workers = ListParams::default().labels(install::WORKER_SELECTOR);
    for pod in Api::<Pod>::all(client.clone()).list(&workers).await?.items {
        let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
        crate::objects::delete(&api, &pod.name_any()).await?;
    }
    for svc in Api::<Service>::all(client.clone())
        .list(&workers)
        .await?
        .items
    {
        let api: Api<Service> =
            Api::namespaced(client.clone(), &svc.namespace().unwrap_or_default());
        crate::objects::delete(&api, &svc.name_any()).await?;
    }
    let mut leftovers = vec![json!({"apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService", "metadata": {"name": install::API_SERVICE}})];
    for name in install::MUTATING_WEBHOOKS {
        leftovers.push(json!({"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration", "metadata": {"name": name}}));
    }
    for name in install::VALIDATING_WEBHOOKS {
        leftovers.push(json!({"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration", "metadata": {"name": name}}));
    }
    for (kind, name) in install::LEFT_BY_COMPONENTS {
        let api_version = if *kind == "Lease" {
            "coordination.k8s.io/v1"
        } else {
            "v1"
        };
        leftovers.push(json!({"apiVersion": api_version, "kind": kind,
            "metadata": {"name": name, "namespace": ns}}));
    }
    for o in leftovers {
        remove(client, &o, false).await?;
    }
    Ok(())
}

/// Reconcile every CDI resource on its changes and on its components' Deployments.
pub async fn run(client: Client, release: Release, metrics: Arc<Metrics>) -> anyhow::Result<()> {
    let ns = release.namespace.clone();
    let ctx = Arc::new(Ctx {
        events: crate::events::Events::of(client.clone(), MANAGER, &identity()),
        client: client.clone(),
        release,
        metrics,
    });
    let controller = Controller::new(Api::<CDI>::all(client.clone()), watcher::Config::default());
    let cdis = controller.store();
    controller
        // Prometheus Operator or the volume populators installed later: what they call for is
        // added right away.
        .watches(
            Api::<CustomResourceDefinition>::all(client.clone()),
            watcher::Config::default(),
            move |crd| {
                let wanted = Extensions::CRDS.contains(&crd.name_any().as_str());
                let all = if wanted { cdis.state() } else { Vec::new() };
                all.into_iter()
                    .map(|c| ObjectRef::from_obj(c.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        // A certificate someone changed (or marked expired) is looked at right away.
        .owns(
            Api::<Secret>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
        )
        .owns(
            Api::<Deployment>::namespaced(client, &ns),
            watcher::Config::default().labels(&format!(
                "app.kubernetes.io/managed-by={}",
                install::MANAGED_BY
            )),
        )
        .run_as("operator", ctx.metrics.clone(), ctx, reconcile)
        .await;
    Ok(())
}

/// This operator instance, as events name it: its pod's name.
fn identity() -> String {
    std::env::var("HOSTNAME").unwrap_or_else(|_| MANAGER.into())
}
