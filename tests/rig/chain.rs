//! A real admission chain, step by step: the control plane a test binary shares, namespaces,
//! the `policies.yml` entries a policy-server serves, the MutatingWebhookConfiguration that
//! sends a namespace's Pods to one of them (live before it returns), a ServiceAccount's
//! kubeconfig with the RBAC a test gives it, and a Pod applied with kubectl, read back as the
//! API server stored it with the warnings kubectl printed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::tools::{ControlPlane, PolicyServer, RealTools};

/// The control plane of every test of a binary that runs at the same time: started by the
/// first, stopped when the last drops it. Tests keep to namespaces of their own, and every
/// webhook selects only its own namespaces, so they do not see each other's Pods.
pub fn shared_plane(tools: &RealTools) -> Arc<ControlPlane> {
    static PLANE: Mutex<Weak<ControlPlane>> = Mutex::new(Weak::new());
    let mut slot = PLANE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(plane) = slot.upgrade() {
        return plane;
    }
    let plane = Arc::new(ControlPlane::start(tools, false));
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&namespace(MARKERS).to_string()));
    *slot = Arc::downgrade(&plane);
    plane
}

fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

/// Creates the namespaces (or leaves them as they are).
pub fn namespaces(plane: &ControlPlane, names: &[&str]) {
    let list = json!({"apiVersion": "v1", "kind": "List",
        "items": names.iter().map(|name| namespace(name)).collect::<Vec<_>>()});
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&list.to_string()));
}

/// Kubewarden's CRDs of 1.35 (`scripts/kubewarden-crds/`), applied and established.
pub fn kubewarden_crds(plane: &ControlPlane) {
    let crds = super::root().join("scripts/kubewarden-crds");
    plane.kubectl_ok(&["apply", "-f", &crds.to_string_lossy()], None);
    plane.kubectl_ok(
        &[
            "wait",
            "--for=condition=established",
            "--timeout=60s",
            "crd",
            "--all",
        ],
        None,
    );
}

/// One policy of a `policies.yml`, as kubewarden-controller v1.35.0 writes it for a
/// ClusterAdmissionPolicy (`internal/controller/policyserver_controller_configmap.go`): every
/// host capability (`"*"`), `allowedToMutate` for a mutating policy, and the kinds it may read.
pub struct Entry {
    pub id: String,
    pub module: PathBuf,
    pub settings: Value,
    pub mutating: bool,
    /// `(apiVersion, kind)` granted to the Kubernetes capability.
    pub context_aware: Vec<(String, String)>,
}

impl Entry {
    pub fn new(id: &str, module: &Path, settings: Value) -> Entry {
        Entry {
            id: id.to_string(),
            module: module.to_path_buf(),
            settings,
            mutating: true,
            context_aware: Vec::new(),
        }
    }

    /// The four kinds `verifiers` reads (metadata.yml's `contextAwareResources`).
    pub fn reading_policies(mut self) -> Entry {
        self.context_aware = [
            "ClusterAdmissionPolicy",
            "ClusterAdmissionPolicyGroup",
            "AdmissionPolicy",
            "AdmissionPolicyGroup",
        ]
        .iter()
        .map(|kind| ("policies.kubewarden.io/v1".to_string(), kind.to_string()))
        .collect();
        self
    }
}

/// The marker policy every policy-server of the chain also serves: the swapper with
/// `swapPolicy: always`, which rewrites `marker.example/…` without a lookup, so that a Pod
/// shows at once whether a webhook configuration is live in the API server.
const MARKER: &str = "chain-marker";
pub const MARKERS: &str = "chain-markers";
const MARKER_IMAGE: &str = "marker.example/probe:1";
const MARKED_IMAGE: &str = "mirror.marker.example/m/probe:1";

/// `policies.yml` for `entries`, with the marker policy.
pub fn policies_yml(tools: &RealTools, entries: &[Entry]) -> String {
    let marker = Entry::new(
        MARKER,
        &tools.annotated_policy(),
        json!({"mirrors": [{"source": "marker.example", "target": "mirror.marker.example/m"}],
            "swapPolicy": "always"}),
    );
    let mut policies = serde_json::Map::new();
    for entry in entries.iter().chain([&marker]) {
        let mut policy = json!({
            "module": format!("file://{}", entry.module.display()),
            "policyMode": "protect",
            "allowedToMutate": entry.mutating,
            "settings": entry.settings,
            "hostCapabilities": ["*"],
        });
        if !entry.context_aware.is_empty() {
            policy["contextAwareResources"] = entry
                .context_aware
                .iter()
                .map(|(api_version, kind)| json!({"apiVersion": api_version, "kind": kind}))
                .collect();
        }
        policies.insert(entry.id.clone(), policy);
    }
    // JSON is YAML.
    Value::Object(policies).to_string()
}

