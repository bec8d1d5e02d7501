//! [`Cluster`] on Kubewarden's Kubernetes host capabilities: the lists of policies that
//! `verifiers` reads, and the host's words when it cannot answer. The SDK's helpers for these
//! calls need its `cluster-context` feature (k8s-openapi), which this policy leaves out: the
//! requests are the SDK 0.17.3's `ListAllResourcesRequest` and
//! `ListResourcesByNamespaceRequest`, field for field, sent through the waPC call the SDK makes.

use kubewarden_policy_sdk::wapc_guest;
use serde::Serialize;
use serde_json::Value;

use crate::verifiers::{Cluster, POLICIES_API_VERSION, PolicyKind};

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

impl Cluster for KubewardenCluster {
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
