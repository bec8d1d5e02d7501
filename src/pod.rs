//! One admission: which containers of the Pod to look at, one decision per distinct image, and
//! the mutated Pod.
//!
//! The Pod stays JSON: a typed model would drop the fields it does not know, and the patch
//! computed from the mutated object would then delete them from the Pod.

use std::collections::BTreeMap;
use std::time::Duration;

use kubewarden_policy_sdk::request::KubernetesAdmissionRequest;
use serde_json::{Map, Value, json};

use crate::budget::{BudgetReport, Budgeted, Clock};
use crate::decide::{
    Decision, LookupError, Manifest, Note, Reason, Registry, decide, quote, truncated,
};
use crate::policy::{Fallback, Policy};
use crate::rules::Router;

/// The annotation that records, for each swapped container, the image the Pod asked for.
pub const ORIGINAL_IMAGES_ANNOTATION: &str = "image-swapper.kubewarden.io/original-images";

/// The kubelet's mark on the mirror Pod of a static Pod: the node runs the manifest file, never
/// this API object, so changing its images would only misreport what runs.
pub const STATIC_POD_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The container lists, in the order their images are looked up.
const CONTAINER_LISTS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];

/// What to answer the API server.
#[derive(Debug, PartialEq)]
pub struct Outcome {
    pub verdict: Verdict,
    /// For the user (kubectl prints them).
    pub warnings: Vec<String>,
    /// For the API server's audit log: keys are name parts the API server prefixes with the
    /// webhook's name; values are JSON text.
    pub audit: BTreeMap<String, String>,
}

#[derive(Debug, PartialEq)]
pub enum Verdict {
    Accept,
    Mutate(Value),
    Reject(String),
}

