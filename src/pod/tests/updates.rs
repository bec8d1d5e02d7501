//! Updates and the ephemeral-containers subresource: only what an update changes is decided,
//! and only what the API server keeps of the request.

use super::*;

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
    let old = pod(json!({"containers": [{"name": "web", "image": "quay.io/argoproj/argocd:v2"}]}));
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
