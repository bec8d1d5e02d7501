//! Answers to the guest's Kubernetes host calls as policy-server 1.35 answers them, for the
//! policies `verifiers` reads: lists served from the objects a test puts in the cluster, the
//! allow-list of `contextAwareResources` checked first, and `field_masks` applied.
//!
//! Each list is served from a reflector of the process, one per kind, namespace, selectors and
//! field masks (`Reflector::compute_id`): the first call for it builds the reflector and waits
//! for its first list (`reader.wait_until_ready()` in `Reflector::create_and_run`), which costs
//! [`Cluster::first_list`]; every later call answers from the reflector's store at once, with
//! no time cache and nothing shared between calls in flight (policy-evaluator's
//! `list_resources_*` are not `#[cached]`, and `handle_request` spawns each call). What the
//! store holds then depends on the PolicyServer's RBAC ([`Access`]): with `watch` it follows
//! the cluster; with `get` and `list` only, the first list succeeds and the watch that should
//! follow is refused and retried for ever, so the store never changes again; without `list`,
//! the first list is refused and retried for ever, and the call never returns (the webhook's
//! timeout ends the admission). The model holds such a call for [`Cluster::never`]. Held
//! against the real 1.35 and a real API server in `tests/model_vs_host.rs`, where the rig had
//! kept each list 60 s (and shared identical lists in flight on the 1.38 model), answered a
//! first list at once, and had no RBAC to lack. policy-server 1.38 serves lists the same way
//! (viccuad/kubewarden-controller @4f232f31 `callback_handler/kubernetes.rs` and
//! `kubernetes/client.rs`: only `get_resource` and `can_i` have a cache, 5 s), so every model
//! shares this one.
//!
//! `can_i` answers from a grants table (a user's verbs on policies.kubewarden.io, as RBAC answers
//! a SubjectAccessReview) through the host's 5 s cache of the same question (policy-evaluator
//! v1.35.0 `can_i_cached`, `#[cached(time = 5)]`, unless `disable_cache`): a grant changed is
//! seen 5 s after the question was last asked. Held against the real 1.35 in
//! `tests/model_vs_host.rs` (`can_i_and_its_5_s_cache`).
//!
//! From kubewarden-controller v1.35.0: `crates/policy-evaluator/src/runtimes/callback.rs`
//! (dispatch on `list_resources_all` / `list_resources_by_namespace`, the allow-list and its
//! refusal text), `callback_handler/kubernetes/client.rs` (`list_resources_from_reflector`: the
//! answer is `{"apiVersion", "kind": "<Kind>List", "metadata": {}, "items"}`),
//! `callback_handler/kubernetes/field_mask.rs` (masks prune everything but `metadata`,
//! `apiVersion` and `kind`), and policy-sdk-rust v0.17.3's request structs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Map, Value, json};

/// One list request, as the SDK's `ListAllResourcesRequest` / `ListResourcesByNamespaceRequest`
/// deserialise it (no defaults: an `Option` may be left out, nothing else).
#[derive(Deserialize, Debug)]
struct ListRequest {
    api_version: String,
    kind: String,
    namespace: Option<String>,
    label_selector: Option<String>,
    field_selector: Option<String>,
    field_masks: Option<Vec<String>>,
}

/// The host's `can_i` answers by request, with when each was asked.
type CanICache = BTreeMap<Vec<u8>, (Instant, String)>;

/// How long policy-server 1.35 answers the same `can_i` question from its cache.
pub const CAN_I_CACHE: Duration = Duration::from_secs(5);

/// One row of the grants table: `user` (`system:serviceaccount:<namespace>:<name>`) may use
/// `verbs` on every kind of policies.kubewarden.io, through the ClusterRoleBinding `binding`
/// to the ClusterRole of the same name.
#[derive(Clone, Debug)]
pub struct Grant {
    pub user: String,
    pub binding: String,
    pub verbs: Vec<String>,
}

/// What the PolicyServer's ServiceAccount may do with the kinds the policy lists (its RBAC).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Access {
    /// `get`, `list` and `watch`: the reflector follows the cluster.
    #[default]
    Watch,
    /// `get` and `list` without `watch`: the first list, then never a change.
    ListOnly,
    /// No `list`: the first list is refused and retried for ever; the call never returns.
    Nothing,
}