impl Outcome {
    /// Accepted, unchanged, nothing to say.
    pub fn unchanged() -> Outcome {
        Outcome {
            verdict: Verdict::Accept,
            warnings: Vec::new(),
            audit: BTreeMap::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operation {
    Create,
    Update,
    /// `pods/ephemeralcontainers`: the API server keeps only `ephemeralContainers` of the object.
    EphemeralContainers,
}

impl Operation {
    /// Whether the API server keeps metadata changes from this request: it keeps nothing but
    /// `ephemeralContainers` from a `pods/ephemeralcontainers` one.
    fn may_change_metadata(self) -> bool {
        self != Operation::EphemeralContainers
    }
}

/// A container whose image this admission may change.
struct Candidate<'o> {
    list: &'static str,
    index: usize,
    name: &'o str,
    image: &'o str,
    /// Its image in `oldObject`, on update.
    old_image: Option<&'o str>,
}

/// A container image this admission rewrites.
struct Swap {
    list: &'static str,
    index: usize,
    name: String,
    original: String,
    image: String,
    pull_secret: Option<String>,
    /// Put back to the swap recorded for it: a re-applied manifest re-sent the original.
    reapplied: bool,
}

/// What the decisions say of the candidates.
#[derive(Default)]
struct Verdicts {
    swaps: Vec<Swap>,
    /// One note per distinct image kept, rejected, or swapped with a warning, in lookup order.
    kept: Vec<(String, Note)>,
    rejected: Vec<(String, Note)>,
    swapped_with_note: Vec<(String, Note)>,
}

/// Takes the request by value: the mutated Pod is the request's own object, changed in place,
/// so a large Pod is neither copied nor compared.
pub fn admit(
    mut request: KubernetesAdmissionRequest,
    policy: &Policy,
    registry: &mut impl Registry,
    clock: &impl Clock,
) -> Outcome {
    if request.kind.kind != "Pod" || !request.kind.group.is_empty() {
        return Outcome::unchanged();
    }
    let operation = match (request.operation.as_str(), request.sub_resource.as_str()) {
        ("CREATE", "") => Operation::Create,
        ("UPDATE", "") => Operation::Update,
        ("UPDATE", "ephemeralcontainers") => Operation::EphemeralContainers,
        _ => return Outcome::unchanged(),
    };
    if annotation(&request.object, STATIC_POD_MIRROR_ANNOTATION).is_some() {
        return Outcome::unchanged();
    }
    let old = match operation {
        Operation::Create => None,
        _ => Some(&request.old_object),
    };
    let candidates = candidates(&request.object, old);
    if candidates.is_empty() {
        return Outcome::unchanged();
    }
    // The live Pod's record: what this policy swapped, and from what.
    let recorded = match operation {
        Operation::Update => recorded_originals(&request.old_object),
        _ => BTreeMap::new(),
    };
    let existing_secrets = pull_secret_names(&request.object);
    let limit = Duration::from_millis(policy.lookup_budget_ms);
    let mut budgeted = Budgeted::new(registry, clock, limit);
    let verdicts = decide_all(
        &candidates,
        operation,
        &existing_secrets,
        &recorded,
        policy,
        &mut budgeted,
    );
    let report = budgeted.report();
    let (warnings, rejections) = messages(&verdicts, policy, &report);
    let audit = audit_annotations(&verdicts, &report);
    if !rejections.is_empty() {
        let message = match rejections.len() {
            1 => rejections.into_iter().next().unwrap_or_default(),
            n => format!(
                "{n} images cannot be admitted: {}",
                capped(rejections, "images").join("; ")
            ),
        };
        return Outcome {
            verdict: Verdict::Reject(message),
            warnings,
            audit,
        };
    }
    let mut object = std::mem::take(&mut request.object);
    let mut changed = false;
    for swap in &verdicts.swaps {
        if let Some(container) = container_mut(&mut object, swap.list, swap.index) {
            container.insert("image".to_string(), Value::String(swap.image.clone()));
            changed = true;
        }
    }
    if operation.may_change_metadata() {
        changed |= record_original_images(&mut object, &verdicts.swaps, &policy.router);
    }
    if operation == Operation::Create {
        let secrets = verdicts
            .swaps
            .iter()
            .filter_map(|s| s.pull_secret.as_deref());
        changed |= add_pull_secrets(&mut object, secrets, &existing_secrets);
    }
    let verdict = if changed {
        Verdict::Mutate(object)
    } else {
        Verdict::Accept
    };
    Outcome {
        verdict,
        warnings,
        audit,
    }
}

/// One decision per distinct image, in container order, and what it means for each container.
fn decide_all(
    candidates: &[Candidate<'_>],
    operation: Operation,
    existing_secrets: &[String],
    recorded: &BTreeMap<String, String>,
    policy: &Policy,
    registry: &mut impl Registry,
) -> Verdicts {
    let mut registry = LookOnce::new(registry);
    let mut decisions: BTreeMap<&str, Decision> = BTreeMap::new();
    let mut verdicts = Verdicts::default();
    for candidate in candidates {
        // `kubectl apply` re-sends the image the user wrote while the live Pod runs its swap:
        // keep the running image (no lookup, no restart) when the record and the old image
        // agree. The record alone never decides.
        if let Some(old_image) = candidate.old_image
            && recorded.get(candidate.name).map(String::as_str) == Some(candidate.image)
            && policy.router.is_swap_of(candidate.image, old_image)
        {
            verdicts.swaps.push(Swap {
                list: candidate.list,
                index: candidate.index,
                name: candidate.name.to_string(),
                original: candidate.image.to_string(),
                image: old_image.to_string(),
                pull_secret: None,
                reapplied: true,
            });
            continue;
        }
        let decision = match decisions.get(candidate.image) {
            Some(decision) => decision,
            None => {
                let decision = decide(candidate.image, policy, &mut registry);
                let decision =
                    check_pull_secret(decision, candidate.image, operation, existing_secrets);
                let image = candidate.image.to_string();
                match &decision {
                    Decision::Keep(note) => verdicts.kept.push((image, note.clone())),
                    Decision::Reject(note) => verdicts.rejected.push((image, note.clone())),
                    Decision::Swap {
                        note: Some(note), ..
                    } => verdicts.swapped_with_note.push((image, note.clone())),
                    _ => {}
                }
                decisions.entry(candidate.image).or_insert(decision)
            }
        };
        if let Decision::Swap {
            image, pull_secret, ..
        } = decision
            && image != candidate.image
        {
            verdicts.swaps.push(Swap {
                list: candidate.list,
                index: candidate.index,
                name: candidate.name.to_string(),
                original: candidate.image.to_string(),
                image: image.clone(),
                pull_secret: pull_secret.clone(),
                reapplied: false,
            });
        }
    }
    verdicts
}

/// The warnings and the rejection reasons, one per distinct image, except that the images the
/// budget left unlooked-up share one message that names the budget.
fn messages(
    verdicts: &Verdicts,
    policy: &Policy,
    report: &BudgetReport,
) -> (Vec<String>, Vec<String>) {
    let over_budget = |(_, note): &&(String, Note)| note.reason == Reason::Budget;
    let mut warnings: Vec<String> = verdicts
        .swapped_with_note
        .iter()
        .chain(&verdicts.kept)
        .filter(|entry| !over_budget(entry))
        .map(|(_, note)| note.text.clone())
        .collect();
    let mut rejections: Vec<String> = verdicts
        .rejected
        .iter()
        .filter(|entry| !over_budget(entry))
        .map(|(_, note)| note.text.clone())
        .collect();
    let budget_images: Vec<&str> = verdicts
        .kept
        .iter()
        .chain(&verdicts.rejected)
        .filter(over_budget)
        .map(|(image, _)| image.as_str())
        .collect();
    if !budget_images.is_empty() {
        let message = budget_message(&budget_images, policy.on_lookup_error, report);
        match policy.on_lookup_error {
            Fallback::Keep => warnings.push(message),
            Fallback::Reject => rejections.push(message),
        }
    }
    (capped(warnings, "images not swapped"), rejections)
}

/// "lookup budget of 800 ms spent: 812 ms on 2 lookups (slowest 406 ms); 28 images were not
/// looked up or compared and were kept as they were (onLookupError is keep): "a", "b", …"
fn budget_message(images: &[&str], action: Fallback, report: &BudgetReport) -> String {
    const NAMED: usize = 5;
    let mut named: Vec<String> = images.iter().take(NAMED).map(|i| quote(i)).collect();
    if images.len() > NAMED {
        named.push(format!("and {} more", images.len() - NAMED));
    }
    let count = match images.len() {
        1 => "1 image was".to_string(),
        n => format!("{n} images were"),
    };
    let lookups = match report.lookups {
        1 => "1 lookup".to_string(),
        n => format!("{n} lookups"),
    };
    let outcome = match action {
        Fallback::Keep => "kept as they were",
        Fallback::Reject => "refused",
    };
    format!(
        "lookup budget of {} ms spent: {} ms on {lookups} (slowest {} ms); {count} not looked up or compared in time and {outcome} (onLookupError is {}): {}",
        report.limit_ms(),
        report.spent_ms(),
        report.slowest_ms(),
        action.as_str(),
        named.join(", ")
    )
}

/// The most entries listed under one audit annotation key; the summary counts them all.
const AUDITED_MAX: usize = 20;
/// The longest image or container name quoted in an audit annotation.
const AUDITED_CHARS_MAX: usize = 200;

/// What the admission did, for the API server's audit log: `swapped` (container, from, to),
/// `kept` and `rejected` (image, reason code), and a `summary` with the counts and the
/// lookups' time. Empty when there is nothing to report.
fn audit_annotations(verdicts: &Verdicts, report: &BudgetReport) -> BTreeMap<String, String> {
    let mut audit = BTreeMap::new();
    if verdicts.swaps.is_empty()
        && verdicts.kept.is_empty()
        && verdicts.rejected.is_empty()
        && report.lookups == 0
    {
        return audit;
    }
    let cut = |text: &str| truncated(text, AUDITED_CHARS_MAX);
    let notes: BTreeMap<&str, &Note> = verdicts
        .swapped_with_note
        .iter()
        .map(|(image, note)| (image.as_str(), note))
        .collect();
    let swapped: Vec<Value> = verdicts
        .swaps
        .iter()
        .take(AUDITED_MAX)
        .map(|swap| {
            let mut entry = json!({
                "container": cut(&swap.name),
                "from": cut(&swap.original),
                "to": cut(&swap.image),
            });
            if swap.reapplied {
                entry["reapplied"] = json!(true);
            }
            if let Some(note) = notes.get(swap.original.as_str()) {
                entry["reason"] = json!(note.reason.code());
            }
            entry
        })
        .collect();
    let by_image = |list: &[(String, Note)]| -> Vec<Value> {
        list.iter()
            .take(AUDITED_MAX)
            .map(|(image, note)| json!({"image": cut(image), "reason": note.reason.code()}))
            .collect()
    };
    for (key, entries) in [
        ("swapped", swapped),
        ("kept", by_image(&verdicts.kept)),
        ("rejected", by_image(&verdicts.rejected)),
    ] {
        if !entries.is_empty() {
            audit.insert(key.to_string(), Value::Array(entries).to_string());
        }
    }
    let summary = json!({
        "swapped": verdicts.swaps.len(),
        "kept": verdicts.kept.len(),
        "rejected": verdicts.rejected.len(),
        "lookups": report.lookups,
        "lookupMilliseconds": report.spent_ms(),
        "budgetMilliseconds": report.limit_ms(),
        "notLookedUp": report.refused,
    });
    audit.insert("summary".to_string(), summary.to_string());
    audit
}

fn container_list<'v>(object: &'v Value, list: &str) -> Option<&'v Vec<Value>> {
    object.get("spec")?.get(list)?.as_array()
}

fn container_mut<'v>(
    object: &'v mut Value,
    list: &str,
    index: usize,
) -> Option<&'v mut Map<String, Value>> {
    object
        .get_mut("spec")?
        .get_mut(list)?
        .get_mut(index)?
        .as_object_mut()
}

