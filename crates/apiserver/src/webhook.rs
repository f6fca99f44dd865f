//! The DataVolume admission webhook (upstream's `/datavolume-mutate`, served by `cdi apiserver`):
//! a DataVolume that clones (`source.pvc`, `source.snapshot`, or a `sourceRef` whose DataSource
//! names one) from another namespace is admitted only when its creator may read that namespace's
//! volumes, by the same SubjectAccessReviews as upstream; an admitted clone gets a short clone
//! token (`cdi.kubevirt.io/storage.clone.token`) naming source and target, which the controller
//! checks before it reads a byte. A clone within one namespace needs no extra permission.

use cdi_api::datasource::DataSource;
use cdi_api::datavolume::DataVolume;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use serde_json::{Value, json};

use cdi_pki::token::{LIFETIME, Payload, Resource, Signer};

/// Where the webhook is served.
pub const PATH: &str = "/datavolume-mutate";
/// The MutatingWebhookConfiguration and its webhook (upstream's names).
pub const CONFIGURATION: &str = "cdi-api-datavolume-mutate";
pub const WEBHOOK: &str = "datavolume-mutate.cdi.kubevirt.io";
/// Where the validating webhook is served, and its configuration and webhook (upstream's).
pub const VALIDATE_PATH: &str = "/datavolume-validate";
pub const VALIDATE_CONFIGURATION: &str = "cdi-api-datavolume-validate";
pub const VALIDATE_WEBHOOK: &str = "datavolume-validate.cdi.kubevirt.io";
/// The DataImportCron validating webhook's (upstream's).
pub const CRON_VALIDATE_PATH: &str = "/dataimportcron-validate";
pub const CRON_VALIDATE_CONFIGURATION: &str = "cdi-api-dataimportcron-validate";
pub const CRON_VALIDATE_WEBHOOK: &str = "dataimportcron-validate.cdi.kubevirt.io";
/// The populator sources' validating webhook (upstream's).
pub const POPULATOR_VALIDATE_PATH: &str = "/populator-validate";
pub const POPULATOR_VALIDATE_CONFIGURATION: &str = "cdi-api-populator-validate";
pub const POPULATOR_VALIDATE_WEBHOOK: &str = "populator-validate.cdi.kubevirt.io";
/// The annotation holding the short clone token.
pub const PVC_MUTATE_PATH: &str = "/pvc-mutate";
pub const PVC_MUTATE_CONFIGURATION: &str = "cdi-api-pvc-mutate";
pub const PVC_MUTATE_WEBHOOK: &str = "pvc-mutate.cdi.kubevirt.io";

pub const CDI_VALIDATE_PATH: &str = "/cdi-validate";
pub const CDI_VALIDATE_CONFIGURATION: &str = "cdi-api-validate";
pub const CDI_VALIDATE_WEBHOOK: &str = "cdi-validate.cdi.kubevirt.io";

pub const CLONE_TOKEN: &str = "cdi.kubevirt.io/storage.clone.token";
/// Annotations under which upstream admits a clone without a token when it cannot be authorized
/// (the claim is already there, or a static volume is looked for).
const NO_TOKEN_OKAY: [&str; 2] = [
    "cdi.kubevirt.io/storage.prePopulated",
    "cdi.kubevirt.io/storage.checkStaticVolume",
];

/// What a DataVolume clones: a claim or a VolumeSnapshot, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloneSource {
    pub snapshot: bool,
    pub namespace: String,
    pub name: String,
}

impl CloneSource {
    /// The resource its token names.
    pub fn resource(&self) -> Resource {
        if self.snapshot {
            Resource::snapshots()
        } else {
            Resource::claims()
        }
    }
}

fn or_own(ns: &str, own: &str) -> String {
    if ns.is_empty() { own } else { ns }.to_string()
}

/// The source `dv` names itself (`source.pvc`, else `source.snapshot`), in `own` namespace when
/// it names none.
pub fn direct_source(dv: &DataVolume, own: &str) -> Option<CloneSource> {
    let source = dv.spec.source.as_ref()?;
    if let Some(p) = &source.pvc {
        return Some(CloneSource {
            snapshot: false,
            namespace: or_own(&p.namespace, own),
            name: p.name.clone(),
        });
    }
    source.snapshot.as_ref().map(|s| CloneSource {
        snapshot: true,
        namespace: or_own(&s.namespace, own),
        name: s.name.clone(),
    })
}

/// The source a DataSource (in namespace `at`) stands for: its `spec.source`, or for one that
/// refers to another DataSource what it resolved to (`status.source`). `None` when it names
/// none yet (not ready): upstream admits such a DataVolume without a token.
pub fn data_source_source(ds: &DataSource, at: &str) -> Option<CloneSource> {
    let s = if ds.spec.source.data_source.is_some() {
        ds.status.as_ref()?.source.clone()?
    } else {
        ds.spec.source.clone()
    };
    if let Some(p) = s.pvc {
        return Some(CloneSource {
            snapshot: false,
            namespace: or_own(&p.namespace, at),
            name: p.name,
        });
    }
    s.snapshot.map(|p| CloneSource {
        snapshot: true,
        namespace: or_own(&p.namespace, at),
        name: p.name,
    })
}

