//! What the request is, before any container is looked at: its operation, whether it is the
//! audit scanner's replay of a running Pod, and the mark of a static Pod's mirror Pod.

use kubewarden_policy_sdk::request::KubernetesAdmissionRequest;
use serde_json::Value;

/// The kubelet's mark on the mirror Pod of a static Pod: the node runs the manifest file, never
/// this API object, so changing its images would only misreport what runs.
pub const STATIC_POD_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Whether `request` is Kubewarden's audit scanner replaying a running Pod rather than the API
/// server admitting one. The scanner (kubewarden-controller v1.31 to v1.35,
/// `internal/audit-scanner`) sends a CREATE whose `uid` is the Pod's own `metadata.uid` and
/// whose `userInfo` is empty; the API server always names the requester and gives each request
/// a uid of its own, and a Pod being created has no uid yet. Nothing else marks an audit.
pub(super) fn is_audit_scan(request: &KubernetesAdmissionRequest) -> bool {
    request.user_info.username.is_empty()
        && !request.uid.is_empty()
        && request
            .object
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            == Some(request.uid.as_str())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Operation {
    Create,
    Update,
    /// `pods/ephemeralcontainers`: the API server keeps only `ephemeralContainers` of the object.
    EphemeralContainers,
}

impl Operation {
    /// The operation of `request`, or `None` for one that changes no Pod's images (a delete,
    /// a connect, another subresource).
    pub(super) fn of(request: &KubernetesAdmissionRequest) -> Option<Operation> {
        match (request.operation.as_str(), request.sub_resource.as_str()) {
            ("CREATE", "") => Some(Operation::Create),
            ("UPDATE", "") => Some(Operation::Update),
            ("UPDATE", "ephemeralcontainers") => Some(Operation::EphemeralContainers),
            _ => None,
        }
    }

    /// Whether the API server keeps metadata changes from this request: it keeps nothing but
    /// `ephemeralContainers` from a `pods/ephemeralcontainers` one.
    pub(super) fn may_change_metadata(self) -> bool {
        self != Operation::EphemeralContainers
    }
}
