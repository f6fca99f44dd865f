//! The cron's decisions, pass by pass: names, polls, imports, garbage collection, classes,
//! snapshots and the DataSource it manages.

use super::*;
use serde_json::json;

const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const NEWER: &str = "sha256:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

/// The current import of [`DIGEST`], done.
fn imported() -> DataVolume {
    serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "fedora-0123456789ab"}, "spec": {},
        "status": {"phase": "Succeeded"}}))
    .unwrap()
}

fn cron(anns: serde_json::Value, status: serde_json::Value) -> DataImportCron {
    serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataImportCron",
        "metadata": {"name": "fedora-cron", "namespace": "golden", "annotations": anns,
            "labels": {"instancetype.kubevirt.io/default-preference": "fedora", "other": "x"}},
        "spec": {
            "schedule": "0 */12 * * *",
            "managedDataSource": "fedora",
            "importsToKeep": 1,
            "template": {"spec": {
                "source": {"registry": {"url": "docker://127.0.0.1:5000/disks/fedora:41"}},
                "storage": {"resources": {"requests": {"storage": "5Gi"}}}}},
        },
        "status": status,
    }))
    .unwrap()
}

fn now() -> Timestamp {
    "2026-12-03T10:00:00Z".parse().unwrap()
}

fn observed(c: &DataImportCron, poll: Poll) -> Observed<'_> {
    Observed {
        cron: c,
        now: now(),
        poll,
        dv: None,
        claim: None,
        data_source: None,
        other_manager: None,
        claims: vec![],
        class: Some("local-path".into()),
        format: DataImportCronSourceFormat::Pvc,
        snapshot: None,
        snapshot_class: None,
        snapshots: vec![],
        clone_denied: None,
    }
}

fn condition(plan: &Plan, t: DataImportCronConditionType) -> (ConditionStatus, String) {
    let c = plan
        .status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == t)
        .unwrap();
    (c.status, c.reason.clone().unwrap_or_default())
}

#[test]
fn names_and_pinned_urls_are_upstreams() {
    let c = cron(json!({}), json!({}));
    assert_eq!(
        import_name(&c, DIGEST).as_deref(),
        Some("fedora-0123456789ab")
    );
    assert_eq!(import_name(&c, "sha256:12"), None);
    assert_eq!(
        import_name(&c, "uid:4a7b2c1d-9e8f-4a6b-8c2d-0123456789ab").as_deref(),
        Some("fedora-4a7b2c1d-9e8")
    );
    assert_eq!(import_name(&c, "uid:4a7b2c1d-9E8f"), None);
    assert_eq!(
        import_name(&c, "uid:4a7b2c1d-9e-"),
        None,
        "no name ends in -"
    );
    assert_eq!(import_name(&c, "md5:0123456789abcdef"), None);
    assert_eq!(
        pinned_url("docker://127.0.0.1:5000/disks/fedora:41", DIGEST),
        format!("docker://127.0.0.1:5000/disks/fedora@{DIGEST}")
    );
    assert_eq!(
        pinned_url("docker://quay.io/containerdisks/fedora", DIGEST),
        format!("docker://quay.io/containerdisks/fedora@{DIGEST}")
    );
    assert_eq!(
        pinned_url(&format!("docker://r:5000/d@{NEWER}"), DIGEST),
        format!("docker://r:5000/d@{DIGEST}")
    );
}

