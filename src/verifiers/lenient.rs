//! A verifier's `signatures`, read as verify-image-signatures reads them (kubewarden/policies
//! `policies/verify-image-signatures/src/settings/`): an untagged enum tried in the order
//! `PubKeys`, `Keyless`, `GithubActions`, `KeylessPrefix`, `Certificate`, structs that ignore
//! unknown fields, `image` matched by `wildmatch` (only `*` and `?` are special), `keyless: []`
//! and `annotations: {}` accepted. The policy's own `signatures` stay strictly validated
//! (`signatures`); a verifier is read as it is, since this policy must verify what it verifies.
//!
//! A rule that reads as no kind, or that its own validation would refuse, is kept as
//! [`SignatureCheck::Unreadable`] under its own `image` pattern: the images that pattern
//! matches cannot be verified (`onLookupError`), and no other image is held up by it. A rule
//! without a readable `image` could match anything, and is kept under `*`.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::glob::Glob;
use crate::signatures::{SignatureCheck, SignatureRule};

/// The rules of a verifier's `settings.signatures`, each entry read on its own; `at` names the
/// policy. A list that is not a list could cover anything: one unreadable rule under `*`.
pub fn verifier_rules_from(list: &Value, at: &str) -> Vec<SignatureRule> {
    let Some(entries) = list.as_array() else {
        return vec![unreadable(
            "*",
            format!("{at} settings.signatures"),
            "is not a list".to_string(),
        )];
    };
    entries
        .iter()
        .enumerate()
        .map(|(i, entry)| rule(entry, &format!("{at} settings.signatures[{i}]")))
        .collect()
}

fn unreadable(image: &str, origin: String, why: String) -> SignatureRule {
    SignatureRule {
        image: Glob::wildmatch(image),
        check: SignatureCheck::Unreadable(format!(
            "the verifier rule {origin} cannot be read: {why}"
        )),
        annotations: None,
        origin,
    }
}

/// One entry, as the first of verify-image-signatures' kinds that deserialises it.
fn rule(entry: &Value, at: &str) -> SignatureRule {
    let image = entry.get("image").and_then(Value::as_str);
    let origin = format!("{at} (image {:?})", image.unwrap_or("*"));
    let Some(image) = image.filter(|image| !image.is_empty()) else {
        return unreadable("*", origin, "it has no image pattern".to_string());
    };
    let annotations = match entry.get("annotations") {
        None | Some(Value::Null) => None,
        Some(value) => match string_map(value) {
            Some(map) => Some(map),
            None => {
                let why = "its annotations are not a map of strings".to_string();
                return unreadable(image, origin, why);
            }
        },
    };
    match check(entry) {
        Ok(check) => SignatureRule {
            image: Glob::wildmatch(image),
            check,
            annotations,
            origin,
        },
        Err(why) => unreadable(image, origin, why),
    }
}

/// The kind, in verify-image-signatures' order; an error when none deserialises, or when the
/// one that does fails its validation (that verifier would not load) or would end the host's
/// verification rather than answer it.
fn check(entry: &Value) -> Result<SignatureCheck, String> {
    if let Some(keys) = entry.get("pubKeys").and_then(strings) {
        if keys.is_empty() || !keys.iter().all(|key| pem(key)) {
            return Err("pubKeys must be PEM public keys, at least one".to_string());
        }
        return Ok(SignatureCheck::PubKeys(keys));
    }
    if let Some(identities) = entry
        .get("keyless")
        .and_then(|list| pairs(list, "issuer", &["subject"]))
    {
        return Ok(SignatureCheck::Keyless(identities));
    }
    if let Some(github) = entry.get("githubActions").and_then(Value::as_object)
        && let Some(owner) = github.get("owner").and_then(Value::as_str)
    {
        let repo = match github.get("repo") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(repo)) => Ok(Some(repo.clone())),
            Some(_) => Err(()),
        };
        if let Ok(repo) = repo {
            return Ok(SignatureCheck::GithubActions {
                owner: owner.to_string(),
                repo,
            });
        }
    }
    if let Some(prefixes) = entry
        .get("keylessPrefix")
        .and_then(|list| pairs(list, "issuer", &["url_prefix", "urlPrefix"]))
    {
        // policy-server parses each prefix with `Url::parse(..).expect(..)`.
        if prefixes.is_empty() || !prefixes.iter().all(|(_, url)| url.contains("://")) {
            return Err("keylessPrefix must list URL prefixes, at least one".to_string());
        }
        return Ok(SignatureCheck::KeylessPrefix(prefixes));
    }
    if let Some(certificates) = entry.get("certificates").and_then(strings)
        && let Some(require_rekor_bundle) = entry.get("requireRekorBundle").and_then(Value::as_bool)
    {
        let chain = match entry.get("certificateChain") {
            None | Some(Value::Null) => None,
            Some(chain) => Some(strings(chain).ok_or("certificateChain is not a list of strings")?),
        };
        if certificates.is_empty() || !certificates.iter().all(|c| pem(c)) {
            return Err("certificates must be PEM certificates, at least one".to_string());
        }
        return Ok(SignatureCheck::Certificates {
            certificates,
            chain,
            require_rekor_bundle,
        });
    }
    Err("it names no kind of signature verify-image-signatures reads (pubKeys, keyless, githubActions, keylessPrefix, or certificates with requireRekorBundle)".to_string())
}

