//! The re-apply rule: a manifest re-sent with the original image keeps the running swap the
//! Pod's record names, without a lookup.

use super::*;

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
