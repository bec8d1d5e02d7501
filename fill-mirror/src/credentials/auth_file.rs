//! The one docker config skopeo reads: the user's file (a mounted Secret) merged with the
//! binary's own logins, written where only this user reads it.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::Context;
use serde_json::{Value, json};

/// The docker config skopeo reads: the user's file as it is, each host the binary logs in to
/// itself replaced by its own login.
pub fn merge(user: Option<Value>, logins: &BTreeMap<String, String>) -> Value {
    let mut config = match user {
        Some(Value::Object(map)) => Value::Object(map),
        _ => json!({}),
    };
    if !config.get("auths").is_some_and(Value::is_object) {
        config["auths"] = json!({});
    }
    for (host, auth) in logins {
        config["auths"][host] = json!({ "auth": auth });
    }
    config
}

/// The user's docker config, as JSON.
pub(super) fn read_user_file(path: &Path) -> anyhow::Result<Value> {
    let flag = format!("--auth-file {}", path.display());
    let text = std::fs::read_to_string(path).with_context(|| flag.clone())?;
    let value: Value =
        serde_json::from_str(&text).with_context(|| format!("{flag}: not a docker config JSON"))?;
    anyhow::ensure!(
        value.is_object(),
        "{flag}: not a docker config JSON (an object with \"auths\")"
    );
    Ok(value)
}

/// Writes `bytes` to `path` as a new file only its owner reads (0600), then renames it over
/// `path`: skopeo never reads half a file.
pub(super) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let next = path.with_extension("json.next");
    let _ = std::fs::remove_file(&next);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&next)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&next, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_merged_config_keeps_the_user_s_entries_and_replaces_the_binary_s_hosts() {
        let user = json!({
            "auths": {
                "quay.io": {"auth": "cm9ib3Q6cXVheQ=="},
                "1.dkr.example": {"auth": "b2xkOm9sZA=="}
            },
            "credHelpers": {"gcr.io": "gcloud"}
        });
        let logins = BTreeMap::from([("1.dkr.example".to_string(), "QVdTOm5ldw==".to_string())]);
        let merged = merge(Some(user), &logins);
        assert_eq!(
            merged,
            json!({
                "auths": {
                    "quay.io": {"auth": "cm9ib3Q6cXVheQ=="},
                    "1.dkr.example": {"auth": "QVdTOm5ldw=="}
                },
                "credHelpers": {"gcr.io": "gcloud"}
            })
        );
        assert_eq!(
            merge(None, &logins),
            json!({"auths": {"1.dkr.example": {"auth": "QVdTOm5ldw=="}}})
        );
    }
}