/// The SubjectAccessReviews' resource attributes that allow a clone of `source`: any one of the
/// alternatives, each all of its checks (upstream's `authorize_utils.go`): `create` on
/// `datavolumes/source`, or a right that reads the volume anyway (`create pods` for a claim;
/// `create pods` and `create pvcs` for a snapshot).
pub fn access_checks(source: &CloneSource) -> Vec<Vec<Value>> {
    let check = |group: &str, resource: &str, subresource: &str| {
        let mut a = json!({"namespace": source.namespace, "verb": "create", "group": group,
            "resource": resource, "name": source.name});
        if !subresource.is_empty() {
            a["subresource"] = json!(subresource);
        }
        a
    };
    let explicit = vec![check("cdi.kubevirt.io", "datavolumes", "source")];
    let implicit = if source.snapshot {
        vec![check("", "pods", ""), check("", "pvcs", "")]
    } else {
        vec![check("", "pods", "")]
    };
    vec![explicit, implicit]
}

/// Upstream's refusal.
pub fn insufficient(user: &str, namespace: &str) -> String {
    format!("User {user} has insufficient permissions in clone source namespace {namespace}")
}

/// Every webhook configuration `cdi apiserver` registers, reaching it through Service
/// `service` in `namespace` on `port`, trusted by `ca_bundle` (PEM).
pub fn configurations(namespace: &str, service: &str, port: u16, ca_bundle: &str) -> Vec<Value> {
    [
        configuration,
        validating_configuration,
        cron_validating_configuration,
        populator_validating_configuration,
        pvc_mutating_configuration,
        cdi_validating_configuration,
    ]
    .iter()
    .map(|make| make(namespace, service, port, ca_bundle))
    .collect()
}

/// The MutatingWebhookConfiguration that sends DataVolume creates and updates here (upstream's
/// operator makes the same one): through Service `service` in `namespace`, trusted by
/// `ca_bundle` (PEM), failing closed.
fn configuration(namespace: &str, service: &str, port: u16, ca_bundle: &str) -> Value {
    let mut webhook = entry(WEBHOOK, PATH, (namespace, service, port), ca_bundle);
    webhook["reinvocationPolicy"] = json!("Never");
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION, "labels": {"cdi.kubevirt.io": "cdi-api"}},
        "webhooks": [webhook]
    })
}

/// The ValidatingWebhookConfiguration that sends DataVolume creates and updates to
/// [`VALIDATE_PATH`] (upstream's), as [`configuration`] does the mutating one.
fn validating_configuration(namespace: &str, service: &str, port: u16, ca_bundle: &str) -> Value {
    let at = (namespace, service, port);
    let webhook = entry(VALIDATE_WEBHOOK, VALIDATE_PATH, at, ca_bundle);
    validating(VALIDATE_CONFIGURATION, webhook)
}

/// The ValidatingWebhookConfiguration for DataImportCrons (upstream's), to
/// [`CRON_VALIDATE_PATH`].
fn cron_validating_configuration(
    namespace: &str,
    service: &str,
    port: u16,
    ca_bundle: &str,
) -> Value {
    let at = (namespace, service, port);
    let mut webhook = entry(CRON_VALIDATE_WEBHOOK, CRON_VALIDATE_PATH, at, ca_bundle);
    webhook["rules"][0]["resources"] = json!(["dataimportcrons"]);
    validating(CRON_VALIDATE_CONFIGURATION, webhook)
}

/// The ValidatingWebhookConfiguration for VolumeImportSources and VolumeUploadSources
/// (upstream's), to [`POPULATOR_VALIDATE_PATH`].
fn populator_validating_configuration(
    namespace: &str,
    service: &str,
    port: u16,
    ca_bundle: &str,
) -> Value {
    let at = (namespace, service, port);
    let mut webhook = entry(
        POPULATOR_VALIDATE_WEBHOOK,
        POPULATOR_VALIDATE_PATH,
        at,
        ca_bundle,
    );
    webhook["rules"][0]["resources"] = json!(["volumeimportsources", "volumeuploadsources"]);
    validating(POPULATOR_VALIDATE_CONFIGURATION, webhook)
}

/// The MutatingWebhookConfiguration that sends the creation of claims labelled
/// `cdi.kubevirt.io/applyStorageProfile: "true"` to [`PVC_MUTATE_PATH`] (upstream's), where
/// they are rendered from their StorageProfile.
fn pvc_mutating_configuration(namespace: &str, service: &str, port: u16, ca_bundle: &str) -> Value {
    let at = (namespace, service, port);
    let mut webhook = entry(PVC_MUTATE_WEBHOOK, PVC_MUTATE_PATH, at, ca_bundle);
    webhook["rules"] = json!([{"operations": ["CREATE"], "apiGroups": [""],
        "apiVersions": ["v1"], "resources": ["persistentvolumeclaims"], "scope": "*"}]);
    webhook["objectSelector"] =
        json!({"matchLabels": {cdi_api::label::APPLY_STORAGE_PROFILE: "true"}});
    webhook["reinvocationPolicy"] = json!("Never");
    webhook["timeoutSeconds"] = json!(10);
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": PVC_MUTATE_CONFIGURATION, "labels": {"cdi.kubevirt.io": "cdi-api"}},
        "webhooks": [webhook]
    })
}

