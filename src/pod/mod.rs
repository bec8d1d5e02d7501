//! One admission, in the order its steps run:
//!
//! 1. `request`: what the request is (its operation, the audit scanner's replay, a static Pod's
//!    mirror); `candidates`: which containers to decide on (on update, only changed images);
//! 2. `reapply`: the running swap a re-applied manifest keeps; `decisions`: one decision per
//!    distinct image (`crate::decide`), the first image of each registry first, each lookup
//!    asked once (`look_once`) within the lookup budget (`crate::budget`);
//! 3. `pull_secrets`: whether a mirror's secret can be added, and adding it;
//! 4. `record`: the original-images annotation; `crate::plan::unmirrored`: the record of source
//!    images the mirror lacks, which the fill job reads;
//! 5. `report`: warnings, the rejection message, audit annotations; `outcome`: the answer.
//!
//! The check role (`action: check`, `check_role`) runs steps 1, 2 (`checks`: one lookup per
//! mirror image, within the same budget) and 5 (`check_report`), and changes nothing. The copies
//! both roles suggest are `crate::plan`'s, in the one form the fill job reads. The swapping role
//! answers the audit scanner's replay of a running Pod unchanged, without a lookup.

mod candidates;
mod check_report;
mod check_role;
mod checks;
mod decisions;
mod look_once;
mod outcome;
mod pull_secrets;
mod reapply;
mod record;
mod report;
mod request;
mod running;
#[cfg(test)]
mod signed_check_tests;
#[cfg(test)]
mod signed_tests;
mod verifier_read;

use std::collections::BTreeMap;
use std::time::Duration;

use kubewarden_policy_sdk::request::KubernetesAdmissionRequest;
use serde_json::Value;

use crate::budget::{Budgeted, Clock};
use crate::decide::Reason;
use crate::policy::{Action, Policy};
use crate::registry::Registry;
use crate::verifiers::Cluster;

use crate::object::{annotation, container_mut};
use crate::plan::unmirrored::{Requester, record_unmirrored};

use candidates::changed_containers;
use check_role::check;
use decisions::decide_all;
pub use outcome::{Outcome, Verdict};
use pull_secrets::{add_pull_secrets, pull_secret_names};
pub use record::ORIGINAL_IMAGES_ANNOTATION;
use record::{record_original_images, recorded_originals};
use report::{audit_annotations, capped, fill_job_may_not_set_images, messages};
pub use request::STATIC_POD_MIRROR_ANNOTATION;
use request::{Operation, is_audit_scan};
pub use verifier_read::VERIFIERS_UNMATCHED;
use verifier_read::{tell_unmatched, with_verifier_rules};

