//! The test rig: the built policy module in a real wasm runtime speaking Kubewarden's waPC
//! protocol, its OCI lookups answered by real registries on loopback or by recorded sessions.
#![allow(dead_code)] // each test crate uses a different part of the rig

pub mod ahead;
pub mod chain;
pub mod controller;
pub mod cosign;
pub mod ecr;
pub mod ecr_api;
pub mod front;
pub mod hanging;
pub mod hosts;
pub mod images;
pub mod install;
pub mod kubernetes;
pub mod lifecycle;
pub mod netns;
pub mod node;
pub mod proxy;
pub mod pull_through;
pub mod registry;
pub mod tools;
pub mod wapc;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{Value, json};

use wapc::{Host, SharedHost, WasmPolicy};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The fill controller's binary (fill-mirror/), built by cargo as the test build is (the policy
/// crate's tests cannot name another package's binary with CARGO_BIN_EXE), once per test binary;
/// its path as cargo reports the artifact.
pub fn fill_mirror() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let output = std::process::Command::new(env!("CARGO"))
            .current_dir(root())
            .args([
                "build",
                "--locked",
                "-p",
                "fill-mirror",
                "--bin",
                "fill-mirror",
            ])
            .arg("--message-format=json")
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run cargo build -p fill-mirror");
        assert!(output.status.success(), "cargo build -p fill-mirror failed");
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|message| message["target"]["name"] == "fill-mirror")
            .find_map(|message| message["executable"].as_str().map(PathBuf::from))
            .expect("cargo named no fill-mirror executable")
    })
}

/// `policy.wasm`, compiled once per test binary, as policy-server compiles it once, and
/// interrupted as policy-server interrupts it: after the host model's default `--policy-timeout`
/// (2 s), unless a test calls it within another timeout ([`validate_within`]).
pub fn policy() -> &'static WasmPolicy {
    static POLICY: OnceLock<WasmPolicy> = OnceLock::new();
    POLICY.get_or_init(|| {
        let module = root().join("policy.wasm");
        if let Err(error) = wapc::check_fresh(&module, &root()) {
            panic!("{error:#}");
        }
        let timeout = proxy::HostModel::from_env().policy_timeout();
        WasmPolicy::load_for_policy_server(&module, timeout).unwrap_or_else(|e| panic!("{e:#}"))
    })
}

pub fn shared<H: Host + 'static>(host: H) -> Arc<Mutex<H>> {
    Arc::new(Mutex::new(host))
}

/// What `kwctl run` would show of a policy answer.
#[derive(Debug)]
pub struct Response {
    pub accepted: bool,
    pub message: Option<String>,
    /// Set on a rejection the policy could not decide (500): the audit scanner's `error`.
    pub code: Option<u64>,
    pub warnings: Vec<String>,
    pub mutated: Option<Value>,
    /// `audit_annotations`, each value parsed as the JSON it is.
    pub audit: serde_json::Map<String, Value>,
}

impl Response {
    /// The image of `list[index]` in the mutated Pod, if it was mutated.
    pub fn image(&self, list: &str, index: usize) -> Option<&str> {
        self.mutated
            .as_ref()?
            .pointer(&format!("/spec/{list}/{index}/image"))?
            .as_str()
    }

    /// Whether every image is as the request wrote it: no mutation, or one that changed only
    /// metadata (the record of images the mirror lacks).
    pub fn images_unchanged(&self, request: &Value) -> bool {
        let Some(pod) = &self.mutated else {
            return true;
        };
        ["containers", "initContainers", "ephemeralContainers"]
            .iter()
            .all(|list| pod["spec"][list] == request["object"]["spec"][list])
    }

    /// The record of source images the mirror lacks, container name to entry, when the Pod
    /// carries one (with its label).
    pub fn unmirrored(&self) -> Option<Value> {
        let pod = self.mutated.as_ref()?;
        let labelled =
            pod["metadata"]["labels"]["image-swapper.kubewarden.io/unmirrored"] == "true";
        let text = pod["metadata"]["annotations"]["image-swapper.kubewarden.io/unmirrored-images"]
            .as_str()?;
        labelled.then(|| serde_json::from_str(text).ok()).flatten()
    }

    pub fn warned(&self, text: &str) -> bool {
        self.warnings.iter().any(|w| w.contains(text))
    }

