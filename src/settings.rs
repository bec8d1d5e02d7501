//! The user-facing settings, and their validation into the [`Policy`] the decisions run on.
//!
//! Validation and compilation are one function, [`Policy::from_settings`]: `validate_settings`
//! calls it when the policy is loaded, and `validate` calls it again at every admission because
//! settings arrive with every request. It is linear in the number of rules (quadratic only in
//! the pairwise target check, over a handful of rules) and builds no regular expression.

use kubewarden_policy_sdk::settings::Validatable;
use serde::{Deserialize, Serialize};

use crate::glob::Glob;
use crate::policy::{Fallback, Platform, Policy, SwapPolicy};
use crate::reference::{self, is_domain, is_path_component, looks_like_registry_host};
use crate::rules::{Prefix, Router, Rule};

/// The default of `lookupBudgetMilliseconds`: policy-server's default evaluation timeout is 2 s,
/// counted in one-second ticks, so an evaluation may be interrupted after only 1 s; 800 ms of
/// lookups leaves room for the rest of the evaluation and one lookup that overruns.
pub const DEFAULT_LOOKUP_BUDGET_MS: u64 = 800;
/// The largest budget: the API server waits at most 30 s for a webhook (`timeoutSeconds`), and
/// the budget must stay under `timeoutEvalSeconds` - 1 s, itself under that.
pub const MAX_LOOKUP_BUDGET_MS: u64 = 28_000;

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
    pub lookup_budget_milliseconds: u64,
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
            lookup_budget_milliseconds: DEFAULT_LOOKUP_BUDGET_MS,
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
        check_one_to_one(&rules, default_mirror.as_ref(), &mut errors);
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
        let budget = settings.lookup_budget_milliseconds;
        if !(1..=MAX_LOOKUP_BUDGET_MS).contains(&budget) {
            errors.push(format!(
                "lookupBudgetMilliseconds: {budget} is not between 1 and {MAX_LOOKUP_BUDGET_MS}; keep it under the policy's timeoutEvalSeconds minus one second (default {DEFAULT_LOOKUP_BUDGET_MS}, for the default timeout of 2 s)"
            ));
        }
        if !errors.is_empty() {
            return Err(errors.join("; "));
        }
        Ok(Policy {
            router: Router::new(rules, default_mirror, exclude),
            swap_policy: settings.swap_policy,
            verify_source: settings.verify_source,
            platforms,
            pin_digest: settings.pin_digest,
            on_missing: settings.on_missing,
            on_lookup_error: settings.on_lookup_error,
            lookup_budget_ms: budget,
        })
    }
}

/// One way into the mirror, for the one-to-one check: a rule, or `defaultMirror`, whose
/// source is every name (`<registry>/<name>`).
struct Mapping<'r> {
    field: String,
    source: Option<&'r Prefix>,
    target: &'r Prefix,
}

impl Mapping<'_> {
    /// The source name this way in sends to `target/rest`: `source/rest`, or for
    /// `defaultMirror` `rest` itself.
    fn source_of(&self, rest: &str) -> String {
        match self.source {
            Some(source) => source.join(rest),
            None => rest.to_string(),
        }
    }
}