fn annotation<'v>(object: &'v Value, key: &str) -> Option<&'v str> {
    object
        .get("metadata")?
        .get("annotations")?
        .get(key)?
        .as_str()
}

/// The original-images annotation of `object`, read as container name to image; an entry that
/// is not a string, or an annotation that is not JSON, records nothing.
fn recorded_originals(object: &Value) -> BTreeMap<String, String> {
    let Some(text) = annotation(object, ORIGINAL_IMAGES_ANNOTATION) else {
        return BTreeMap::new();
    };
    match serde_json::from_str::<Map<String, Value>>(text) {
        Ok(entries) => entries
            .into_iter()
            .filter_map(|(name, image)| Some((name, image.as_str()?.to_string())))
            .collect(),
        Err(_) => BTreeMap::new(),
    }
}

/// Kubernetes truncates long warning lists; past this many entries, the rest are counted.
const LISTED_MAX: usize = 20;

fn capped(mut items: Vec<String>, what: &str) -> Vec<String> {
    if items.len() > LISTED_MAX {
        let more = items.len() - LISTED_MAX;
        items.truncate(LISTED_MAX);
        items.push(format!("… and {more} more {what}"));
    }
    items
}

/// The containers to decide on, in lookup order. On update, only containers whose image
/// changed, and ephemeral containers that were added: changing the image of a running container
/// restarts it, so an update that did not touch an image must not touch it either.
fn candidates<'o>(object: &'o Value, old: Option<&'o Value>) -> Vec<Candidate<'o>> {
    let mut candidates = Vec::new();
    for list in CONTAINER_LISTS {
        let Some(containers) = container_list(object, list) else {
            continue;
        };
        // Name to image in the old Pod, so that the comparison stays linear in the containers.
        let old_images: BTreeMap<&str, &str> = old
            .and_then(|old| container_list(old, list))
            .into_iter()
            .flatten()
            .filter_map(|o| Some((o.get("name")?.as_str()?, o.get("image")?.as_str()?)))
            .collect();
        for (index, container) in containers.iter().enumerate() {
            let name = container
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let Some(image) = container.get("image").and_then(Value::as_str) else {
                continue;
            };
            let old_image = old_images.get(name).copied();
            if old.is_none() || old_image != Some(image) {
                candidates.push(Candidate {
                    list,
                    index,
                    name,
                    image,
                    old_image,
                });
            }
        }
    }
    candidates
}

/// On update and for ephemeral containers the API server refuses new `imagePullSecrets`: a mirror
/// that needs a secret the Pod lacks would only turn into ImagePullBackOff.
fn check_pull_secret(
    decision: Decision,
    image: &str,
    operation: Operation,
    existing: &[String],
) -> Decision {
    match decision {
        Decision::Swap {
            image: target,
            pull_secret: Some(secret),
            ..
        } if operation != Operation::Create && !existing.contains(&secret) => {
            Decision::Keep(Note {
                reason: Reason::NoPullSecret,
                text: format!(
                    "image {}: kept, not swapped to {}: that mirror needs imagePullSecret {secret:?}, which the Pod lacks and which cannot be added after creation",
                    quote(image),
                    quote(&target)
                ),
            })
        }
        other => other,
    }
}

