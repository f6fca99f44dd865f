//! The generated CRDs: checked in, complete, and structural as apiextensions/v1 requires.

use std::path::PathBuf;

use cdi_api::crd;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds")
}

#[test]
fn checked_in_crds_match_the_types() {
    let dir = deploy_dir();
    let mut expected: Vec<String> = Vec::new();
    for (name, yaml) in crd::rendered() {
        let path = dir.join(&name);
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == yaml,
            "{} differs from what the types generate: run `cargo run -p cdi -- crds --out-dir deploy/crds`",
            path.display()
        );
        expected.push(name);
    }
    let mut present: Vec<String> = std::fs::read_dir(&dir)
        .expect("deploy/crds exists")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    present.sort();
    expected.sort();
    assert_eq!(
        present, expected,
        "deploy/crds holds exactly the generated files"
    );
}

#[test]
fn every_kind_with_upstream_names_scope_and_columns() {
    let crds = crd::crds();
    let find = |kind: &str| -> &CustomResourceDefinition {
        crds.iter()
            .find(|c| c.spec.names.kind == kind)
            .unwrap_or_else(|| panic!("no CRD for {kind}"))
    };
    let expect = [
        (
            "DataVolume",
            "datavolumes",
            "Namespaced",
            &["dv", "dvs"][..],
            true,
        ),
        ("CDIConfig", "cdiconfigs", "Cluster", &[][..], false),
        ("CDI", "cdis", "Cluster", &["cdi", "cdis"][..], false),
        (
            "StorageProfile",
            "storageprofiles",
            "Cluster",
            &[][..],
            true,
        ),
        (
            "DataSource",
            "datasources",
            "Namespaced",
            &["das"][..],
            false,
        ),
        (
            "DataImportCron",
            "dataimportcrons",
            "Namespaced",
            &["dic", "dics"][..],
            false,
        ),
        (
            "VolumeImportSource",
            "volumeimportsources",
            "Namespaced",
            &[][..],
            false,
        ),
        (
            "VolumeUploadSource",
            "volumeuploadsources",
            "Namespaced",
            &[][..],
            false,
        ),
        (
            "VolumeCloneSource",
            "volumeclonesources",
            "Namespaced",
            &[][..],
            false,
        ),
        (
            "ObjectTransfer",
            "objecttransfers",
            "Cluster",
            &["ot", "ots"][..],
            true,
        ),
    ];
    assert_eq!(crds.len(), expect.len());
    for (kind, plural, scope, short, status) in expect {
        let c = find(kind);
        assert_eq!(c.spec.group, "cdi.kubevirt.io");
        assert_eq!(
            c.metadata.name.as_deref(),
            Some(format!("{plural}.cdi.kubevirt.io").as_str())
        );
        assert_eq!(c.spec.names.plural, plural);
        assert_eq!(c.spec.scope, scope, "{kind}");
        assert_eq!(
            c.spec.names.short_names.clone().unwrap_or_default(),
            short,
            "{kind}"
        );
        // The CDI kind is served at v1alpha1 too (not stored), as upstream's.
        let versions: Vec<(&str, bool, bool)> = c
            .spec
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.served, v.storage))
            .collect();
        let mut want = vec![("v1beta1", true, true)];
        if kind == "CDI" {
            want.insert(0, ("v1alpha1", true, false));
        }
        assert_eq!(versions, want, "{kind}");
        let v = c.spec.versions.iter().find(|v| v.storage).unwrap();
        let has_status = v.subresources.as_ref().is_some_and(|s| s.status.is_some());
        assert_eq!(has_status, status, "{kind} status subresource");
    }

    let dv = find("DataVolume");
    assert_eq!(
        dv.spec.names.categories.as_deref(),
        Some(&["all".to_string()][..])
    );
    let cols: Vec<(String, String, String)> = dv.spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| (c.name.clone(), c.type_.clone(), c.json_path.clone()))
        .collect();
    let want = [
        ("Phase", "string", ".status.phase"),
        ("Progress", "string", ".status.progress"),
        ("Restarts", "integer", ".status.restartCount"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ];
    assert_eq!(
        cols,
        want.iter()
            .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
            .collect::<Vec<_>>()
    );
}

#[test]
fn yaml_reads_back_as_the_same_crds() {
    let all: String = crd::rendered()
        .into_iter()
        .map(|(_, y)| format!("---\n{y}"))
        .collect();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&all).expect("valid multi-document YAML");
    let want: Vec<Value> = crd::crds()
        .iter()
        .map(|c| serde_json::to_value(c).unwrap())
        .collect();
    assert_eq!(docs, want);
    for doc in docs {
        assert_eq!(doc["apiVersion"], "apiextensions.k8s.io/v1");
        assert_eq!(doc["kind"], "CustomResourceDefinition");
    }
}