/// `sources.yaml` naming plain-HTTP registries (`127.0.0.1:PORT`) as insecure.
pub fn insecure_sources(hosts: &[&str]) -> String {
    json!({"insecure_sources": hosts}).to_string()
}

/// A MutatingWebhookConfiguration named `name` (the API server calls configurations in the
/// order of their names; unique on the control plane) that sends the Pods of `namespaces` to
/// policy `policy` of `server`.
pub struct Webhook<'a> {
    pub name: &'a str,
    pub server: &'a PolicyServer,
    pub policy: &'a str,
    pub namespaces: &'a [&'a str],
    /// `Fail` or `Ignore`.
    pub failure_policy: &'a str,
    pub timeout_seconds: u32,
}

impl Webhook<'_> {
    /// Applies the configuration and returns once the API server calls it: a Pod of the marker
    /// policy, created with `--dry-run=server`, comes back rewritten.
    pub fn install(&self, plane: &ControlPlane) {
        use base64::Engine as _;
        let ca_bundle = base64::engine::general_purpose::STANDARD.encode(&self.server.cert_pem);
        // A label value is at most 63 characters; a configuration's name can be longer.
        let marker = &super::registry::sha256(self.name.as_bytes())[7..23];
        let pods = json!([{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
            "operations": ["CREATE", "UPDATE"]}]);
        let configuration = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": self.name},
            "webhooks": [
                {
                    "name": format!("{}.kubewarden.admission", self.policy),
                    "clientConfig": {"url": self.server.url(self.policy), "caBundle": ca_bundle},
                    "rules": pods,
                    "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                        "operator": "In", "values": self.namespaces}]},
                    "failurePolicy": self.failure_policy,
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": self.timeout_seconds,
                },
                {
                    "name": "marker.kubewarden.admission",
                    "clientConfig": {"url": self.server.url(MARKER), "caBundle": ca_bundle},
                    "rules": pods,
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": MARKERS}},
                    "objectSelector": {"matchLabels": {MARKER: marker}},
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 10,
                },
            ],
        });
        // `create`, not `apply`: tests that share the control plane never take over each
        // other's configuration by reusing its name.
        plane.kubectl_ok(&["create", "-f", "-"], Some(&configuration.to_string()));
        let mut probe = pod(MARKERS, "probe", MARKER_IMAGE);
        probe["metadata"]["labels"] = json!({MARKER: marker});
        let started = Instant::now();
        loop {
            let answered = dry_run(plane, &probe);
            if answered.stored.as_ref().map(|pod| image_of(pod, 0)) == Some(MARKED_IMAGE) {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "webhook configuration {} not called within 60 s: {answered:?}\npolicy-server:\n{}",
                self.name,
                self.server.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// A Pod of one container `web` per image.
pub fn pod(namespace: &str, name: &str, image: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "web", "image": image}]},
    })
}

/// The image of container `index` of a Pod.
pub fn image_of(pod: &Value, index: usize) -> &str {
    pod["spec"]["containers"][index]["image"]
        .as_str()
        .unwrap_or_default()
}

/// What `kubectl apply` of a Pod came to.
#[derive(Debug)]
pub struct Applied {
    /// The Pod as the API server stored it (`kubectl get pod -o json`); None when refused.
    pub stored: Option<Value>,
    /// kubectl's error when the admission was refused.
    pub refused: Option<String>,
    /// The `Warning:` lines kubectl printed, without the prefix.
    pub warnings: Vec<String>,
    /// How long `kubectl apply` took.
    pub took: Duration,
}

impl Applied {
    /// The stored image of container `index`; panics when the Pod was refused.
    pub fn image(&self, index: usize) -> &str {
        image_of(self.pod(), index)
    }