/// The ValidatingWebhookConfiguration that sends the deletion of the CDI resource to
/// [`CDI_VALIDATE_PATH`] (upstream's; failing open, as upstream's does).
fn cdi_validating_configuration(
    namespace: &str,
    service: &str,
    port: u16,
    ca_bundle: &str,
) -> Value {
    let at = (namespace, service, port);
    let mut webhook = entry(CDI_VALIDATE_WEBHOOK, CDI_VALIDATE_PATH, at, ca_bundle);
    webhook["rules"] = json!([{"operations": ["DELETE"], "apiGroups": ["cdi.kubevirt.io"],
        "apiVersions": ["v1beta1"], "resources": ["cdis"], "scope": "*"}]);
    webhook["failurePolicy"] = json!("Ignore");
    validating(CDI_VALIDATE_CONFIGURATION, webhook)
}

/// A ValidatingWebhookConfiguration `name` of one webhook.
fn validating(name: &str, webhook: Value) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"cdi.kubevirt.io": "cdi-api"}},
        "webhooks": [webhook]
    })
}

/// One webhook of a configuration: DataVolume creates and updates, through the Service, failing
/// closed.
fn entry(name: &str, path: &str, (namespace, service, port): (&str, &str, u16), ca: &str) -> Value {
    use base64::Engine;
    json!({
        "name": name,
        "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": ["cdi.kubevirt.io"],
            "apiVersions": ["v1beta1"], "resources": ["datavolumes"], "scope": "*"}],
        "clientConfig": {
            "service": {"namespace": namespace, "name": service, "path": path, "port": port},
            "caBundle": base64::engine::general_purpose::STANDARD.encode(ca.as_bytes())},
        "failurePolicy": "Fail", "sideEffects": "None", "matchPolicy": "Exact",
        "timeoutSeconds": 30, "admissionReviewVersions": ["v1", "v1beta1"]
    })
}

/// The object a review is about, and on an update the object it was.
fn both<T: serde::de::DeserializeOwned>(request: &Value) -> Result<(T, Option<T>), String> {
    let new = serde_json::from_value(request["object"].clone()).map_err(|e| e.to_string())?;
    let old = if request["operation"] == "UPDATE" {
        serde_json::from_value(request["oldObject"].clone()).ok()
    } else {
        None
    };
    Ok((new, old))
}

/// Answer a validating AdmissionReview of a VolumeImportSource or VolumeUploadSource.
pub fn validate_populator(review: &Value) -> Value {
    use cdi_api::populators::{VolumeImportSource, VolumeUploadSource};
    let request = &review["request"];
    let kind = request["kind"]["kind"].as_str().unwrap_or("");
    let judged = match kind {
        "VolumeImportSource" => both::<VolumeImportSource>(request)
            .map(|(new, old)| cdi_core::admission::volume_import_source(&new, old.as_ref())),
        "VolumeUploadSource" => both::<VolumeUploadSource>(request)
            .map(|(new, old)| cdi_core::admission::volume_upload_source(&new, old.as_ref())),
        other => Err(format!("unexpected resource: {other}")),
    };
    let response = match judged {
        Ok(causes) => refused_for(&causes),
        Err(e) => refused(400, &e, None),
    };
    answer(&request["uid"], response)
}

/// Answer a validating AdmissionReview of a DataImportCron: upstream's refusals (cdi-core
/// `admission`), or allowed.
pub fn validate_cron(review: &Value) -> Value {
    use cdi_api::datasource::DataImportCron;
    let request = &review["request"];
    let response = match both::<DataImportCron>(request) {
        Err(e) => refused(
            400,
            &format!("the object is not a DataImportCron: {e}"),
            None,
        ),
        Ok((cron, old)) => {
            if cron.metadata.deletion_timestamp.is_some() {
                allowed()
            } else {
                refused_for(&cdi_core::admission::data_import_cron(&cron, old.as_ref()))
            }
        }
    };
    answer(&request["uid"], response)
}

/// Allowed without causes; else upstream's refusal: 422, every cause's message after a space,
/// and the causes themselves.
fn refused_for(causes: &[cdi_core::admission::Cause]) -> Value {
    if causes.is_empty() {
        return allowed();
    }
    let listed: Vec<Value> = causes
        .iter()
        .map(|c| {
            let mut v = json!({"reason": c.reason, "message": c.message});
            if !c.field.is_empty() {
                v["field"] = json!(c.field);
            }
            v
        })
        .collect();
    json!({"allowed": false, "status": {"code": 422,
        "message": cdi_core::admission::message(causes),
        "details": {"causes": listed}}})
}

/// Answer a validating AdmissionReview: upstream's refusals of a DataVolume (cdi-core
/// `admission`), 422 with every cause, or allowed. `taken` is upstream's refusal of a new
/// DataVolume whose claim name is in use, found by the caller.
pub fn validate(review: &Value, taken: Option<cdi_core::admission::Cause>) -> Value {
    let request = &review["request"];
    if let Some(cause) = taken {
        return answer(&request["uid"], refused_for(&[cause]));
    }
    let response = match both::<DataVolume>(request) {
        Err(e) => refused(400, &format!("the object is not a DataVolume: {e}"), None),
        Ok((dv, old)) => {
            // An update that leaves the spec alone (finalizers, labels, annotations) always
            // goes through: a DataVolume made while no webhook ran must still be deletable.
            let unchanged = old.as_ref().is_some_and(|o| o.spec == dv.spec);
            let mut causes = if dv.metadata.deletion_timestamp.is_some() || unchanged {
                Vec::new()
            } else {
                cdi_core::admission::data_volume(&dv, old.as_ref())
            };
            if dv.metadata.deletion_timestamp.is_none() {
                causes.extend(cdi_core::admission::extensions(&dv, old.as_ref()));
            }
            refused_for(&causes)
        }
    };
    answer(&request["uid"], response)
}