/// No two distinct source names may map to one mirror name. Two ways in whose targets are
/// equal or nested (`inner` = `outer/suffix`) meet unless the inner one mirrors exactly the
/// outer one's `source/suffix`: then every name under it goes through the inner (more specific)
/// rule to the very place the outer rule would have sent it. With every nested pair so, the
/// ways in that could produce one mirror name all agree on its source name.
///
/// A source under any target never applies either: its images count as already swapped.
fn check_one_to_one(rules: &[Rule], default_mirror: Option<&Prefix>, errors: &mut Vec<String>) {
    let mappings: Vec<Mapping<'_>> = rules
        .iter()
        .map(|rule| Mapping {
            field: format!("mirrors[{}]", rule.index),
            source: Some(&rule.source),
            target: &rule.target,
        })
        .chain(default_mirror.map(|registry| Mapping {
            field: "defaultMirror".to_string(),
            source: None,
            target: registry,
        }))
        .collect();
    for (i, inner) in mappings.iter().enumerate() {
        for (j, outer) in mappings.iter().enumerate() {
            if i == j {
                continue;
            }
            let Some(suffix) = outer.target.strip_from(inner.target.as_str()) else {
                continue;
            };
            // Equal targets are reported once, from the later entry.
            if suffix.is_empty() && j > i {
                continue;
            }
            let consistent = !suffix.is_empty()
                && inner.source.map(Prefix::as_str) == Some(outer.source_of(suffix).as_str());
            if consistent {
                continue;
            }
            let rest = match inner.source {
                Some(_) => "app".to_string(),
                None => "docker.io/library/app".to_string(),
            };
            let shared = inner.target.join(&rest);
            let via_inner = inner.source_of(&rest);
            let via_outer = match suffix {
                "" => outer.source_of(&rest),
                suffix => outer.source_of(&Prefix::new(suffix.to_string()).join(&rest)),
            };
            let relation = if suffix.is_empty() {
                format!("is also the target of {}", outer.field)
            } else {
                format!(
                    "lies under {}'s target {:?}",
                    outer.field,
                    outer.target.as_str()
                )
            };
            errors.push(format!(
                "{}: {:?} {relation}, so two images would share one mirror image: {via_inner:?} (via {}) and {via_outer:?} (via {}) would both become {shared:?}; give each rule a target of its own that does not nest in another",
                target_field(&inner.field),
                inner.target.as_str(),
                inner.field,
                outer.field,
            ));
        }
    }
    for rule in rules {
        if let Some(owner) = mappings.iter().find(|m| rule.source.is_within(m.target)) {
            errors.push(format!(
                "mirrors[{}].source: {:?} lies under {}'s target {:?}: its images count as already swapped, so the rule would never apply",
                rule.index,
                rule.source.as_str(),
                owner.field,
                owner.target.as_str()
            ));
        }
    }
}

