//! The one docker config skopeo reads: the user's file (a mounted Secret) merged with the
//! binary's own logins, written where only this user reads it.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::Context;
use base64::Engine;
use serde_json::{Value, json};

/// Docker Hub's names: the one images carry, its API host and the legacy index key `docker
/// login` writes (`https://index.docker.io/v1/`).
const DOCKER_HUB: [&str; 3] = ["docker.io", "registry-1.docker.io", "index.docker.io"];

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

/// The login (base64 of `user:password`) a docker config holds for `host`, as containers/image
/// finds it: the entry named by the host itself, else one whose key names it with a scheme or a
/// path (`https://index.docker.io/v1/`, `quay.io/team`), Docker Hub under any of its names; its
/// `auth`, or its `username` and `password`. None without one (a `credHelpers` entry is for
/// skopeo alone).
pub fn entry(config: &Value, host: &str) -> Option<String> {
    let auths = config.get("auths")?.as_object()?;
    let names_host = |key: &str| {
        let bare = key
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        let bare = bare.split('/').next().unwrap_or(bare);
        bare == host || (DOCKER_HUB.contains(&bare) && DOCKER_HUB.contains(&host))
    };
    let value = auths.get(host).or_else(|| {
        auths
            .iter()
            .find(|(key, _)| names_host(key))
            .map(|(_, v)| v)
    })?;
    if let Some(auth) = value
        .get("auth")
        .and_then(Value::as_str)
        .filter(|a| !a.is_empty())
    {
        return Some(auth.to_string());
    }
    let user = value.get("username")?.as_str()?;
    let password = value.get("password")?.as_str()?;
    Some(base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
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

    #[rstest::rstest]
    #[case::its_own_key("quay.io", Some("cm9ib3Q6cXVheQ=="))]
    #[case::docker_hub_s_legacy_key("docker.io", Some("aHViOmh1Yg=="))]
    #[case::a_key_with_a_path("ghcr.io", Some("Z2g6Z2g="))]
    #[case::username_and_password("127.0.0.1:5000", Some("cHVsbGVyOnB1bGwtdG9rZW4="))]
    #[case::none("registry.example", None)]
    fn a_host_s_login_is_found_as_containers_image_finds_it(
        #[case] host: &str,
        #[case] expected: Option<&str>,
    ) {
        let config = json!({"auths": {
            "quay.io": {"auth": "cm9ib3Q6cXVheQ=="},
            "https://index.docker.io/v1/": {"auth": "aHViOmh1Yg=="},
            "ghcr.io/team": {"auth": "Z2g6Z2g="},
            "127.0.0.1:5000": {"username": "puller", "password": "pull-token"},
        }});
        assert_eq!(entry(&config, host).as_deref(), expected);
    }

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
