//! `signatures`: verify-image-signatures' list, read as that policy reads it, so that an
//! operator pastes theirs (kubewarden/policies `verify-image-signatures/src/settings/`). Each
//! entry names one kind (`pubKeys`, `keyless`, `keylessPrefix`, `githubActions`,
//! `certificates`); a list that names none or two is refused here, where that policy's
//! untagged enum would fail with "data did not match any variant".

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::glob::Glob;
use crate::signatures::{SignatureCheck, SignatureRule};

#[derive(Deserialize, Serialize, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SignatureSetting {
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pub_keys: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyless: Option<Vec<KeylessSetting>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyless_prefix: Option<Vec<KeylessPrefixSetting>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub github_actions: Option<GithubActionsSetting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificates: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_chain: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_rekor_bundle: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// The SDK's `KeylessInfo`: snake case, as verify-image-signatures reads it.
#[derive(Deserialize, Serialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KeylessSetting {
    pub issuer: String,
    pub subject: String,
}

/// The SDK's `KeylessPrefixInfo`, whose field is `url_prefix`; verify-image-signatures' README
/// writes `urlPrefix`, so both spellings are read.
#[derive(Deserialize, Serialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KeylessPrefixSetting {
    pub issuer: String,
    #[serde(alias = "urlPrefix")]
    pub url_prefix: String,
}

#[derive(Deserialize, Serialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GithubActionsSetting {
    pub owner: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
}

/// Validates `signatures` into rules; every error names `signatures[i]`, the field and the
/// value.
pub(super) fn rules(settings: &[SignatureSetting], errors: &mut Vec<String>) -> Vec<SignatureRule> {
    settings
        .iter()
        .enumerate()
        .filter_map(|(i, setting)| rule(setting, &format!("signatures[{i}]"), errors))
        .collect()
}

