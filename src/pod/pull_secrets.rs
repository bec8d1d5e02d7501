//! A rule's `pullSecret`: appended to the Pod on creation, and, after creation (when the API
//! server refuses new secrets), a reason to keep an image rather than send it to a mirror the
//! Pod cannot pull from.

use serde_json::Value;

use crate::decide::{Decision, Note, Reason};
use crate::text::quote;

use super::Operation;

/// On update and for ephemeral containers the API server refuses new `imagePullSecrets`: a mirror
/// that needs a secret the Pod lacks would only turn into ImagePullBackOff.
pub(super) fn check_pull_secret(
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