/// The JSON patch that puts `token` on an object with `annotations` (`None`: it has none).
pub fn token_patch(annotations: Option<&Value>, token: &str) -> Value {
    if annotations.is_some_and(Value::is_object) {
        json!([{"op": "add", "path": format!("/metadata/annotations/{}",
            CLONE_TOKEN.replace('~', "~0").replace('/', "~1")), "value": token}])
    } else {
        json!([{"op": "add", "path": "/metadata/annotations", "value": {CLONE_TOKEN: token}}])
    }
}

/// The answer to an AdmissionReview.
fn answer(uid: &Value, response: Value) -> Value {
    let mut response = response;
    response["uid"] = uid.clone();
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

fn allowed() -> Value {
    json!({"allowed": true})
}

fn refused(code: u16, message: &str, field: Option<&str>) -> Value {
    let mut status = json!({"status": "Failure", "message": message, "code": code});
    if let Some(field) = field {
        status["details"] = json!({"causes": [{"reason": "FieldValueInvalid", "message": message,
            "field": field}]});
    }
    json!({"allowed": false, "status": status})
}

/// What the webhook reads from the cluster and asks of it.
pub struct Webhook {
    pub client: kube::Client,
}

/// Why a clone's source could not be looked at.
enum Lookup {
    /// A DataSource or namespace that is not there (or not readable).
    Missing(String),
    Failed(String),
}

impl Webhook {
    /// Answer an AdmissionReview (its JSON): allowed, allowed with a token `signer` signs
    /// added, or refused saying why.
    pub async fn review(&self, review: &Value, signer: &Signer) -> Value {
        let request = &review["request"];
        let uid = &request["uid"];
        let response = self.admit(request, signer).await;
        answer(uid, response)
    }

    async fn admit(&self, request: &Value, signer: &Signer) -> Value {
        let dv: DataVolume = match serde_json::from_value(request["object"].clone()) {
            Ok(dv) => dv,
            Err(e) => return refused(400, &format!("the object is not a DataVolume: {e}"), None),
        };
        if dv.metadata.deletion_timestamp.is_some() {
            return allowed();
        }
        let target_ns = dv
            .metadata
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .or_else(|| request["namespace"].as_str().map(String::from))
            .unwrap_or_default();
        let target_name = dv
            .metadata
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .or_else(|| request["name"].as_str().map(String::from))
            .unwrap_or_default();
        let anns = dv.metadata.annotations.clone().unwrap_or_default();
        let no_token_okay = NO_TOKEN_OKAY.iter().any(|k| anns.contains_key(*k));
        let source = match self.clone_source(&dv, &target_ns).await {
            Ok(Some(s)) => s,
            Ok(None) => return allowed(),
            Err(Lookup::Missing(_)) if no_token_okay => return allowed(),
            Err(Lookup::Missing(m) | Lookup::Failed(m)) => return refused(400, &m, None),
        };
        if source.namespace != target_ns {
            match self.namespace_exists(&source.namespace).await {
                Ok(true) => {}
                Ok(false) if no_token_okay => return allowed(),
                Ok(false) => {
                    return refused(
                        404,
                        &format!("namespaces \"{}\" not found", source.namespace),
                        None,
                    );
                }
                Err(m) => return refused(500, &m, None),
            }
            let user = &request["userInfo"];
            match self.may_clone(&source, user).await {
                Ok(true) => {}
                Ok(false) if no_token_okay => return allowed(),
                Ok(false) => {
                    let who = user["username"].as_str().unwrap_or("");
                    let field = if source.snapshot {
                        "spec.source.snapshot.namespace"
                    } else {
                        "spec.source.PVC.namespace"
                    };
                    return refused(422, &insufficient(who, &source.namespace), Some(field));
                }
                Err(m) => return refused(500, &m, None),
            }
        }
        // The token is given at creation only (upstream's rule); an update is only checked.
        if request["operation"] != "CREATE" {
            return allowed();
        }
        let payload = Payload::for_clone(
            (&source.namespace, &source.name),
            source.resource(),
            (&target_ns, &target_name),
        );
        let token = signer.sign(&payload, LIFETIME);
        let patch = token_patch(request["object"]["metadata"].get("annotations"), &token);
        use base64::Engine;
        json!({"allowed": true, "patchType": "JSONPatch",
            "patch": base64::engine::general_purpose::STANDARD.encode(patch.to_string())})
    }

    async fn clone_source(
        &self,
        dv: &DataVolume,
        own: &str,
    ) -> Result<Option<CloneSource>, Lookup> {
        if dv.spec.source.is_some() {
            return Ok(direct_source(dv, own));
        }
        let Some(r) = dv
            .spec
            .source_ref
            .as_ref()
            .filter(|r| r.kind == "DataSource")
        else {
            return Ok(None);
        };
        let ns = r
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| own.to_string());
        let api: kube::Api<DataSource> = kube::Api::namespaced(self.client.clone(), &ns);
        match api.get_opt(&r.name).await {
            Ok(Some(ds)) => Ok(data_source_source(&ds, &ns)),
            Ok(None) => Err(Lookup::Missing(format!(
                "datasources.cdi.kubevirt.io \"{}\" not found: DataVolume {own}/{} names \
                 DataSource {ns}/{} in spec.sourceRef; create it first",
                r.name,
                dv.metadata.name.as_deref().unwrap_or(""),
                r.name
            ))),
            Err(e) => Err(Lookup::Failed(format!(
                "reading DataSource {ns}/{}: {e}",
                r.name
            ))),
        }
    }

    async fn namespace_exists(&self, name: &str) -> Result<bool, String> {
        kube::Api::<Namespace>::all(self.client.clone())
            .get_opt(name)
            .await
            .map(|n| n.is_some())
            .map_err(|e| format!("reading namespace {name}: {e}"))
    }

    /// Answer a validating AdmissionReview of a DataVolume: at creation, a claim of its name
    /// that is not its to take is refused first (upstream's order), then its spec is judged.
    pub async fn validate(&self, review: &Value) -> Value {
        let request = &review["request"];
        let mut taken = None;
        if request["operation"] == "CREATE"
            && let Ok(dv) = serde_json::from_value::<DataVolume>(request["object"].clone())
        {
            let ns = dv
                .metadata
                .namespace
                .clone()
                .or_else(|| request["namespace"].as_str().map(String::from))
                .unwrap_or_default();
            let name = dv.metadata.name.clone().unwrap_or_default();
            let claims: kube::Api<PersistentVolumeClaim> =
                kube::Api::namespaced(self.client.clone(), &ns);
            let claim = match claims.get_opt(&name).await {
                Ok(c) => c,
                Err(e) => {
                    let why = format!("reading PersistentVolumeClaim {ns}/{name}: {e}");
                    return answer(&request["uid"], refused(400, &why, None));
                }
            };
            // The gate that allows adoption, when the DataVolume does not say.
            let config: Option<cdi_api::config::CDIConfig> = match claim {
                Some(_) => kube::Api::all(self.client.clone())
                    .get_opt(cdi_api::name::CDI_CONFIG)
                    .await
                    .unwrap_or(None),
                None => None,
            };
            let mut judged = dv;
            judged.metadata.namespace = Some(ns);
            taken = cdi_core::admission::claim_taken(&judged, claim.as_ref(), config.as_ref());
        }
        validate(review, taken)
    }

    /// Answer a validating AdmissionReview of the CDI resource's deletion (upstream's): refused
    /// while its `uninstallStrategy` is `BlockUninstallIfWorkloadsExist` and DataVolumes other
    /// than DataImportCrons' exist, unless CDI was never deployed (no phase) or failed.
    pub async fn validate_cdi(&self, review: &Value) -> Value {
        use cdi_api::config::CDI;
        use cdi_api::enums::UninstallStrategy;
        let request = &review["request"];
        let uid = &request["uid"];
        if request["operation"] != "DELETE" {
            return answer(uid, allowed());
        }
        let cdi: CDI = match serde_json::from_value(request["oldObject"].clone()) {
            Ok(c) => c,
            Err(_) => {
                let name = request["name"].as_str().unwrap_or("");
                match kube::Api::<CDI>::all(self.client.clone()).get(name).await {
                    Ok(c) => c,
                    Err(e) => {
                        let why = format!("reading CDI {name}: {e}");
                        return answer(uid, refused(400, &why, None));
                    }
                }
            }
        };
        let phase = cdi
            .status
            .as_ref()
            .and_then(|s| s.phase.as_ref())
            .map(|p| p.as_str().to_string())
            .unwrap_or_default();
        if phase.is_empty() || phase == "Error" {
            return answer(uid, allowed());
        }
        if cdi.spec.uninstall_strategy != Some(UninstallStrategy::BlockUninstallIfWorkloadsExist) {
            return answer(uid, allowed());
        }
        // Upstream asks for two at most, and says how many it saw.
        let list = kube::api::ListParams::default()
            .labels(&format!("!{}", cdi_api::label::DATA_IMPORT_CRON))
            .limit(2);
        match kube::Api::<DataVolume>::all(self.client.clone())
            .list(&list)
            .await
        {
            Ok(l) if l.items.is_empty() => answer(uid, allowed()),
            Ok(l) => {
                let why = format!(
                    "rejecting the uninstall request, since there are still {} DataVolumes \
                     present. Either delete all DataVolumes or change the uninstall strategy \
                     before uninstalling CDI",
                    l.items.len()
                );
                answer(uid, refused(400, &why, None))
            }
            Err(e) => answer(
                uid,
                refused(400, &format!("listing DataVolumes: {e}"), None),
            ),
        }
    }

    /// Answer a mutating AdmissionReview of a claim labelled
    /// `cdi.kubevirt.io/applyStorageProfile: "true"`: its spec rendered from the StorageProfile
    /// (`cdi_core::render::render_pvc`), or a refusal naming the claim and the fix.
    pub async fn render_pvc(&self, review: &Value) -> Value {
        use k8s_openapi::api::storage::v1::StorageClass;
        let request = &review["request"];
        let uid = &request["uid"];
        if request["operation"] != "CREATE" {
            return answer(uid, allowed());
        }
        let mut claim: PersistentVolumeClaim =
            match serde_json::from_value(request["object"].clone()) {
                Ok(c) => c,
                Err(e) => {
                    let why = format!("the object is not a PersistentVolumeClaim: {e}");
                    return answer(uid, refused(400, &why, None));
                }
            };
        let labelled = claim
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(cdi_api::label::APPLY_STORAGE_PROFILE))
            .is_some_and(|v| v == "true");
        if !labelled {
            // The configuration's object selector sends no others.
            return answer(uid, allowed());
        }
        if claim.metadata.namespace.is_none() {
            claim.metadata.namespace = request["namespace"].as_str().map(String::from);
        }
        let ns = claim.metadata.namespace.clone().unwrap_or_default();
        let list = kube::api::ListParams::default();
        let read = async {
            let classes = kube::Api::<StorageClass>::all(self.client.clone())
                .list(&list)
                .await?
                .items;
            let profiles =
                kube::Api::<cdi_api::storageprofile::StorageProfile>::all(self.client.clone())
                    .list(&list)
                    .await?
                    .items;
            let config = kube::Api::<cdi_api::config::CDIConfig>::all(self.client.clone())
                .get_opt(cdi_api::name::CDI_CONFIG)
                .await?;
            let clone_size = self.clone_source_size(&claim, &ns).await?;
            Ok::<_, kube::Error>((classes, profiles, config, clone_size))
        };
        let (classes, profiles, config, clone_size) = match read.await {
            Ok(r) => r,
            Err(e) => {
                let why = format!("rendering PersistentVolumeClaim {ns}: {e}");
                return answer(uid, refused(500, &why, None));
            }
        };
        let ctx = cdi_core::render::RenderContext {
            storage_classes: &classes,
            storage_profiles: &profiles,
            config: config.as_ref(),
            csi_drivers: &[],
            clone_size,
        };
        match cdi_core::render::render_pvc(&claim, &ctx) {
            Ok(spec) => {
                use base64::Engine;
                let patch = json!([{"op": "add", "path": "/spec", "value": spec}]);
                answer(
                    uid,
                    json!({"allowed": true, "patchType": "JSONPatch",
                        "patch": base64::engine::general_purpose::STANDARD.encode(patch.to_string())}),
                )
            }
            Err(e) => answer(uid, refused(422, &e.to_string(), None)),
        }
    }

    /// The size of a VolumeCloneSource's source, for a claim cloning through one that asks for
    /// no size: the source claim's request, or the snapshot's `restoreSize`.
    async fn clone_source_size(
        &self,
        claim: &PersistentVolumeClaim,
        ns: &str,
    ) -> Result<Option<i64>, kube::Error> {
        let Some(r) = claim
            .spec
            .as_ref()
            .and_then(|s| s.data_source_ref.as_ref())
            .filter(|r| {
                r.kind == "VolumeCloneSource" && r.api_group.as_deref() == Some(cdi_api::GROUP)
            })
        else {
            return Ok(None);
        };
        let at = claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(cdi_api::ann::DATA_SOURCE_NAMESPACE))
            .map_or(ns, String::as_str);
        let sources: kube::Api<cdi_api::populators::VolumeCloneSource> =
            kube::Api::namespaced(self.client.clone(), at);
        let Some(source) = sources.get_opt(&r.name).await? else {
            return Ok(None);
        };
        let quantity = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
            q.and_then(|q| cdi_core::Quantity::try_from(q).ok())
                .map(|q| q.value())
        };
        let source = source.spec.source;
        match source.kind.as_str() {
            "PersistentVolumeClaim" => {
                let claims: kube::Api<PersistentVolumeClaim> =
                    kube::Api::namespaced(self.client.clone(), at);
                Ok(claims.get_opt(&source.name).await?.and_then(|c| {
                    quantity(
                        c.spec
                            .as_ref()?
                            .resources
                            .as_ref()?
                            .requests
                            .as_ref()?
                            .get("storage"),
                    )
                }))
            }
            "VolumeSnapshot" => {
                let resource = kube::discovery::ApiResource {
                    group: "snapshot.storage.k8s.io".into(),
                    version: "v1".into(),
                    api_version: "snapshot.storage.k8s.io/v1".into(),
                    kind: "VolumeSnapshot".into(),
                    plural: "volumesnapshots".into(),
                };
                let snapshots: kube::Api<kube::api::DynamicObject> =
                    kube::Api::namespaced_with(self.client.clone(), at, &resource);
                Ok(snapshots.get_opt(&source.name).await?.and_then(|s| {
                    let size = s.data["status"]["restoreSize"].as_str()?.to_string();
                    quantity(Some(
                        &k8s_openapi::apimachinery::pkg::api::resource::Quantity(size),
                    ))
                }))
            }
            _ => Ok(None),
        }
    }

    /// Whether the requester (`userInfo` of the review) may clone `source`.
    async fn may_clone(&self, source: &CloneSource, user: &Value) -> Result<bool, String> {
        may_clone(&self.client, source, user).await
    }
}

