//! The kubelet runs pods as host processes: through the API server with the kube-rs client, on a
//! whole `cluster::start` (scheduler, PV controller, provisioners, kubelets).

mod common;

use std::time::Duration;

use common::wait_for;
use k8s_openapi::api::core::v1::{
    ConfigMap, ContainerStatus, Event, PersistentVolume, PersistentVolumeClaim, Pod, Secret,
};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use kubesim::cluster::Running;
use serde_json::{Value, json};

async fn start() -> (tempfile::TempDir, Running) {
    common::cluster().await
}

async fn start_in(dir: &std::path::Path) -> Running {
    common::cluster_in(dir).await
}

async fn create<K>(client: &Client, value: Value)
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), "default");
    let object: K = serde_json::from_value(value).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

/// A pod running `script` with `sh -c` (an image the kubelet does not know: the command runs on
/// the host, in the container's root directory).
fn shell_pod(name: &str, policy: &str, script: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"restartPolicy": policy,
        "containers": [{"name": "main", "image": "docker.io/library/busybox:1.36",
            "command": ["/bin/sh", "-c", script]}]}})
}

async fn pod_where(client: &Client, name: &str, what: &str, check: impl Fn(&Pod) -> bool) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    wait_for(what, async || {
        let p = pods.get(name).await.unwrap();
        check(&p).then_some(p)
    })
    .await
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn waiting_reason(p: &Pod) -> Option<String> {
    let statuses = p.status.as_ref()?.container_statuses.as_ref()?;
    statuses
        .first()?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .reason
        .clone()
}

fn main_status(p: &Pod) -> ContainerStatus {
    p.status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0]
        .clone()
}