#[test]
fn a_claim_source_is_imported_by_its_uid_once_its_service_account_may_clone_it() {
    let mut c = cron(json!({}), json!({}));
    c.spec.template.spec.source = Some(
        serde_json::from_value(json!({"pvc": {"namespace": "", "name": "golden-disk"}})).unwrap(),
    );
    c.spec.service_account_name = Some("importer".into());
    assert_eq!(
        claim_source(&c),
        Some(("golden".to_string(), "golden-disk".to_string()))
    );
    assert_eq!(
        service_account_user(&c),
        (
            "system:serviceaccount:golden:importer".to_string(),
            vec![
                "system:serviceaccounts".to_string(),
                "system:serviceaccounts:golden".to_string()
            ]
        )
    );
    let uid = "uid:4a7b2c1d-9e8f-4a6b-8c2d-0123456789ab";
    let mut o = observed(&c, Poll::Digest(uid.into()));
    o.clone_denied = Some("no rights".into());
    let plan = decide(&o);
    assert_eq!(plan.annotations[DESIRED_DIGEST].as_deref(), Some(uid));
    assert!(plan.create_dv.is_none());
    assert!(
        plan.status
            .current_imports
            .as_deref()
            .unwrap_or(&[])
            .is_empty()
    );
    assert_eq!(
        condition(&plan, DataImportCronConditionType::Progressing),
        (ConditionStatus::False, NOT_AUTHORIZED.to_string())
    );
    assert_eq!(plan.requeue_after, Some(AUTHORIZATION_WAIT));

    let plan = decide(&observed(&c, Poll::Digest(uid.into())));
    let dv = plan.create_dv.unwrap();
    assert_eq!(dv.metadata.name.as_deref(), Some("fedora-4a7b2c1d-9e8"));
    let pvc = dv.spec.source.unwrap().pvc.unwrap();
    assert_eq!(
        (pvc.namespace.as_str(), pvc.name.as_str()),
        ("", "golden-disk")
    );
}

#[test]
fn a_new_cron_polls_at_once_then_on_its_schedule() {
    let c = cron(json!({}), json!({}));
    assert!(poll_due(&c, now()));
    let plan = decide(&observed(&c, Poll::Digest(DIGEST.into())));
    assert_eq!(plan.annotations[DESIRED_DIGEST].as_deref(), Some(DIGEST));
    assert_eq!(
        plan.annotations[NEXT_CRON_TIME].as_deref(),
        Some("2026-12-03T12:00:00Z")
    );
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(2 * 3600)));
    let dv = plan.create_dv.as_ref().unwrap();
    assert_eq!(dv.metadata.name.as_deref(), Some("fedora-0123456789ab"));
    assert_eq!(
        dv.spec
            .source
            .as_ref()
            .unwrap()
            .registry
            .as_ref()
            .unwrap()
            .url
            .as_deref(),
        Some(format!("docker://127.0.0.1:5000/disks/fedora@{DIGEST}").as_str())
    );
    let labels = dv.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[label::DATA_IMPORT_CRON], "fedora-cron");
    assert_eq!(
        labels["instancetype.kubevirt.io/default-preference"],
        "fedora"
    );
    assert!(!labels.contains_key("other"));
    assert!(
        dv.metadata.owner_references.is_none(),
        "kept when the cron goes"
    );
    let mut gone = c.clone();
    gone.metadata.uid = Some("cron-uid".into());
    gone.spec.retention_policy = Some(DataImportCronRetentionPolicy::None);
    let plan_none = decide(&observed(&gone, Poll::Digest(DIGEST.into())));
    let owners = plan_none
        .create_dv
        .as_ref()
        .and_then(|d| d.metadata.owner_references.clone())
        .unwrap();
    assert_eq!(
        (owners[0].kind.as_str(), owners[0].uid.as_str()),
        ("DataImportCron", "cron-uid")
    );
    let Some(DataSourceChange::Create(ds)) = &plan_none.data_source else {
        panic!("{:?}", plan_none.data_source)
    };
    assert_eq!(ds.metadata.owner_references.as_ref(), Some(&owners));
    assert_eq!(
        plan.status.current_imports.as_ref().unwrap()[0].data_volume_name,
        "fedora-0123456789ab"
    );
    assert_eq!(
        condition(&plan, DataImportCronConditionType::UpToDate),
        (ConditionStatus::False, "Outdated".into())
    );
    // The DataSource is made, empty until an import succeeds.
    let Some(DataSourceChange::Create(ds)) = &plan.data_source else {
        panic!("{:?}", plan.data_source)
    };
    assert_eq!(ds.metadata.name.as_deref(), Some("fedora"));
    assert_eq!(ds.spec.source, DataSourceSource::default());
    assert_eq!(plan.outdated, (true, false));
    let mut classless = observed(&c, Poll::Digest(DIGEST.into()));
    classless.class = None;
    assert_eq!(
        decide(&classless).outdated,
        (true, true),
        "waits for a default class"
    );

    let later = cron(
        json!({(NEXT_CRON_TIME): "2026-12-03T12:00:00Z", (DESIRED_DIGEST): DIGEST}),
        json!({}),
    );
    assert!(!poll_due(&later, now()));
    let unscheduled = {
        let mut c = cron(json!({}), json!({}));
        c.spec.schedule = String::new();
        c
    };
    assert!(!poll_due(&unscheduled, now()));
}