/// Takes the request by value: the mutated Pod is the request's own object, changed in place,
/// so a large Pod is neither copied nor compared.
pub fn admit(
    mut request: KubernetesAdmissionRequest,
    policy: &Policy,
    registry: &mut impl Registry,
    cluster: &mut impl Cluster,
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
    match policy.action {
        // The monitor deployment's check is for the scanner: an admission it answers at once
        // and without a lookup, so that no Pod waits on its mirror (nor on a hanging one).
        Action::Check if !policy.check_admissions && !is_audit_scan(&request) => {
            return Outcome::unchanged();
        }
        Action::Check => return check(&request, operation, policy, registry, cluster, clock),
        // The scanner's answer is a report, never applied: a swap there changes nothing, and
        // its lookups would queue every admission behind the host's lock (hundreds of Pods
        // each hour).
        Action::Swap if is_audit_scan(&request) => return Outcome::unchanged(),
        Action::Swap => {}
    }
    if annotation(&request.object, STATIC_POD_MIRROR_ANNOTATION).is_some() {
        return Outcome::unchanged();
    }
    let requester = Requester::of(&request.user_info.username, policy);
    let candidates = changed_containers(&request, operation);
    if candidates.is_empty() {
        // Nothing to decide, but the record of unmirrored images stays the policy's own: one
        // written by hand in a metadata update goes, since the fill job acts on it, and one
        // removed by hand comes back; only the fill job drops the entries it filled.
        let previous = std::mem::take(&mut request.old_object);
        let mut object = std::mem::take(&mut request.object);
        if operation.may_change_metadata()
            && record_unmirrored(
                &mut object,
                Some(&previous),
                requester,
                &BTreeMap::new(),
                policy,
            )
        {
            return Outcome {
                verdict: Verdict::Mutate(object),
                warnings: Vec::new(),
                audit: BTreeMap::new(),
            };
        }
        return Outcome::unchanged();
    }
    // The fill job's identity may drop entries of the record and do nothing else: its token
    // sits in the fill job's Pods, and an image it wrote would run with the Pod's own rights.
    if requester == Requester::FillJob {
        return Outcome {
            verdict: Verdict::Reject(fill_job_may_not_set_images(
                &request.user_info.username,
                &candidates,
            )),
            warnings: Vec::new(),
            audit: BTreeMap::new(),
        };
    }
    // The live Pod's record: what this policy swapped, and from what.
    let recorded = match operation {
        Operation::Update => recorded_originals(&request.old_object),
        _ => BTreeMap::new(),
    };
    // The verifiers' rules, read once the admission has images to decide on.
    let with_verifiers;
    let mut unmatched = None;
    let policy = if policy.verifiers.is_empty() {
        policy
    } else {
        let read;
        (read, unmatched) = with_verifier_rules(policy, &request.namespace, cluster);
        with_verifiers = read;
        &with_verifiers
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
    let (mut warnings, rejections) = messages(&verdicts, policy, &report);
    let mut audit = audit_annotations(&verdicts, &report);
    tell_unmatched(&mut warnings, &mut audit, unmatched);
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
    // Images kept because no target of their rule holds them, or holds a copy that verifies
    // (with the digest it serves, when known): the record the fill job reads.
    let unmirrored: BTreeMap<String, Option<String>> = verdicts
        .kept
        .iter()
        .filter(|(_, note)| matches!(note.reason, Reason::Absent | Reason::Unverified))
        .map(|(image, note)| (image.clone(), note.unverified_digest.clone()))
        .collect();
    let previous = match operation {
        Operation::Update => Some(std::mem::take(&mut request.old_object)),
        _ => None,
    };
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
        changed |= record_unmirrored(
            &mut object,
            previous.as_ref(),
            requester,
            &unmirrored,
            policy,
        );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::tests::FakeClock;
    use crate::decide::tests::{DIGEST_A, DIGEST_B, FakeRegistry, policy_from};
    use crate::plan::{UNMIRRORED_ANNOTATION, UNMIRRORED_LABEL};
    use crate::registry::{LookupError, Manifest};
    use kubewarden_policy_sdk::request::GroupVersionKind;
    use report::{AUDITED_CHARS_MAX, AUDITED_MAX, LISTED_MAX};
    use serde_json::{Map, json};

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
        super::admit(
            request,
            policy,
            registry,
            &mut crate::verifiers::NoCluster,
            &FakeClock::default(),
        )
    }

    fn accepted_warnings(outcome: Outcome) -> Vec<String> {
        match outcome.verdict {
            Verdict::Accept => outcome.warnings,
            other => panic!("expected accept, got {other:?}"),
        }
    }

    /// A Pod whose images were all kept, with the record of those the mirror lacks: every image
    /// as written, the warnings.
    fn recorded(outcome: Outcome) -> (Value, Vec<String>) {
        let warnings = outcome.warnings.clone();
        let pod = mutated(outcome);
        assert_eq!(
            pod["metadata"]["labels"][UNMIRRORED_LABEL],
            json!("true"),
            "{pod}"
        );
        (pod, warnings)
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

    /// The fill job's identity may drop record entries and nothing else: an update from it that
    /// sets an image is refused, naming the container, before any lookup; the same update from
    /// anyone else is decided as usual.
    #[test]
    fn the_fill_jobs_identity_may_not_set_an_image() {
        const FILL_JOB: &str = "system:serviceaccount:kubewarden:fill-mirror";
        let policy = policy_from(&SETTINGS.replace(
            r#"{"mirrors":"#,
            &format!(r#"{{"fillJobUsernames":["{FILL_JOB}"],"mirrors":"#),
        ));
        let old = pod(json!({"containers": [{"name": "web", "image": "nginx:1.26"}]}));
        let mut new = old.clone();
        new["spec"]["containers"][0]["image"] = json!("evil.example.com/x:1");
        let update = |username: &str| {
            let mut request = request("UPDATE", "", new.clone(), old.clone());
            request.user_info.username = username.to_string();
            request
        };
        let mut registry = registry();
        assert_eq!(
            rejection(admit(update(FILL_JOB), &policy, &mut registry)),
            format!(
                "\"{FILL_JOB}\" is in fillJobUsernames, which may only drop entries of the record of unmirrored images; this request sets the image of containers[0] \"web\": \"evil.example.com/x:1\""
            )
        );
        assert!(registry.asked.is_empty());
        let outcome = admit(update("kubernetes-admin"), &policy, &mut registry);
        assert!(
            !matches!(outcome.verdict, Verdict::Reject(_)),
            "{outcome:?}"
        );
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

    /// The API server keeps only `ephemeralContainers` from this subresource: a body whose other
    /// containers differ from `oldObject` causes no lookup, no warning and no rejection.
    #[test]
    fn ephemeral_container_subresource_ignores_the_other_lists() {
        let old = pod(json!({"containers": [{"name": "web", "image": ARGO}]}));
        let mut new = old.clone();
        new["spec"]["containers"][0]["image"] = json!("nginx:missing");
        new["spec"]["initContainers"] = json!([{"name": "init", "image": "nginx:gone"}]);
        new["spec"]["ephemeralContainers"] =
            json!([{"name": "debug", "image": "quay.io/argoproj/argocd:v2"}]);
        let policy = policy_from(&SETTINGS.replace("]}", r#"],"onMissing":"reject"}"#));
        let mut registry = registry();
        let outcome = admit(
            request("UPDATE", "ephemeralcontainers", new, old),
            &policy,
            &mut registry,
        );
        assert!(outcome.warnings.is_empty(), "{:?}", outcome.warnings);
        let pod = mutated(outcome);
        assert_eq!(
            pod["spec"]["ephemeralContainers"][0]["image"],
            format!("{ARGO}@{DIGEST_B}")
        );
        assert_eq!(registry.asked, [ARGO]);
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
        let (pod, warnings) = recorded(outcome);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(
            pod["spec"]["containers"][0]["image"],
            json!("nginx:missing")
        );
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
        let (pod, warnings) = recorded(outcome);
        assert_eq!(warnings.len(), LISTED_MAX + 1);
        assert_eq!(warnings[LISTED_MAX], "… and 30 more images not swapped");
        let record: Value = serde_json::from_str(
            pod["metadata"]["annotations"][UNMIRRORED_ANNOTATION]
                .as_str()
                .unwrap_or_default(),
        )
        .expect("JSON");
        assert_eq!(record.as_object().map(Map::len), Some(50));
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

    /// A re-applied container changed nothing: the summary counts it apart from swaps.
    #[test]
    fn the_summary_counts_reapplied_containers_apart_from_swaps() {
        let (request, _) = reapplied(Some(json!({"web": "nginx:1.27"})));
        let outcome = admit(request, &policy_from(SETTINGS), &mut registry());
        let summary: Value = serde_json::from_str(&outcome.audit["summary"]).expect("JSON");
        assert_eq!(
            (&summary["swapped"], &summary["reapplied"]),
            (&json!(0), &json!(1))
        );
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
        crate::registry::never_verifies!();

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
            &mut crate::verifiers::NoCluster,
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
                "lookup budget of 800 ms: 28 images were not looked up or compared in time and kept as they were (onLookupError is keep): \"app2:1\", \"app3:1\", \"app4:1\", \"app5:1\", \"app6:1\" (mirror.example.com would need about 300 ms, 200 ms were left), and 23 more; the evaluation had run 600 ms, 600 ms of it in 2 lookups (the slowest 300 ms)"
            ]
        );
        let summary: Value = serde_json::from_str(&audit["summary"]).expect("JSON");
        assert_eq!(
            summary,
            json!({"swapped": 2, "reapplied": 0, "kept": 28, "rejected": 0, "lookups": 2,
                   "lookupMilliseconds": 600, "evaluationMilliseconds": 600,
                   "budgetMilliseconds": 800, "notLookedUp": 28})
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
            message.starts_with("lookup budget of 800 ms: 28 images were not looked up or compared in time and refused (onLookupError is reject): \"app2:1\"")
                && message.ends_with("; the evaluation had run 600 ms, 600 ms of it in 2 lookups (the slowest 300 ms)"),
            "{message}"
        );
    }

    #[test]
    fn a_first_lookup_longer_than_the_budget_swaps_that_image_only() {
        let (outcome, asked) = budget_admission("", 5, 1_500);
        assert_eq!(asked, 1);
        assert!(
            outcome.warnings[0]
                == "lookup budget of 800 ms: 4 images were not looked up or compared in time and kept as they were (onLookupError is keep): \"app1:1\", \"app2:1\", \"app3:1\", \"app4:1\" (the budget had run out before a lookup on mirror.example.com); the evaluation had run 1500 ms, 1500 ms of it in 1 lookup (the slowest 1500 ms)",
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

    /// Reading the request took 150 ms before the first lookup: the warning says what each
    /// figure measures, the evaluation's time and the lookups' part of it.
    #[test]
    fn the_budget_warning_names_what_each_figure_measures() {
        let settings =
            r#"{"mirrors":[{"source":"docker.io","target":"mirror.example.com/dockerhub"}]}"#;
        let (object, inner) = many_images(5);
        let clock = FakeClock::default();
        clock.advance(Duration::from_millis(150));
        let mut registry = Distant {
            inner,
            clock: clock.clone(),
            ms: 300,
        };
        let outcome = super::admit(
            request("CREATE", "", object, Value::Null),
            &policy_from(settings),
            &mut registry,
            &mut crate::verifiers::NoCluster,
            &clock,
        );
        assert!(
            outcome.warnings[0].starts_with("lookup budget of 800 ms: 3 images were")
                && outcome.warnings[0].ends_with("(mirror.example.com would need about 300 ms, 50 ms were left); the evaluation had run 750 ms, 600 ms of it in 2 lookups (the slowest 300 ms)"),
            "{:?}",
            outcome.warnings
        );
        let summary: Value = serde_json::from_str(&outcome.audit["summary"]).expect("JSON");
        assert_eq!(
            (
                &summary["lookupMilliseconds"],
                &summary["evaluationMilliseconds"]
            ),
            (&json!(600), &json!(750))
        );
    }

    /// Lookups on two mirrors whose lookups take 85 and 405 ms (20 and 100 ms away): one image
    /// on the far mirror among eight on the near one, at every position. Every lookup after the
    /// first ends within the budget, and the far image is looked up while the budget is fresh.
    #[test]
    fn every_lookup_ends_within_the_budget_whatever_order_the_pod_names_its_registries() {
        let settings = r#"{"mirrors":[
            {"source":"docker.io","target":"near.example.com/hub"},
            {"source":"quay.io","target":"far.example.com/quay"}]}"#;
        let policy = policy_from(settings);
        for far_at in 0..=8 {
            let mut images: Vec<String> = (0..8).map(|i| format!("app{i}:1")).collect();
            images.insert(far_at, "quay.io/org/far:1".to_string());
            let containers: Vec<Value> = images
                .iter()
                .enumerate()
                .map(|(i, image)| json!({"name": format!("c{i}"), "image": image}))
                .collect();
            let clock = FakeClock::default();
            let mut registry = PerHost {
                clock: clock.clone(),
                latency_ms: [("near.example.com", 85), ("far.example.com", 405)],
                ended: Vec::new(),
            };
            let outcome = super::admit(
                request(
                    "CREATE",
                    "",
                    pod(json!({ "containers": containers })),
                    Value::Null,
                ),
                &policy,
                &mut registry,
                &mut crate::verifiers::NoCluster,
                &clock,
            );
            let late: Vec<_> = registry
                .ended
                .iter()
                .skip(1)
                .filter(|(_, at)| *at > 800)
                .collect();
            assert!(
                late.is_empty(),
                "far image at {far_at}: {late:?} of {:?}",
                registry.ended
            );
            let pod = mutated(outcome);
            assert!(
                pod["spec"]["containers"][far_at]["image"]
                    .as_str()
                    .is_some_and(|i| i.starts_with("far.example.com/quay/org/far:1@")),
                "far image at {far_at}: {pod}"
            );
        }
    }

    /// Answers every digest lookup after its registry host's latency, and notes when it ended.
    struct PerHost {
        clock: FakeClock,
        latency_ms: [(&'static str, u64); 2],
        ended: Vec<(String, u64)>,
    }

    impl Registry for PerHost {
        crate::registry::never_verifies!();

        fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError> {
            let host = crate::registry::registry_host(image);
            let ms = self
                .latency_ms
                .iter()
                .find(|(h, _)| *h == host)
                .map_or(0, |(_, ms)| *ms);
            self.clock.advance(Duration::from_millis(ms));
            let at = u64::try_from(self.clock.now().as_millis()).unwrap_or(u64::MAX);
            self.ended.push((image.to_string(), at));
            Ok(DIGEST_A.to_string())
        }

        fn manifest(&mut self, _image: &str) -> Result<Manifest, LookupError> {
            Err(LookupError::Failed("not used".to_string()))
        }
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