    pub fn pod(&self) -> &Value {
        self.stored
            .as_ref()
            .unwrap_or_else(|| panic!("refused: {:?}", self.refused))
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.pod()["metadata"]["annotations"][key].as_str()
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.pod()["metadata"]["labels"][key].as_str()
    }

    /// An annotation that holds JSON, parsed.
    pub fn json_annotation(&self, key: &str) -> Option<Value> {
        self.annotation(key)
            .map(|text| serde_json::from_str(text).unwrap_or_else(|e| panic!("{key}: {e}")))
    }

    pub fn warned(&self, text: &str) -> bool {
        self.warnings.iter().any(|warning| warning.contains(text))
    }
}

/// `kubectl apply` of `object` (a Pod), then the Pod as the API server stored it.
pub fn apply(plane: &ControlPlane, object: &Value) -> Applied {
    let mut applied = submit(plane, &["apply", "-f", "-"], object);
    if applied.refused.is_none() {
        let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        applied.stored = Some(plane.get_json(&["pod", "-n", namespace, name]));
    }
    applied
}

/// `kubectl create --dry-run=server` of `object`: what the API server would store, through
/// every webhook, storing nothing.
pub fn dry_run(plane: &ControlPlane, object: &Value) -> Applied {
    submit(
        plane,
        &["create", "--dry-run=server", "-o", "json", "-f", "-"],
        object,
    )
}

fn submit(plane: &ControlPlane, args: &[&str], object: &Value) -> Applied {
    let started = Instant::now();
    let output = plane.kubectl(args, Some(&object.to_string()));
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let warnings = stderr
        .lines()
        .filter_map(|line| line.strip_prefix("Warning: "))
        .map(str::to_string)
        .collect();
    if !output.status.success() {
        return Applied {
            stored: None,
            refused: Some(stderr),
            warnings,
            took,
        };
    }
    Applied {
        stored: serde_json::from_slice(&output.stdout).ok(),
        refused: None,
        warnings,
        took,
    }
}

/// The policy kinds `verifiers` reads, as RBAC names their resources.
const POLICY_RESOURCES: [&str; 4] = [
    "clusteradmissionpolicies",
    "clusteradmissionpolicygroups",
    "admissionpolicies",
    "admissionpolicygroups",
];

/// A ServiceAccount `namespace/name` granted `verbs` on Kubewarden's four policy kinds
/// cluster-wide (none when `verbs` is empty), and a kubeconfig that acts as it (a token from
/// the TokenRequest API), as a PolicyServer's Pod does.
pub fn service_account_kubeconfig(
    plane: &ControlPlane,
    namespace: &str,
    name: &str,
    verbs: &[&str],
) -> PathBuf {
    namespaces(plane, &[namespace]);
    let mut items = vec![json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": namespace}})];
    if !verbs.is_empty() {
        let role = format!("{namespace}-{name}");
        items.push(
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [{"apiGroups": ["policies.kubewarden.io"], "resources": POLICY_RESOURCES,
                "verbs": verbs}]}),
        );
        items.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding", "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}));
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&list.to_string()));
    let token = plane.kubectl_ok(
        &["create", "token", "-n", namespace, name, "--duration", "2h"],
        None,
    );
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": format!("https://127.0.0.1:{}", plane.port),
            "certificate-authority": plane.ca_file()}}],
        "users": [{"name": name, "user": {"token": token.trim()}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": name}}],
        "current-context": "local",
    });
    let path = plane
        .data_dir()
        .join(format!("{namespace}-{name}.kubeconfig"));
    std::fs::write(&path, kubeconfig.to_string()).expect("kubeconfig");
    path
}

/// A Kubewarden policy object (`ClusterAdmissionPolicy`, or `AdmissionPolicy` in `namespace`)
/// for Pods, as an operator applies it: no controller runs here, so it only stands in the API
/// server to be read.
pub fn kubewarden_policy(
    kind: &str,
    namespace: Option<&str>,
    name: &str,
    module: &str,
    mutating: bool,
    settings: Value,
) -> Value {
    let mut metadata = json!({"name": name});
    if let Some(namespace) = namespace {
        metadata["namespace"] = json!(namespace);
    }
    json!({
        "apiVersion": "policies.kubewarden.io/v1",
        "kind": kind,
        "metadata": metadata,
        "spec": {
            "module": module,
            "mutating": mutating,
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                "operations": ["CREATE", "UPDATE"]}],
            "settings": settings,
        },
    })
}