#[test]
fn a_new_class_replaces_the_current_import() {
    let on = |class: &str| {
        cron(
            json!({(DESIRED_DIGEST): DIGEST, (NEXT_CRON_TIME): "2026-12-03T12:00:00Z",
                (STORAGE_CLASS): class}),
            json!({"currentImports": [{"DataVolumeName": "fedora-0123456789ab", "Digest": DIGEST}]}),
        )
    };
    let claim = |phase: &str, class: &str| -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": "fedora-0123456789ab",
            "labels": {(label::DATA_IMPORT_CRON): "fedora-cron"}},
            "spec": {"storageClassName": class}, "status": {"phase": phase}}))
        .unwrap()
    };
    // The class recorded is the one wanted: nothing to do on that account.
    let same = on("local-path");
    let bound = claim("Bound", "local-path");
    let mut o = observed(&same, Poll::NotDue);
    o.claim = Some(&bound);
    let plan = decide(&o);
    assert!(plan.delete.is_empty() && !plan.annotations.contains_key(STORAGE_CLASS));
    // Another class recorded: the current import goes first, the record stays.
    let moved = on("old-class");
    let old = claim("Bound", "old-class");
    let mut o = observed(&moved, Poll::NotDue);
    o.claim = Some(&old);
    let plan = decide(&o);
    assert_eq!(plan.delete, vec!["fedora-0123456789ab"]);
    assert!(plan.create_dv.is_none() && !plan.annotations.contains_key(STORAGE_CLASS));
    // Once it is gone: the new class recorded, the image imported again.
    let plan = decide(&observed(&moved, Poll::NotDue));
    assert_eq!(
        plan.annotations[STORAGE_CLASS].as_deref(),
        Some("local-path")
    );
    assert_eq!(
        plan.create_dv.unwrap().metadata.name.as_deref(),
        Some("fedora-0123456789ab")
    );
    // A pending claim of the cron's on another class just goes.
    let pending = claim("Pending", "old-class");
    let mut o = observed(&same, Poll::NotDue);
    o.claim = Some(&pending);
    assert_eq!(decide(&o).delete, vec!["fedora-0123456789ab"]);
    // A new cron records its class.
    let fresh = cron(json!({}), json!({}));
    let plan = decide(&observed(&fresh, Poll::Digest(DIGEST.into())));
    assert_eq!(
        plan.annotations[STORAGE_CLASS].as_deref(),
        Some("local-path")
    );
}

