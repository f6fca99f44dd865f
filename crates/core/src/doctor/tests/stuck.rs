use super::*;
use crate::doctor::text::MAX_SUMMARY;

/// A warning `reason` with `message` about the `kind` object `name` in `vms`.
fn event(kind: &str, name: &str, reason: &str, message: &str) -> Event {
    of(json!({
        "metadata": {"name": format!("{name}.{reason}"), "namespace": "vms"},
        "involvedObject": {"kind": kind, "name": name},
        "reason": reason, "type": "Warning", "message": message,
    }))
}

/// The DataVolume `disk` cloning PVC `vms/golden`, with `status`.
fn clone_of_golden(status: Value) -> DataVolume {
    let mut d = dv(json!({}), status);
    d.spec.source = of(json!({"pvc": {"namespace": "vms", "name": "golden"}}));
    d
}

/// A claim of `vms` that is no DataVolume's (a clone's source).
fn other_claim(name: &str) -> PersistentVolumeClaim {
    of(json!({"metadata": {"name": name, "namespace": "vms"}, "status": {"phase": "Bound"}}))
}

/// A pod of `vms` that writes claim `golden`.
fn writer(name: &str, phase: &str) -> Pod {
    of(json!({
        "metadata": {"name": name, "namespace": "vms"},
        "spec": {"containers": [{"name": "c", "volumeMounts": [{"name": "v", "mountPath": "/d"}]}],
                 "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "golden"}}]},
        "status": {"phase": phase},
    }))
}

#[test]
fn a_clone_source_a_pod_writes_names_the_pods_and_the_fix() {
    let in_progress = status("CloneInProgress", ("True", "Pod is running", ""));
    let requested = json!({"k8s.io/CloneRequest": "vms/golden"});
    let on_claim = |m: &str| event("PersistentVolumeClaim", "disk", "CloneSourceInUse", m);
    let on_dv = |m: &str| event("DataVolume", "disk", "CloneSourceInUse", m);
    let vm = "pod vms/virt-launcher-vm using PersistentVolumeClaim golden";
    // (events, pods of vms, claim annotations, the summary when the source is in use)
    let rows = [
        (
            vec![on_claim(vm)],
            vec![writer("virt-launcher-vm", "Running")],
            requested.clone(),
            Some("clone source PVC vms/golden is in use by pod vms/virt-launcher-vm"),
        ),
        // Upstream says it on the DataVolume, one event a pod.
        (
            vec![
                on_dv("pod vms/a using PersistentVolumeClaim golden"),
                on_dv("pod vms/b using PersistentVolumeClaim golden"),
            ],
            vec![writer("a", "Running"), writer("b", "Running")],
            json!({}),
            Some("clone source PVC vms/golden is in use by pods vms/a, vms/b"),
        ),
        // Copied from the temporary claim in the source's namespace, whose pods are not seen.
        (
            vec![on_claim(
                "[tmp-pvc-claim-uid] : pod golden/vm using PersistentVolumeClaim fedora",
            )],
            vec![],
            json!({"cdi.kubevirt.io/clonePhase": "HostClone"}),
            Some("clone source PVC golden/fedora is in use by pod golden/vm"),
        ),
        // The writer gone or done: the event is history.
        (vec![on_claim(vm)], vec![], requested.clone(), None),
        (
            vec![on_claim(vm)],
            vec![writer("virt-launcher-vm", "Succeeded")],
            requested.clone(),
            None,
        ),
        // The copy read the source already.
        (
            vec![on_claim(vm)],
            vec![writer("virt-launcher-vm", "Running")],
            json!({"k8s.io/CloneRequest": "vms/golden", "k8s.io/CloneOf": "true"}),
            None,
        ),
    ];
    for (events, pods, anns, said) in rows {
        let mut w = World::new(clone_of_golden(in_progress.clone()));
        w.claims = vec![claim("Bound", anns), other_claim("golden")];
        w.pods = pods;
        w.events = events;
        let d = w.diagnose();
        match said {
            Some(summary) => {
                assert_eq!(d.cause, Cause::SourceInUse, "{d:?}");
                assert_eq!(d.summary, summary);
                assert!(d.explanation.contains("virtctl stop"), "{d:?}");
                assert!(d.explanation.contains("read-only"), "{d:?}");
            }
            None => assert_eq!(d.cause, Cause::Progressing, "{d:?}"),
        }
    }
}

#[test]
fn a_clone_source_that_is_gone_is_waited_for_and_named() {
    let waiting = "The source pvc vms/golden doesn't exist; DataVolume vms/disk is cloned once \
                   it does";
    let said = status("CloneInProgress", ("False", "CloneWithoutSource", waiting));
    let quiet = status("CloneInProgress", ("True", "Pod is running", ""));
    let gone = event(
        "PersistentVolumeClaim",
        "disk",
        "CloneWithoutSource",
        "The source pvc vms/golden doesn't exist",
    );
    let requested = json!({"k8s.io/CloneRequest": "vms/golden"});
    let copied = json!({"k8s.io/CloneRequest": "vms/golden", "k8s.io/CloneOf": "true"});
    // (status, claim annotations, the source claim exists, events, waits for the source)
    let rows = [
        // The DataVolume says so.
        (said.clone(), requested.clone(), false, vec![], true),
        // A controller that says so only in the claim's event.
        (
            quiet.clone(),
            requested.clone(),
            false,
            vec![gone.clone()],
            true,
        ),
        // The event is history: the source is back, or the copy read it.
        (
            quiet.clone(),
            requested.clone(),
            true,
            vec![gone.clone()],
            false,
        ),
        (quiet.clone(), copied, false, vec![gone.clone()], false),
        (quiet, requested, false, vec![], false),
    ];
    for (st, anns, exists, events, waits) in rows {
        let mut w = World::new(clone_of_golden(st));
        w.claims = vec![claim("Bound", anns.clone())];
        if exists {
            w.claims.push(other_claim("golden"));
        }
        w.events = events;
        let d = w.diagnose();
        if waits {
            assert_eq!(d.cause, Cause::SourceNotReady, "{anns}: {d:?}");
            assert_eq!(
                d.summary,
                "waits for source PVC vms/golden (deleted or not yet created)"
            );
        } else {
            assert_eq!(d.cause, Cause::Progressing, "{anns}: {d:?}");
        }
    }

    // Before its claim, also through a DataSource, which names the PVC.
    let pending = status("Pending", ("False", "CloneWithoutSource", waiting));
    let mut d = dv(json!({}), pending);
    d.spec.source = None;
    d.spec.source_ref = Some(of(json!({"kind": "DataSource", "name": "fedora"})));
    let mut w = World::new(d);
    w.data_sources = vec![of(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": "fedora", "namespace": "vms"},
        "spec": {"source": {"pvc": {"namespace": "", "name": "golden"}}},
    }))];
    let d = w.diagnose();
    assert_eq!(d.cause, Cause::SourceNotReady, "{d:?}");
    assert_eq!(
        d.summary,
        "waits for source PVC vms/golden (deleted or not yet created)"
    );
}