fn strings(value: &Value) -> Option<Vec<String>> {
    value
        .as_array()?
        .iter()
        .map(|item| item.as_str().map(str::to_string))
        .collect()
}

fn string_map(value: &Value) -> Option<BTreeMap<String, String>> {
    value
        .as_object()?
        .iter()
        .map(|(key, value)| Some((key.clone(), value.as_str()?.to_string())))
        .collect()
}

/// A list of objects with a string `first` and a string under one of `second`'s spellings.
fn pairs(value: &Value, first: &str, second: &[&str]) -> Option<Vec<(String, String)>> {
    value
        .as_array()?
        .iter()
        .map(|item| {
            let a = item.get(first)?.as_str()?;
            let b = second.iter().find_map(|name| item.get(*name))?.as_str()?;
            Some((a.to_string(), b.to_string()))
        })
        .collect()
}

/// PEM armour of any label, as the `pem` crate's parse (verify-image-signatures' check)
/// requires of it.
fn pem(text: &str) -> bool {
    let text = text.trim();
    text.starts_with("-----BEGIN ") && text.contains("-----END ") && text.ends_with("-----")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubewarden_policy_sdk::host_capabilities::verification::{KeylessInfo, KeylessPrefixInfo};
    use rstest::rstest;
    use serde::Deserialize;
    use serde_json::json;

    /// verify-image-signatures' own `Signature` (kubewarden/policies,
    /// `policies/verify-image-signatures/src/settings/`, as of 2026-08): the untagged enum and
    /// its structs, copied field for field, so each shape is read here as it reads it.
    #[derive(Deserialize, Debug)]
    #[serde(untagged)]
    #[allow(dead_code)]
    enum Theirs {
        PubKeys {
            image: String,
            #[serde(rename = "pubKeys")]
            pub_keys: Vec<String>,
            annotations: Option<BTreeMap<String, String>>,
        },
        Keyless {
            image: String,
            keyless: Vec<KeylessInfo>,
            annotations: Option<BTreeMap<String, String>>,
        },
        GithubActions {
            image: String,
            #[serde(rename = "githubActions")]
            github_actions: TheirGithub,
            annotations: Option<BTreeMap<String, String>>,
        },
        KeylessPrefix {
            image: String,
            #[serde(rename = "keylessPrefix")]
            keyless_prefix: Vec<KeylessPrefixInfo>,
            annotations: Option<BTreeMap<String, String>>,
        },
        Certificate {
            image: String,
            certificates: Vec<String>,
            #[serde(rename = "certificateChain")]
            certificate_chain: Option<Vec<String>>,
            #[serde(rename = "requireRekorBundle")]
            require_rekor_bundle: bool,
            annotations: Option<BTreeMap<String, String>>,
        },
    }

    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct TheirGithub {
        owner: String,
        repo: Option<String>,
    }

    fn their_kind(entry: &Value) -> &'static str {
        match serde_json::from_value::<Theirs>(entry.clone()) {
            Ok(Theirs::PubKeys { .. }) => "pubKeys",
            Ok(Theirs::Keyless { .. }) => "keyless",
            Ok(Theirs::GithubActions { .. }) => "githubActions",
            Ok(Theirs::KeylessPrefix { .. }) => "keylessPrefix",
            Ok(Theirs::Certificate { .. }) => "certificates",
            Err(_) => "unreadable",
        }
    }

    fn our_kind(rule: &SignatureRule) -> &'static str {
        match rule.check {
            SignatureCheck::PubKeys(_) => "pubKeys",
            SignatureCheck::Keyless(_) => "keyless",
            SignatureCheck::GithubActions { .. } => "githubActions",
            SignatureCheck::KeylessPrefix(_) => "keylessPrefix",
            SignatureCheck::Certificates { .. } => "certificates",
            SignatureCheck::Unreadable(_) => "unreadable",
        }
    }

    const KEY: &str = "-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----";
    const ISSUER: &str = "https://token.actions.githubusercontent.com";

    /// Each shape a verifier may hold that this policy's own `signatures` refuses: read as
    /// verify-image-signatures reads it, kind for kind, and matched by its image as
    /// `wildmatch` matches (every character but `*` and `?` itself).
    #[rstest]
    #[case::brackets_in_image(json!({"image": "ghcr.io/org/app:[v1]", "pubKeys": [KEY]}), "ghcr.io/org/app:[v1]")]
    #[case::braces_in_image(json!({"image": "ghcr.io/{org}/*", "pubKeys": [KEY]}), "ghcr.io/{org}/app:1")]
    #[case::backslash_in_image(json!({"image": "ghcr.io/org\\*", "pubKeys": [KEY]}), "ghcr.io/org\\app")]
    #[case::space_in_image(json!({"image": "ghcr.io/org/* ", "pubKeys": [KEY]}), "ghcr.io/org/app ")]
    #[case::two_kinds_the_first_wins(json!({"image": "*", "pubKeys": [KEY], "keyless": [{"issuer": ISSUER, "subject": "s"}]}), "x")]
    #[case::keyless_before_github(json!({"image": "*", "githubActions": {"owner": "o"}, "keyless": [{"issuer": ISSUER, "subject": "s"}]}), "x")]
    #[case::empty_keyless(json!({"image": "*", "keyless": []}), "x")]
    #[case::empty_annotations(json!({"image": "*", "pubKeys": [KEY], "annotations": {}}), "x")]
    #[case::unknown_fields(json!({"image": "*", "githubActions": {"owner": "o", "workflow": "w"}, "note": "x"}), "x")]
    #[case::certificates_without_rekor(json!({"image": "*", "certificates": [KEY]}), "x")]
    #[case::no_kind(json!({"image": "ghcr.io/org/*"}), "ghcr.io/org/app")]
    #[case::annotations_not_strings(json!({"image": "ghcr.io/org/*", "pubKeys": [KEY], "annotations": {"n": 1}}), "ghcr.io/org/app")]
    fn a_verifiers_rule_is_read_as_verify_image_signatures_reads_it(
        #[case] entry: Value,
        #[case] matched: &str,
    ) {
        let rules = verifier_rules_from(&json!([entry.clone()]), "ClusterAdmissionPolicy v");
        assert_eq!(rules.len(), 1);
        assert_eq!(our_kind(&rules[0]), their_kind(&entry), "{rules:?}");
        assert!(rules[0].image.matches(matched), "{:?}", rules[0].image);
    }

    /// A rule it cannot read holds up only the images its own pattern matches, and says which
    /// rule; one without an image pattern could match any.
    #[test]
    fn an_unreadable_rule_covers_only_what_its_pattern_matches() {
        let rules = verifier_rules_from(
            &json!([{"image": "ghcr.io/org/*", "pubKeys": ["not a key"]}, {"pubKeys": [KEY]}]),
            "AdmissionPolicy team/v",
        );
        assert!(rules[0].image.matches("ghcr.io/org/app:1"));
        assert!(!rules[0].image.matches("docker.io/library/nginx:1"));
        assert!(
            matches!(&rules[0].check, SignatureCheck::Unreadable(why) if why == "the verifier rule AdmissionPolicy team/v settings.signatures[0] (image \"ghcr.io/org/*\") cannot be read: pubKeys must be PEM public keys, at least one"),
            "{rules:?}"
        );
        assert!(rules[1].image.matches("docker.io/library/nginx:1"));
        assert_eq!(our_kind(&rules[1]), "unreadable");
        let not_a_list = verifier_rules_from(&json!({"image": "*"}), "AdmissionPolicy team/v");
        assert_eq!(our_kind(&not_a_list[0]), "unreadable");
    }
}