#[test]
fn a_succeeded_import_moves_the_data_source_and_old_ones_go() {
    let c = cron(
        json!({(DESIRED_DIGEST): DIGEST, (NEXT_CRON_TIME): "2026-12-03T12:00:00Z"}),
        json!({"currentImports": [{"DataVolumeName": "fedora-0123456789ab", "Digest": DIGEST}]}),
    );
    let dv = imported();
    let claim = |name: &str, used: &str| -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": name,
            "annotations": {(LAST_USE_TIME): used}}}))
        .unwrap()
    };
    let (current, old, older) = (
        claim("fedora-0123456789ab", "2026-12-01T00:00:00Z"),
        claim("fedora-aaaaaaaaaaaa", "2026-12-02T00:00:00Z"),
        claim("fedora-bbbbbbbbbbbb", "2026-11-01T00:00:00Z"),
    );
    let ds: DataSource = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": "fedora", "labels": {(label::DATA_IMPORT_CRON): "fedora-cron"}},
        "spec": {"source": {"pvc": {"namespace": "golden", "name": "fedora-aaaaaaaaaaaa"}}}}))
    .unwrap();
    let mut o = observed(&c, Poll::NotDue);
    o.dv = Some(&dv);
    o.data_source = Some(&ds);
    o.claims = vec![&old, &current, &older];
    let plan = decide(&o);
    assert!(plan.create_dv.is_none());
    assert_eq!(
        plan.status.last_imported_pvc,
        Some(DataVolumeSourcePvc {
            namespace: "golden".into(),
            name: "fedora-0123456789ab".into()
        })
    );
    assert_eq!(
        plan.delete,
        vec!["fedora-aaaaaaaaaaaa", "fedora-bbbbbbbbbbbb"]
    );
    assert_eq!(plan.touch.as_deref(), Some("fedora-0123456789ab"));
    let Some(DataSourceChange::Patch(p)) = &plan.data_source else {
        panic!("{:?}", plan.data_source)
    };
    assert_eq!(p["spec"]["source"]["pvc"]["name"], "fedora-0123456789ab");
    assert_eq!(
        condition(&plan, DataImportCronConditionType::UpToDate),
        (ConditionStatus::True, "UpToDate".into())
    );
    assert_eq!(
        condition(&plan, DataImportCronConditionType::Progressing),
        (ConditionStatus::False, "NoImport".into())
    );
    assert!(!plan.outdated.0);
    assert_eq!(
        plan.status.source_format,
        Some(DataImportCronSourceFormat::Pvc)
    );

    // A newer digest: imported next to the current one, which is kept meanwhile.
    let newer = cron(
        json!({(DESIRED_DIGEST): NEWER, (NEXT_CRON_TIME): "2026-12-03T12:00:00Z"}),
        json!({"currentImports": [{"DataVolumeName": "fedora-0123456789ab", "Digest": DIGEST}]}),
    );
    let mut o = observed(&newer, Poll::NotDue);
    o.dv = Some(&dv);
    o.data_source = Some(&ds);
    let plan = decide(&o);
    assert_eq!(
        plan.create_dv.as_ref().unwrap().metadata.name.as_deref(),
        Some("fedora-fedcba987654")
    );
    assert_eq!(
        condition(&plan, DataImportCronConditionType::UpToDate),
        (ConditionStatus::False, "Outdated".into())
    );
}

#[test]
fn a_source_that_cannot_be_polled_says_why() {
    let c = cron(json!({}), json!({}));
    let plan = decide(&observed(
        &c,
        Poll::Failed("docker://127.0.0.1:1/x: connection refused".into()),
    ));
    assert!(plan.create_dv.is_none());
    assert!(!plan.annotations.contains_key(LAST_CRON_TIME));
    let c2 = plan
        .status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == DataImportCronConditionType::UpToDate)
        .unwrap();
    assert_eq!(c2.reason.as_deref(), Some("PollFailed"));
    assert!(
        c2.message
            .as_deref()
            .unwrap()
            .contains("connection refused")
    );
    // Tried again at the next scheduled time, not in a loop; said until then.
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(2 * 3600)));
    let mut after = c.clone();
    after.status = Some(plan.status.clone());
    after.metadata.annotations = Some(
        plan.annotations
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
            .collect(),
    );
    let again = decide(&observed(&after, Poll::NotDue));
    assert_eq!(again.status.conditions, plan.status.conditions);
    let recovered = decide(&observed(&after, Poll::Digest(DIGEST.into())));
    assert!(recovered.create_dv.is_some());
    assert!(
        !recovered
            .status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.reason.as_deref() == Some(POLL_FAILED))
    );
    // Whatever a user writes as the digest is not a crash.
    let odd = cron(json!({(DESIRED_DIGEST): "latest"}), json!({}));
    let plan = decide(&observed(&odd, Poll::NotDue));
    assert!(plan.create_dv.is_none());
    let bad = cron(json!({}), json!({}));
    let mut bad = bad;
    bad.spec.schedule = "every day".into();
    let plan = decide(&observed(&bad, Poll::NotDue));
    assert!(plan.status.conditions.iter().flatten().any(|c| {
        c.message
            .as_deref()
            .unwrap_or("")
            .contains("Illegal cron schedule")
    }));
}