#[test]
fn a_recovered_worker_is_no_crash_loop_and_last_words_are_no_log_chatter() {
    let listening = "2026-12-01T10:00:00.000000Z  INFO cdi::upload_server: upload server \
                     listening address=0.0.0.0:8443";
    let killed = json!({"exitCode": 137, "reason": "Error", "message": listening});
    let container = |ready: bool, state: Value, last: Value| {
        json!({"phase": "Running", "containerStatuses": [{"name": "c", "image": "i",
            "imageID": "", "ready": ready, "restartCount": 1, "state": state,
            "lastState": {"terminated": last}}]})
    };
    let running = json!({"running": {}});
    let backing_off = json!({"waiting": {"reason": "CrashLoopBackOff"}});
    let chatter_then_error = json!({"exitCode": 1,
        "message": format!("{listening}\nERROR cdi: certificate expired\n")});
    let chatter_only = json!({"exitCode": 1, "message": listening});
    // (readiness probe, pod status, the cause, the summary when a crash loop)
    let rows = [
        // An upload server killed once and serving again.
        (
            true,
            container(true, running.clone(), killed.clone()),
            Cause::UploadWaiting,
            None,
        ),
        // Still down: said by how it ended, not by its log's last line.
        (
            true,
            container(false, backing_off.clone(), killed),
            Cause::CrashLoop,
            Some("worker pod cdi-upload-disk restarted once: killed by signal 9 (SIGKILL)"),
        ),
        // Without a probe, ready is only started: a brief run between failures.
        (
            false,
            container(true, running, chatter_then_error),
            Cause::CrashLoop,
            Some("worker pod cdi-upload-disk restarted once: ERROR cdi: certificate expired"),
        ),
        (
            true,
            container(false, backing_off, chatter_only),
            Cause::CrashLoop,
            Some("worker pod cdi-upload-disk restarted once: Error (exit code 1)"),
        ),
    ];
    for (probed, st, cause, summary) in rows {
        let mut w = World::new(dv(
            json!({}),
            status("UploadReady", ("True", "Pod is running", "")),
        ));
        w.claims = vec![claim("Bound", json!({}))];
        let mut upload = pod("cdi-upload-disk", true, json!({}), st);
        if probed {
            upload.spec.as_mut().unwrap().containers[0].readiness_probe =
                Some(of(json!({"httpGet": {"path": "/healthz", "port": 8080}})));
        }
        w.pods = vec![upload];
        let d = w.diagnose();
        assert_eq!(d.cause, cause, "{d:?}");
        if let Some(s) = summary {
            assert_eq!(d.summary, s);
        }
        assert!(!d.summary.contains("listening"), "{d:?}");
    }
}

