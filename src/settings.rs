//! The user-facing settings, and their validation into the [`Policy`] the decisions run on.
//!
//! Validation and compilation are one function, [`Policy::from_settings`]: `validate_settings`
//! calls it when the policy is loaded, and `validate` calls it again at every admission because
//! settings arrive with every request. It is linear in the size of the settings and builds no
//! regular expression.

use kubewarden_policy_sdk::settings::Validatable;
use serde::{Deserialize, Serialize};

use crate::glob::Glob;
use crate::reference::{self, is_domain, is_path_component, looks_like_registry_host};
use crate::rules::{Prefix, Rule};

#[derive(Deserialize, Serialize, Debug, Clone, PartialEq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct Settings {
    pub mirrors: Vec<MirrorSetting>,
    pub default_mirror: Option<DefaultMirrorSetting>,
    pub swap_policy: SwapPolicy,
    pub verify_source: bool,
    pub platforms: Vec<String>,
    pub pin_digest: bool,
    pub on_missing: Fallback,
    pub on_lookup_error: Fallback,
    pub exclude: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            mirrors: Vec::new(),
            default_mirror: None,
            swap_policy: SwapPolicy::Exists,
            verify_source: false,
            platforms: Vec::new(),
            pin_digest: true,
            on_missing: Fallback::Keep,
            on_lookup_error: Fallback::Keep,
            exclude: Vec::new(),
        }
    }
}

#[derive(Deserialize, Serialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MirrorSetting {
    pub source: String,
    pub target: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret: Option<String>,
}

#[derive(Deserialize, Serialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DefaultMirrorSetting {
    pub registry: String,
}

#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum SwapPolicy {
    /// Swap only to what a lookup has just verified.
    #[default]
    Exists,
    /// Swap without looking.
    Always,
}

#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum Fallback {
    /// Admit the Pod with its original image, and say why in a warning.
    #[default]
    Keep,
    /// Refuse the Pod, and say why.
    Reject,
}

/// The settings, validated and ready for decisions.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Longest source first, so the first match is the most specific.
    pub rules: Vec<Rule>,
    pub default_mirror: Option<Prefix>,
    /// Every target, so that an image already swapped is recognised and left alone.
    pub targets: Vec<Prefix>,
    pub exclude: Vec<Glob>,
    pub swap_policy: SwapPolicy,
    /// Tag references: also require the mirror's content to be the source's.
    pub verify_source: bool,
    /// With `verify_source`, the platforms a mirror copy of a multi-platform source must cover;
    /// empty means every platform the source lists.
    pub platforms: Vec<Platform>,
    pub pin_digest: bool,
    pub on_missing: Fallback,
    pub on_lookup_error: Fallback,
}

/// `os/architecture[/variant]`, as image indexes name platforms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl Platform {
    pub fn parse(text: &str) -> Option<Platform> {
        let parts: Vec<&str> = text.split('/').collect();
        let word = |s: &&str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        if !(2..=3).contains(&parts.len()) || !parts.iter().all(word) {
            return None;
        }
        Some(Platform {
            os: parts[0].to_string(),
            architecture: parts[1].to_string(),
            variant: parts.get(2).map(|v| v.to_string()),
        })
    }

    /// Whether an index entry's platform serves this one: a platform named without a variant
    /// accepts any variant of its architecture.
    pub fn covers(&self, os: &str, architecture: &str, variant: Option<&str>) -> bool {
        self.os == os
            && self.architecture == architecture
            && self
                .variant
                .as_deref()
                .is_none_or(|wanted| Some(wanted) == variant)
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        match &self.variant {
            Some(variant) => write!(f, "/{variant}"),
            None => Ok(()),
        }
    }
}