#[test]
fn the_snapshot_format_keeps_snapshots_of_the_imports() {
    let c = cron(
        json!({(DESIRED_DIGEST): DIGEST, (NEXT_CRON_TIME): "2026-12-03T12:00:00Z"}),
        json!({"currentImports": [{"DataVolumeName": "fedora-0123456789ab", "Digest": DIGEST}]}),
    );
    let dv = imported();
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "fedora-0123456789ab"},
        "spec": {"volumeMode": "Block", "resources": {"requests": {"storage": "5Gi"}}},
        "status": {"phase": "Bound"}}))
    .unwrap();
    let mut o = observed(&c, Poll::NotDue);
    o.format = DataImportCronSourceFormat::Snapshot;
    o.snapshot_class = Some("csi-snapclass".into());
    o.dv = Some(&dv);
    o.claim = Some(&claim);
    // Imported: the snapshot is taken, the DataSource names it, not up to date until ready.
    let plan = decide(&o);
    let snap = plan.create_snapshot.as_ref().unwrap();
    assert_eq!(snap["metadata"]["name"], "fedora-0123456789ab");
    assert_eq!(
        snap["spec"]["source"]["persistentVolumeClaimName"],
        "fedora-0123456789ab"
    );
    assert_eq!(snap["spec"]["volumeSnapshotClassName"], "csi-snapclass");
    assert_eq!(
        snap["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.sourceVolumeMode"],
        "Block"
    );
    assert_eq!(
        snap["metadata"]["labels"][label::DATA_IMPORT_CRON],
        "fedora-cron"
    );
    let Some(DataSourceChange::Create(ds)) = &plan.data_source else {
        panic!("{:?}", plan.data_source)
    };
    assert_eq!(
        ds.spec.source.snapshot.as_ref().map(|s| s.name.as_str()),
        Some("fedora-0123456789ab")
    );
    assert_eq!(
        condition(&plan, DataImportCronConditionType::UpToDate),
        (ConditionStatus::False, "ImportProgressing".into())
    );
    assert_eq!(plan.requeue_after, Some(SNAPSHOT_WAIT));
    assert!(plan.delete.is_empty());
    // Ready: the claim goes, the cron is up to date.
    o.snapshot = Some(true);
    let plan = decide(&o);
    assert!(plan.create_snapshot.is_none());
    assert_eq!(plan.delete, vec!["fedora-0123456789ab"]);
    assert_eq!(
        condition(&plan, DataImportCronConditionType::UpToDate),
        (ConditionStatus::True, "UpToDate".into())
    );
    assert_eq!(
        plan.status.source_format,
        Some(DataImportCronSourceFormat::Snapshot)
    );
    // Only the snapshot left: still the import; older snapshots beyond importsToKeep go.
    o.dv = None;
    o.claim = None;
    o.snapshots = vec![
        ("fedora-aaaaaaaaaaaa".into(), "2026-12-02T00:00:00Z".into()),
        ("fedora-0123456789ab".into(), "2026-12-01T00:00:00Z".into()),
    ];
    let plan = decide(&o);
    assert!(plan.delete.is_empty());
    assert_eq!(plan.delete_snapshots, vec!["fedora-aaaaaaaaaaaa"]);
    assert!(plan.create_dv.is_none());
    // The profile says pvc again: the snapshot goes and the image is imported as a claim.
    o.format = DataImportCronSourceFormat::Pvc;
    let plan = decide(&o);
    assert_eq!(plan.delete_snapshots, vec!["fedora-0123456789ab"]);
    assert_eq!(
        plan.create_dv.unwrap().metadata.name.as_deref(),
        Some("fedora-0123456789ab")
    );
}

