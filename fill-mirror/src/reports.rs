//! The check role's reports: where they are read (the cluster's Reports and PolicyReports, or
//! files), and which of the copies their `fail` results name the fill job runs. Anyone who may
//! write a report in a namespace can write its message, so a copy runs only when it is the
//! check policy's own result, in a report about a live Pod of a namespace that policy covers,
//! and names an image that Pod runs; a signature copy then carries the image it signs, so that
//! it is refused as a record's is once the source's tag names another digest.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context;
use image_swapper_policy::decide::images::source_image;
use image_swapper_policy::plan::{Copy, copies_in_message, report_copy_problem};
use image_swapper_policy::policy::Policy;
use image_swapper_policy::reference::Reference;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, Client};
use serde_json::Value;

use crate::coverage::Coverage;
use crate::source::policy_resource;

/// A copy a report names, with what a record's copy carries: for a signature, the image it
/// signs as the source names it (by tag, or pinned), so that the copy is refused when that
/// tag has moved on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportCopy {
    pub copy: Copy,
    pub signs: Option<String>,
    /// The namespace of the report (and of its Pod): who asks for the copy.
    pub namespace: String,
}

/// What a report's copies are checked against: the Pods it may be about (`namespace/name`),
/// and which namespaces the check policy covers (none: every namespace, reports from files).
pub struct Guards {
    pub pods: BTreeMap<String, Value>,
    pub coverage: Option<Coverage>,
}

/// The report kinds Kubewarden's audit scanner writes about a namespaced resource
/// (kubewarden-controller `internal/audit-scanner/report`: one report per resource, named by
/// its uid, `scope` the resource): OpenReports (the Helm chart's default) and wgpolicyk8s.io
/// PolicyReports. The check role audits Pods, so its results are never in a cluster-wide report,
/// and those are not read.
fn report_resources() -> [ApiResource; 2] {
    let kind = |group: &str, version: &str, kind: &str, plural: &str| {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    };
    [
        kind("openreports.io", "v1alpha1", "Report", "reports"),
        kind(
            "wgpolicyk8s.io",
            "v1alpha2",
            "PolicyReport",
            "policyreports",
        ),
    ]
}

/// Every report in the cluster, as JSON. A kind the cluster does not serve (its CRD not
/// installed: 404) is none; any other error is the run's.
pub async fn reports_from_cluster(client: &Client) -> anyhow::Result<Vec<Value>> {
    let mut reports = Vec::new();
    for resource in report_resources() {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        match api.list(&ListParams::default()).await {
            Ok(list) => {
                for report in list.items {
                    // A DynamicObject serialises with its fields flattened beside its metadata.
                    let mut value = serde_json::to_value(&report)?;
                    value["kind"] = Value::from(resource.kind.clone());
                    reports.push(value);
                }
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                tracing::debug!(kind = %resource.kind, "the cluster serves no such report kind");
            }
            Err(error) => {
                return Err(error).with_context(|| format!("listing the {}s", resource.kind));
            }
        }
    }
    Ok(reports)
}

/// The reports from `kubectl get ... -o json` output files (lists or single objects).
pub fn reports_from_files(paths: &[String]) -> anyhow::Result<Vec<Value>> {
    let mut reports = Vec::new();
    for path in paths {
        let text = std::fs::read(path).with_context(|| format!("--reports {path}: cannot read"))?;
        let stream = serde_json::Deserializer::from_slice(&text).into_iter::<Value>();
        for document in stream {
            let document = document.with_context(|| {
                format!("--reports {path}: not JSON (kubectl get policyreports -o json output)")
            })?;
            match document.get("items").and_then(Value::as_array) {
                Some(items) => reports.extend(items.iter().cloned()),
                None => reports.push(document),
            }
        }
    }
    Ok(reports)
}

fn text<'v>(value: &'v Value, pointer: &str) -> &'v str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Whether a report has a `fail` result of the check policy (`ids`): only those are read.
fn has_finding(report: &Value, ids: &[String]) -> bool {
    report
        .get("results")
        .and_then(Value::as_array)
        .is_some_and(|results| {
            results.iter().any(|result| {
                ids.iter().any(|id| id == text(result, "/policy"))
                    && text(result, "/result") == "fail"
            })
        })
}