impl Policy {
    /// Validates the settings; every error names the field, the rule and the value.
    pub fn from_settings(settings: &Settings) -> Result<Policy, String> {
        let mut errors = Vec::new();
        let mut rules = Vec::new();
        for (index, mirror) in settings.mirrors.iter().enumerate() {
            let field = |name: &str| format!("mirrors[{index}].{name}");
            let source = parse_prefix(&field("source"), &mirror.source)
                .map_err(|e| errors.push(e))
                .ok();
            let target = parse_prefix(&field("target"), &mirror.target)
                .map_err(|e| errors.push(e))
                .ok();
            if let Some(secret) = mirror.pull_secret.as_ref().filter(|s| !is_secret_name(s)) {
                errors.push(format!(
                    "{}: {secret:?} is not a valid Secret name (lower-case letters, digits, '-' and '.', at most 253 characters)",
                    field("pullSecret")
                ));
            }
            if let (Some(source), Some(target)) = (source, target) {
                if target.is_within(&source) {
                    errors.push(format!(
                        "{}: {:?} is inside its own source {:?}: swapped images would match the rule again",
                        field("target"),
                        mirror.target,
                        mirror.source
                    ));
                }
                rules.push(Rule {
                    index,
                    source,
                    target,
                    pull_secret: mirror.pull_secret.clone(),
                });
            }
        }
        for (i, a) in rules.iter().enumerate() {
            if let Some(b) = rules[..i].iter().find(|b| b.source == a.source) {
                errors.push(format!(
                    "mirrors[{}].source: {:?} is the same source as mirrors[{}], so one of the two rules would never apply",
                    a.index,
                    settings.mirrors.get(a.index).map_or(a.source.as_str(), |m| m.source.as_str()),
                    b.index
                ));
            }
        }
        let default_mirror = settings.default_mirror.as_ref().and_then(|mirror| {
            parse_prefix("defaultMirror.registry", &mirror.registry)
                .map_err(|e| errors.push(e))
                .ok()
        });
        if settings.mirrors.is_empty() && settings.default_mirror.is_none() {
            errors.push("mirrors: no mirror is configured; set mirrors or defaultMirror, or the policy swaps nothing".to_string());
        }
        let exclude = settings
            .exclude
            .iter()
            .enumerate()
            .filter_map(|(i, pattern)| {
                Glob::new(pattern)
                    .map_err(|e| errors.push(format!("exclude[{i}]: {pattern:?}: {e}")))
                    .ok()
            })
            .collect();
        let platforms = settings
            .platforms
            .iter()
            .enumerate()
            .filter_map(|(i, text)| {
                Platform::parse(text)
                    .ok_or_else(|| errors.push(format!("platforms[{i}]: {text:?} is not os/architecture[/variant], e.g. \"linux/arm64\" or \"linux/arm/v7\"")))
                    .ok()
            })
            .collect();
        if !settings.platforms.is_empty() && !settings.verify_source {
            errors.push("platforms: only used with verifySource: true, which is not set; set it, or remove platforms".to_string());
        }
        if settings.verify_source && settings.swap_policy == SwapPolicy::Always {
            errors.push("verifySource: true needs swapPolicy: exists; swapPolicy: always swaps without looking".to_string());
        }
        if !errors.is_empty() {
            return Err(errors.join("; "));
        }
        rules.sort_by_key(|rule| std::cmp::Reverse(rule.source.as_str().len()));
        let targets = rules
            .iter()
            .map(|r| r.target.clone())
            .chain(default_mirror.clone())
            .collect();
        Ok(Policy {
            rules,
            default_mirror,
            targets,
            exclude,
            swap_policy: settings.swap_policy,
            verify_source: settings.verify_source,
            platforms,
            pin_digest: settings.pin_digest,
            on_missing: settings.on_missing,
            on_lookup_error: settings.on_lookup_error,
        })
    }
}

impl Validatable for Settings {
    fn validate(&self) -> Result<(), String> {
        Policy::from_settings(self).map(|_| ())
    }
}

/// Parses the JSON settings, naming the field of any type error, unknown field or unknown value.
pub fn parse_settings(json: &[u8]) -> Result<Settings, String> {
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." {
            "settings".to_string()
        } else {
            path
        };
        format!("{path}: {}", e.inner())
    })
}