fn target_field(mapping: &str) -> String {
    if mapping == "defaultMirror" {
        "defaultMirror.registry".to_string()
    } else {
        format!("{mapping}.target")
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
    // Runtimes keep a host as written, and images name hosts in lower case: a rule for
    // "Quay.io" would match no image, and a target with capitals would never be recognised as
    // the "quay.io" an image names.
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(format!(
            "{field}: {value:?}: registry host {host:?} has upper-case letters, and image references are matched as written (in lower case): write {:?}",
            value.replacen(host, &host.to_ascii_lowercase(), 1)
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
            r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"},{"source":"docker.io/library","target":"m.io/hub/library"}]}"#,
        )
        .expect("valid settings");
        let sources: Vec<&str> = policy
            .router
            .rules
            .iter()
            .map(|r| r.source.as_str())
            .collect();
        assert_eq!(sources, ["docker.io/library", "docker.io"]);
        let targets: Vec<&str> = policy.router.targets.iter().map(|t| t.as_str()).collect();
        assert_eq!(targets, ["m.io/hub/library", "m.io/hub"]);
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
    #[case::shared_target(
        r#"{"mirrors":[{"source":"docker.io","target":"mirror.example.com/hub"},{"source":"quay.io","target":"mirror.example.com/hub"}]}"#,
        "mirrors[1].target: \"mirror.example.com/hub\" is also the target of mirrors[0], so two images would share one mirror image: \"quay.io/app\" (via mirrors[1]) and \"docker.io/app\" (via mirrors[0]) would both become \"mirror.example.com/hub/app\""
    )]
    #[case::nested_target(
        r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"},{"source":"docker.io/library","target":"m.io/hub/official"}]}"#,
        "mirrors[1].target: \"m.io/hub/official\" lies under mirrors[0]'s target \"m.io/hub\", so two images would share one mirror image: \"docker.io/library/app\" (via mirrors[1]) and \"docker.io/official/app\" (via mirrors[0])"
    )]
    #[case::default_mirror_nested_in_a_rule_target(
        r#"{"mirrors":[{"source":"quay.io","target":"m.io/cache"}],"defaultMirror":{"registry":"m.io/cache/all"}}"#,
        "defaultMirror.registry: \"m.io/cache/all\" lies under mirrors[0]'s target \"m.io/cache\""
    )]
    #[case::rule_target_nested_in_default_mirror(
        r#"{"mirrors":[{"source":"quay.io","target":"m.io/cache/dockerhub"}],"defaultMirror":{"registry":"m.io/cache"}}"#,
        "mirrors[0].target: \"m.io/cache/dockerhub\" lies under defaultMirror's target \"m.io/cache\""
    )]
    #[case::rule_target_equal_to_default_mirror(
        r#"{"mirrors":[{"source":"quay.io","target":"m.io/cache"}],"defaultMirror":{"registry":"m.io/cache"}}"#,
        "defaultMirror.registry: \"m.io/cache\" is also the target of mirrors[0]"
    )]
    #[case::source_under_another_target(
        r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"},{"source":"m.io/hub/team","target":"other.io/team"}]}"#,
        "mirrors[1].source: \"m.io/hub/team\" lies under mirrors[0]'s target \"m.io/hub\": its images count as already swapped"
    )]
    #[case::source_under_default_mirror(
        r#"{"mirrors":[{"source":"m.io/cache/quay.io","target":"other.io/q"}],"defaultMirror":{"registry":"m.io/cache"}}"#,
        "mirrors[0].source: \"m.io/cache/quay.io\" lies under defaultMirror's target \"m.io/cache\""
    )]
    #[case::upper_case_source_host(
        r#"{"mirrors":[{"source":"Quay.io/argoproj","target":"m.io/q"}]}"#,
        "mirrors[0].source: \"Quay.io/argoproj\": registry host \"Quay.io\" has upper-case letters, and image references are matched as written (in lower case): write \"quay.io/argoproj\""
    )]
    #[case::upper_case_target_host(
        r#"{"mirrors":[{"source":"quay.io","target":"Mirror.example.com/q"}]}"#,
        "mirrors[0].target: \"Mirror.example.com/q\": registry host \"Mirror.example.com\" has upper-case letters"
    )]
    #[case::budget_zero(
        r#"{"defaultMirror":{"registry":"m.io"},"lookupBudgetMilliseconds":0}"#,
        "lookupBudgetMilliseconds: 0 is not between 1 and 28000"
    )]
    #[case::budget_too_large(
        r#"{"defaultMirror":{"registry":"m.io"},"lookupBudgetMilliseconds":30000}"#,
        "lookupBudgetMilliseconds: 30000 is not between 1 and 28000"
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
    #[case::nested_target_mirroring_the_same_path(
        r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"},{"source":"docker.io/library","target":"m.io/hub/library","pullSecret":"official"}]}"#
    )]
    #[case::sibling_targets(
        r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"},{"source":"quay.io","target":"m.io/quay"}]}"#
    )]
    #[case::rule_in_default_mirror_layout(
        r#"{"mirrors":[{"source":"docker.io","target":"m.io/cache/docker.io","pullSecret":"hub"}],"defaultMirror":{"registry":"m.io/cache"}}"#
    )]
    #[case::budget_bounds(
        r#"{"defaultMirror":{"registry":"m.io"},"lookupBudgetMilliseconds":28000}"#
    )]
    fn valid_settings_are_accepted(#[case] json: &str) {
        assert!(policy(json).is_ok(), "{:?}", policy(json).err());
    }
}

/// The test the one-to-one rule stands for: over many images and every accepted settings
/// below, no two distinct normalised source references are routed to one mirror reference.
#[cfg(test)]
mod one_to_one_tests {
    use super::*;
    use crate::reference::Reference;
    use crate::rules::Route;
    use std::collections::BTreeMap;