#[test]
fn summaries_are_one_bounded_line() {
    let log = "\n2026-12-01T10:00:00Z  INFO cdi::importer: starting import\nUnable to process \
               data: qemu-img: Could not open '/data/disk.img'\ncaused by: No such file\n";
    let long = "x".repeat(600);
    // (the Running message of a failed DataVolume, the summary)
    let rows = [
        (
            log.to_string(),
            "failed for good: Unable to process data: qemu-img: Could not open '/data/disk.img'"
                .to_string(),
        ),
        (
            long.clone(),
            format!(
                "failed for good: {}…",
                &long[..MAX_SUMMARY - 1 - "failed for good: ".len()]
            ),
        ),
    ];
    for (message, summary) in rows {
        let w = World::new(dv(
            json!({}),
            status("Failed", ("False", "Error", message.as_str())),
        ));
        let d = w.diagnose();
        assert_eq!(d.cause, Cause::Failed);
        assert_eq!(d.summary, summary);
        assert!(d.summary.chars().count() <= MAX_SUMMARY);
    }
    // A crash loop's plain-text termination message, several lines long.
    let mut w = World::new(dv(
        json!({}),
        status("ImportInProgress", ("False", "Error", "")),
    ));
    w.claims = vec![claim("Bound", json!({}))];
    w.pods = vec![pod(
        "importer-disk",
        true,
        json!({}),
        json!({"phase": "Running", "containerStatuses": [{"name": "c", "image": "i",
            "imageID": "", "ready": false, "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1,
                "message": "Unable to connect to http data source\n  caused by: timeout\n"}}}]}),
    )];
    let d = w.diagnose();
    assert_eq!(d.cause, Cause::CrashLoop);
    assert_eq!(
        d.summary,
        "worker pod importer-disk restarted twice: Unable to connect to http data source"
    );
}

#[test]
fn a_refused_worker_quotes_the_api_error_not_an_earlier_pods_scheduling() {
    let api = "Pod \"importer-disk\" is invalid: spec.containers[0].resources.requests: Invalid \
               value: \"2\": must be less than or equal to cpu limit";
    let said = format!(
        "the worker pod importer-disk for claim vms/disk was refused: {api}; check CDIConfig \
         spec.podResourceRequirements and the CDI resource's spec.workload"
    );
    let refused = json!({
        "cdi.kubevirt.io/storage.pod.schedulable": "false",
        "cdi.kubevirt.io/storage.condition.running": "false",
        "cdi.kubevirt.io/storage.condition.running.reason": "ErrCreatingPod",
        "cdi.kubevirt.io/storage.condition.running.message": said.clone(),
    });
    // The DataVolume still says an earlier pod could not be scheduled.
    let unschedulable = status(
        "ImportScheduled",
        ("False", "Unschedulable", "Importer pod cannot be scheduled"),
    );
    let on_claim = |m: &str| event("PersistentVolumeClaim", "disk", "ErrCreatingPod", m);
    // (events: none, the controller's, one copied from PVC prime)
    let rows = [
        vec![],
        vec![on_claim(said.as_str())],
        vec![on_claim(format!("[prime-claim-uid] : {said}").as_str())],
    ];
    for events in rows {
        let mut w = World::new(dv(json!({}), unschedulable.clone()));
        w.claims = vec![claim("Bound", refused.clone())];
        w.events = events;
        let d = w.diagnose();
        assert_eq!(d.cause, Cause::WorkerRefused, "{d:?}");
        assert_eq!(
            d.summary,
            format!("the API server refuses the worker pod: {api}")
        );
        assert!(!d.explanation.contains("cannot be scheduled"), "{d:?}");
    }
}