/// `host[:port][/path]`: a registry host runtimes read as a host, and lower-case path segments.
fn parse_prefix(field: &str, value: &str) -> Result<Prefix, String> {
    let (host, path) = match value.split_once('/') {
        Some((host, path)) => (host, Some(path)),
        None => (value, None),
    };
    if value.is_empty() {
        return Err(format!(
            "{field}: the value is empty; write a registry host, e.g. \"mirror.example.com/dockerhub\""
        ));
    }
    if value.contains(['@']) || path.is_some_and(|p| p.contains(':')) {
        return Err(format!(
            "{field}: {value:?} names an image; write a registry host and optional path, without tag or digest"
        ));
    }
    if !is_domain(host) {
        return Err(format!(
            "{field}: {value:?}: {host:?} is not a valid registry host[:port]"
        ));
    }
    if !looks_like_registry_host(host) {
        return Err(format!(
            "{field}: {value:?}: {host:?} is not a registry host (it needs a '.', a ':port' or to be localhost), so runtimes would read it as docker.io/{value}"
        ));
    }
    if let Some(bad) = path
        .into_iter()
        .flat_map(|p| p.split('/'))
        .find(|s| !is_path_component(s))
    {
        return Err(format!(
            "{field}: {value:?}: path segment {bad:?} is not valid (lower-case letters, digits, and '.', '_', '-' between them)"
        ));
    }
    let host = if host == "index.docker.io" {
        reference::DOCKER_HUB
    } else {
        host
    };
    let prefix = match path {
        Some(path) => format!("{host}/{path}"),
        None => host.to_string(),
    };
    if prefix.len() >= reference::NAME_MAX_LEN {
        return Err(format!(
            "{field}: {value:?} is longer than a repository name may be"
        ));
    }
    Ok(Prefix::new(prefix))
}