fn pull_secret_names(object: &Value) -> Vec<String> {
    object
        .get("spec")
        .and_then(|spec| spec.get("imagePullSecrets"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|secret| {
            secret
                .get("name")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .collect()
}

/// Appends the secrets the Pod lacks, once each; says whether it changed the Pod.
fn add_pull_secrets<'s>(
    object: &mut Value,
    secrets: impl Iterator<Item = &'s str>,
    existing: &[String],
) -> bool {
    let mut added: Vec<&str> = Vec::new();
    for secret in secrets {
        if !existing.iter().any(|e| e == secret) && !added.contains(&secret) {
            added.push(secret);
        }
    }
    let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else {
        return false;
    };
    if added.is_empty() {
        return false;
    }
    let list = spec
        .entry("imagePullSecrets")
        .or_insert_with(|| Value::Array(Vec::new()));
    if !list.is_array() {
        *list = Value::Array(Vec::new());
    }
    let Some(list) = list.as_array_mut() else {
        return false;
    };
    list.extend(
        added
            .into_iter()
            .map(|name| serde_json::json!({ "name": name })),
    );
    true
}

/// Rewrites the annotation so that it describes the Pod as it leaves admission: a container
/// has an entry when this admission swapped it, or when its recorded original still routes to
/// its image (repository and tag); every other entry goes, and the annotation goes when none
/// is left. Says whether it changed the Pod.
fn record_original_images(object: &mut Value, swaps: &[Swap], router: &Router) -> bool {
    let current = annotation(object, ORIGINAL_IMAGES_ANNOTATION);
    if current.is_none() && swaps.is_empty() {
        return false;
    }
    let existing = recorded_originals(object);
    let swapped: BTreeMap<&str, &str> = swaps
        .iter()
        .map(|s| (s.name.as_str(), s.original.as_str()))
        .collect();
    let mut originals: BTreeMap<&str, &str> = BTreeMap::new();
    for list in CONTAINER_LISTS {
        for container in container_list(object, list).into_iter().flatten() {
            let (Some(name), Some(image)) = (
                container.get("name").and_then(Value::as_str),
                container.get("image").and_then(Value::as_str),
            ) else {
                continue;
            };
            if let Some(original) = swapped.get(name) {
                originals.insert(name, original);
            } else if let Some(original) = existing.get(name)
                && router.is_swap_of(original, image)
            {
                originals.insert(name, original);
            }
        }
    }
    let updated =
        (!originals.is_empty()).then(|| serde_json::to_string(&originals).unwrap_or_default());
    if updated.as_deref() == current {
        return false;
    }
    let Some(annotations) = object
        .as_object_mut()
        .and_then(|pod| object_entry(pod, "metadata"))
        .and_then(|metadata| object_entry(metadata, "annotations"))
    else {
        return false;
    };
    match updated {
        Some(updated) => annotations.insert(
            ORIGINAL_IMAGES_ANNOTATION.to_string(),
            Value::String(updated),
        ),
        None => annotations.remove(ORIGINAL_IMAGES_ANNOTATION),
    };
    true
}

/// The object under `key`, made an empty object when it is missing or not an object.
fn object_entry<'m>(
    map: &'m mut Map<String, Value>,
    key: &str,
) -> Option<&'m mut Map<String, Value>> {
    let value = map.entry(key).or_insert_with(|| Value::Object(Map::new()));
    if !value.is_object() {
        *value = Value::Object(Map::new());
    }
    value.as_object_mut()
}

/// Asks the registry once per distinct lookup per admission, however many containers or
/// decisions need it; lookups keep the order of their first use. A refusal of the budget is
/// remembered too: the budget only shrinks, so asking again would be refused again.
struct LookOnce<'r, R: Registry> {
    inner: &'r mut R,
    digests: BTreeMap<String, Result<String, LookupError>>,
    manifests: BTreeMap<String, Result<Manifest, LookupError>>,
}

impl<'r, R: Registry> LookOnce<'r, R> {
    fn new(inner: &'r mut R) -> Self {
        LookOnce {
            inner,
            digests: BTreeMap::new(),
            manifests: BTreeMap::new(),
        }
    }
}

