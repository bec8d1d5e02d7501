//! A stand-in for kubewarden-controller's reconcile of what an install applies (no machine here
//! runs the controller, and its images are not reachable): for each PolicyServer with policies,
//! the real policy-server 1.35 as a process, configured as the controller configures its
//! Deployment (`policies.yml` of its ClusterAdmissionPolicies, `sources.yaml`, the
//! `imagePullSecret` as its docker config, `KUBEWARDEN_WORKERS`); for each policy the webhook
//! configuration the controller writes; and once the API server calls each, the policy's
//! status `PolicyActive`, so that an install's `kubectl wait --for=condition=PolicyActive` runs
//! as typed. The audit scanner's replay of a running Pod is here too ([`Controller::audit`]).
//!
//! From kubewarden-controller (read at `internal/controller/policyserver_controller_configmap.go`
//! and `policy_subreconciler_webhook.go`): a ClusterAdmissionPolicy's id is `clusterwide-<name>`
//! (1.35), its webhook configuration is named after the id, its one webhook
//! `<id>.kubewarden.admission` with the policy's rules, failure policy, object selector and
//! timeout, `sideEffects: None` unless set, and a namespace selector that skips the controller's
//! namespace before the policy's own expressions; mutating policies get a
//! MutatingWebhookConfiguration, the others a ValidatingWebhookConfiguration.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use super::tools::{ControlPlane, PolicyServer, PolicyServerOptions, RealTools, scratch_dir};

/// What the stand-in needs beside the cluster's objects.
pub struct Reconcile<'a> {
    pub tools: &'a RealTools,
    /// The built module, standing for every policy's `spec.module` (the release's, which this
    /// machine cannot pull).
    pub module: &'a Path,
    /// Plain-HTTP registries of the rig, added to every PolicyServer's `insecureSources`.
    pub insecure: &'a [&'a str],
    /// The controller's namespace (`kubewarden`): its Secrets, and skipped by every webhook.
    pub namespace: &'a str,
    /// A namespace every policy's webhook selects, where a dry-run Pod shows it is called.
    pub probe_namespace: &'a str,
}

/// The policy-servers the stand-in runs, killed on drop.
pub struct Controller {
    /// By PolicyServer name.
    pub servers: BTreeMap<String, PolicyServer>,
    /// Each policy's PolicyServer, by policy name.
    pub placed: BTreeMap<String, String>,
}

/// A policy's id in policy-server, its webhook and its reports (1.35's).
pub fn id(policy: &str) -> String {
    format!("clusterwide-{policy}")
}