#[tokio::test]
async fn a_pod_on_the_virt_node_writes_into_its_volume() {
    let (dir, running) = start().await;
    let client = running.client.clone();
    create::<PersistentVolumeClaim>(
        &client,
        json!({"metadata": {"name": "disk"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await;
    create::<Pod>(&client, json!({"metadata": {"name": "vm"}, "spec": {
        "restartPolicy": "Never",
        "nodeSelector": {"node-role.kubernetes.io/virt-local": "true"},
        "tolerations": [{"key": "virt-local", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
        "containers": [{"name": "main", "image": "busybox",
            "command": ["/bin/sh", "-c"],
            "args": ["echo hello from $(HOSTNAME_ALIAS) > data/greeting && printf \"written %s\" \"$KUBESIM_POD_CAPACITY\" > \"$KUBESIM_POD_ROOT/dev/termination-log\""],
            "env": [{"name": "HOSTNAME_ALIAS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "volumeMounts": [{"name": "disk", "mountPath": "/data"}]}],
        "volumes": [{"name": "disk", "persistentVolumeClaim": {"claimName": "disk"}}]}}))
    .await;
    let pod = pod_where(&client, "vm", "the pod to succeed", |p| {
        phase(p) == "Succeeded"
    })
    .await;
    let status = pod.status.clone().unwrap();
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some("node-2")
    );
    assert!(
        status.pod_ip.as_deref().unwrap().starts_with("127.2."),
        "{status:?}"
    );
    assert_eq!(status.host_ip.as_deref(), Some("127.2.0.1"));
    let c = main_status(&pod);
    let done = c.state.unwrap().terminated.unwrap();
    assert_eq!(
        (done.exit_code, done.reason.as_deref()),
        (0, Some("Completed"))
    );
    assert_eq!(done.message.as_deref(), Some("written /data=1073741824"));
    // The file is in the volume's directory on node-2.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let volume = claims
        .get("disk")
        .await
        .unwrap()
        .spec
        .unwrap()
        .volume_name
        .unwrap();
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&volume)
        .await
        .unwrap();
    let path = pv.spec.unwrap().host_path.unwrap().path;
    assert!(
        path.starts_with(
            &dir.path()
                .join("nodes/node-2")
                .to_string_lossy()
                .into_owned()
        ),
        "{path}"
    );
    assert_eq!(
        std::fs::read_to_string(std::path::Path::new(&path).join("greeting")).unwrap(),
        "hello from vm\n"
    );
    let conditions = status.conditions.unwrap();
    for (type_, want) in [
        ("PodScheduled", "True"),
        ("Initialized", "True"),
        ("Ready", "False"),
    ] {
        let c = conditions.iter().find(|c| c.type_ == type_).unwrap();
        assert_eq!(c.status, want, "{type_}");
    }
    running.stop().await;
}

#[tokio::test]
async fn restart_policies_and_termination_messages() {
    let (_dir, running) = start().await;
    let client = running.client.clone();
    // Fails once (the marker lives in an emptyDir, kept across restarts), then succeeds.
    let mut flaky = shell_pod(
        "flaky",
        "OnFailure",
        "if [ -e state/failed ]; then exit 0; fi; touch state/failed; echo first try broke >&2; exit 3",
    );
    flaky["spec"]["containers"][0]["terminationMessagePolicy"] = json!("FallbackToLogsOnError");
    flaky["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "state", "mountPath": "/state"}]);
    flaky["spec"]["volumes"] = json!([{"name": "state", "emptyDir": {}}]);
    create::<Pod>(&client, flaky).await;
    create::<Pod>(
        &client,
        shell_pod(
            "never",
            "Never",
            "echo no >&2; echo gave up > \"$KUBESIM_POD_ROOT/dev/termination-log\"; exit 7",
        ),
    )
    .await;
    create::<Pod>(&client, shell_pod("always", "Always", "exit 0")).await;

    let flaky = pod_where(&client, "flaky", "flaky to succeed", |p| {
        phase(p) == "Succeeded"
    })
    .await;
    let c = main_status(&flaky);
    assert_eq!(c.restart_count, 1);
    let last = c.last_state.unwrap().terminated.unwrap();
    assert_eq!((last.exit_code, last.reason.as_deref()), (3, Some("Error")));
    assert_eq!(last.message.as_deref(), Some("first try broke\n"));
    assert_eq!(c.state.unwrap().terminated.unwrap().exit_code, 0);

    let never = pod_where(&client, "never", "never to fail", |p| phase(p) == "Failed").await;
    let c = main_status(&never);
    assert_eq!(c.restart_count, 0);
    let t = c.state.unwrap().terminated.unwrap();
    // The file wins over the log, with or without the fallback.
    assert_eq!((t.exit_code, t.message.as_deref()), (7, Some("gave up\n")));

    // Restarted after each exit, with back-off in between; the pod stays Running.
    let always = pod_where(&client, "always", "always to restart twice", |p| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|c| c[0].restart_count >= 2)
    })
    .await;
    assert_eq!(phase(&always), "Running");
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let reasons: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some("always"))
        .filter_map(|e| e.reason)
        .collect();
    assert!(
        reasons.iter().any(|r| r == "BackOff") && reasons.iter().any(|r| r == "Started"),
        "{reasons:?}"
    );
    running.stop().await;
}

#[tokio::test]
async fn environment_secrets_and_config_maps() {
    let (_dir, running) = start().await;
    let client = running.client.clone();
    create::<Secret>(
        &client,
        json!({"metadata": {"name": "creds"},
        "stringData": {"user": "alice", "token": "s3cret"}}),
    )
    .await;
    create::<ConfigMap>(
        &client,
        json!({"metadata": {"name": "settings"},
        "data": {"MODE": "fast", "LEVEL": "2"}}),
    )
    .await;
    let script = "printf '%s|%s|%s|%s|%s|%s' \"$USER_NAME\" \"$CFG_MODE\" \"$CFG_LEVEL\" \"$GREETING\" \"$MY_IP\" \"$(cat creds/token)\" > \"$KUBESIM_POD_ROOT/dev/termination-log\"";
    let mut pod = shell_pod("env", "Never", script);
    let c = &mut pod["spec"]["containers"][0];
    c["env"] = json!([
        {"name": "USER_NAME", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "user"}}},
        {"name": "CFG_MODE", "value": "overridden"},
        {"name": "GREETING", "value": "hi $(USER_NAME), $$(USER_NAME)"},
        {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]);
    c["envFrom"] = json!([{"prefix": "CFG_", "configMapRef": {"name": "settings"}}]);
    c["volumeMounts"] = json!([{"name": "creds", "mountPath": "/creds", "readOnly": true}]);
    pod["spec"]["volumes"] = json!([{"name": "creds", "secret": {"secretName": "creds"}}]);
    create::<Pod>(&client, pod).await;
    let pod = pod_where(&client, "env", "env to succeed", |p| {
        phase(p) == "Succeeded"
    })
    .await;
    let ip = pod.status.as_ref().unwrap().pod_ip.clone().unwrap();
    let message = main_status(&pod)
        .state
        .unwrap()
        .terminated
        .unwrap()
        .message
        .unwrap();
    assert_eq!(
        message,
        format!("alice|overridden|2|hi alice, $(USER_NAME)|{ip}|s3cret")
    );

    // A missing secret holds the container with the kubelet's reason until it exists.
    let mut missing = shell_pod("missing", "Never", "exit 0");
    missing["spec"]["containers"][0]["env"] =
        json!([{"name": "X", "valueFrom": {"secretKeyRef": {"name": "later", "key": "x"}}}]);
    create::<Pod>(&client, missing).await;
    let waiting = pod_where(&client, "missing", "a config error", |p| {
        waiting_reason(p).as_deref() == Some("CreateContainerConfigError")
    })
    .await;
    let w = main_status(&waiting).state.unwrap().waiting.unwrap();
    assert_eq!(w.message.as_deref(), Some("secret \"later\" not found"));
    assert_eq!(phase(&waiting), "Pending");
    create::<Secret>(
        &client,
        json!({"metadata": {"name": "later"}, "stringData": {"x": "1"}}),
    )
    .await;
    pod_where(
        &client,
        "missing",
        "the pod to run once the secret exists",
        |p| phase(p) == "Succeeded",
    )
    .await;

    // An image it cannot run, with no command.
    create::<Pod>(
        &client,
        json!({"metadata": {"name": "unknown"}, "spec": {
        "containers": [{"name": "main", "image": "quay.io/example/server:1"}]}}),
    )
    .await;
    let p = pod_where(&client, "unknown", "ErrImagePull", |p| {
        waiting_reason(p).as_deref() == Some("ErrImagePull")
    })
    .await;
    let w = main_status(&p).state.unwrap().waiting.unwrap();
    assert!(w.message.unwrap().contains("give the container a command"));
    running.stop().await;
}

/// Whether a process is alive.
fn alive(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

fn pid_of(p: &Pod) -> Option<i32> {
    let id = p.status.as_ref()?.container_statuses.as_ref()?[0]
        .container_id
        .clone()?;
    id.strip_prefix("process://")?.parse().ok()
}

#[tokio::test]
async fn deletion_stops_the_processes() {
    let (_dir, running) = start().await;
    let client = running.client.clone();
    // Ignores TERM: killed after the grace period. Its child (in the same group) goes too.
    let mut stubborn = shell_pod("stubborn", "Always", "trap '' TERM; sleep 300 & wait; wait");
    stubborn["spec"]["terminationGracePeriodSeconds"] = json!(1);
    create::<Pod>(&client, stubborn).await;
    create::<Pod>(&client, shell_pod("polite", "Always", "sleep 300")).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut pids = Vec::new();
    for name in ["stubborn", "polite"] {
        let p = pod_where(&client, name, "the pod to run", |p| {
            phase(p) == "Running" && pid_of(p).is_some()
        })
        .await;
        let pid = pid_of(&p).unwrap();
        assert!(alive(pid));
        pids.push(pid);
    }
    let polite_started = std::time::Instant::now();
    pods.delete("polite", &DeleteParams::default())
        .await
        .unwrap();
    pods.delete("stubborn", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("both pods to be deleted", async || {
        let left = pods.list(&ListParams::default()).await.unwrap().items;
        left.is_empty().then_some(())
    })
    .await;
    // TERM ends `sleep` well before the 30 s default grace period.
    assert!(polite_started.elapsed() < Duration::from_secs(5));
    for pid in pids {
        assert!(!alive(pid), "process {pid} survived its pod");
    }
    running.stop().await;
}

/// Put a pod straight into the store, past the API server's checks: the kubelet must not rely
/// on them.
fn create_unchecked(running: &Running, pod: Value) {
    let store = running.server.store();
    let registry = store.registry();
    let pods = registry.get("", "v1", "pods").unwrap();
    store.create(pods, "default", pod, false, None).unwrap();
}

fn events_of(events: &[Event], pod: &str) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(pod))
        .map(|e| {
            (
                e.reason.clone().unwrap_or_default(),
                e.message.clone().unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test]
async fn hostile_names_and_paths_make_nothing_outside_the_cluster_directory() {
    let outer = tempfile::tempdir().unwrap();
    let dir = outer.path().join("cluster");
    // A hostPath volume may be anywhere, by design; nothing is to be made in it but by the pod.
    let host = outer.path().join("host");
    std::fs::create_dir_all(&host).unwrap();
    let running = start_in(&dir).await;
    let client = running.client.clone();
    // Six levels up from a pod's containers/ or volumes/ directory is `outer`.
    let up = "../../../../../..";
    let pod = |name: &str, container: Value, volumes: Value| {
        let mut c =
            json!({"name": "main", "image": "busybox", "command": ["/bin/sh", "-c", "exit 0"]});
        c.as_object_mut()
            .unwrap()
            .extend(container.as_object().unwrap().clone());
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": "node-1", "restartPolicy": "Never",
                "containers": [c], "volumes": volumes}})
    };
    let host_volume = json!({"name": "host", "hostPath": {"path": host.to_string_lossy()}});
    let refused = [
        (
            pod("container-name", json!({"name": format!("{up}/escaped-container")}), json!([])),
            format!("spec.containers[0].name: Invalid value: \"{up}/escaped-container\": must not contain '/'"),
        ),
        (
            pod(
                "volume-name",
                json!({"volumeMounts": [{"name": format!("{up}/escaped-volume"), "mountPath": "/v"}]}),
                json!([{"name": format!("{up}/escaped-volume"), "emptyDir": {}}]),
            ),
            format!("spec.volumes[0].name: Invalid value: \"{up}/escaped-volume\""),
        ),
        (
            pod(
                "sub-path",
                json!({"volumeMounts": [{"name": "host", "mountPath": "/v", "subPath": "../escaped-sub-path"}]}),
                json!([host_volume]),
            ),
            "spec.containers[0].volumeMounts[0].subPath: Invalid value: \"../escaped-sub-path\"".into(),
        ),
        (
            pod(
                "item-path",
                json!({}),
                json!([{"name": "d", "downwardAPI": {"items": [{"path": format!("{up}/../escaped-item"),
                    "fieldRef": {"fieldPath": "metadata.name"}}]}}]),
            ),
            format!("spec.volumes[0].downwardAPI.items[0].path: Invalid value: \"{up}/../escaped-item\""),
        ),
        // Mounts are links: one inside another would be made in the other's volume.
        (
            pod(
                "nested",
                json!({"volumeMounts": [{"name": "host", "mountPath": "/data"},
                    {"name": "e", "mountPath": "/data/../../data/sub"}]}),
                json!([host_volume, {"name": "e", "emptyDir": {}}]),
            ),
            "spec.containers[0].volumeMounts[1].mountPath: Invalid value: \"/data/../../data/sub\": \
             lies inside spec.containers[0].volumeMounts[0].mountPath \"/data\""
                .into(),
        ),
        (
            pod(
                "log-in-mount",
                json!({"volumeMounts": [{"name": "host", "mountPath": "/data"}],
                    "terminationMessagePath": "/data/termination-log"}),
                json!([host_volume]),
            ),
            "spec.containers[0].terminationMessagePath: Invalid value: \"/data/termination-log\": \
             lies inside spec.containers[0].volumeMounts[0].mountPath \"/data\""
                .into(),
        ),
        // The root itself replaced by a link to the host path.
        (
            pod(
                "root-mount",
                json!({"volumeMounts": [{"name": "e", "mountPath": "/data"},
                    {"name": "host", "mountPath": "/data/../.."}]}),
                json!([host_volume, {"name": "e", "emptyDir": {}}]),
            ),
            "spec.containers[0].volumeMounts[1].mountPath: Invalid value: \"/data/../..\": \
             names the container's root"
                .into(),
        ),
    ];
    for (p, _) in &refused {
        create_unchecked(&running, p.clone());
    }
    // `..` in a container path stops at its root, as at `/`: this one runs.
    create_unchecked(
        &running,
        pod(
            "contained",
            json!({"command": ["/bin/sh", "-c", "echo in > escaped-mount/f; echo done > escaped-log"],
                "volumeMounts": [{"name": "e", "mountPath": format!("/{up}/../escaped-mount")}],
                "terminationMessagePath": format!("/{up}/../../escaped-log")}),
            json!([{"name": "e", "emptyDir": {}}]),
        ),
    );

    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    for (p, want) in &refused {
        let name = p["metadata"]["name"].as_str().unwrap();
        let waiting = pod_where(&client, name, name, |p| {
            waiting_reason(p).as_deref() == Some("CreateContainerConfigError")
        })
        .await;
        let message = main_status(&waiting)
            .state
            .unwrap()
            .waiting
            .unwrap()
            .message;
        assert!(
            message
                .as_deref()
                .is_some_and(|m| m.starts_with(want.as_str())),
            "{name}: {message:?}\nwanted {want}"
        );
        assert_eq!(phase(&waiting), "Pending");
        let failed = wait_for("a Failed event", async || {
            let all = events.list(&ListParams::default()).await.unwrap().items;
            let told = events_of(&all, name);
            told.into_iter().find(|(reason, _)| reason == "Failed")
        })
        .await;
        assert!(
            failed.1.starts_with(&format!("Error: {want}")),
            "{failed:?}"
        );
    }
    let done = pod_where(&client, "contained", "contained to succeed", |p| {
        phase(p) == "Succeeded"
    })
    .await;
    let t = main_status(&done).state.unwrap().terminated.unwrap();
    assert_eq!((t.exit_code, t.message.as_deref()), (0, Some("done\n")));
    let root = dir
        .join("nodes/node-1/pods")
        .join(done.metadata.uid.unwrap())
        .join("containers/main/root");
    assert_eq!(
        std::fs::read_to_string(root.join("escaped-mount/f")).unwrap(),
        "in\n"
    );

    // All of that said, nothing was made outside the cluster's directory.
    let mut outside: Vec<String> = std::fs::read_dir(outer.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    outside.sort();
    assert_eq!(outside, ["cluster", "host"]);
    assert_eq!(std::fs::read_dir(&host).unwrap().count(), 0, "{host:?}");
    running.stop().await;
}

fn claim_volume_name(c: &PersistentVolumeClaim) -> Option<String> {
    c.spec.as_ref()?.volume_name.clone()
}

/// kube's in-use protection: a claim deleted while a running pod mounts it, and its volume
/// deleted by hand while bound, both stay (Terminating) with their data until the pod is gone;
/// a new pod cannot start on the claim meanwhile. Then claim, volume and directory all go.
#[tokio::test]
async fn claims_and_volumes_in_use_are_kept_until_the_pod_is_gone() {
    let (dir, running) = start().await;
    let client = running.client.clone();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for name in ["disk", "spare"] {
        create::<PersistentVolumeClaim>(
            &client,
            json!({"metadata": {"name": name}, "spec": {"accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Mi"}}}}),
        )
        .await;
        let c = claims.get(name).await.unwrap();
        assert_eq!(
            c.metadata.finalizers.as_deref(),
            Some(&["kubernetes.io/pvc-protection".to_string()][..])
        );
    }
    let mut user = shell_pod("user", "Always", "echo kept > data/file; sleep 300");
    user["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "d", "mountPath": "/data"}]);
    user["spec"]["volumes"] =
        json!([{"name": "d", "persistentVolumeClaim": {"claimName": "disk"}}]);
    create::<Pod>(&client, user).await;
    // The spare claim is bound too (a short-lived pod), so that both take the same path.
    let mut binder = shell_pod("binder", "Never", "true");
    binder["spec"]["volumes"] =
        json!([{"name": "d", "persistentVolumeClaim": {"claimName": "spare"}}]);
    create::<Pod>(&client, binder).await;
    pod_where(&client, "binder", "the binder pod to finish", |p| {
        phase(p) == "Succeeded"
    })
    .await;
    pod_where(&client, "user", "the user pod to run", |p| {
        phase(p) == "Running"
    })
    .await;
    let volume = wait_for("the claim to be bound", async || {
        claim_volume_name(&claims.get("disk").await.unwrap())
    })
    .await;
    let pv = volumes.get(&volume).await.unwrap();
    let path = std::path::PathBuf::from(pv.spec.unwrap().host_path.unwrap().path);
    wait_for("the pod's file in the volume", async || {
        (std::fs::read_to_string(path.join("file")).ok()? == "kept\n").then_some(())
    })
    .await;
    let mut finalizers = pv.metadata.finalizers.unwrap();
    finalizers.sort();
    assert_eq!(
        finalizers,
        [
            "external-provisioner.volume.kubernetes.io/finalizer",
            "kubernetes.io/pv-protection"
        ]
    );
    let spare_volume = claim_volume_name(&claims.get("spare").await.unwrap()).unwrap();
    let spare_path = std::path::PathBuf::from(
        volumes
            .get(&spare_volume)
            .await
            .unwrap()
            .spec
            .unwrap()
            .host_path
            .unwrap()
            .path,
    );

    // Delete the volume by hand, then both claims: the spare one (no pod holds it) goes with
    // its volume and directory, and a pass that released it also saw the one in use.
    volumes
        .delete(&volume, &DeleteParams::default())
        .await
        .unwrap();
    for name in ["disk", "spare"] {
        claims.delete(name, &DeleteParams::default()).await.unwrap();
    }
    wait_for(
        "the unused claim, its volume and directory to go",
        async || {
            let gone = claims.get_opt("spare").await.unwrap().is_none()
                && volumes.get_opt(&spare_volume).await.unwrap().is_none()
                && !spare_path.exists();
            gone.then_some(())
        },
    )
    .await;
    let kept = claims.get("disk").await.unwrap();
    assert!(kept.metadata.deletion_timestamp.is_some());
    let pv = volumes.get(&volume).await.unwrap();
    assert!(pv.metadata.deletion_timestamp.is_some());
    assert_eq!(pv.status.unwrap().phase.as_deref(), Some("Bound"));
    assert_eq!(
        std::fs::read_to_string(path.join("file")).unwrap(),
        "kept\n"
    );
    assert_eq!(phase(&pods.get("user").await.unwrap()), "Running");

    // A new pod cannot have the claim any more.
    let mut late = shell_pod("late", "Never", "true");
    late["spec"]["volumes"] =
        json!([{"name": "d", "persistentVolumeClaim": {"claimName": "disk"}}]);
    create::<Pod>(&client, late).await;
    let late = pod_where(&client, "late", "the late pod to be unschedulable", |p| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "PodScheduled" && c.status == "False")
    })
    .await;
    let message = late.status.unwrap().conditions.unwrap()[0]
        .message
        .clone()
        .unwrap();
    assert!(
        message.contains("persistentvolumeclaim \"disk\" is being deleted"),
        "{message}"
    );

    // The pod goes: so do the claim, the volume and its directory.
    for name in ["user", "late"] {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
    wait_for("the claim, its volume and directory to go", async || {
        let gone = claims.get_opt("disk").await.unwrap().is_none()
            && volumes.get_opt(&volume).await.unwrap().is_none()
            && !path.exists();
        gone.then_some(())
    })
    .await;
    assert!(path.starts_with(dir.path()));
    running.stop().await;
}
