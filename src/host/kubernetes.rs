//! [`Cluster`] on Kubewarden's Kubernetes host capabilities: the lists of policies that
//! `verifiers` reads, whether the PolicyServer may list and watch them (`can_i`), and the host's
//! words when it cannot answer. The SDK's helpers for these calls need its `cluster-context`
//! feature (k8s-openapi), which this policy leaves out: the requests are the SDK 0.17.3's
//! `ListAllResourcesRequest`, `ListResourcesByNamespaceRequest` and `CanIRequest`, field for
//! field, sent through the waPC call the SDK makes.

use kubewarden_policy_sdk::wapc_guest;
use serde::Serialize;
use serde_json::Value;

use crate::verifiers::{Access, AccessReview, Cluster, POLICIES_API_VERSION, PolicyKind};

use super::errors::one_line;

/// Kubewarden's Kubernetes host capabilities.
pub struct KubewardenCluster;

/// The SDK's list requests (policy-sdk-rust v0.17.3 `src/host_capabilities/kubernetes.rs`):
/// snake-case keys, `namespace` only in the namespaced one, `field_masks` a sorted set.
#[derive(Serialize)]
struct ListRequest<'a> {
    api_version: &'a str,
    kind: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<&'a str>,
    label_selector: Option<&'a str>,
    field_selector: Option<&'a str>,
    field_masks: &'a [&'a str],
}

/// The SDK's `CanIRequest` (policy-sdk-rust v0.17.3 `src/host_capabilities/kubernetes.rs`):
/// a SubjectAccessReview's user, groups and resource attributes in snake case, and whether the
/// host may answer from its 5 s cache (policy-evaluator v1.35.0 `can_i_cached`).
#[derive(Serialize)]
struct CanIRequest<'a> {
    subject_access_review: SubjectAccessReview<'a>,
    disable_cache: bool,
}

#[derive(Serialize)]
struct SubjectAccessReview<'a> {
    groups: Option<Vec<String>>,
    resource_attributes: ResourceAttributes<'a>,
    user: String,
}

#[derive(Serialize)]
struct ResourceAttributes<'a> {
    group: Option<&'a str>,
    name: Option<&'a str>,
    namespace: Option<&'a str>,
    resource: &'a str,
    subresource: Option<&'a str>,
    verb: &'a str,
    version: Option<&'a str>,
}