    const ACCEPTED: &[&str] = &[
        r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"},{"source":"docker.io/library","target":"m.io/hub/library"}]}"#,
        r#"{"mirrors":[{"source":"docker.io","target":"m.io/cache/docker.io"},{"source":"quay.io/argoproj","target":"m.io/cache/quay.io/argoproj"}],"defaultMirror":{"registry":"m.io/cache"}}"#,
        r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"},{"source":"quay.io","target":"m.io/quay"},{"source":"ghcr.io/org","target":"m.io/gh"}],"defaultMirror":{"registry":"cache.io/all"}}"#,
    ];

    fn images() -> Vec<String> {
        let hosts = [
            "docker.io",
            "quay.io",
            "ghcr.io",
            "m.io",
            "cache.io",
            "registry.k8s.io",
        ];
        let paths = [
            "app",
            "library/app",
            "official/app",
            "argoproj/app",
            "org/app",
            "hub/app",
            "quay/app",
            "cache/docker.io/app",
            "docker.io/app",
            "quay.io/argoproj/app",
            "docker.io/library/app",
            "library/library/app",
        ];
        let mut images = Vec::new();
        for host in hosts {
            for path in paths {
                images.push(format!("{host}/{path}:1"));
            }
        }
        images
    }

    #[test]
    fn accepted_settings_never_send_two_images_to_one_mirror_image() {
        for settings in ACCEPTED {
            let policy = Policy::from_settings(&parse_settings(settings.as_bytes()).expect("JSON"))
                .unwrap_or_else(|e| panic!("{settings}: {e}"));
            let mut seen: BTreeMap<String, String> = BTreeMap::new();
            for image in images() {
                let reference = Reference::parse(&image).expect("reference");
                if let Route::Mirror(destination) = policy.router.route(&reference)
                    && let Some(before) =
                        seen.insert(destination.repository.clone(), reference.name().to_string())
                    && before != reference.name()
                {
                    panic!(
                        "{settings}: {before} and {} both go to {}",
                        reference.name(),
                        destination.repository
                    );
                }
            }
            assert!(
                seen.len() > 10,
                "{settings}: too few routed to prove anything"
            );
        }
    }

    /// The same images under settings the validation refuses: each does collide, so the
    /// refusal is needed, not merely cautious.
    #[test]
    fn refused_settings_would_collide() {
        for settings in [
            r#"{"mirrors":[{"source":"docker.io","target":"mirror.example.com/hub"},{"source":"quay.io","target":"mirror.example.com/hub"}]}"#,
            r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"},{"source":"docker.io/library","target":"m.io/hub/official"}]}"#,
            r#"{"mirrors":[{"source":"quay.io","target":"m.io/cache/docker.io"}],"defaultMirror":{"registry":"m.io/cache"}}"#,
        ] {
            let parsed = parse_settings(settings.as_bytes()).expect("JSON");
            assert!(Policy::from_settings(&parsed).is_err(), "{settings}");
            // Route with the checks bypassed, to show the collision the check prevents.
            let mut rules = Vec::new();
            for (index, mirror) in parsed.mirrors.iter().enumerate() {
                rules.push(Rule {
                    index,
                    source: Prefix::new(mirror.source.clone()),
                    target: Prefix::new(mirror.target.clone()),
                    pull_secret: None,
                });
            }
            let default = parsed
                .default_mirror
                .as_ref()
                .map(|d| Prefix::new(d.registry.clone()));
            let router = Router::new(rules, default, Vec::new());
            let mut seen: BTreeMap<String, String> = BTreeMap::new();
            let collided = images().iter().any(|image| {
                let reference = Reference::parse(image).expect("reference");
                match router.route(&reference) {
                    Route::Mirror(d) => seen
                        .insert(d.repository, reference.name().to_string())
                        .is_some_and(|before| before != reference.name()),
                    _ => false,
                }
            });
            assert!(
                collided,
                "{settings}: no collision found among the sample images"
            );
        }
    }
}
