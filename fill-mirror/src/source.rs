//! Where the fill job reads from: the swapping policy's settings (its ClusterAdmissionPolicy,
//! or a file), the Pods that carry the record (the cluster, or `kubectl get pods -o json`
//! output), and each Pod's record read by the policy crate's own reader. The check role's
//! reports are read in `reports.rs`.

use std::collections::BTreeSet;
use std::time::SystemTime;

use anyhow::{Context, bail};
use image_swapper_policy::plan::{Copy, FillRecord, pod_key, read_record};
use image_swapper_policy::plan::{UNMIRRORED_ANNOTATION, UNMIRRORED_LABEL};
use image_swapper_policy::policy::Policy;
use image_swapper_policy::settings::parse_settings;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, Client};
use serde_json::Value;

/// The ClusterAdmissionPolicy kind, as Kubewarden's CRD serves it.
pub fn policy_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("policies.kubewarden.io", "v1", "ClusterAdmissionPolicy"),
        "clusteradmissionpolicies",
    )
}

/// The label selector of the Pods that carry the record.
pub fn record_selector() -> String {
    format!("{UNMIRRORED_LABEL}=true")
}

/// The policy from a settings document: the settings themselves, or a policy object whose
/// `spec.settings` they are.
pub fn policy_from_document(document: &Value, origin: &str) -> anyhow::Result<Policy> {
    let settings = match document.get("spec") {
        Some(spec) => spec.get("settings").cloned().unwrap_or(Value::Null),
        None => document.clone(),
    };
    let bytes = serde_json::to_vec(&settings)?;
    let settings = parse_settings(&bytes)
        .map_err(|error| anyhow::anyhow!("the swapping policy's settings ({origin}): {error}"))?;
    Policy::from_settings(&settings)
        .map_err(|error| anyhow::anyhow!("the swapping policy's settings ({origin}): {error}"))
}

pub fn policy_from_file(path: &str) -> anyhow::Result<Policy> {
    let text = std::fs::read(path).with_context(|| format!("--settings {path}: cannot read"))?;
    let document: Value =
        serde_json::from_slice(&text).with_context(|| format!("--settings {path}: not JSON"))?;
    policy_from_document(&document, path)
}

pub async fn policy_from_cluster(client: &Client, name: &str) -> anyhow::Result<Policy> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &policy_resource());
    let object = api
        .get(name)
        .await
        .with_context(|| format!("reading the ClusterAdmissionPolicy {name}"))?;
    policy_from_document(
        &serde_json::to_value(&object)?,
        &format!("ClusterAdmissionPolicy {name}"),
    )
}

/// The Pods as JSON, from `kubectl get pods -o json` output files (a list or single objects).
pub fn pods_from_files(paths: &[String]) -> anyhow::Result<Vec<Value>> {
    let mut pods = Vec::new();
    for path in paths {
        let text = std::fs::read(path).with_context(|| format!("--pods {path}: cannot read"))?;
        let stream = serde_json::Deserializer::from_slice(&text).into_iter::<Value>();
        for document in stream {
            let document = document.with_context(|| {
                format!("--pods {path}: not JSON (kubectl get pods -o json output)")
            })?;
            match document.get("items").and_then(Value::as_array) {
                Some(items) => pods.extend(items.iter().cloned()),
                None => pods.push(document),
            }
        }
    }
    Ok(pods)
}

pub async fn pods_from_cluster(client: &Client) -> anyhow::Result<Vec<Value>> {
    let api: Api<Pod> = Api::all(client.clone());
    let list = api
        .list(&ListParams::default().labels(&record_selector()))
        .await
        .context("listing the Pods that carry the record")?;
    list.items
        .iter()
        .map(|pod| serde_json::to_value(pod).context("a Pod as JSON"))
        .collect()
}

/// When the Pod was created: when admission wrote its record.
pub fn created(pod: &Value) -> Option<SystemTime> {
    let text = pod.pointer("/metadata/creationTimestamp")?.as_str()?;
    let time: k8s_openapi::jiff::Timestamp = text.parse().ok()?;
    Some(SystemTime::from(time))
}

/// Each Pod's record read against the policy: the records, and every note, each once.
pub fn records(pods: &[Value], policy: &Policy) -> Vec<(String, FillRecord, Option<SystemTime>)> {
    pods.iter()
        .filter(|pod| {
            pod.pointer("/metadata/annotations")
                .and_then(|a| a.get(UNMIRRORED_ANNOTATION))
                .is_some()
        })
        .filter_map(|pod| Some((pod_key(pod), read_record(pod, policy)?, created(pod))))
        .collect()
}

/// The distinct copies of the records, in order: what `list` prints.
pub fn copies(records: &[(String, FillRecord, Option<SystemTime>)]) -> Vec<Copy> {
    let mut seen = BTreeSet::new();
    records
        .iter()
        .flat_map(|(_, record, _)| record.entries.iter())
        .flat_map(|entry| std::iter::once(&entry.copy).chain(entry.signature.as_ref()))
        .filter(|copy| seen.insert(copy.destination.clone()))
        .cloned()
        .collect()
}

/// A client from the environment (in-cluster, or KUBECONFIG).
pub async fn client() -> anyhow::Result<Client> {
    match Client::try_default().await {
        Ok(client) => Ok(client),
        Err(error) => bail!("no Kubernetes client: {error}"),
    }
}

/// The check policy's ids in the reports' results, for a ClusterAdmissionPolicy `name`:
/// `clusterwide-<name>` before Kubewarden 1.37.2, `kw.cap.<name>` from it on.
pub fn check_policy_ids(name: &str) -> Vec<String> {
    vec![format!("clusterwide-{name}"), format!("kw.cap.{name}")]
}