/// The guards of the reports with a finding, from the cluster: the check policy's
/// `namespaceSelector` (its ClusterAdmissionPolicy `check_policy`), the labels of the reports'
/// namespaces, and the Pods the reports are about, each read once.
pub async fn guards_from_cluster(
    client: &Client,
    reports: &[Value],
    ids: &[String],
    check_policy: &str,
) -> anyhow::Result<Guards> {
    let about: BTreeSet<(String, String)> = reports
        .iter()
        .filter(|report| has_finding(report, ids))
        .map(|report| {
            (
                text(report, "/metadata/namespace").to_string(),
                text(report, "/scope/name").to_string(),
            )
        })
        .filter(|(namespace, name)| !namespace.is_empty() && !name.is_empty())
        .collect();
    let mut guards = Guards {
        pods: BTreeMap::new(),
        coverage: Some(Coverage::default()),
    };
    let Some(coverage) = guards.coverage.as_mut().filter(|_| !about.is_empty()) else {
        return Ok(guards);
    };
    let policies: Api<DynamicObject> = Api::all_with(client.clone(), &policy_resource());
    let check = policies
        .get(check_policy)
        .await
        .with_context(|| format!("reading the check policy's ClusterAdmissionPolicy {check_policy}: its reports are read only in the namespaces it covers"))?;
    if let Err(error) = coverage.follow(&serde_json::to_value(&check)?) {
        tracing::error!(policy = %check_policy, %error, "cannot read which namespaces the check policy covers; no report is read until it can be");
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespaces = namespaces
        .list(&ListParams::default())
        .await
        .context("listing the namespaces")?;
    for namespace in namespaces.items {
        let name = namespace.metadata.name.unwrap_or_default();
        coverage.namespace_seen(&name, namespace.metadata.labels.unwrap_or_default());
    }
    for (namespace, name) in about {
        let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        if let Some(pod) = api
            .get_opt(&name)
            .await
            .with_context(|| format!("reading the Pod {namespace}/{name}"))?
        {
            let key = format!("{namespace}/{name}");
            guards.pods.insert(key, serde_json::to_value(&pod)?);
        }
    }
    Ok(guards)
}

/// The guards of reports read from files: the Pods of `--pods` files; every namespace.
pub fn guards_from_pods(pods: &[Value]) -> Guards {
    let pods = pods
        .iter()
        .map(|pod| (image_swapper_policy::plan::pod_key(pod), pod.clone()))
        .collect();
    Guards {
        pods,
        coverage: None,
    }
}

/// Why a report is not about a live Pod of a namespace the check policy covers, or the Pod.
fn report_pod<'g>(report: &Value, guards: &'g Guards) -> Result<&'g Value, String> {
    let namespace = text(report, "/metadata/namespace");
    if namespace.is_empty() {
        return Err("it is cluster-wide, and the check policy reports on Pods".into());
    }
    if text(report, "/scope/kind") != "Pod" {
        return Err(format!(
            "its scope is {:?}, not a Pod",
            report.get("scope").cloned().unwrap_or_default().to_string()
        ));
    }
    let scope_namespace = text(report, "/scope/namespace");
    if !scope_namespace.is_empty() && scope_namespace != namespace {
        return Err(format!(
            "its scope's namespace {scope_namespace} is not its own"
        ));
    }
    if let Some(coverage) = &guards.coverage
        && !coverage.covers(namespace)
    {
        return Err(format!(
            "the check policy does not cover its namespace {namespace}"
        ));
    }
    let key = format!("{namespace}/{}", text(report, "/scope/name"));
    let Some(pod) = guards.pods.get(&key) else {
        return Err(format!("the Pod {key} it is about does not exist"));
    };
    let uid = text(report, "/scope/uid");
    if !uid.is_empty() && uid != text(pod, "/metadata/uid") {
        return Err(format!(
            "the Pod {key} it is about is another Pod now (uid {uid})"
        ));
    }
    Ok(pod)
}

/// The images a Pod's containers of every kind run.
fn pod_images(pod: &Value) -> Vec<&str> {
    ["containers", "initContainers", "ephemeralContainers"]
        .iter()
        .filter_map(|list| pod.pointer(&format!("/spec/{list}"))?.as_array())
        .flatten()
        .filter_map(|container| container.get("image")?.as_str())
        .collect()
}

/// The digest a cosign signature tag (`repository:sha256-<hex>.sig`) names, when it is one.
fn signature_digest(reference: &str) -> Option<String> {
    let (_, tag) = reference.rsplit_once(':')?;
    let hex = tag.strip_prefix("sha256-")?.strip_suffix(".sig")?;
    Some(format!("sha256:{hex}"))
}

/// What of an image a copy needs: its mirror repository, and its tag and digest; `None` when
/// no rule routes it and it is no mirror image.
struct Named {
    repositories: Vec<String>,
    tag: Option<String>,
    digest: Option<String>,
}