/// Whether `user` (a `userInfo`: `username`, `groups`, and optionally `uid`, `extra`) may clone
/// `source`, by SubjectAccessReviews for each alternative of [`access_checks`].
pub async fn may_clone(
    client: &kube::Client,
    source: &CloneSource,
    user: &Value,
) -> Result<bool, String> {
    let reviews: kube::Api<SubjectAccessReview> = kube::Api::all(client.clone());
    for alternative in access_checks(source) {
        let mut all = true;
        for attributes in alternative {
            let mut spec = json!({"user": user["username"], "groups": user["groups"],
                "resourceAttributes": attributes});
            if let Some(extra) = user.get("extra").filter(|e| e.is_object()) {
                spec["extra"] = extra.clone();
            }
            if let Some(uid) = user.get("uid").filter(|u| u.is_string()) {
                spec["uid"] = uid.clone();
            }
            let sar: SubjectAccessReview =
                serde_json::from_value(json!({"apiVersion": "authorization.k8s.io/v1",
                    "kind": "SubjectAccessReview", "spec": spec}))
                .map_err(|e| format!("building the SubjectAccessReview: {e}"))?;
            let answer = reviews
                .create(&kube::api::PostParams::default(), &sar)
                .await
                .map_err(|e| format!("authorizing the clone: {e}"))?;
            if !answer.status.is_some_and(|s| s.allowed) {
                all = false;
                break;
            }
        }
        if all {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_operator_removes_exactly_the_configurations_registered_here() {
        let mut mutating = Vec::new();
        let mut validating = Vec::new();
        for c in configurations("cdi", "cdi-api", 443, "") {
            let name = c["metadata"]["name"].as_str().unwrap().to_string();
            match c["kind"].as_str() {
                Some("MutatingWebhookConfiguration") => mutating.push(name),
                _ => validating.push(name),
            }
        }
        mutating.sort();
        validating.sort();
        let sorted = |l: &[&str]| {
            let mut v: Vec<String> = l.iter().map(|s| s.to_string()).collect();
            v.sort();
            v
        };
        assert_eq!(mutating, sorted(cdi_core::install::MUTATING_WEBHOOKS));
        assert_eq!(validating, sorted(cdi_core::install::VALIDATING_WEBHOOKS));
    }
    use super::*;

    fn dv(yaml: &str) -> DataVolume {
        serde_json::from_value(serde_json::from_str::<Value>(yaml).unwrap()).unwrap()
    }

    #[test]
    fn the_source_is_the_claim_or_the_snapshot_in_the_own_namespace_by_default() {
        let claim = dv(r#"{"metadata": {"name": "d", "namespace": "vms"},
            "spec": {"source": {"pvc": {"namespace": "", "name": "img"}}}}"#);
        assert_eq!(
            direct_source(&claim, "vms"),
            Some(CloneSource {
                snapshot: false,
                namespace: "vms".into(),
                name: "img".into()
            })
        );
        let snap = dv(r#"{"metadata": {"name": "d", "namespace": "vms"},
            "spec": {"source": {"snapshot": {"namespace": "golden", "name": "s"}}}}"#);
        let s = direct_source(&snap, "vms").unwrap();
        assert!(s.snapshot);
        assert_eq!(s.resource(), Resource::snapshots());
        let http = dv(r#"{"metadata": {"name": "d"},
            "spec": {"source": {"http": {"url": "http://x"}}}}"#);
        assert_eq!(direct_source(&http, "vms"), None);
    }

    #[test]
    fn a_chained_data_source_stands_for_what_it_resolved_to() {
        let ds = |json: &str| -> DataSource { serde_json::from_str(json).unwrap() };
        let direct = ds(r#"{"metadata": {"name": "f"}, "spec": {"source":
            {"pvc": {"namespace": "", "name": "img"}}}}"#);
        assert_eq!(
            data_source_source(&direct, "golden").unwrap().namespace,
            "golden"
        );
        let chained = ds(r#"{"metadata": {"name": "f"}, "spec": {"source":
            {"dataSource": {"namespace": "golden", "name": "other"}}}}"#);
        assert_eq!(data_source_source(&chained, "golden"), None);
        let resolved = ds(r#"{"metadata": {"name": "f"}, "spec": {"source":
            {"dataSource": {"namespace": "golden", "name": "other"}}},
            "status": {"source": {"snapshot": {"namespace": "golden", "name": "s"}}}}"#);
        assert!(data_source_source(&resolved, "golden").unwrap().snapshot);
    }

    #[test]
    fn access_is_the_explicit_right_or_what_reads_the_volume_anyway() {
        let claim = CloneSource {
            snapshot: false,
            namespace: "golden".into(),
            name: "img".into(),
        };
        let checks = access_checks(&claim);
        assert_eq!(checks.len(), 2);
        assert_eq!(checks[0][0]["resource"], "datavolumes");
        assert_eq!(checks[0][0]["subresource"], "source");
        assert_eq!(checks[0][0]["namespace"], "golden");
        assert_eq!(checks[1].len(), 1);
        assert_eq!(checks[1][0]["resource"], "pods");
        let snap = CloneSource {
            snapshot: true,
            ..claim
        };
        let checks = access_checks(&snap);
        assert_eq!(
            checks[1]
                .iter()
                .map(|c| c["resource"].as_str().unwrap())
                .collect::<Vec<_>>(),
            ["pods", "pvcs"]
        );
    }

    #[test]
    fn the_token_is_added_with_or_without_annotations() {
        let patch = token_patch(None, "t");
        assert_eq!(patch[0]["path"], "/metadata/annotations");
        assert_eq!(patch[0]["value"][CLONE_TOKEN], "t");
        let patch = token_patch(Some(&json!({"a": "b"})), "t");
        assert_eq!(
            patch[0]["path"],
            "/metadata/annotations/cdi.kubevirt.io~1storage.clone.token"
        );
        let mut object = json!({"metadata": {"annotations": {"a": "b"}}});
        json_patch_apply(&mut object, &patch);
        assert_eq!(object["metadata"]["annotations"][CLONE_TOKEN], "t");
    }

    /// Enough of RFC 6902 `add` for the patches above.
    fn json_patch_apply(object: &mut Value, patch: &Value) {
        for op in patch.as_array().unwrap() {
            let path = op["path"].as_str().unwrap();
            let mut parts: Vec<String> = path
                .split('/')
                .skip(1)
                .map(|p| p.replace("~1", "/").replace("~0", "~"))
                .collect();
            let last = parts.pop().unwrap();
            let mut at = &mut *object;
            for p in parts {
                at = &mut at[p.as_str()];
            }
            at[last.as_str()] = op["value"].clone();
        }
    }

    #[test]
    fn the_configuration_sends_datavolume_writes_here_and_fails_closed() {
        let c = configuration("cdi", "cdi-api", 443, "PEM");
        let w = &c["webhooks"][0];
        assert_eq!(w["name"], WEBHOOK);
        assert_eq!(w["failurePolicy"], "Fail");
        assert_eq!(w["clientConfig"]["service"]["path"], PATH);
        assert_eq!(w["rules"][0]["resources"][0], "datavolumes");
        let v = validating_configuration("cdi", "cdi-api", 443, "PEM");
        assert_eq!(v["kind"], "ValidatingWebhookConfiguration");
        assert_eq!(v["webhooks"][0]["name"], VALIDATE_WEBHOOK);
        assert_eq!(
            v["webhooks"][0]["clientConfig"]["service"]["path"],
            VALIDATE_PATH
        );
    }

    #[test]
    fn refusals_carry_upstreams_status_and_causes() {
        let bad = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "d", "namespace": "vms", "finalizers": []},
            "spec": {"source": {"http": {"url": "https://a/b"}}}});
        let review = |operation: &str, object: &Value, old: Value| {
            validate(
                &json!({"request": {"uid": "u1", "operation": operation,
                "object": object, "oldObject": old}}),
                None,
            )
        };
        let answer = review("CREATE", &bad, Value::Null);
        let taken = cdi_core::admission::Cause {
            reason: "FieldValueDuplicate",
            message: "Destination PVC vms/d already exists".into(),
            field: "DataVolume.Name".into(),
        };
        let first = validate(
            &json!({"request": {"uid": "u0", "operation": "CREATE",
            "object": bad}}),
            Some(taken),
        );
        assert_eq!(
            first["response"]["status"]["message"],
            " Destination PVC vms/d already exists"
        );
        let response = &answer["response"];
        assert_eq!(response["uid"], "u1");
        assert_eq!(response["allowed"], false);
        assert_eq!(response["status"]["code"], 422);
        assert_eq!(response["status"]["message"], " Missing Data volume PVC");
        assert_eq!(
            response["status"]["details"]["causes"][0],
            json!({"reason": "FieldValueInvalid", "message": "Missing Data volume PVC",
                "field": "spec.PVC"})
        );
        let cron = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataImportCron",
            "metadata": {"name": "c", "namespace": "vms"},
            "spec": {"schedule": "", "managedDataSource": "",
                "template": {"spec": {"source": {"registry": {"url": "docker://r/i:1"}},
                    "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}}});
        let answer = validate_cron(&json!({"request": {"uid": "u2", "operation": "CREATE",
            "object": cron}}));
        assert_eq!(
            answer["response"]["status"]["message"],
            " Illegal ManagedDataSource value"
        );
        let c = cron_validating_configuration("cdi", "cdi-api", 443, "PEM");
        assert_eq!(
            c["webhooks"][0]["rules"][0]["resources"],
            json!(["dataimportcrons"])
        );
        let vis = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "VolumeImportSource",
            "metadata": {"name": "v", "namespace": "vms"}, "spec": {}});
        let answer = validate_populator(&json!({"request": {"uid": "u3", "operation": "CREATE",
            "kind": {"group": "cdi.kubevirt.io", "version": "v1beta1", "kind": "VolumeImportSource"},
            "object": vis}}));
        assert_eq!(
            answer["response"]["status"]["message"],
            " Missing VolumeImport source"
        );
        // A finalizer added to a DataVolume made before the webhook: its spec is as it was.
        let mut finalized = bad.clone();
        finalized["metadata"]["finalizers"] = json!(["cdi.kubevirt.io/dataVolumeFinalizer"]);
        assert_eq!(
            review("UPDATE", &finalized, bad.clone())["response"]["allowed"],
            true
        );
    }
}