/// The rules of a structural schema (apiextensions/v1) that a generator can get wrong: every
/// node says its type (or is int-or-string / preserve-unknown-fields), no references, no
/// `additionalProperties` beside `properties`, and value validation only without types in the
/// logical junctors.
fn check_structural(node: &Value, path: &str, errors: &mut Vec<String>) {
    let Some(obj) = node.as_object() else {
        errors.push(format!("{path}: not an object"));
        return;
    };
    if obj.contains_key("$ref") {
        errors.push(format!("{path}: $ref is not allowed"));
    }
    let typed = obj.contains_key("type")
        || obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
        || obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if !typed {
        errors.push(format!("{path}: no type"));
    }
    if obj.contains_key("properties") && obj.contains_key("additionalProperties") {
        errors.push(format!(
            "{path}: properties and additionalProperties together"
        ));
    }
    // apiextensions' one exception: an int-or-string node may say
    // `anyOf: [{type: integer}, {type: string}]` (what controller-gen writes for a Quantity).
    let int_or_string_any_of = obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
        && obj.get("anyOf") == Some(&serde_json::json!([{"type": "integer"}, {"type": "string"}]));
    for junctor in ["anyOf", "oneOf", "allOf"] {
        if junctor == "anyOf" && int_or_string_any_of {
            continue;
        }
        for (i, branch) in obj
            .get(junctor)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            for banned in ["type", "description", "default", "nullable"] {
                if branch.get(banned).is_some() {
                    errors.push(format!("{path}.{junctor}[{i}]: {banned} inside a junctor"));
                }
            }
        }
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            check_structural(sub, &format!("{path}.{name}"), errors);
        }
    }
    if let Some(items) = obj.get("items") {
        check_structural(items, &format!("{path}[]"), errors);
    }
    match obj.get("additionalProperties") {
        Some(extra @ Value::Object(_)) => check_structural(extra, &format!("{path}{{}}"), errors),
        Some(other) => errors.push(format!(
            "{path}: additionalProperties {other} (use a schema)"
        )),
        None => {}
    }
}

#[test]
fn schemas_are_structural() {
    for c in crd::crds() {
        let schema = c.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .unwrap_or_else(|| panic!("{} has no schema", c.spec.names.kind));
        let mut errors = Vec::new();
        check_structural(
            &serde_json::to_value(schema).unwrap(),
            &c.spec.names.kind,
            &mut errors,
        );
        assert!(errors.is_empty(), "{}", errors.join("\n"));
    }
}

#[test]
fn upstream_validations_are_in_the_schema() {
    let crds = crd::crds();
    let schema_of = |kind: &str| -> Value {
        let c = crds.iter().find(|c| c.spec.names.kind == kind).unwrap();
        serde_json::to_value(
            c.spec.versions[0]
                .schema
                .as_ref()
                .unwrap()
                .open_api_v3_schema
                .as_ref()
                .unwrap(),
        )
        .unwrap()
    };
    let dv = schema_of("DataVolume");
    let content_type = &dv["properties"]["spec"]["properties"]["contentType"];
    assert_eq!(
        content_type["enum"],
        serde_json::json!(["kubevirt", "archive"])
    );
    let cfg = schema_of("CDIConfig");
    let global =
        &cfg["properties"]["spec"]["properties"]["filesystemOverhead"]["properties"]["global"];
    assert_eq!(global["pattern"], cdi_api::config::PERCENT_PATTERN);
    let sp = schema_of("StorageProfile");
    let sets = &sp["properties"]["spec"]["properties"]["claimPropertySets"];
    assert_eq!(sets["maxItems"], 8);
    assert_eq!(sets["items"]["properties"]["accessModes"]["maxItems"], 4);
    assert_eq!(
        sets["items"]["properties"]["volumeMode"]["enum"],
        serde_json::json!(["Block", "Filesystem"])
    );
    assert_eq!(
        sets["items"]["required"],
        serde_json::json!(["accessModes", "volumeMode"])
    );
}

/// Every node of `schema` (paths as in `check_structural`) that is int-or-string.
fn int_or_string_nodes(node: &Value, path: &str, out: &mut Vec<(String, Value)>) {
    if node.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        out.push((path.to_string(), node.clone()));
    }
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            int_or_string_nodes(sub, &format!("{path}.{name}"), out);
        }
    }
    if let Some(items) = node.get("items") {
        int_or_string_nodes(items, &format!("{path}[]"), out);
    }
    if let Some(extra) = node.get("additionalProperties").filter(|a| a.is_object()) {
        int_or_string_nodes(extra, &format!("{path}{{}}"), out);
    }
}

/// Every `resource.Quantity` carries controller-gen's schema, as upstream's CRDs do: integer or
/// string, the string matching kube's quantity pattern ("10 Gi" and "abc" are refused at
/// admission, before any controller sees them).
#[test]
fn quantities_carry_upstreams_pattern() {
    let want = serde_json::json!({
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
        "x-kubernetes-int-or-string": true,
    });
    assert_eq!(want["pattern"], crd::QUANTITY_PATTERN);
    let mut found = Vec::new();
    for c in crd::crds() {
        let schema = serde_json::to_value(
            c.spec.versions[0]
                .schema
                .as_ref()
                .unwrap()
                .open_api_v3_schema
                .as_ref()
                .unwrap(),
        )
        .unwrap();
        int_or_string_nodes(&schema, &c.spec.names.kind, &mut found);
    }
    for (path, node) in &found {
        assert_eq!(node, &want, "{path}");
    }
    let paths: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
    for expected in [
        "DataVolume.spec.pvc.resources.requests{}",
        "DataVolume.spec.pvc.resources.limits{}",
        "DataVolume.spec.storage.resources.requests{}",
        "DataVolume.spec.storage.resources.limits{}",
        "CDIConfig.spec.podResourceRequirements.requests{}",
        "CDIConfig.status.defaultPodResourceRequirements.limits{}",
        "CDI.spec.config.podResourceRequirements.requests{}",
        "DataImportCron.spec.template.spec.storage.resources.requests{}",
    ] {
        assert!(paths.contains(&expected), "{expected} not in {paths:?}");
    }
}