impl<'a> CanIRequest<'a> {
    fn of(review: &AccessReview<'a>) -> CanIRequest<'a> {
        let (group, version) = POLICIES_API_VERSION
            .split_once('/')
            .unwrap_or((POLICIES_API_VERSION, ""));
        CanIRequest {
            subject_access_review: SubjectAccessReview {
                groups: Some(review.account.groups()),
                resource_attributes: ResourceAttributes {
                    group: Some(group),
                    name: None,
                    namespace: review.namespace,
                    resource: review.kind.resource(),
                    subresource: None,
                    verb: review.verb,
                    version: Some(version),
                },
                user: review.account.username(),
            },
            // A grant changed is seen within the host's 5 s, and the API server is asked at
            // most once per 5 s per question, not at every admission.
            disable_cache: false,
        }
    }
}

/// The answer's `SubjectAccessReviewStatus` (k8s-openapi's camel case): `allowed`, and the
/// authorizer's `reason` or `evaluationError`.
fn read_access(answer: &Value) -> Result<Access, String> {
    let allowed = answer
        .get("allowed")
        .and_then(Value::as_bool)
        .ok_or_else(|| format!("policy-server's can_i answer has no allowed: {answer}"))?;
    let reason = ["reason", "evaluationError"]
        .iter()
        .filter_map(|field| answer.get(*field).and_then(Value::as_str))
        .filter(|text| !text.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    Ok(Access { allowed, reason })
}

impl Cluster for KubewardenCluster {
    fn can_i(&mut self, review: &AccessReview<'_>) -> Result<Access, String> {
        let payload = serde_json::to_vec(&CanIRequest::of(review))
            .map_err(|e| format!("the can_i request could not be written: {e}"))?;
        let answer = wapc_guest::host_call("kubewarden", "kubernetes", "can_i", &payload)
            .map_err(|error| read_kubernetes_error(&error.to_string()))?;
        let answer: Value = serde_json::from_slice(&answer)
            .map_err(|e| format!("policy-server's can_i answer is not JSON: {e}"))?;
        read_access(&answer)
    }

    fn list(&mut self, kind: PolicyKind, namespace: Option<&str>) -> Result<Value, String> {
        let request = ListRequest {
            api_version: POLICIES_API_VERSION,
            kind: kind.name(),
            namespace,
            label_selector: None,
            field_selector: None,
            field_masks: kind.field_masks(),
        };
        let operation = match namespace {
            Some(_) => "list_resources_by_namespace",
            None => "list_resources_all",
        };
        let payload = serde_json::to_vec(&request)
            .map_err(|e| format!("the list request could not be written: {e}"))?;
        let answer = wapc_guest::host_call("kubewarden", "kubernetes", operation, &payload)
            .map_err(|error| read_kubernetes_error(&error.to_string()))?;
        serde_json::from_slice(&answer)
            .map_err(|e| format!("policy-server's answer is not a list: {e}"))
    }
}

/// The host's text as one line, with what to grant when it refused. policy-evaluator
/// (v1.35.0 `runtimes/callback.rs`) refuses a kind missing from the policy's
/// `contextAwareResources` with `Policy has not been granted access to Kubernetes
/// policies.kubewarden.io/v1/<Kind> resources. The violation has been reported.`, and a failed
/// call as `Callback evaluation failure: ` and anyhow's debug form of the error.
fn read_kubernetes_error(text: &str) -> String {
    let text = text.strip_prefix("Host error: ").unwrap_or(text);
    let text = text
        .strip_prefix("Callback evaluation failure: ")
        .unwrap_or(text);
    let head = ["\n\nCaused by:", "\nStack backtrace:"]
        .iter()
        .filter_map(|marker| text.find(marker))
        .min()
        .map_or(text, |end| &text[..end]);
    let line = one_line(head);
    if line.contains("has not been granted access to Kubernetes") {
        format!(
            "{line} List the four policies.kubewarden.io/v1 kinds (ClusterAdmissionPolicy, ClusterAdmissionPolicyGroup, AdmissionPolicy, AdmissionPolicyGroup) in this ClusterAdmissionPolicy's spec.contextAwareResources"
        )
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verifiers::ServiceAccount;

    #[test]
    fn the_request_is_the_sdks_field_for_field() {
        let request = ListRequest {
            api_version: POLICIES_API_VERSION,
            kind: "AdmissionPolicy",
            namespace: Some("team"),
            label_selector: None,
            field_selector: None,
            field_masks: PolicyKind::AdmissionPolicy.field_masks(),
        };
        assert_eq!(
            serde_json::to_string(&request).expect("JSON"),
            r#"{"api_version":"policies.kubewarden.io/v1","kind":"AdmissionPolicy","namespace":"team","label_selector":null,"field_selector":null,"field_masks":["spec.module","spec.settings.signatures"]}"#
        );
    }

    #[test]
    fn the_can_i_request_is_the_sdks_field_for_field() {
        let account = ServiceAccount {
            namespace: "kubewarden".to_string(),
            name: "policy-server".to_string(),
        };
        let review = AccessReview {
            account: &account,
            verb: "watch",
            kind: PolicyKind::AdmissionPolicy,
            namespace: Some("team"),
        };
        assert_eq!(
            serde_json::to_string(&CanIRequest::of(&review)).expect("JSON"),
            r#"{"subject_access_review":{"groups":["system:serviceaccounts","system:serviceaccounts:kubewarden","system:authenticated"],"resource_attributes":{"group":"policies.kubewarden.io","name":null,"namespace":"team","resource":"admissionpolicies","subresource":null,"verb":"watch","version":"v1"},"user":"system:serviceaccount:kubewarden:policy-server"},"disable_cache":false}"#
        );
    }

    #[test]
    fn a_can_i_answer_reads_allowed_and_the_reason() {
        assert_eq!(
            read_access(
                &serde_json::json!({"allowed": true, "reason": "RBAC: allowed by ClusterRoleBinding \"x\""})
            ),
            Ok(Access {
                allowed: true,
                reason: "RBAC: allowed by ClusterRoleBinding \"x\"".to_string()
            })
        );
        assert_eq!(
            read_access(&serde_json::json!({"allowed": false})),
            Ok(Access {
                allowed: false,
                reason: String::new()
            })
        );
        assert!(read_access(&serde_json::json!({"denied": true})).is_err());
    }

    #[test]
    fn a_kind_not_granted_says_what_to_grant_and_a_failure_reads_as_one_line() {
        let denied = "Host error: Policy has not been granted access to Kubernetes policies.kubewarden.io/v1/ClusterAdmissionPolicy resources. The violation has been reported.";
        let read = read_kubernetes_error(denied);
        assert!(
            read.starts_with("Policy has not been granted access to Kubernetes policies.kubewarden.io/v1/ClusterAdmissionPolicy resources. The violation has been reported. List the four"),
            "{read}"
        );
        let failed = "Host error: Callback evaluation failure: kube::Client was not initialized properly\n\nCaused by:\n    0: x\n\nStack backtrace:\n   0: anyhow";
        assert_eq!(
            read_kubernetes_error(failed),
            "kube::Client was not initialized properly"
        );
    }
}