#[test]
fn a_data_source_not_the_crons_is_never_taken_over_and_is_said() {
    let c = cron(
        json!({(DESIRED_DIGEST): DIGEST, (NEXT_CRON_TIME): "2026-12-03T12:00:00Z"}),
        json!({"currentImports": [{"DataVolumeName": "fedora-0123456789ab", "Digest": DIGEST}]}),
    );
    let dv = imported();
    let fix = "label it cdi.kubevirt.io/dataImportCron=fedora-cron";
    // The DataSource's labels; the cron its label names, when that cron names it too; the
    // reason on UpToDate and the event (none: the cron's own); whether the pass stops
    // (upstream's shouldReconcileCron); what the message says.
    type Case<'a> = (
        serde_json::Value,
        Option<&'a str>,
        Option<&'a str>,
        bool,
        &'a [&'a str],
    );
    let cases: [Case; 6] = [
        (
            json!({(label::DATA_IMPORT_CRON): "fedora-cron"}),
            None,
            None,
            false,
            &[],
        ),
        (
            json!({}),
            None,
            Some(ownership::NOT_MANAGED),
            false,
            &[
                "DataSource fedora has no cdi.kubevirt.io/dataImportCron label",
                fix,
            ],
        ),
        (
            json!({(label::DATA_IMPORT_CRON): ""}),
            None,
            Some(ownership::NOT_MANAGED),
            false,
            &["has no cdi.kubevirt.io/dataImportCron label", fix],
        ),
        (
            json!({(label::DATA_IMPORT_CRON): "old-cron"}),
            None,
            Some(ownership::NOT_MANAGED),
            false,
            &[
                "DataSource fedora is labelled cdi.kubevirt.io/dataImportCron=old-cron",
                fix,
            ],
        ),
        (
            json!({(label::DATA_IMPORT_CRON): "other-cron"}),
            Some("other-cron"),
            Some(ownership::ALREADY_MANAGED),
            true,
            &[
                "DataSource fedora is already managed by DataImportCron other-cron",
                "delete DataImportCron other-cron and label DataSource fedora cdi.kubevirt.io/dataImportCron=fedora-cron",
            ],
        ),
        // Whatever a label says is words, not a crash.
        (
            json!({(label::DATA_IMPORT_CRON): "ünïcødé/../\"%s"}),
            None,
            Some(ownership::NOT_MANAGED),
            false,
            &["=ünïcødé/../\"%s"],
        ),
    ];
    for (labels, other, reason, stops, says) in cases {
        let ds: DataSource = serde_json::from_value(json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
            "metadata": {"name": "fedora", "labels": labels.clone()},
            "spec": {"source": {"pvc": {"namespace": "golden", "name": "someone-elses"}}}}))
        .unwrap();
        let mut o = observed(&c, Poll::NotDue);
        o.dv = Some(&dv);
        o.data_source = Some(&ds);
        o.other_manager = other.map(str::to_string);
        let plan = decide(&o);
        let up = plan
            .status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == DataImportCronConditionType::UpToDate)
            .unwrap();
        let Some(reason) = reason else {
            assert_eq!(up.status, ConditionStatus::True, "{labels}");
            assert!(plan.warning.is_none(), "{labels}");
            let Some(DataSourceChange::Patch(p)) = &plan.data_source else {
                panic!("{labels}: {:?}", plan.data_source)
            };
            assert_eq!(p["spec"]["source"]["pvc"]["name"], "fedora-0123456789ab");
            continue;
        };
        let message = up.message.clone().unwrap_or_default();
        assert_eq!(
            (up.status, up.reason.as_deref()),
            (ConditionStatus::False, Some(reason)),
            "{labels}: {message}"
        );
        for said in says {
            assert!(message.contains(said), "{labels}: {message}");
        }
        assert_eq!(plan.warning, Some((reason, message.clone())), "{labels}");
        assert!(plan.data_source.is_none(), "never taken over: {labels}");
        assert!(plan.outdated.0, "{labels}");
        assert!(
            plan.requeue_after
                .is_some_and(|r| r <= ownership::CONFLICT_WAIT),
            "{labels}: {:?}",
            plan.requeue_after
        );
        // Another cron's: nothing of this cron's runs. Otherwise the import goes on as
        // upstream's does (the DataSource is then handed over by a label, ready at once).
        assert_eq!(plan.touch.is_none(), stops, "{labels}");
        assert_eq!(plan.status.last_imported_pvc.is_none(), stops, "{labels}");
        if stops {
            assert!(
                plan.annotations.is_empty() && plan.create_dv.is_none(),
                "{labels}"
            );
            assert!(plan.delete.is_empty(), "{labels}");
        }
    }

    // A poll failure keeps UpToDate (it stands until a poll succeeds); the event still
    // says whose the DataSource is.
    let ds: DataSource = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": "fedora"}, "spec": {"source": {}}}))
    .unwrap();
    let mut o = observed(&c, Poll::Failed("connection refused".into()));
    o.data_source = Some(&ds);
    let plan = decide(&o);
    assert_eq!(
        condition(&plan, DataImportCronConditionType::UpToDate),
        (ConditionStatus::False, POLL_FAILED.into())
    );
    assert_eq!(plan.warning.map(|w| w.0), Some(ownership::NOT_MANAGED));
    // Said again, the condition's times stay: the pass writes nothing new.
    let mut again = c.clone();
    again.status = Some(plan.status.clone());
    let mut o = observed(&again, Poll::NotDue);
    o.data_source = Some(&ds);
    o.now = "2026-12-03T10:05:00Z".parse().unwrap();
    assert_eq!(decide(&o).status.conditions, plan.status.conditions);
}

