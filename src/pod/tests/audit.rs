//! The audit annotations an admission writes for the API server's audit log, within its
//! rules and bounded for huge Pods.

use super::*;

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