/// A Kubernetes Secret name: a DNS-1123 subdomain.
fn is_secret_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            let bytes = label.as_bytes();
            let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
            matches!((bytes.first(), bytes.last()), (Some(f), Some(l)) if alnum(f) && alnum(l))
                && bytes.iter().all(|b| alnum(b) || *b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn policy(json: &str) -> Result<Policy, String> {
        Policy::from_settings(&parse_settings(json.as_bytes())?)
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let settings = parse_settings(
            br#"{"mirrors":[{"source":"docker.io","target":"mirror.example.com/hub"}]}"#,
        )
        .expect("valid settings");
        assert_eq!(
            (
                settings.swap_policy,
                settings.pin_digest,
                settings.on_missing,
                settings.on_lookup_error
            ),
            (SwapPolicy::Exists, true, Fallback::Keep, Fallback::Keep)
        );
    }

    #[test]
    fn rules_are_ordered_most_specific_first() {
        let policy = policy(
            r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"},{"source":"docker.io/library","target":"m.io/official"}]}"#,
        )
        .expect("valid settings");
        let sources: Vec<&str> = policy.rules.iter().map(|r| r.source.as_str()).collect();
        assert_eq!(sources, ["docker.io/library", "docker.io"]);
        let targets: Vec<&str> = policy.targets.iter().map(|t| t.as_str()).collect();
        assert_eq!(targets, ["m.io/official", "m.io/hub"]);
    }

    #[rstest]
    #[case::unknown_field(
        r#"{"mirrors":[],"pinDigests":true}"#,
        "pinDigests: unknown field `pinDigests`"
    )]
    #[case::unknown_rule_field(
        r#"{"mirrors":[{"source":"docker.io","target":"m.io/x","secret":"s"}]}"#,
        "mirrors[0].secret: unknown field `secret`"
    )]
    #[case::unknown_swap_policy(
        r#"{"swapPolicy":"sometimes"}"#,
        "swapPolicy: unknown variant `sometimes`, expected `exists` or `always`"
    )]
    #[case::unknown_fallback(
        r#"{"onMissing":"ignore"}"#,
        "onMissing: unknown variant `ignore`, expected `keep` or `reject`"
    )]
    #[case::unknown_lookup_fallback(
        r#"{"onLookupError":"Keep"}"#,
        "onLookupError: unknown variant `Keep`"
    )]
    #[case::wrong_type(
        r#"{"pinDigest":"yes"}"#,
        "pinDigest: invalid type: string \"yes\", expected a boolean"
    )]
    #[case::missing_target(
        r#"{"mirrors":[{"source":"docker.io"}]}"#,
        "mirrors[0]: missing field `target`"
    )]
    fn parse_errors_name_the_field_and_value(#[case] json: &str, #[case] message: &str) {
        let error = parse_settings(json.as_bytes()).expect_err("invalid settings");
        assert!(
            error.starts_with(message),
            "{error:?} should start with {message:?}"
        );
    }

    #[rstest]
    #[case::nothing_configured(r#"{}"#, "mirrors: no mirror is configured")]
    #[case::empty_source(
        r#"{"mirrors":[{"source":"","target":"m.io/x"}]}"#,
        "mirrors[0].source: the value is empty"
    )]
    #[case::source_not_a_host(
        r#"{"mirrors":[{"source":"library/nginx","target":"m.io/x"}]}"#,
        "mirrors[0].source: \"library/nginx\": \"library\" is not a registry host"
    )]
    #[case::target_not_a_host(
        r#"{"mirrors":[{"source":"docker.io","target":"mirror/hub"}]}"#,
        "mirrors[0].target: \"mirror/hub\": \"mirror\" is not a registry host"
    )]
    #[case::bad_host(
        r#"{"mirrors":[{"source":"docker.io","target":"-m.io/x"}]}"#,
        "mirrors[0].target: \"-m.io/x\": \"-m.io\" is not a valid registry host[:port]"
    )]
    #[case::bad_port(
        r#"{"mirrors":[{"source":"docker.io","target":"m.io:http/x"}]}"#,
        "mirrors[0].target: \"m.io:http/x\": \"m.io:http\" is not a valid registry host[:port]"
    )]
    #[case::upper_case_path(
        r#"{"mirrors":[{"source":"docker.io","target":"m.io/Hub"}]}"#,
        "mirrors[0].target: \"m.io/Hub\": path segment \"Hub\" is not valid"
    )]
    #[case::trailing_slash(
        r#"{"mirrors":[{"source":"docker.io/","target":"m.io/x"}]}"#,
        "mirrors[0].source: \"docker.io/\": path segment \"\" is not valid"
    )]
    #[case::target_with_tag(
        r#"{"mirrors":[{"source":"docker.io","target":"m.io/x:1"}]}"#,
        "mirrors[0].target: \"m.io/x:1\" names an image"
    )]
    #[case::target_with_digest(
        r#"{"mirrors":[{"source":"docker.io","target":"m.io/x@sha256:0"}]}"#,
        "mirrors[0].target: \"m.io/x@sha256:0\" names an image"
    )]
    #[case::target_inside_source(
        r#"{"mirrors":[{"source":"m.io","target":"m.io/cache"}]}"#,
        "mirrors[0].target: \"m.io/cache\" is inside its own source \"m.io\""
    )]
    #[case::duplicate_source(r#"{"mirrors":[{"source":"quay.io","target":"m.io/a"},{"source":"quay.io","target":"m.io/b"}]}"#, "mirrors[1].source: \"quay.io\" is the same source as mirrors[0]")]
    #[case::duplicate_after_normalising(r#"{"mirrors":[{"source":"docker.io","target":"m.io/a"},{"source":"index.docker.io","target":"m.io/b"}]}"#, "mirrors[1].source: \"index.docker.io\" is the same source as mirrors[0]")]
    #[case::bad_pull_secret(
        r#"{"mirrors":[{"source":"docker.io","target":"m.io/x","pullSecret":"My_Secret"}]}"#,
        "mirrors[0].pullSecret: \"My_Secret\" is not a valid Secret name"
    )]
    #[case::bad_default_mirror(
        r#"{"defaultMirror":{"registry":"cache"}}"#,
        "defaultMirror.registry: \"cache\": \"cache\" is not a registry host"
    )]
    #[case::bad_glob(
        r#"{"defaultMirror":{"registry":"m.io"},"exclude":["ok:*","pause:[0-9]"]}"#,
        "exclude[1]: \"pause:[0-9]\": '[' is not supported, use"
    )]
    #[case::empty_glob(
        r#"{"defaultMirror":{"registry":"m.io"},"exclude":[""]}"#,
        "exclude[0]: \"\": a pattern cannot be empty"
    )]
    #[case::bad_platform(
        r#"{"defaultMirror":{"registry":"m.io"},"verifySource":true,"platforms":["linux/amd64","arm64"]}"#,
        "platforms[1]: \"arm64\" is not os/architecture[/variant]"
    )]
    #[case::platform_upper_case(
        r#"{"defaultMirror":{"registry":"m.io"},"verifySource":true,"platforms":["Linux/amd64"]}"#,
        "platforms[0]: \"Linux/amd64\" is not os/architecture[/variant]"
    )]
    #[case::platforms_without_verify_source(
        r#"{"defaultMirror":{"registry":"m.io"},"platforms":["linux/amd64"]}"#,
        "platforms: only used with verifySource: true"
    )]
    #[case::verify_source_with_always(
        r#"{"defaultMirror":{"registry":"m.io"},"verifySource":true,"swapPolicy":"always"}"#,
        "verifySource: true needs swapPolicy: exists"
    )]
    fn validation_errors_name_the_field_and_value(#[case] json: &str, #[case] message: &str) {
        let error = policy(json).expect_err("invalid settings");
        assert!(
            error.starts_with(message),
            "{error:?} should start with {message:?}"
        );
    }

    #[test]
    fn every_error_is_reported_at_once() {
        let error = policy(r#"{"mirrors":[{"source":"x","target":"y"}],"exclude":["[a]"]}"#)
            .expect_err("invalid");
        assert_eq!(error.matches("; ").count(), 2, "{error}");
    }

    #[rstest]
    #[case::host_only(r#"{"mirrors":[{"source":"docker.io","target":"mirror.example.com"}]}"#)]
    #[case::host_port_path(
        r#"{"mirrors":[{"source":"localhost:5000/team","target":"127.0.0.1:5001/a/b"}]}"#
    )]
    #[case::default_mirror_only(
        r#"{"defaultMirror":{"registry":"123456789012.dkr.ecr.eu-west-1.amazonaws.com/cache"}}"#
    )]
    #[case::secret_with_dots(
        r#"{"mirrors":[{"source":"quay.io","target":"m.io/q","pullSecret":"mirror.pull-1"}]}"#
    )]
    #[case::platforms(
        r#"{"defaultMirror":{"registry":"m.io"},"verifySource":true,"platforms":["linux/amd64","linux/arm/v7","windows/amd64"]}"#
    )]
    fn valid_settings_are_accepted(#[case] json: &str) {
        assert!(policy(json).is_ok(), "{:?}", policy(json).err());
    }
}

#[cfg(test)]
mod platform_tests {
    use super::Platform;
    use rstest::rstest;

    #[rstest]
    #[case::same("linux/amd64", ("linux", "amd64", None), true)]
    #[case::any_variant("linux/arm64", ("linux", "arm64", Some("v8")), true)]
    #[case::exact_variant("linux/arm/v7", ("linux", "arm", Some("v7")), true)]
    #[case::other_variant("linux/arm/v7", ("linux", "arm", Some("v6")), false)]
    #[case::variant_missing("linux/arm/v7", ("linux", "arm", None), false)]
    #[case::other_arch("linux/amd64", ("linux", "arm64", None), false)]
    #[case::other_os("linux/amd64", ("windows", "amd64", None), false)]
    fn platforms_cover_index_entries(
        #[case] wanted: &str,
        #[case] entry: (&str, &str, Option<&str>),
        #[case] covered: bool,
    ) {
        let platform = Platform::parse(wanted).expect("valid platform");
        assert_eq!(platform.covers(entry.0, entry.1, entry.2), covered);
        assert_eq!(platform.to_string(), wanted);
    }
}