/// What the first list of a reflector cost on the real policy-server 1.35 against a loopback
/// kube-apiserver 1.36 (`tests/model_vs_host.rs`): the discovery of the kind, the list, and the
/// wait for the store; 60-170 ms for the four lists of a first admission with `verifiers`,
/// which then took 620-830 ms where the next took 210-260 (most of the rest is the process's
/// first verification: `HostModel::cold_verification`).
pub const FIRST_LIST: Duration = Duration::from_millis(25);

/// How long the model holds a call the host never answers: the longest an API server waits for
/// a webhook (`timeoutSeconds` is at most 30), after which the admission is over whatever the
/// host does.
pub const NEVER: Duration = Duration::from_secs(30);

/// The objects in the cluster and what the policy was granted.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// Whole objects, each with its `apiVersion`, `kind` and `metadata` (`namespace` for
    /// namespaced kinds).
    pub objects: Vec<Value>,
    /// `contextAwareResources`: `(apiVersion, kind)` pairs; `None` grants every kind (kwctl's
    /// `--allow-context-aware` with this module's metadata, which lists them all).
    pub granted: Option<Vec<(String, String)>>,
    /// The PolicyServer's RBAC on the listed kinds.
    pub access: Access,
    /// What a reflector's first list costs ([`FIRST_LIST`]).
    pub first_list: Duration,
    /// How long a call the host never answers is held ([`NEVER`]).
    pub never: Duration,
    /// Objects added after the start ([`Cluster::add`]), seen by every copy of this cluster.
    added: Arc<Mutex<Vec<Value>>>,
    /// The grants table `can_i` answers from ([`Cluster::grant`]), shared by every copy.
    grants: Arc<Mutex<Vec<Grant>>>,
    /// The host's cache of `can_i` answers.
    can_i_answers: Arc<Mutex<CanICache>>,
    /// The process's reflectors, by id, each with the objects its store holds when it does not
    /// follow the cluster: shared by every copy, as one policy-server process shares them.
    reflectors: Arc<Mutex<BTreeMap<String, Vec<Value>>>>,
}

impl Default for Cluster {
    fn default() -> Self {
        Cluster {
            objects: Vec::new(),
            granted: None,
            access: Access::default(),
            first_list: FIRST_LIST,
            never: NEVER,
            added: Arc::default(),
            grants: Arc::default(),
            can_i_answers: Arc::default(),
            reflectors: Arc::default(),
        }
    }
}

