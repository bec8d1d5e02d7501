//! One admission: which containers of the Pod to look at, one decision per distinct image, and
//! the mutated Pod.
//!
//! The Pod stays JSON: a typed model would drop the fields it does not know, and the patch
//! computed from the mutated object would then delete them from the Pod.

use std::collections::BTreeMap;

use kubewarden_policy_sdk::request::KubernetesAdmissionRequest;
use serde_json::{Map, Value};

use crate::decide::{Decision, LookupError, Manifest, Registry, decide, quote};
use crate::settings::Policy;

/// The annotation that records, for each swapped container, the image the Pod asked for.
pub const ORIGINAL_IMAGES_ANNOTATION: &str = "image-swapper.kubewarden.io/original-images";

/// The container lists, in the order their images are looked up.
const CONTAINER_LISTS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];

/// What to answer the API server.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    Accept {
        warnings: Vec<String>,
    },
    Mutate {
        object: Value,
        warnings: Vec<String>,
    },
    Reject {
        message: String,
        warnings: Vec<String>,
    },
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
}

/// A container image this admission rewrites.
struct Swap {
    list: &'static str,
    index: usize,
    name: String,
    original: String,
    image: String,
    pull_secret: Option<String>,
}

/// What the decisions say of the candidates.
#[derive(Default)]
struct Verdicts {
    swaps: Vec<Swap>,
    /// Names of containers whose new image is not swapped (their annotation entry is stale).
    kept: Vec<String>,
    warnings: Vec<String>,
    rejections: Vec<String>,
}

/// Takes the request by value: the mutated Pod is the request's own object, changed in place,
/// so a large Pod is neither copied nor compared.
pub fn admit(
    mut request: KubernetesAdmissionRequest,
    policy: &Policy,
    registry: &mut impl Registry,
) -> Outcome {
    let accept = Outcome::Accept {
        warnings: Vec::new(),
    };
    if request.kind.kind != "Pod" || !request.kind.group.is_empty() {
        return accept;
    }
    let operation = match (request.operation.as_str(), request.sub_resource.as_str()) {
        ("CREATE", "") => Operation::Create,
        ("UPDATE", "") => Operation::Update,
        ("UPDATE", "ephemeralcontainers") => Operation::EphemeralContainers,
        _ => return accept,
    };
    let old = match operation {
        Operation::Create => None,
        _ => Some(&request.old_object),
    };
    let existing_secrets = pull_secret_names(&request.object);
    let candidates = candidates(&request.object, old);
    if candidates.is_empty() {
        return accept;
    }
    let verdicts = decide_all(&candidates, operation, &existing_secrets, policy, registry);
    let warnings = capped(verdicts.warnings, "images not swapped");
    let mut rejections = verdicts.rejections;
    if !rejections.is_empty() {
        let message = match rejections.len() {
            1 => rejections.remove(0),
            n => format!(
                "{n} images cannot be admitted: {}",
                capped(rejections, "images").join("; ")
            ),
        };
        return Outcome::Reject { message, warnings };
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
        changed |= record_original_images(&mut object, &verdicts.swaps, &verdicts.kept);
    }
    if operation == Operation::Create {
        let secrets = verdicts
            .swaps
            .iter()
            .filter_map(|s| s.pull_secret.as_deref());
        changed |= add_pull_secrets(&mut object, secrets, &existing_secrets);
    }
    if changed {
        Outcome::Mutate { object, warnings }
    } else {
        Outcome::Accept { warnings }
    }
}

/// One decision per distinct image, in container order, and what it means for each container.
fn decide_all(
    candidates: &[Candidate<'_>],
    operation: Operation,
    existing_secrets: &[String],
    policy: &Policy,
    registry: &mut impl Registry,
) -> Verdicts {
    let mut registry = LookOnce::new(registry);
    let mut decisions: BTreeMap<&str, Decision> = BTreeMap::new();
    let mut verdicts = Verdicts::default();
    for candidate in candidates {
        let decision = match decisions.get(candidate.image) {
            Some(decision) => decision,
            None => {
                let decision = decide(candidate.image, policy, &mut registry);
                let decision =
                    check_pull_secret(decision, candidate.image, operation, existing_secrets);
                match &decision {
                    Decision::Keep { warning }
                    | Decision::Swap {
                        warning: Some(warning),
                        ..
                    } => verdicts.warnings.push(warning.clone()),
                    Decision::Reject { message } => verdicts.rejections.push(message.clone()),
                    _ => {}
                }
                decisions.entry(candidate.image).or_insert(decision)
            }
        };
        match decision {
            Decision::Swap {
                image, pull_secret, ..
            } if image != candidate.image => verdicts.swaps.push(Swap {
                list: candidate.list,
                index: candidate.index,
                name: candidate.name.to_string(),
                original: candidate.image.to_string(),
                image: image.clone(),
                pull_secret: pull_secret.clone(),
            }),
            Decision::AlreadySwapped => {}
            _ => verdicts.kept.push(candidate.name.to_string()),
        }
    }
    verdicts
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
            if old.is_none() || old_images.get(name) != Some(&image) {
                candidates.push(Candidate {
                    list,
                    index,
                    name,
                    image,
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
        } if operation != Operation::Create && !existing.contains(&secret) => Decision::Keep {
            warning: format!(
                "image {}: kept, not swapped to {}: that mirror needs imagePullSecret {secret:?}, which the Pod lacks and which cannot be added after creation",
                quote(image),
                quote(&target)
            ),
        },
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

/// Merges into the annotation: swapped containers get their original image; containers whose
/// new image was not swapped lose a stale entry; the annotation goes when no entry is left.
fn record_original_images(object: &mut Value, swaps: &[Swap], kept: &[String]) -> bool {
    let current = object
        .get("metadata")
        .and_then(|m| m.get("annotations"))
        .and_then(|a| a.get(ORIGINAL_IMAGES_ANNOTATION))
        .and_then(Value::as_str);
    if current.is_none() && swaps.is_empty() {
        return false;
    }
    // Borrowed keys and values: only the final JSON text is allocated.
    let existing: BTreeMap<String, String> = current
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default();
    let mut originals: BTreeMap<&str, &str> = existing
        .iter()
        .map(|(name, image)| (name.as_str(), image.as_str()))
        .collect();
    for swap in swaps {
        originals.insert(&swap.name, &swap.original);
    }
    for name in kept {
        originals.remove(name.as_str());
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
/// decisions need it; lookups keep the order of their first use.
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
        match outcome {
            Outcome::Mutate { object, .. } => object,
            other => panic!("expected a mutation, got {other:?}"),
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
        assert_eq!(twice, Outcome::Accept { warnings: vec![] });
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
        assert_eq!(outcome, Outcome::Accept { warnings: vec![] });
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
        let Outcome::Accept { warnings } = outcome else {
            panic!("expected accept, got {outcome:?}")
        };
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
        let Outcome::Reject { message, .. } = outcome else {
            panic!("expected reject, got {outcome:?}")
        };
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
                Outcome::Accept { warnings: vec![] }
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
        let Outcome::Accept { warnings } = outcome else {
            panic!("expected accept, got {outcome:?}")
        };
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
        let Outcome::Accept { warnings } = outcome else {
            panic!("expected accept, got {outcome:?}")
        };
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
            assert_eq!(outcome, Outcome::Accept { warnings: vec![] });
        }
    }
}
