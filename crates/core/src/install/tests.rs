//! The installation, end to end: the release from the operator's environment, the objects and
//! rules it keeps, placement and pull policy, the status as its Deployments roll out, and which
//! CDI resource is the installation.

use super::*;
use cdi_api::config::{CDI, CDIStatus};
use cdi_api::enums::{CdiPhase, ConditionStatus};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

fn release(version: &str) -> Release {
    Release::tagged("reg", version, "cdi")
}

fn deployment(name: &str, version: &str, ready: i32) -> Deployment {
    Deployment {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            generation: Some(2),
            labels: Some([(UPDATE_VERSION.to_string(), version.to_string())].into()),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            ..Default::default()
        }),
        status: Some(DeploymentStatus {
            observed_generation: Some(2),
            replicas: Some(1),
            updated_replicas: Some(1),
            ready_replicas: Some(ready),
            ..Default::default()
        }),
    }
}

fn all(version: &str, ready: i32) -> Vec<Deployment> {
    [CONTROLLER, APISERVER, UPLOAD_PROXY]
        .iter()
        .map(|n| deployment(n, version, ready))
        .collect()
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap())
}

fn condition_of(s: &CDIStatus, t: &str) -> (ConditionStatus, Option<String>) {
    let c = s
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == t)
        .unwrap();
    (c.status, c.reason.clone())
}

#[test]
fn deploying_then_deployed_then_degraded_then_upgrading() {
    let mut cdi = CDI::new("cdi", Default::default());
    let s = status(&cdi, &release("1"), &all("1", 0), now());
    assert_eq!(s.phase, Some(CdiPhase::Deploying));
    assert_eq!(
        condition_of(&s, "Progressing"),
        (ConditionStatus::True, Some("DeployStarted".into()))
    );
    assert_eq!(
        cr_ready(Some(&s)),
        None,
        "progressing leaves the metric as it was"
    );
    cdi.status = Some(s);
    let s = status(&cdi, &release("1"), &all("1", 1), now());
    assert_eq!(s.phase, Some(CdiPhase::Deployed));
    assert_eq!(s.observed_version.as_deref(), Some("1"));
    assert_eq!(
        condition_of(&s, "Available"),
        (ConditionStatus::True, Some("DeployCompleted".into()))
    );
    assert_eq!(cr_ready(Some(&s)), Some(1));
    // The same observation changes nothing, not even the times.
    cdi.status = Some(s.clone());
    let later = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_100).unwrap());
    assert_eq!(status(&cdi, &release("1"), &all("1", 1), later.clone()), s);
    // A lost replica: still deployed, degraded.
    let degraded = status(&cdi, &release("1"), &all("1", 0), later.clone());
    assert_eq!(degraded.phase, Some(CdiPhase::Deployed));
    assert_eq!(condition_of(&degraded, "Degraded").0, ConditionStatus::True);
    // A new release: upgrading until its Deployments roll out.
    let up = status(&cdi, &release("2"), &all("1", 1), later.clone());
    assert_eq!(up.phase, Some(CdiPhase::Upgrading));
    assert_eq!(up.observed_version.as_deref(), Some("1"));
    assert_eq!(up.target_version.as_deref(), Some("2"));
    cdi.status = Some(up);
    let done = status(&cdi, &release("2"), &all("2", 1), later);
    assert_eq!(done.phase, Some(CdiPhase::Deployed));
    assert_eq!(done.observed_version.as_deref(), Some("2"));
}

#[test]
fn the_release_comes_from_the_operators_environment() {
    let r = release("v9");
    let manifests = operator_manifests(&r);
    let deployment = manifests
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .unwrap();
    let env: Vec<(String, String)> = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?.into(), e["value"].as_str()?.into())))
        .collect();
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(Release::from_env(get, "cdi"), Ok(r));
    let err = Release::from_env(|_| None, "cdi").unwrap_err();
    assert!(err.contains("OPERATOR_IMAGE"), "{err}");
}

#[test]
fn the_operator_holds_every_rule_it_grants_and_components_use_their_own_accounts() {
    let r = release("1");
    let manifests = operator_manifests(&r);
    let held: Vec<&Value> = manifests
        .iter()
        .filter(|o| matches!(o["kind"].as_str(), Some("ClusterRole" | "Role")))
        .flat_map(|o| o["rules"].as_array().unwrap())
        .collect();
    for o in components(&r, &CDI::new("cdi", Default::default())) {
        for rule in o["rules"].as_array().into_iter().flatten() {
            assert!(
                held.contains(&rule),
                "the operator grants {rule} without holding it"
            );
        }
        if o["kind"] == "Deployment" {
            let account = &o["spec"]["template"]["spec"]["serviceAccountName"];
            let expected = if o["metadata"]["name"] == CONTROLLER {
                CONTROLLER_ACCOUNT
            } else {
                o["metadata"]["name"].as_str().unwrap()
            };
            assert_eq!(account, expected);
        }
    }
}

#[test]
fn infra_placement_pull_policy_and_replicas_reach_the_deployments() {
    let cdi: CDI = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDI", "metadata": {"name": "cdi"},
        "spec": {"imagePullPolicy": "Always", "infra": {"nodeSelector": {"infra": "yes"},
            "tolerations": [{"key": "infra", "operator": "Exists"}], "apiServerReplicas": 2},
            "config": {"logVerbosity": 3}}}))
    .unwrap();
    let objects = components(&release("1"), &cdi);
    let api = objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == APISERVER)
        .unwrap();
    let pod = &api["spec"]["template"]["spec"];
    assert_eq!(api["spec"]["replicas"], 2);
    assert_eq!(pod["nodeSelector"]["infra"], "yes");
    assert_eq!(pod["tolerations"][0]["key"], "infra");
    assert_eq!(pod["containers"][0]["imagePullPolicy"], "Always");
    assert_eq!(pod["containers"][0]["args"][0], "-v=3");
}

#[test]
fn the_installation_is_the_resource_holding_the_finalizer_else_the_oldest() {
    let mut a = CDI::new("a", Default::default());
    let mut b = CDI::new("b", Default::default());
    a.metadata.creation_timestamp = Some(now());
    b.metadata.creation_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap(),
    ));
    assert_eq!(
        active(&[a.clone(), b.clone()])
            .unwrap()
            .metadata
            .name
            .as_deref(),
        Some("b")
    );
    a.metadata.finalizers = Some(vec![FINALIZER.into()]);
    assert_eq!(active(&[a, b]).unwrap().metadata.name.as_deref(), Some("a"));
    assert_eq!(unwanted(now()).phase, Some(CdiPhase::Error));
}