    /// What the host answered for a policy it interrupted ([`wapc::interrupted_answer`]), in
    /// the terms of a policy's answer.
    pub fn from_admission_response(answer: &Value) -> Response {
        Response {
            accepted: answer["allowed"].as_bool().expect("allowed is a boolean"),
            message: answer["status"]["message"].as_str().map(str::to_string),
            code: answer["status"]["code"].as_u64(),
            warnings: answer["warnings"]
                .as_array()
                .map(|w| {
                    w.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
            mutated: None,
            audit: serde_json::Map::new(),
        }
    }

    /// Whether this is policy-server's answer for an evaluation it interrupted: the whole
    /// [`wapc::INTERRUPTED`] text, code 500, and nothing of the policy's.
    pub fn interrupted(&self) -> bool {
        !self.accepted
            && self.message.as_deref() == Some(wapc::INTERRUPTED)
            && self.code == Some(500)
            && self.warnings.is_empty()
            && self.mutated.is_none()
            && self.audit.is_empty()
    }
}

pub fn parse_response(bytes: &[u8]) -> Response {
    let value: Value = serde_json::from_slice(bytes).expect("the policy answers JSON");
    Response {
        accepted: value["accepted"].as_bool().expect("accepted is a boolean"),
        message: value["message"].as_str().map(str::to_string),
        code: value["code"].as_u64(),
        warnings: value["warnings"]
            .as_array()
            .map(|w| {
                w.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default(),
        mutated: value
            .get("mutated_object")
            .filter(|v| !v.is_null())
            .cloned(),
        audit: value["audit_annotations"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(key, text)| {
                let text = text.as_str().expect("audit annotation values are strings");
                let parsed = serde_json::from_str(text)
                    .unwrap_or_else(|e| panic!("audit annotation {key} is not JSON: {e}"));
                (key.clone(), parsed)
            })
            .collect(),
    }
}

/// Runs `validate` on a fresh instance, as policy-server does for every request, within the
/// default `--policy-timeout`; an interrupted evaluation gets policy-server's answer.
pub fn validate(settings: &Value, request: &Value, host: SharedHost) -> Response {
    validate_within(settings, request, host, policy_timeout())
}

/// The same for a policy whose `timeoutEvalSeconds` is `timeout`.
pub fn validate_within(
    settings: &Value,
    request: &Value,
    host: SharedHost,
    timeout: wapc::Timeout,
) -> Response {
    let payload = json!({"settings": settings, "request": request}).to_string();
    let evaluation = policy().call_within("validate", payload.as_bytes(), host, timeout);
    answer_of(&evaluation, request["uid"].as_str().unwrap_or_default())
}

/// policy-server's answer to one evaluation of request `uid`: the policy's own, or for an
/// evaluation it interrupted, the refusal it writes in its place (code 500).
pub fn answer_of(evaluation: &wapc::Evaluation, uid: &str) -> Response {
    if evaluation.interrupted {
        return Response::from_admission_response(&wapc::interrupted_answer(uid));
    }
    match &evaluation.result {
        Ok(answer) => parse_response(answer),
        Err(error) => panic!("validate failed: {error}"),
    }
}

/// The host model's default evaluation timeout (`--policy-timeout`).
pub fn policy_timeout() -> wapc::Timeout {
    Some(proxy::HostModel::from_env().policy_timeout())
}

/// Runs `validate_settings`: `(valid, message)`.
pub fn validate_settings(settings: &Value) -> (bool, Option<String>) {
    let host = shared(hosts::InstantHost::default());
    let evaluation = policy().call("validate_settings", settings.to_string().as_bytes(), host);
    let value: Value = serde_json::from_slice(
        &evaluation
            .result
            .unwrap_or_else(|e| panic!("validate_settings failed: {e}")),
    )
    .expect("JSON answer");
    (
        value["valid"].as_bool().expect("valid is a boolean"),
        value["message"].as_str().map(str::to_string),
    )
}

/// An AdmissionRequest for a Pod, as the API server sends it.
pub fn pod_request(operation: &str, spec: Value) -> Value {
    json!({
        "uid": "1299d386-525b-4032-98ae-1949f69f9cfc",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": "web",
        "namespace": "default",
        "operation": operation,
        "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
        "object": {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": spec,
        },
        "oldObject": null,
        "dryRun": false,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    })
}

/// A running Pod as Kubewarden's audit scanner sends it to `/audit/<policy>` (Go's JSON of
/// `admission/v1.AdmissionRequest`, kubewarden-controller v1.35.0 `internal/audit-scanner`, as
/// KUBEWARDEN.md gives it): a CREATE whose `uid` is the Pod's `metadata.uid`, `resource.resource`
/// the Kind, an empty `userInfo`, a null `oldObject`, no `dryRun`, `subResource` or `options`,
/// and the live object with its uid, resourceVersion and status. `n` makes the Pod's name and
/// uid its own.
pub fn audit_request(n: usize, spec: Value, annotations: Value) -> Value {
    let uid = format!("6b3a9f0c-7d1e-4f53-9d4c-{n:012x}");
    let name = format!("web-7d4b9c8f6-{n:05}");
    json!({
        "uid": uid,
        "name": name,
        "namespace": "default",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "Pod"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": "CREATE",
        "userInfo": {},
        "oldObject": null,
        "object": {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name, "namespace": "default", "uid": uid, "resourceVersion": "48213",
                "labels": {"app": "web"}, "annotations": annotations,
            },
            "spec": spec,
            "status": {"phase": "Running", "podIP": "10.42.0.17"},
        },
    })
}

pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn read_yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