/// The session tags kwctl records these calls under (policy-evaluator `CallbackRequestType`).
pub fn session_tag(operation: &str) -> Option<&'static str> {
    match operation {
        "list_resources_all" => Some("KubernetesListResourceAll"),
        "list_resources_by_namespace" => Some("KubernetesListResourceNamespace"),
        "can_i" => Some("KubernetesCanI"),
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
            ..Cluster::default()
        }
    }

    /// The policies of `verifiers`' kinds as `policy` objects (`kubectl get -o json`'s items).
    pub fn with_objects(objects: Vec<Value>) -> Cluster {
        Cluster {
            objects,
            ..Cluster::default()
        }
    }

    /// Creates `object` in the cluster now: a reflector that watches sees it at its next list.
    pub fn add(&self, object: Value) {
        self.added
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(object);
    }

    /// Sets the user's row of the grants table: seen by a `can_i` the cache does not answer.
    pub fn grant(&self, grant: Grant) {
        let mut grants = self.grants.lock().unwrap_or_else(|e| e.into_inner());
        grants.retain(|row| row.user != grant.user);
        grants.push(grant);
    }

    /// The host's `can_i`: RBAC's SubjectAccessReview status from the grants table (allowed
    /// with RBAC's reason, or refused without one, as RBAC leaves a refusal's reason empty),
    /// the same question within [`CAN_I_CACHE`] of its last asking answered from the cache.
    fn can_i(&self, payload: &[u8]) -> Result<String, String> {
        // The SDK's `CanIRequest`: the SubjectAccessReview, and whether the cache may answer.
        let request: Value = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
        let review = &request["subject_access_review"];
        let field = |pointer: &str| review.pointer(pointer).and_then(Value::as_str);
        let (Some(user), Some(verb)) = (field("/user"), field("/resource_attributes/verb")) else {
            return Err(format!("not a CanIRequest: {request}"));
        };
        let mut cache = self.can_i_answers.lock().unwrap_or_else(|e| e.into_inner());
        if request["disable_cache"] == json!(false)
            && let Some((asked, answer)) = cache.get(payload)
            && asked.elapsed() < CAN_I_CACHE
        {
            return Ok(answer.clone());
        }
        let grants = self.grants.lock().unwrap_or_else(|e| e.into_inner());
        let row = grants.iter().find(|row| {
            row.user == user
                && field("/resource_attributes/group") == Some("policies.kubewarden.io")
                && row.verbs.iter().any(|granted| granted == verb)
        });
        let answer = match row {
            Some(row) => {
                let account = row
                    .user
                    .strip_prefix("system:serviceaccount:")
                    .and_then(|account| account.split_once(':'))
                    .map(|(namespace, name)| format!("{name}/{namespace}"))
                    .unwrap_or_default();
                json!({"allowed": true, "reason": format!("RBAC: allowed by ClusterRoleBinding \"{}\" of ClusterRole \"{}\" to ServiceAccount \"{account}\"", row.binding, row.binding)})
            }
            None => json!({"allowed": false}),
        }
        .to_string();
        cache.insert(payload.to_vec(), (Instant::now(), answer.clone()));
        Ok(answer)
    }

    /// Every object in the cluster now.
    fn current(&self) -> Vec<Value> {
        let added = self.added.lock().unwrap_or_else(|e| e.into_inner());
        self.objects.iter().chain(added.iter()).cloned().collect()
    }

    /// The objects the reflector `id` serves now: the cluster's with `watch`; what its first
    /// list saw without; the first list paid (and never returning without `list`) when the
    /// process has no such reflector yet.
    fn served(&self, id: &str) -> Result<Vec<Value>, String> {
        let known = self
            .reflectors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned();
        match (known, self.access) {
            (Some(_), Access::Watch) => return Ok(self.current()),
            (Some(store), _) => return Ok(store),
            (None, _) => {}
        }
        if self.access == Access::Nothing {
            std::thread::sleep(self.never);
            return Err(format!(
                "the rig held this list for {} s: policy-server never answers it without `list`",
                self.never.as_secs()
            ));
        }
        std::thread::sleep(self.first_list);
        let store = self.current();
        // Two first calls at once each build a reflector (the host's map is read, then written
        // after the wait); the one written last stays.
        self.reflectors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string(), store.clone());
        Ok(store)
    }

    /// The host's answer to `operation` with `payload`; the error text is the host's whole
    /// message as the guest receives it after the waPC wrapper.
    pub fn answer(&self, operation: &str, payload: &[u8]) -> Result<String, String> {
        if operation == "can_i" {
            return self.can_i(payload);
        }
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
        let id = format!(
            "{}|{}|{:?}|{:?}|{:?}|{:?}",
            request.api_version,
            request.kind,
            namespace,
            request.label_selector,
            request.field_selector,
            request.field_masks
        );
        let items: Vec<Value> = self
            .served(&id)?
            .iter()
            .filter(|object| object["kind"] == json!(request.kind))
            .filter(|object| {
                namespace.is_none_or(|ns| object.pointer("/metadata/namespace") == Some(&json!(ns)))
            })
            .map(|object| masked(&stored(object), request.field_masks.as_deref()))
            .collect();
        Ok(json!({"apiVersion": request.api_version, "kind": format!("{}List", request.kind), "metadata": {}, "items": items}).to_string())
    }
}

/// What a reflector keeps of an object (`modify_object` in `reflector.rs`): `managedFields`
/// emptied and the last-applied annotation removed, through kube's accessors, which write both
/// fields when they were absent.
fn stored(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.insert("managedFields".to_string(), json!([]));
        let annotations = metadata.entry("annotations").or_insert_with(|| json!({}));
        if let Some(annotations) = annotations.as_object_mut() {
            annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
        }
    }
    object
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