#[test]
fn a_data_source_that_can_never_be_ready_is_named_with_the_fix() {
    let data_source = |source: Value, reason: &str, message: &str| -> DataSource {
        of(json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
            "metadata": {"name": "itself", "namespace": "vms"},
            "spec": {"source": source},
            "status": {"conditions": [{"type": "Ready", "status": "False",
                                       "reason": reason, "message": message}]},
        }))
    };
    let itself = json!({"dataSource": {"namespace": "vms", "name": "itself"}});
    // (the DataSource's source, its Ready reason and message, the cause)
    let rows = [
        (
            itself.clone(),
            "SelfReference",
            "DataSource cannot self-reference",
            Cause::DataSourceInvalid,
        ),
        (
            json!({"dataSource": {"namespace": "other", "name": "f"}}),
            "CrossNamespaceReference",
            "DataSource cannot reference a DataSource in another namespace",
            Cause::DataSourceInvalid,
        ),
        (
            json!({"dataSource": {"namespace": "vms", "name": "latest"}}),
            "MaxReferenceDepthReached",
            "DataSource reference chain exceeds maximum depth of 1",
            Cause::DataSourceInvalid,
        ),
        (
            json!({}),
            "NoSource",
            "No source PVC set",
            Cause::DataSourceInvalid,
        ),
        // Its image only missing yet: CDI goes on once it is there.
        (
            json!({"pvc": {"namespace": "vms", "name": "golden"}}),
            "NotFound",
            "PVC not found",
            Cause::SourceNotReady,
        ),
    ];
    for (source, reason, message, cause) in rows {
        let mut d = dv(
            json!({}),
            status(
                "Pending",
                (
                    "False",
                    "DataSourceNotReady",
                    "DataVolume vms/disk: Empty source field in 'itself'. DataSource may not be \
                     ready yet",
                ),
            ),
        );
        d.spec.source = None;
        d.spec.source_ref = Some(of(json!({"kind": "DataSource", "name": "itself"})));
        let mut w = World::new(d);
        w.data_sources = vec![data_source(source, reason, message)];
        let d = w.diagnose();
        assert_eq!(d.cause, cause, "{reason}: {d:?}");
        if cause == Cause::DataSourceInvalid {
            assert_eq!(
                d.summary,
                format!("DataSource vms/itself can never be ready: {reason} ({message})")
            );
            assert!(
                d.explanation
                    .contains("kubectl edit datasource -n vms itself"),
                "{d:?}"
            );
            assert!(!d.explanation.contains("CDI goes on by itself"), "{d:?}");
        }
    }
}

#[test]
fn a_copy_waiting_for_its_source_to_be_filled_says_so() {
    let in_progress = status("CloneInProgress", ("True", "Pod is running", ""));
    let requested = json!({"k8s.io/CloneRequest": "vms/golden"});
    let waits = event(
        "PersistentVolumeClaim",
        "disk",
        crate::clone::host::CLONE_SOURCE_NOT_POPULATED,
        "waits for its source to be populated: PVC vms/golden: the copy starts once it is",
    );
    let filled: PersistentVolumeClaim = of(json!({"metadata": {"name": "golden",
        "namespace": "vms", "annotations": {"cdi.kubevirt.io/storage.pod.phase": "Succeeded"}},
        "status": {"phase": "Bound"}}));
    // (the source claim, the claim's annotations, whether it waits)
    let rows = [
        (other_claim("golden"), requested.clone(), true),
        // The source filled since: the event is history.
        (filled, requested.clone(), false),
        // The copy read the source already.
        (
            other_claim("golden"),
            json!({"k8s.io/CloneRequest": "vms/golden", "k8s.io/CloneOf": "true"}),
            false,
        ),
    ];
    for (source, anns, waiting) in rows {
        let mut w = World::new(clone_of_golden(in_progress.clone()));
        w.claims = vec![claim("Bound", anns), source];
        w.events = vec![waits.clone()];
        let d = w.diagnose();
        if waiting {
            assert_eq!(d.cause, Cause::SourceNotReady, "{d:?}");
            assert_eq!(d.summary, "waits for source PVC vms/golden to be populated");
        } else {
            assert_eq!(d.cause, Cause::Progressing, "{d:?}");
        }
    }
}

#[test]
fn a_clone_its_source_could_never_fill_is_named_once() {
    let message = "The clone doesn't meet the validation requirements: target resources \
                   requests storage size is smaller than the source";
    let refused = status("Pending", ("False", "CloneValidationFailed", message));
    let d = World::new(clone_of_golden(refused)).diagnose();
    assert_eq!(d.cause, Cause::ClaimNotValid, "{d:?}");
    assert_eq!(d.summary, format!("its clone cannot be made: {message}"));
    assert_eq!(d.explanation.matches("smaller than the source").count(), 1);
    assert!(d.explanation.contains("larger size"), "{d:?}");
}