impl<R: Registry> Registry for LookOnce<'_, R> {
    fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError> {
        let inner = &mut self.inner;
        self.digests
            .entry(image.to_string())
            .or_insert_with(|| inner.manifest_digest(image))
            .clone()
    }

    fn manifest(&mut self, image: &str) -> Result<Manifest, LookupError> {
        let inner = &mut self.inner;
        self.manifests
            .entry(image.to_string())
            .or_insert_with(|| inner.manifest(image))
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::tests::FakeClock;
    use crate::decide::tests::{DIGEST_A, DIGEST_B, FakeRegistry, policy_from};
    use kubewarden_policy_sdk::request::GroupVersionKind;
    use serde_json::json;

    const SETTINGS: &str = r#"{"mirrors":[
        {"source":"docker.io","target":"mirror.example.com/dockerhub","pullSecret":"mirror-pull"},
        {"source":"quay.io","target":"mirror.example.com/quay"}]}"#;
    const NGINX: &str = "mirror.example.com/dockerhub/library/nginx:1.27";
    const ARGO: &str = "mirror.example.com/quay/argoproj/argocd:v2";

    fn request(
        operation: &str,
        sub_resource: &str,
        object: Value,
        old: Value,
    ) -> KubernetesAdmissionRequest {
        KubernetesAdmissionRequest {
            kind: GroupVersionKind {
                group: String::new(),
                version: "v1".to_string(),
                kind: "Pod".to_string(),
            },
            operation: operation.to_string(),
            sub_resource: sub_resource.to_string(),
            object,
            old_object: old,
            ..Default::default()
        }
    }

    fn pod(containers: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": containers})
    }

    fn registry() -> FakeRegistry {
        FakeRegistry::default()
            .with(NGINX, Ok(DIGEST_A))
            .with(ARGO, Ok(DIGEST_B))
    }

    fn mutated(outcome: Outcome) -> Value {
        match outcome.verdict {
            Verdict::Mutate(object) => object,
            other => panic!("expected a mutation, got {other:?}"),
        }
    }

    /// An admission whose lookups take no time.
    fn admit(
        request: KubernetesAdmissionRequest,
        policy: &Policy,
        registry: &mut impl Registry,
    ) -> Outcome {
        super::admit(request, policy, registry, &FakeClock::default())
    }

    fn accepted_warnings(outcome: Outcome) -> Vec<String> {
        match outcome.verdict {
            Verdict::Accept => outcome.warnings,
            other => panic!("expected accept, got {other:?}"),
        }
    }

    fn rejection(outcome: Outcome) -> String {
        match outcome.verdict {
            Verdict::Reject(message) => message,
            other => panic!("expected reject, got {other:?}"),
        }
    }

    #[test]
    fn swaps_every_container_list_and_records_originals() {
        let object = pod(json!({
            "containers": [{"name": "web", "image": "nginx:1.27"}],
            "initContainers": [{"name": "init", "image": "quay.io/argoproj/argocd:v2"}],
            "ephemeralContainers": [{"name": "debug", "image": "nginx:1.27"}],
        }));
        let mut registry = registry();
        let pod = mutated(admit(
            request("CREATE", "", object, Value::Null),
            &policy_from(SETTINGS),
            &mut registry,
        ));
        assert_eq!(
            pod["spec"]["containers"][0]["image"],
            format!("{NGINX}@{DIGEST_A}")
        );
        assert_eq!(
            pod["spec"]["initContainers"][0]["image"],
            format!("{ARGO}@{DIGEST_B}")
        );
        assert_eq!(
            pod["spec"]["ephemeralContainers"][0]["image"],
            format!("{NGINX}@{DIGEST_A}")
        );
        let originals: Value = serde_json::from_str(
            pod["metadata"]["annotations"][ORIGINAL_IMAGES_ANNOTATION]
                .as_str()
                .expect("annotation"),
        )
        .expect("JSON annotation");
        assert_eq!(
            originals,
            json!({"web": "nginx:1.27", "init": "quay.io/argoproj/argocd:v2", "debug": "nginx:1.27"})
        );
        assert_eq!(
            pod["spec"]["imagePullSecrets"],
            json!([{"name": "mirror-pull"}])
        );
        assert_eq!(
            registry.asked,
            [NGINX, ARGO],
            "one lookup per distinct image, in container order"
        );
    }

    #[test]
    fn keeps_fields_it_does_not_know_and_existing_secrets() {
        let object = pod(json!({
            "futureField": {"x": 1},
            "imagePullSecrets": [{"name": "mirror-pull"}, {"name": "other"}],
            "containers": [{"name": "web", "image": "nginx:1.27", "newContainerField": true}],
        }));
        let pod = mutated(admit(
            request("CREATE", "", object, Value::Null),
            &policy_from(SETTINGS),
            &mut registry(),
        ));
        assert_eq!(pod["spec"]["futureField"], json!({"x": 1}));
        assert_eq!(
            pod["spec"]["containers"][0]["newContainerField"],
            json!(true)
        );
        assert_eq!(
            pod["spec"]["imagePullSecrets"],
            json!([{"name": "mirror-pull"}, {"name": "other"}])
        );
    }

    #[test]
    fn admitting_twice_changes_nothing_and_looks_nothing_up() {
        let object = pod(json!({"containers": [{"name": "web", "image": "nginx:1.27"}]}));
        let policy = policy_from(SETTINGS);
        let once = mutated(admit(
            request("CREATE", "", object, Value::Null),
            &policy,
            &mut registry(),
        ));
        let mut registry = registry();
        let twice = admit(
            request("CREATE", "", once, Value::Null),
            &policy,
            &mut registry,
        );
        assert_eq!(twice, Outcome::unchanged());
        assert!(registry.asked.is_empty());
    }

    #[test]
    fn metadata_only_update_touches_nothing() {
        let old = pod(json!({"containers": [{"name": "web", "image": "nginx:1.27"}]}));
        let mut new = old.clone();
        new["metadata"]["labels"] = json!({"a": "b"});
        let mut registry = registry();
        let outcome = admit(
            request("UPDATE", "", new, old),
            &policy_from(SETTINGS),
            &mut registry,
        );
        assert_eq!(outcome, Outcome::unchanged());
        assert!(registry.asked.is_empty());
    }

    #[test]
    fn update_swaps_only_the_changed_image_and_adds_no_secret() {
        let old = pod(json!({
            "imagePullSecrets": [{"name": "mirror-pull"}],
            "containers": [{"name": "web", "image": "nginx:1.26"}, {"name": "side", "image": "quay.io/x/unchanged:1"}]
        }));
        let mut new = old.clone();
        new["spec"]["containers"][0]["image"] = json!("nginx:1.27");
        let mut registry = registry();
        let pod = mutated(admit(
            request("UPDATE", "", new, old),
            &policy_from(SETTINGS),
            &mut registry,
        ));
        assert_eq!(
            pod["spec"]["containers"][0]["image"],
            format!("{NGINX}@{DIGEST_A}")
        );
        assert_eq!(
            pod["spec"]["containers"][1]["image"],
            "quay.io/x/unchanged:1"
        );
        assert_eq!(registry.asked, [NGINX]);
    }

    #[test]
    fn update_cannot_add_the_pull_secret_so_it_keeps_the_image() {
        let old = pod(json!({"containers": [{"name": "web", "image": "nginx:1.26"}]}));
        let mut new = old.clone();
        new["spec"]["containers"][0]["image"] = json!("nginx:1.27");
        let outcome = admit(
            request("UPDATE", "", new, old),
            &policy_from(SETTINGS),
            &mut registry(),
        );
        let warnings = accepted_warnings(outcome);
        assert!(
            warnings[0].contains("needs imagePullSecret \"mirror-pull\""),
            "{warnings:?}"
        );
    }

    #[test]
    fn ephemeral_container_subresource_swaps_the_added_container_only() {
        let old =
            pod(json!({"containers": [{"name": "web", "image": "quay.io/argoproj/argocd:v2"}]}));
        let mut new = old.clone();
        new["spec"]["ephemeralContainers"] =
            json!([{"name": "debug", "image": "quay.io/argoproj/argocd:v2"}]);
        let mut registry = registry();
        let pod = mutated(admit(
            request("UPDATE", "ephemeralcontainers", new, old),
            &policy_from(SETTINGS),
            &mut registry,
        ));
        assert_eq!(
            pod["spec"]["ephemeralContainers"][0]["image"],
            format!("{ARGO}@{DIGEST_B}")
        );
        assert_eq!(
            pod["spec"]["containers"][0]["image"],
            "quay.io/argoproj/argocd:v2"
        );
        assert!(
            pod["metadata"].get("annotations").is_none(),
            "the API server would drop it"
        );
    }

    #[test]
    fn rejections_are_gathered_into_one_message() {
        let policy = policy_from(&SETTINGS.replace("]}", r#"],"onMissing":"reject"}"#));
        let object = pod(json!({"containers": [
            {"name": "a", "image": "nginx:missing"}, {"name": "b", "image": "quay.io/x/gone:1"}, {"name": "c", "image": "nginx:1.27"}
        ]}));
        let outcome = admit(
            request("CREATE", "", object, Value::Null),
            &policy,
            &mut registry(),
        );
        let message = rejection(outcome);
        assert!(
            message.starts_with("2 images cannot be admitted: image \"nginx:missing\""),
            "{message}"
        );
        assert!(message.contains("\"quay.io/x/gone:1\""), "{message}");
    }

    #[test]
    fn other_kinds_and_operations_are_accepted_unchanged() {
        let object = pod(json!({"containers": [{"name": "web", "image": "nginx:1.27"}]}));
        let mut deployment = request("CREATE", "", object.clone(), Value::Null);
        deployment.kind.kind = "Deployment".to_string();
        deployment.kind.group = "apps".to_string();
        let delete = request("DELETE", "", object.clone(), Value::Null);
        let status = request("UPDATE", "status", object, Value::Null);
        let mut registry = registry();
        for request in [deployment, delete, status] {
            assert_eq!(
                admit(request, &policy_from(SETTINGS), &mut registry),
                Outcome::unchanged()
            );
        }
        assert!(registry.asked.is_empty());
    }

    #[test]
    fn missing_images_keep_the_pod_and_warn_once_per_image() {
        let object = pod(json!({"containers": [
            {"name": "a", "image": "nginx:missing"}, {"name": "b", "image": "nginx:missing"}
        ]}));
        let outcome = admit(
            request("CREATE", "", object, Value::Null),
            &policy_from(SETTINGS),
            &mut registry(),
        );
        let warnings = accepted_warnings(outcome);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
    }

    #[test]
    fn many_kept_images_give_a_bounded_list_of_warnings() {
        let containers: Vec<Value> = (0..50)
            .map(|i| json!({"name": format!("c{i}"), "image": format!("nginx:missing-{i}")}))
            .collect();
        let object = pod(json!({ "containers": containers }));
        let outcome = admit(
            request("CREATE", "", object, Value::Null),
            &policy_from(SETTINGS),
            &mut registry(),
        );
        let warnings = accepted_warnings(outcome);
        assert_eq!(warnings.len(), LISTED_MAX + 1);
        assert_eq!(warnings[LISTED_MAX], "… and 30 more images not swapped");
    }

    #[test]
    fn update_compares_containers_by_name() {
        let old = pod(
            json!({"imagePullSecrets": [{"name": "mirror-pull"}], "containers": [
                {"name": "a", "image": "nginx:1.27"}, {"name": "b", "image": "quay.io/argoproj/argocd:v2"}
            ]}),
        );
        let mut new = old.clone();
        // Reordered, and b's image now equals a's old one: only b changed.
        new["spec"]["containers"] = json!([
            {"name": "b", "image": "nginx:1.27"}, {"name": "a", "image": "nginx:1.27"}
        ]);
        let mut registry = registry();
        let pod = mutated(admit(
            request("UPDATE", "", new, old),
            &policy_from(SETTINGS),
            &mut registry,
        ));
        assert_eq!(
            pod["spec"]["containers"][0]["image"],
            format!("{NGINX}@{DIGEST_A}")
        );
        assert_eq!(pod["spec"]["containers"][1]["image"], "nginx:1.27");
    }

    #[test]
    fn malformed_pods_are_accepted_unchanged() {
        let policy = policy_from(SETTINGS);
        for object in [
            Value::Null,
            json!({"spec": null}),
            json!({"spec": {"containers": "nginx"}}),
            json!({"spec": {"containers": [null, 1, {"image": 5}, {"name": "no-image"}]}}),
        ] {
            let outcome = admit(
                request("CREATE", "", object, Value::Null),
                &policy,
                &mut registry(),
            );
            assert_eq!(outcome, Outcome::unchanged());
        }
    }

    fn annotated(mut pod: Value, originals: Value) -> Value {
        pod["metadata"]["annotations"] =
            json!({ ORIGINAL_IMAGES_ANNOTATION: originals.to_string() });
        pod
    }

    fn originals(pod: &Value) -> Option<Value> {
        let text = pod["metadata"]["annotations"][ORIGINAL_IMAGES_ANNOTATION].as_str()?;
        serde_json::from_str(text).ok()
    }

    #[test]
    fn static_pod_mirrors_are_left_alone_without_a_lookup() {
        let mut object = pod(json!({"containers": [{"name": "etcd", "image": "nginx:1.27"}]}));
        object["metadata"]["annotations"] = json!({ STATIC_POD_MIRROR_ANNOTATION: "6f5c4e3d2b1a" });
        let mut registry = registry();
        let outcome = admit(
            request("CREATE", "", object, Value::Null),
            &policy_from(SETTINGS),
            &mut registry,
        );
        assert_eq!(outcome, Outcome::unchanged());
        assert!(registry.asked.is_empty());
    }

    const SWAPPED: &str = "mirror.example.com/dockerhub/library/nginx:1.27@sha256:1111111111111111111111111111111111111111111111111111111111111111";

    /// The live Pod runs the swap; `kubectl apply` re-sends `nginx:1.27`.
    fn reapplied(record: Option<Value>) -> (KubernetesAdmissionRequest, Value) {
        let old = pod(json!({
            "imagePullSecrets": [{"name": "mirror-pull"}],
            "containers": [{"name": "web", "image": SWAPPED}]
        }));
        let old = match record {
            Some(record) => annotated(old, record),
            None => old,
        };
        let mut new = old.clone();
        new["spec"]["containers"][0]["image"] = json!("nginx:1.27");
        (request("UPDATE", "", new, old.clone()), old)
    }

    #[test]
    fn a_reapplied_original_keeps_the_running_swap_without_a_lookup() {
        let (request, old) = reapplied(Some(json!({"web": "nginx:1.27"})));
        let mut registry = registry();
        let outcome = admit(request, &policy_from(SETTINGS), &mut registry);
        let pod = mutated(outcome);
        assert_eq!(pod["spec"]["containers"][0]["image"], SWAPPED);
        assert_eq!(originals(&pod), originals(&old));
        assert!(registry.asked.is_empty(), "{:?}", registry.asked);
    }

    #[test]
    fn without_the_record_a_reapplied_original_is_decided_afresh() {
        let (request, _) = reapplied(None);
        let mut registry = registry();
        let pod = mutated(admit(request, &policy_from(SETTINGS), &mut registry));
        assert_eq!(
            pod["spec"]["containers"][0]["image"],
            format!("{NGINX}@{DIGEST_A}")
        );
        assert_eq!(registry.asked, [NGINX]);
    }

    #[rstest::rstest]
    #[case::record_names_another_image(json!({"web": "nginx:1.26"}))]
    #[case::record_for_another_container(json!({"side": "nginx:1.27"}))]
    #[case::record_not_routing_to_the_old_image(json!({"web": "httpd:1.27"}))]
    fn a_record_that_does_not_match_the_old_image_is_ignored(#[case] record: Value) {
        let (request, _) = reapplied(Some(record));
        let mut registry = registry();
        let pod = mutated(admit(request, &policy_from(SETTINGS), &mut registry));
        assert_eq!(
            pod["spec"]["containers"][0]["image"],
            format!("{NGINX}@{DIGEST_A}"),
            "looked up and swapped afresh"
        );
        assert_eq!(registry.asked, [NGINX]);
        assert_eq!(originals(&pod), Some(json!({"web": "nginx:1.27"})));
    }

    #[test]
    fn an_update_to_an_image_under_a_target_drops_the_stale_record() {
        let old = annotated(
            pod(json!({"containers": [{"name": "web", "image": SWAPPED}]})),
            json!({"web": "nginx:1.27"}),
        );
        let mut new = old.clone();
        new["spec"]["containers"][0]["image"] = json!(ARGO);
        let mut registry = registry();
        let pod = mutated(admit(
            request("UPDATE", "", new, old),
            &policy_from(SETTINGS),
            &mut registry,
        ));
        assert_eq!(pod["spec"]["containers"][0]["image"], ARGO);
        assert!(
            pod["metadata"]["annotations"]
                .get(ORIGINAL_IMAGES_ANNOTATION)
                .is_none(),
            "{pod}"
        );
        assert!(registry.asked.is_empty());
    }

    #[test]
    fn a_record_that_matches_survives_admitting_twice() {
        let object = annotated(
            pod(json!({"containers": [
                {"name": "web", "image": SWAPPED}, {"name": "side", "image": ARGO}
            ]})),
            json!({"web": "nginx:1.27", "gone": "nginx:1.0"}),
        );
        let pod = mutated(admit(
            request("CREATE", "", object, Value::Null),
            &policy_from(SETTINGS),
            &mut registry(),
        ));
        assert_eq!(
            originals(&pod),
            Some(json!({"web": "nginx:1.27"})),
            "a container that is not in the Pod has no entry"
        );
    }

    /// Every lookup takes `ms` on the fake clock.
    struct Distant {
        inner: FakeRegistry,
        clock: FakeClock,
        ms: u64,
    }

    impl Registry for Distant {
        fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError> {
            self.clock.advance(Duration::from_millis(self.ms));
            self.inner.manifest_digest(image)
        }

        fn manifest(&mut self, image: &str) -> Result<Manifest, LookupError> {
            self.clock.advance(Duration::from_millis(self.ms));
            self.inner.manifest(image)
        }
    }

    fn many_images(n: usize) -> (Value, FakeRegistry) {
        let mut registry = FakeRegistry::default();
        let containers: Vec<Value> = (0..n)
            .map(|i| {
                registry.answers.insert(
                    format!("mirror.example.com/dockerhub/library/app{i}:1"),
                    Ok(DIGEST_A.to_string()),
                );
                json!({"name": format!("c{i}"), "image": format!("app{i}:1")})
            })
            .collect();
        (pod(json!({ "containers": containers })), registry)
    }

    fn budget_admission(extra: &str, n: usize, ms: u64) -> (Outcome, usize) {
        let settings = format!(
            r#"{{"mirrors":[{{"source":"docker.io","target":"mirror.example.com/dockerhub"}}]{extra}}}"#
        );
        let (object, inner) = many_images(n);
        let clock = FakeClock::default();
        let mut registry = Distant {
            inner,
            clock: clock.clone(),
            ms,
        };
        let outcome = super::admit(
            request("CREATE", "", object, Value::Null),
            &policy_from(&settings),
            &mut registry,
            &clock,
        );
        (outcome, registry.inner.asked.len())
    }

    #[test]
    fn the_first_images_are_swapped_and_the_rest_kept_with_one_budget_warning() {
        // 300 ms per lookup, 800 ms budget: two lookups, 28 images not looked up.
        let (outcome, asked) = budget_admission("", 30, 300);
        assert_eq!(asked, 2);
        let audit = outcome.audit.clone();
        let pod = match outcome.verdict {
            Verdict::Mutate(pod) => pod,
            other => panic!("{other:?}"),
        };
        let images: Vec<&str> = pod["spec"]["containers"]
            .as_array()
            .expect("containers")
            .iter()
            .filter_map(|c| c["image"].as_str())
            .collect();
        assert!(
            images[..2].iter().all(|i| i.ends_with(DIGEST_A)),
            "{images:?}"
        );
        assert_eq!(
            images[2..].iter().filter(|i| i.starts_with("app")).count(),
            28
        );
        assert_eq!(
            outcome.warnings,
            [
                "lookup budget of 800 ms spent: 600 ms on 2 lookups (slowest 300 ms); 28 images were not looked up or compared in time and kept as they were (onLookupError is keep): \"app2:1\", \"app3:1\", \"app4:1\", \"app5:1\", \"app6:1\", and 23 more"
            ]
        );
        let summary: Value = serde_json::from_str(&audit["summary"]).expect("JSON");
        assert_eq!(
            summary,
            json!({"swapped": 2, "kept": 28, "rejected": 0, "lookups": 2,
                   "lookupMilliseconds": 600, "budgetMilliseconds": 800, "notLookedUp": 28})
        );
        let kept: Value = serde_json::from_str(&audit["kept"]).expect("JSON");
        assert_eq!(kept[0], json!({"image": "app2:1", "reason": "budget"}));
        assert_eq!(kept.as_array().map(Vec::len), Some(AUDITED_MAX));
    }

    #[test]
    fn with_on_lookup_error_reject_the_spent_budget_refuses_the_pod() {
        let (outcome, _) = budget_admission(r#","onLookupError":"reject""#, 30, 300);
        let message = rejection(outcome);
        assert!(
            message.starts_with("lookup budget of 800 ms spent: 600 ms on 2 lookups (slowest 300 ms); 28 images were not looked up or compared in time and refused (onLookupError is reject)"),
            "{message}"
        );
    }

    #[test]
    fn a_first_lookup_longer_than_the_budget_swaps_that_image_only() {
        let (outcome, asked) = budget_admission("", 5, 1_500);
        assert_eq!(asked, 1);
        assert!(
            outcome.warnings[0].starts_with("lookup budget of 800 ms spent: 1500 ms on 1 lookup (slowest 1500 ms); 4 images were"),
            "{:?}",
            outcome.warnings
        );
        let pod = mutated(outcome);
        assert!(
            pod["spec"]["containers"][0]["image"]
                .as_str()
                .is_some_and(|i| i.ends_with(DIGEST_A))
        );
    }

    #[test]
    fn near_lookups_swap_the_whole_pod() {
        let (outcome, asked) = budget_admission("", 30, 1);
        assert_eq!(asked, 30);
        assert!(outcome.warnings.is_empty(), "{:?}", outcome.warnings);
    }

    #[test]
    fn audit_annotations_name_swaps_keeps_and_reasons_within_the_api_servers_rules() {
        let object = pod(json!({"containers": [
            {"name": "web", "image": "nginx:1.27"},
            {"name": "job", "image": "nginx:missing"},
            {"name": "bad", "image": "::"},
        ]}));
        let outcome = admit(
            request("CREATE", "", object, Value::Null),
            &policy_from(SETTINGS),
            &mut registry(),
        );
        let audit = &outcome.audit;
        for key in audit.keys() {
            assert!(
                key.len() <= 63
                    && key
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)),
                "{key}"
            );
        }
        let swapped: Value = serde_json::from_str(&audit["swapped"]).expect("JSON");
        assert_eq!(
            swapped,
            json!([{"container": "web", "from": "nginx:1.27", "to": format!("{NGINX}@{DIGEST_A}")}])
        );
        let kept: Value = serde_json::from_str(&audit["kept"]).expect("JSON");
        assert_eq!(
            kept,
            json!([{"image": "nginx:missing", "reason": "absent"},
                   {"image": "::", "reason": "invalid-reference"}])
        );
        assert!(!audit.contains_key("rejected"));
    }

    #[test]
    fn an_admission_with_nothing_to_report_has_no_audit_annotations() {
        let object = pod(json!({"containers": [{"name": "x", "image": "ghcr.io/org/app:1"}]}));
        let outcome = admit(
            request("CREATE", "", object, Value::Null),
            &policy_from(SETTINGS),
            &mut registry(),
        );
        assert_eq!(outcome, Outcome::unchanged());
    }

    #[test]
    fn audit_values_stay_bounded_for_huge_pods_and_images() {
        let long = format!("nginx:{}", "a".repeat(10_000));
        let containers: Vec<Value> = (0..2_000)
            .map(|i| json!({"name": format!("c{i}"), "image": format!("{long}{i}")}))
            .collect();
        let outcome = admit(
            request(
                "CREATE",
                "",
                pod(json!({ "containers": containers })),
                Value::Null,
            ),
            &policy_from(SETTINGS),
            &mut registry(),
        );
        let total: usize = outcome.audit.values().map(String::len).sum();
        assert!(total < 8_000, "{total} bytes of audit annotations");
        let kept: Value = serde_json::from_str(&outcome.audit["kept"]).expect("JSON");
        assert_eq!(kept.as_array().map(Vec::len), Some(AUDITED_MAX));
        assert!(
            kept[0]["image"]
                .as_str()
                .is_some_and(|i| i.chars().count() == AUDITED_CHARS_MAX + 1 && i.ends_with('…'))
        );
    }
}
