//! The swapping role's admission, tested end to end through [`admit`] over an in-memory
//! registry: the helpers every topic shares and the plain cases here, one file per topic beside
//! them. Apart from `mod.rs` so that it reads as the steps.

use super::*;
use crate::budget::tests::FakeClock;
use crate::decide::tests::{DIGEST_A, DIGEST_B, FakeRegistry, policy_from};
use crate::plan::{UNMIRRORED_ANNOTATION, UNMIRRORED_LABEL};
use crate::registry::{LookupError, Manifest};
use kubewarden_policy_sdk::request::GroupVersionKind;
use report::{AUDITED_CHARS_MAX, AUDITED_MAX, LISTED_MAX};
use serde_json::{Map, Value, json};

mod audit;
mod budget;
mod reapply;
mod updates;

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
    pod["metadata"]["annotations"] = json!({ ORIGINAL_IMAGES_ANNOTATION: originals.to_string() });
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