fn named(image: &str, policy: &Policy) -> Option<Named> {
    let (repositories, reference) = match source_image(image, policy) {
        Some(source) => (
            source
                .targets
                .iter()
                .map(|t| t.repository().to_string())
                .collect(),
            Reference::parse(&source.source).ok()?,
        ),
        // A Pod the swapper swapped names the mirror's image.
        None => {
            let reference = Reference::parse(image).ok()?;
            (vec![reference.name().to_string()], reference)
        }
    };
    Some(Named {
        repositories,
        tag: reference.tag().map(str::to_string),
        digest: reference.digest().map(str::to_string),
    })
}

/// Whether `pod` runs the image `copy` fills (checked as the policy writes it), and for a
/// signature the image it signs as the source names it; or why not. The copy's mirror
/// repository is one an image of the Pod is routed to (or, swapped, is under); a copy by digest
/// or a signature names the digest the image pins, when it pins one; a copy by tag names its
/// tag.
fn pod_runs(pod: &Value, copy: &Copy, policy: &Policy) -> Result<Option<String>, String> {
    let repository = |reference: &str| {
        Reference::parse(reference)
            .map(|r| r.name().to_string())
            .unwrap_or_default()
    };
    let (source_repository, destination_repository) =
        (repository(&copy.source), repository(&copy.destination));
    let source = Reference::parse(&copy.source).ok();
    let signed = signature_digest(&copy.source);
    let by_digest = source.as_ref().and_then(|s| s.digest()).map(str::to_string);
    let by_tag = source.as_ref().and_then(|s| s.tag()).map(str::to_string);
    for image in pod_images(pod) {
        let Some(named) = named(image, policy) else {
            continue;
        };
        if !named.repositories.contains(&destination_repository) {
            continue;
        }
        let pins = |digest: &str| named.digest.as_deref().is_none_or(|d| d == digest);
        let found = match (&signed, &by_digest) {
            // Pinned, the Pod runs that digest; by tag, the tag must name it when copied.
            (Some(signed), _) if pins(signed) => match (&named.digest, &named.tag) {
                (Some(digest), _) => Some(Some(format!("{source_repository}@{digest}"))),
                (None, Some(tag)) => Some(Some(format!("{source_repository}:{tag}"))),
                (None, None) => None,
            },
            (None, Some(digest)) if named.digest.as_deref() == Some(digest.as_str()) => Some(None),
            (None, None) if named.digest.is_none() && named.tag == by_tag => Some(None),
            _ => None,
        };
        if let Some(signs) = found {
            return Ok(signs);
        }
    }
    Err(format!(
        "fills no image its Pod runs ({})",
        pod_images(pod).join(", ")
    ))
}

/// The copies the check policy's `fail` results name (an `error` is an image it could not
/// check, and carries no finding), each checked by the policy crate as the check role writes
/// it and against the Pod the report is about; and one note for each copy or report refused or
/// not well formed, none of it run.
pub fn report_copies(
    reports: &[Value],
    ids: &[String],
    policy: &Policy,
    guards: &Guards,
) -> (Vec<ReportCopy>, Vec<String>) {
    let mut copies = Vec::new();
    let mut notes = Vec::new();
    for report in reports.iter().filter(|report| has_finding(report, ids)) {
        let place = format!(
            "{} {}/{}",
            report
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("report"),
            text(report, "/metadata/namespace"),
            text(report, "/metadata/name")
        );
        let pod = match report_pod(report, guards) {
            Ok(pod) => pod,
            Err(why) => {
                notes.push(format!("refused {place}: {why}, none of it run"));
                continue;
            }
        };
        let results = report.get("results").and_then(Value::as_array);
        for (i, result) in results.into_iter().flatten().enumerate() {
            let id = text(result, "/policy");
            if !ids.iter().any(|own| own == id) || text(result, "/result") != "fail" {
                continue;
            }
            let Some(message) = result.get("message").and_then(Value::as_str) else {
                notes.push(format!(
                    "skipped {place}: results[{i}] of {id}: its message is not a string, not read"
                ));
                continue;
            };
            for copy in copies_in_message(message) {
                let checked = match report_copy_problem(&copy, policy) {
                    None => pod_runs(pod, &copy, policy),
                    Some(problem) => Err(format!("is not the policy's own: {problem}")),
                };
                match checked {
                    Ok(signs) => copies.push(ReportCopy {
                        copy: copy.under(policy, None),
                        signs,
                        namespace: text(report, "/metadata/namespace").to_string(),
                    }),
                    Err(why) => notes.push(format!(
                        "refused {place} results[{i}] of {id}: its copy docker://{} docker://{} {why}, not run",
                        copy.source, copy.destination
                    )),
                }
            }
        }
    }
    (copies, notes)
}