fn items(plane: &ControlPlane, kind: &str) -> Vec<Value> {
    plane.get_json(&[kind])["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn name(object: &Value) -> String {
    object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

impl Controller {
    /// Reconciles every ClusterAdmissionPolicy and its PolicyServer; returns once the API
    /// server calls every policy's webhook and each policy is `PolicyActive`.
    pub fn reconcile(plane: &ControlPlane, how: &Reconcile) -> Controller {
        let policies = items(plane, "clusteradmissionpolicies");
        let mut servers = BTreeMap::new();
        let mut placed = BTreeMap::new();
        for server in items(plane, "policyservers") {
            let server_name = name(&server);
            let bound: Vec<&Value> = policies
                .iter()
                .filter(|p| p["spec"]["policyServer"].as_str().unwrap_or("default") == server_name)
                .collect();
            if bound.is_empty() {
                continue;
            }
            let started = start_server(plane, how, &server, &bound);
            for policy in &bound {
                placed.insert(name(policy), server_name.clone());
                plane.kubectl_ok(
                    &["apply", "-f", "-"],
                    Some(&webhook(policy, &started, how.namespace).to_string()),
                );
            }
            servers.insert(server_name, started);
        }
        let controller = Controller { servers, placed };
        controller.wait_called(plane, how.probe_namespace);
        for policy in controller.placed.keys() {
            mark_active(plane, policy);
        }
        controller
    }

    /// The policy-server that serves `policy`.
    pub fn server_of(&self, policy: &str) -> &PolicyServer {
        let server = self
            .placed
            .get(policy)
            .unwrap_or_else(|| panic!("no PolicyServer serves {policy}"));
        &self.servers[server]
    }

    /// What the audit scanner records for the running `pod` under `policy`: `pass`, `fail` or
    /// `error` (a refusal with code 500, or no answer), with the message, from policy-server's
    /// `/audit/<id>` and a request in the scanner's shape (KUBEWARDEN.md, "The audit scanner").
    pub fn audit(&self, policy: &str, pod: &Value) -> (&'static str, Option<String>) {
        let metadata = &pod["metadata"];
        let request = json!({
            "uid": metadata["uid"],
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "Pod"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "userInfo": {},
            "oldObject": null,
            "object": pod,
        });
        let server = self.server_of(policy);
        let answer = server.try_post(
            &format!("audit/{}", id(policy)),
            &PolicyServer::review(&request),
            Duration::from_secs(10),
        );
        let Ok((answer, _)) = answer else {
            return ("error", answer.err());
        };
        let response = &answer["response"];
        let message = response["status"]["message"].as_str().map(str::to_string);
        match (
            response["allowed"].as_bool(),
            response["status"]["code"].as_u64(),
        ) {
            (Some(true), _) => ("pass", message),
            (Some(false), Some(500)) | (None, _) => ("error", message),
            (Some(false), _) => ("fail", message),
        }
    }

    /// Returns once the API server has called every policy's webhook: a dry-run Pod in the
    /// probe namespace, then the API server's count of calls per webhook (`/metrics`).
    fn wait_called(&self, plane: &ControlPlane, namespace: &str) {
        let probe = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "webhook-probe", "namespace": namespace},
            "spec": {"containers": [{"name": "probe", "image": "registry.invalid/probe:1"}]}})
        .to_string();
        let begun = Instant::now();
        loop {
            plane.kubectl(&["create", "--dry-run=server", "-f", "-"], Some(&probe));
            let metrics = plane.kubectl_ok(&["get", "--raw", "/metrics"], None);
            let uncalled: Vec<String> = self
                .placed
                .keys()
                .map(|policy| format!("{}.kubewarden.admission", id(policy)))
                .filter(|webhook| {
                    !metrics.lines().any(|line| {
                        line.starts_with(
                            "apiserver_admission_webhook_admission_duration_seconds_count{",
                        ) && line.contains(&format!("name=\"{webhook}\""))
                    })
                })
                .collect();
            if uncalled.is_empty() {
                return;
            }
            assert!(
                begun.elapsed() < Duration::from_secs(60),
                "the API server never called {uncalled:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// policy-server for `server` and its `policies`, configured as the controller configures its
/// Deployment.
fn start_server(
    plane: &ControlPlane,
    how: &Reconcile,
    server: &Value,
    policies: &[&Value],
) -> PolicyServer {
    let spec = &server["spec"];
    let mut entries = serde_json::Map::new();
    for policy in policies {
        let spec = &policy["spec"];
        entries.insert(
            id(&name(policy)),
            json!({
                "module": format!("file://{}", how.module.display()),
                "policyMode": spec["mode"].as_str().unwrap_or("protect"),
                "allowedToMutate": spec["mutating"].as_bool().unwrap_or(false),
                "settings": spec.get("settings").cloned().unwrap_or(json!({})),
                "hostCapabilities": ["*"],
            }),
        );
    }
    let mut insecure: Vec<String> = spec["insecureSources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect();
    insecure.extend(how.insecure.iter().map(|s| s.to_string()));
    let sources = json!({"insecure_sources": insecure}).to_string();
    // The evaluation timeout: one policy per PolicyServer here, so the policy's own.
    let timeout = policies
        .iter()
        .filter_map(|p| p["spec"]["timeoutEvalSeconds"].as_u64())
        .max();
    let workers = spec["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "KUBEWARDEN_WORKERS")
        .and_then(|e| e["value"].as_str()?.parse().ok());
    let dir = scratch_dir("controller");
    let mut env = Vec::new();
    if let Some(secret) = spec["imagePullSecret"].as_str() {
        let object = plane.get_json(&["secret", "-n", how.namespace, secret]);
        let encoded = object["data"][".dockerconfigjson"]
            .as_str()
            .unwrap_or_else(|| {
                panic!("Secret {secret} has no .dockerconfigjson: the controller refuses it")
            });
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .expect("the docker config's base64");
        // The Secret's `.dockerconfigjson` mounted as `config.json` in a folder, the variable
        // naming the folder (`configureImagePullSecret` in policyserver_controller_deployment.go).
        std::fs::write(dir.join("config.json"), decoded).expect("config.json");
        env.push((
            "KUBEWARDEN_DOCKER_CONFIG_JSON_PATH",
            dir.to_str().expect("a UTF-8 path"),
        ));
    }
    let policies_yml = Value::Object(entries).to_string();
    PolicyServer::start(
        how.tools,
        &policies_yml,
        PolicyServerOptions {
            sources: Some(&sources),
            workers,
            policy_timeout: timeout,
            env,
            ..PolicyServerOptions::default()
        },
    )
}

/// The webhook configuration the controller writes for `policy`, served by `server`.
fn webhook(policy: &Value, server: &PolicyServer, namespace: &str) -> Value {
    use base64::engine::general_purpose::STANDARD;
    let spec = &policy["spec"];
    let policy_id = id(&name(policy));
    let mut expressions = vec![json!({"key": "kubernetes.io/metadata.name",
        "operator": "NotIn", "values": [namespace]})];
    expressions.extend(
        spec["namespaceSelector"]["matchExpressions"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
    );
    let mut hook = json!({
        "name": format!("{policy_id}.kubewarden.admission"),
        "clientConfig": {"url": server.url(&policy_id), "caBundle": STANDARD.encode(&server.cert_pem)},
        "rules": spec["rules"],
        "failurePolicy": spec["failurePolicy"].as_str().unwrap_or("Fail"),
        "matchPolicy": spec["matchPolicy"].as_str().unwrap_or("Equivalent"),
        "namespaceSelector": {"matchExpressions": expressions},
        "sideEffects": spec["sideEffects"].as_str().unwrap_or("None"),
        "timeoutSeconds": spec["timeoutSeconds"].as_u64().unwrap_or(10),
        "admissionReviewVersions": ["v1"],
    });
    if spec["objectSelector"].is_object() {
        hook["objectSelector"] = spec["objectSelector"].clone();
    }
    let kind = if spec["mutating"].as_bool().unwrap_or(false) {
        "MutatingWebhookConfiguration"
    } else {
        "ValidatingWebhookConfiguration"
    };
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": policy_id, "labels": {"app.kubernetes.io/part-of": "kubewarden"}},
        "webhooks": [hook],
    })
}

/// The policy's status as the controller writes it once its webhook is in place.
fn mark_active(plane: &ControlPlane, policy: &str) {
    let now = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .expect("date");
    let now = String::from_utf8_lossy(&now.stdout).trim().to_string();
    let status = json!({"status": {"policyStatus": "active", "conditions": [{
        "type": "PolicyActive", "status": "True", "reason": "PolicyActive",
        "message": "the policy webhook is registered", "lastTransitionTime": now}]}});
    plane.kubectl_ok(
        &[
            "patch",
            "clusteradmissionpolicy",
            policy,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ],
        None,
    );
}
