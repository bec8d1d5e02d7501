//! Answers to the guest's Kubernetes host calls as policy-server 1.35 answers them, for the
//! policies `verifiers` reads: lists served from the objects a test puts in the cluster, the
//! allow-list of `contextAwareResources` checked first, and `field_masks` applied.
//!
//! From kubewarden-controller v1.35.0: `crates/policy-evaluator/src/runtimes/callback.rs`
//! (dispatch on `list_resources_all` / `list_resources_by_namespace`, the allow-list and its
//! refusal text), `callback_handler/kubernetes/client.rs` (`list_resources_from_reflector`: the
//! answer is `{"apiVersion", "kind": "<Kind>List", "metadata": {}, "items"}`),
//! `callback_handler/kubernetes/field_mask.rs` (masks prune everything but `metadata`,
//! `apiVersion` and `kind`), and policy-sdk-rust v0.17.3's request structs.

use serde::Deserialize;
use serde_json::{Map, Value, json};

/// One list request, as the SDK's `ListAllResourcesRequest` / `ListResourcesByNamespaceRequest`
/// deserialise it (no defaults: an `Option` may be left out, nothing else).
#[derive(Deserialize, Debug)]
struct ListRequest {
    api_version: String,
    kind: String,
    namespace: Option<String>,
    #[allow(dead_code)]
    label_selector: Option<String>,
    #[allow(dead_code)]
    field_selector: Option<String>,
    field_masks: Option<Vec<String>>,
}

/// The objects in the cluster and what the policy was granted.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    /// Whole objects, each with its `apiVersion`, `kind` and `metadata` (`namespace` for
    /// namespaced kinds).
    pub objects: Vec<Value>,
    /// `contextAwareResources`: `(apiVersion, kind)` pairs; `None` grants every kind (kwctl's
    /// `--allow-context-aware` with this module's metadata, which lists them all).
    pub granted: Option<Vec<(String, String)>>,
}

/// The session tags kwctl records these calls under (policy-evaluator `CallbackRequestType`).
pub fn session_tag(operation: &str) -> Option<&'static str> {
    match operation {
        "list_resources_all" => Some("KubernetesListResourceAll"),
        "list_resources_by_namespace" => Some("KubernetesListResourceNamespace"),
        _ => None,
    }
}

impl Cluster {
    /// The policies of `verifiers`' kinds, ready to list: each object given as
    /// `(kind, namespace, name, spec)`.
    pub fn with_policies(policies: &[(&str, Option<&str>, &str, Value)]) -> Cluster {
        let objects = policies
            .iter()
            .map(|(kind, namespace, name, spec)| {
                let mut metadata = json!({"name": name, "uid": format!("uid-{name}"), "resourceVersion": "1", "managedFields": [], "annotations": {}});
                if let Some(namespace) = namespace {
                    metadata["namespace"] = json!(namespace);
                }
                json!({"apiVersion": "policies.kubewarden.io/v1", "kind": kind, "metadata": metadata, "spec": spec, "status": {"policyStatus": "active"}})
            })
            .collect();
        Cluster {
            objects,
            granted: None,
        }
    }

    /// The host's answer to `operation` with `payload`; the error text is the host's whole
    /// message as the guest receives it after the waPC wrapper.
    pub fn answer(&self, operation: &str, payload: &[u8]) -> Result<String, String> {
        let request: ListRequest = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
        let granted = self.granted.as_ref().is_none_or(|granted| {
            granted
                .iter()
                .any(|(api, kind)| *api == request.api_version && *kind == request.kind)
        });
        if !granted {
            return Err(format!(
                "Policy has not been granted access to Kubernetes {}/{} resources. The violation has been reported.",
                request.api_version, request.kind
            ));
        }
        let namespaced = request.kind.starts_with("AdmissionPolicy");
        let namespace = match (operation, &request.namespace) {
            ("list_resources_by_namespace", Some(namespace)) if namespaced => Some(namespace),
            ("list_resources_by_namespace", _) => {
                return Err(format!(
                    "resource {}/{} is cluster wide. Cannot search for it inside of a namespace",
                    request.api_version, request.kind
                ));
            }
            _ => None,
        };
        let items: Vec<Value> = self
            .objects
            .iter()
            .filter(|object| object["kind"] == json!(request.kind))
            .filter(|object| {
                namespace.is_none_or(|ns| object.pointer("/metadata/namespace") == Some(&json!(ns)))
            })
            .map(|object| masked(object, request.field_masks.as_deref()))
            .collect();
        Ok(json!({"apiVersion": request.api_version, "kind": format!("{}List", request.kind), "metadata": {}, "items": items}).to_string())
    }
}

/// `field_mask::prune_in_place` on everything but `apiVersion`, `kind` and `metadata`.
fn masked(object: &Value, masks: Option<&[String]>) -> Value {
    let Some(masks) = masks else {
        return object.clone();
    };
    let mut kept = Map::new();
    for key in ["apiVersion", "kind", "metadata"] {
        if let Some(value) = object.get(key) {
            kept.insert(key.to_string(), value.clone());
        }
    }
    let paths: Vec<Vec<&str>> = masks.iter().map(|m| m.split('.').collect()).collect();
    for (key, value) in object.as_object().into_iter().flatten() {
        if ["apiVersion", "kind", "metadata"].contains(&key.as_str()) {
            continue;
        }
        let under: Vec<&[&str]> = paths
            .iter()
            .filter(|p| p.first() == Some(&key.as_str()))
            .map(|p| &p[1..])
            .collect();
        if !under.is_empty() {
            kept.insert(key.clone(), prune(value, &under));
        }
    }
    Value::Object(kept)
}

/// Keeps, of `value`, what `paths` name; a path that ends keeps the whole subtree. Arrays are
/// transparent: the same paths apply to each element.
fn prune(value: &Value, paths: &[&[&str]]) -> Value {
    if paths.iter().any(|p| p.is_empty()) {
        return value.clone();
    }
    match value {
        Value::Array(items) => Value::Array(items.iter().map(|v| prune(v, paths)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .filter_map(|(key, value)| {
                    let under: Vec<&[&str]> = paths
                        .iter()
                        .filter(|p| p.first() == Some(&key.as_str()))
                        .map(|p| &p[1..])
                        .collect();
                    (!under.is_empty()).then(|| (key.clone(), prune(value, &under)))
                })
                .collect(),
        ),
        other => other.clone(),
    }
}