/// The current import's DataVolume deleted (a failed one, by hand): its claim, going with it or
/// failed, is no import, and the import before it keeps the DataSource and its claim.
#[test]
fn a_claim_going_with_its_deleted_import_takes_nothing_over() {
    let c = cron(
        json!({(DESIRED_DIGEST): NEWER, (NEXT_CRON_TIME): "2026-12-03T12:00:00Z"}),
        json!({"currentImports": [{"DataVolumeName": "fedora-fedcba987654", "Digest": NEWER}],
            "lastImportedPVC": {"namespace": "golden", "name": "fedora-0123456789ab"}}),
    );
    let good: PersistentVolumeClaim = serde_json::from_value(json!({"metadata": {
        "name": "fedora-0123456789ab", "annotations": {(LAST_USE_TIME): "2026-12-01T00:00:00Z"}},
        "status": {"phase": "Bound"}}))
    .unwrap();
    let ds: DataSource = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": "fedora", "labels": {(label::DATA_IMPORT_CRON): "fedora-cron"}},
        "spec": {"source": {"pvc": {"namespace": "golden", "name": "fedora-0123456789ab"}}}}))
    .unwrap();
    let going: PersistentVolumeClaim = serde_json::from_value(json!({"metadata": {
        "name": "fedora-fedcba987654", "deletionTimestamp": "2026-12-03T09:59:00Z",
        "finalizers": ["kubernetes.io/pvc-protection"]}, "status": {"phase": "Bound"}}))
    .unwrap();
    let failed: PersistentVolumeClaim = serde_json::from_value(json!({"metadata": {
        "name": "fedora-fedcba987654",
        "annotations": {"cdi.kubevirt.io/storage.pod.phase": "Failed"}},
        "status": {"phase": "Bound"}}))
    .unwrap();
    for claim in [&going, &failed] {
        let mut o = observed(&c, Poll::NotDue);
        o.claim = Some(claim);
        o.data_source = Some(&ds);
        o.claims = vec![&good, claim];
        let plan = decide(&o);
        assert!(plan.delete.is_empty(), "{:?}", plan.delete);
        assert_ne!(
            plan.status
                .last_imported_pvc
                .as_ref()
                .map(|p| p.name.as_str()),
            Some("fedora-fedcba987654")
        );
        assert!(
            !matches!(&plan.data_source, Some(DataSourceChange::Patch(p))
                if p["spec"]["source"]["pvc"]["name"] == "fedora-fedcba987654"),
            "{:?}",
            plan.data_source
        );
    }
}
