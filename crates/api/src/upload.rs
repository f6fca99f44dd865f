//! UploadTokenRequest (`upload.cdi.kubevirt.io/v1beta1`): served by CDI's API server, not a CRD.

use kube::CustomResource;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

/// The API group of upload token requests.
pub const UPLOAD_GROUP: &str = "upload.cdi.kubevirt.io";

/// UploadTokenRequest is the CR used to initiate a CDI upload.
#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[kube(
    group = "upload.cdi.kubevirt.io",
    version = "v1beta1",
    kind = "UploadTokenRequest",
    namespaced,
    status = "UploadTokenRequestStatus",
    derive = "PartialEq",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct UploadTokenRequestSpec {
    /// PvcName is the name of the PVC to upload to.
    pub pvc_name: String,
}

/// UploadTokenRequestStatus stores the status of a token request.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct UploadTokenRequestStatus {
    /// Token is a JWT token to be inserted in "Authentication Bearer header".
    pub token: Option<String>,
}