fn rule(setting: &SignatureSetting, at: &str, errors: &mut Vec<String>) -> Option<SignatureRule> {
    let before = errors.len();
    let image = match Glob::new(&setting.image) {
        Ok(glob) => Some(glob),
        Err(error) => {
            errors.push(format!("{at}.image: {:?}: {error}", setting.image));
            None
        }
    };
    let kinds: Vec<&str> = [
        ("pubKeys", setting.pub_keys.is_some()),
        ("keyless", setting.keyless.is_some()),
        ("keylessPrefix", setting.keyless_prefix.is_some()),
        ("githubActions", setting.github_actions.is_some()),
        ("certificates", setting.certificates.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect();
    let check = match kinds[..] {
        [] => {
            errors.push(format!(
                "{at}: names no signature to verify; set one of pubKeys, keyless, keylessPrefix, githubActions or certificates"
            ));
            None
        }
        [_] => check(setting, at, errors),
        _ => {
            errors.push(format!(
                "{at}: sets {}; one entry verifies one kind of signature, write one entry per kind (each must verify)",
                kinds.join(" and ")
            ));
            None
        }
    };
    if setting.certificates.is_none()
        && (setting.certificate_chain.is_some() || setting.require_rekor_bundle.is_some())
    {
        errors.push(format!(
            "{at}: certificateChain and requireRekorBundle go with certificates, which is not set"
        ));
    }
    if let Some(annotations) = &setting.annotations
        && annotations.is_empty()
    {
        errors.push(format!(
            "{at}.annotations: is empty; remove it, or name the annotations every signature must carry"
        ));
    }
    if errors.len() > before {
        return None;
    }
    Some(SignatureRule {
        image: image?,
        check: check?,
        annotations: setting.annotations.clone(),
        origin: format!("{at} (image {:?})", setting.image),
    })
}

fn check(setting: &SignatureSetting, at: &str, errors: &mut Vec<String>) -> Option<SignatureCheck> {
    if let Some(keys) = &setting.pub_keys {
        pem_list(keys, "PUBLIC KEY", &format!("{at}.pubKeys"), errors);
        return Some(SignatureCheck::PubKeys(keys.clone()));
    }
    if let Some(identities) = &setting.keyless {
        if identities.is_empty() {
            errors.push(format!(
                "{at}.keyless: is empty; name at least one issuer and subject"
            ));
        }
        for (i, identity) in identities.iter().enumerate() {
            not_blank(
                &identity.issuer,
                &format!("{at}.keyless[{i}].issuer"),
                errors,
            );
            not_blank(
                &identity.subject,
                &format!("{at}.keyless[{i}].subject"),
                errors,
            );
        }
        let pairs = identities
            .iter()
            .map(|k| (k.issuer.clone(), k.subject.clone()))
            .collect();
        return Some(SignatureCheck::Keyless(pairs));
    }
    if let Some(prefixes) = &setting.keyless_prefix {
        if prefixes.is_empty() {
            errors.push(format!(
                "{at}.keylessPrefix: is empty; name at least one issuer and url_prefix"
            ));
        }
        for (i, prefix) in prefixes.iter().enumerate() {
            let field = format!("{at}.keylessPrefix[{i}]");
            not_blank(&prefix.issuer, &format!("{field}.issuer"), errors);
            // policy-server parses it with `Url::parse(..).expect(..)`
            // (policy-evaluator `sigstore_verification.rs`): a prefix that is not a URL would
            // end the host's verification, not answer it.
            if !is_absolute_url(&prefix.url_prefix) {
                errors.push(format!(
                    "{field}.url_prefix: {:?} is not an absolute URL, e.g. \"https://github.com/org/repo/.github/workflows/release.yml@refs/tags/\"",
                    prefix.url_prefix
                ));
            }
        }
        let pairs = prefixes
            .iter()
            .map(|k| (k.issuer.clone(), k.url_prefix.clone()))
            .collect();
        return Some(SignatureCheck::KeylessPrefix(pairs));
    }
    if let Some(github) = &setting.github_actions {
        not_blank(&github.owner, &format!("{at}.githubActions.owner"), errors);
        return Some(SignatureCheck::GithubActions {
            owner: github.owner.clone(),
            repo: github.repo.clone(),
        });
    }
    let certificates = setting.certificates.as_ref()?;
    pem_list(
        certificates,
        "CERTIFICATE",
        &format!("{at}.certificates"),
        errors,
    );
    if let Some(chain) = &setting.certificate_chain {
        pem_list(
            chain,
            "CERTIFICATE",
            &format!("{at}.certificateChain"),
            errors,
        );
    }
    let Some(require_rekor_bundle) = setting.require_rekor_bundle else {
        // verify-image-signatures requires it too (a `bool`, no default).
        errors.push(format!(
            "{at}.requireRekorBundle: is required with certificates; true needs a Rekor bundle in each signature (stronger), false does not"
        ));
        return None;
    };
    Some(SignatureCheck::Certificates {
        certificates: certificates.clone(),
        chain: setting.certificate_chain.clone(),
        require_rekor_bundle,
    })
}

fn not_blank(value: &str, field: &str, errors: &mut Vec<String>) {
    if value.trim().is_empty() {
        errors.push(format!("{field}: is empty"));
    }
}

/// A non-empty list of PEM blocks of `label`. Only the armour is checked: parsing the key or
/// the certificate is the host's, at verification (the module carries no crypto).
fn pem_list(items: &[String], label: &str, field: &str, errors: &mut Vec<String>) {
    if items.is_empty() {
        errors.push(format!("{field}: is empty; give at least one PEM {label}"));
    }
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    for (i, item) in items.iter().enumerate() {
        let text = item.trim();
        if !(text.starts_with(&begin) && text.ends_with(&end)) {
            let shown = crate::text::truncated(text, 40);
            errors.push(format!(
                "{field}[{i}]: {shown:?} is not a PEM {label}: it must start with {begin:?} and end with {end:?}"
            ));
        }
    }
}

/// `scheme://host...`: what `Url::parse` accepts for the prefixes people write.
fn is_absolute_url(text: &str) -> bool {
    let Some((scheme, rest)) = text.split_once("://") else {
        return false;
    };
    !scheme.is_empty()
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
        && !rest.is_empty()
        && !rest.starts_with('/')
        && !text.chars().any(char::is_whitespace)
}

#[cfg(test)]
mod tests {
    use crate::policy::Policy;
    use crate::settings::parse_settings;
    use crate::signatures::SignatureCheck;
    use rstest::rstest;

    const KEY: &str = "-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----";
    const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----";

    fn policy(signatures: &str) -> Result<Policy, String> {
        let json = format!(
            r#"{{"mirrors":[{{"source":"docker.io","target":"m.io/hub"}}],"signatures":{signatures}}}"#
        );
        Policy::from_settings(&parse_settings(json.as_bytes())?)
    }

    /// verify-image-signatures' own examples (its README), pasted.
    #[test]
    fn verify_image_signatures_lists_are_read_as_they_are() {
        let list = serde_json::json!([
            {"image": "ghcr.io/kubewarden/*", "githubActions": {"owner": "kubewarden", "repo": "app-example"}},
            {"image": "ghcr.io/kubewarden/*", "keylessPrefix": [{"issuer": "https://token.actions.githubusercontent.com", "urlPrefix": "https://github.com/kubewarden/app-example/.github/workflows/ci.yml@refs/tags/"}]},
            {"image": "ghcr.io/kubewarden/*", "keyless": [{"issuer": "https://token.actions.githubusercontent.com", "subject": "kubewarden"}]},
            {"image": "ghcr.io/kubewarden/*", "pubKeys": [KEY, KEY], "annotations": {"env": "prod"}},
            {"image": "registry.acme.org/secure-project/*", "certificates": [CERT, CERT], "certificateChain": [CERT], "requireRekorBundle": true}
        ]);
        let policy = policy(&list.to_string()).expect("valid signatures");
        assert_eq!(policy.signatures.len(), 5);
        assert!(matches!(
            &policy.signatures[4].check,
            SignatureCheck::Certificates { certificates, require_rekor_bundle: true, .. } if certificates.len() == 2
        ));
    }

    #[rstest]
    #[case::no_kind(r#"[{"image":"*"}]"#, "signatures[0]: names no signature to verify")]
    #[case::two_kinds(
        r#"[{"image":"*","pubKeys":["K"],"keyless":[]}]"#,
        "signatures[0]: sets pubKeys and keyless"
    )]
    #[case::not_pem(
        r#"[{"image":"*","pubKeys":["hello"]}]"#,
        "signatures[0].pubKeys[0]: \"hello\" is not a PEM PUBLIC KEY"
    )]
    #[case::no_keys(r#"[{"image":"*","pubKeys":[]}]"#, "signatures[0].pubKeys: is empty")]
    #[case::empty_image(
        r#"[{"image":"","githubActions":{"owner":"o"}}]"#,
        "signatures[0].image: \"\": a pattern cannot be empty"
    )]
    #[case::prefix_not_url(
        r#"[{"image":"*","keylessPrefix":[{"issuer":"i","url_prefix":"github.com/org"}]}]"#,
        "signatures[0].keylessPrefix[0].url_prefix: \"github.com/org\" is not an absolute URL"
    )]
    #[case::rekor_unsaid(
        r#"[{"image":"*","certificates":["-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----"]}]"#,
        "signatures[0].requireRekorBundle: is required with certificates"
    )]
    #[case::chain_without_certificates(
        r#"[{"image":"*","githubActions":{"owner":"o"},"requireRekorBundle":true}]"#,
        "signatures[0]: certificateChain and requireRekorBundle go with certificates"
    )]
    #[case::unknown_field(
        r#"[{"image":"*","pubkeys":["K"]}]"#,
        "signatures[0].pubkeys: unknown field `pubkeys`, expected one of `image`, `pubKeys`"
    )]
    fn bad_rules_are_refused_naming_the_rule_and_the_field(
        #[case] signatures: &str,
        #[case] expected: &str,
    ) {
        let error = policy(signatures).expect_err("invalid signatures");
        assert!(error.contains(expected), "{error}");
    }

    /// A covered image is always written pinned: `pinDigest: false` beside `signatures` is
    /// refused however either is written, and allowed only without `signatures`.
    #[rstest]
    #[case::pub_keys(
        r#""signatures":[{"image":"*","pubKeys":["KEY"]}],"pinDigest":false"#,
        true
    )]
    #[case::written_first(r#""pinDigest":false,"signatures":[{"image":"docker.io/*","keyless":[{"issuer":"i","subject":"s"}]}]"#, true)]
    #[case::with_verify_source(r#""verifySource":true,"pinDigest":false,"signatures":[{"image":"*","githubActions":{"owner":"o"}}]"#, true)]
    #[case::pinned(
        r#""signatures":[{"image":"*","pubKeys":["KEY"]}],"pinDigest":true"#,
        false
    )]
    #[case::no_signatures(r#""signatures":[],"pinDigest":false"#, false)]
    fn pin_digest_false_is_refused_with_signatures(#[case] fields: &str, #[case] refused: bool) {
        let json = format!(
            r#"{{"mirrors":[{{"source":"docker.io","target":"m.io/hub"}}],{}}}"#,
            fields.replace("KEY", &KEY.replace('\n', "\\n"))
        );
        let result = Policy::from_settings(&parse_settings(json.as_bytes()).expect("parsed"));
        match result {
            Err(error) if refused => assert!(
                error.contains("pinDigest: false cannot be used with signatures"),
                "{error}"
            ),
            Ok(_) if !refused => {}
            other => panic!(
                "{fields}: refused {refused} expected, got {:?}",
                other.err()
            ),
        }
    }

    #[test]
    fn on_unverified_reject_without_signatures_is_refused() {
        let json =
            br#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"}],"onUnverified":"reject"}"#;
        let error =
            Policy::from_settings(&parse_settings(json).expect("parsed")).expect_err("refused");
        assert!(
            error.contains("onUnverified: reject is only used with signatures"),
            "{error}"
        );
    }
}
