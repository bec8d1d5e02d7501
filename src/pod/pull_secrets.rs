//! A mirror's `pullSecret`: appended to the Pod on creation. (After creation the API server
//! refuses new secrets, so the decision skips mirrors whose secret the Pod lacks: see
//! `crate::decide::PullSecrets`.)

use serde_json::Value;

pub(super) fn pull_secret_names(object: &Value) -> Vec<String> {
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
pub(super) fn add_pull_secrets<'s>(
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
