//! The user-facing settings, and their validation into the [`Policy`] the decisions run on.
//!
//! Validation and compilation are one function, [`Policy::from_settings`]: `validate_settings`
//! calls it when the policy is loaded, and `validate` calls it again at every admission because
//! settings arrive with every request. It is linear in the number of rules (quadratic only in
//! the pairwise target check, over a handful of rules) and builds no regular expression.

mod exclude;
mod mirrors;
mod one_to_one;
mod prefix;
mod signatures;

use kubewarden_policy_sdk::settings::Validatable;
use serde::{Deserialize, Serialize};

use crate::glob::Glob;
use crate::policy::{Action, Fallback, Platform, Policy, SwapPolicy};
use crate::rules::Router;
use crate::verifiers::ServiceAccount;

use exclude::matching_spelling;
use one_to_one::check_one_to_one;

pub use mirrors::{DefaultMirrorSetting, MirrorSetting, TargetSetting};
pub use signatures::{
    GithubActionsSetting, KeylessPrefixSetting, KeylessSetting, SignatureSetting,
};

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
    pub action: Action,
    pub mirrors: Vec<MirrorSetting>,
    pub default_mirror: Option<DefaultMirrorSetting>,
    pub swap_policy: SwapPolicy,
    /// Unset: tag references of uncovered images are not compared, covered images are verified
    /// at their source.
    pub verify_source: Option<bool>,
    pub platforms: Vec<String>,
    pub pin_digest: bool,
    pub on_missing: Fallback,
    pub on_lookup_error: Fallback,
    pub lookup_budget_milliseconds: u64,
    pub exclude: Vec<String>,
    /// `action: check`: also report source images no target of their rule holds.
    pub report_unmirrored: bool,
    /// `action: check`: also check admissions, for `mode: protect` (by default only the audit
    /// scanner's requests are checked, and admissions are accepted at once).
    pub check_admissions: bool,
    /// verify-image-signatures' `signatures`: images that must verify at their mirror name
    /// before they are swapped.
    pub signatures: Vec<SignatureSetting>,
    /// A mirror copy that does not verify under `signatures`: keep the source (default), or
    /// refuse the Pod.
    pub on_unverified: Fallback,
    /// Verifier policies in the cluster whose `signatures` count as this policy's own, read at
    /// every admission.
    pub verifiers: Vec<VerifierSetting>,
    /// `<namespace>/<name>` of the PolicyServer's ServiceAccount: with `verifiers`, whether it
    /// may list and watch the verifier kinds is asked at every admission before they are read.
    pub policy_server_service_account: Option<String>,
    /// The requesters (Kubernetes usernames) whose Pod updates may drop entries of the record of
    /// unmirrored images: the fill job's ServiceAccount, once the mirror holds them.
    pub fill_job_usernames: Vec<String>,
}

/// One entry of `verifiers`: a glob on the `spec.module` of the cluster's policies.
#[derive(Deserialize, Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VerifierSetting {
    /// Unset: every policy whose `settings.signatures` has verify-image-signatures' shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            action: Action::Swap,
            mirrors: Vec::new(),
            default_mirror: None,
            swap_policy: SwapPolicy::Exists,
            verify_source: None,
            platforms: Vec::new(),
            pin_digest: true,
            on_missing: Fallback::Keep,
            on_lookup_error: Fallback::Keep,
            lookup_budget_milliseconds: DEFAULT_LOOKUP_BUDGET_MS,
            exclude: Vec::new(),
            report_unmirrored: true,
            check_admissions: false,
            signatures: Vec::new(),
            on_unverified: Fallback::Keep,
            verifiers: Vec::new(),
            policy_server_service_account: None,
            fill_job_usernames: Vec::new(),
        }
    }
}

impl Policy {
    /// Validates the settings; every error names the field, the rule and the value.
    pub fn from_settings(settings: &Settings) -> Result<Policy, String> {
        let mut errors = Vec::new();
        let rules = mirrors::rules(&settings.mirrors, &mut errors);
        let default_mirrors =
            mirrors::default_mirrors(settings.default_mirror.as_ref(), &mut errors);
        check_one_to_one(&rules, &default_mirrors, &mut errors);
        if settings.mirrors.is_empty() && settings.default_mirror.is_none() {
            errors.push("mirrors: no mirror is configured; set mirrors or defaultMirror, or the policy swaps nothing".to_string());
        }
        let exclude = settings
            .exclude
            .iter()
            .enumerate()
            .filter_map(|(i, pattern)| match (Glob::new(pattern), matching_spelling(pattern)) {
                (Err(e), _) => {
                    errors.push(format!("exclude[{i}]: {pattern:?}: {e}"));
                    None
                }
                (Ok(_), Some(spelling)) => {
                    errors.push(format!(
                        "exclude[{i}]: {pattern:?} can never match: patterns are matched against the normalised reference (registry host, repository, then :tag or @digest, e.g. \"docker.io/library/nginx:1.27\"); write {spelling:?}"
                    ));
                    None
                }
                (Ok(glob), None) => Some(glob),
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
        if !settings.platforms.is_empty() && settings.verify_source != Some(true) {
            errors.push("platforms: only used with verifySource: true, which is not set; set it, or remove platforms".to_string());
        }
        if settings.verify_source == Some(true) && settings.swap_policy == SwapPolicy::Always {
            errors.push("verifySource: true needs swapPolicy: exists; swapPolicy: always swaps without looking".to_string());
        }
        let signature_rules = signatures::rules(&settings.signatures, &mut errors);
        let verifiers: Vec<Option<Glob>> = settings
            .verifiers
            .iter()
            .enumerate()
            .filter_map(|(i, verifier)| match &verifier.module {
                None => Some(None),
                Some(module) => Glob::new(module)
                    .map_err(|e| errors.push(format!("verifiers[{i}].module: {module:?}: {e}")))
                    .ok()
                    .map(Some),
            })
            .collect();
        // The settings that verify: either list may bring rules at admission.
        let verifying = [
            ("signatures", !settings.signatures.is_empty()),
            ("verifiers", !settings.verifiers.is_empty()),
        ];
        for (field, set) in verifying {
            if set && settings.swap_policy == SwapPolicy::Always {
                errors.push(format!("{field}: needs swapPolicy: exists; swapPolicy: always swaps without looking, so nothing would be verified"));
            }
        }
        // A verified image written without its digest lets the node pull whatever the tag names
        // when it pulls: content nobody verified, past a verifier whose rules see only the
        // mirror's name. verify-image-signatures pins what it verifies for the same reason.
        for (field, set) in verifying {
            if set && !settings.pin_digest {
                errors.push(format!("pinDigest: false cannot be used with {field}: an image that verified is written pinned to the digest that verified, or the node may pull content nobody verified; remove pinDigest: false, or remove {field}"));
            }
        }
        if verifying.iter().all(|(_, set)| !set) && settings.on_unverified == Fallback::Reject {
            errors.push("onUnverified: reject is only used with signatures or verifiers, which are empty; set one, or remove onUnverified".to_string());
        }
        let verifiers_reader = policy_server_service_account(settings, &mut errors);
        check_fill_job_usernames(settings, &mut errors);
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
            action: settings.action,
            router: Router::new(rules, default_mirrors, exclude),
            swap_policy: settings.swap_policy,
            verify_source: settings.verify_source == Some(true),
            verify_covered_at_source: settings.verify_source != Some(false),
            platforms,
            pin_digest: settings.pin_digest,
            on_missing: settings.on_missing,
            on_lookup_error: settings.on_lookup_error,
            lookup_budget_ms: budget,
            report_unmirrored: settings.report_unmirrored,
            check_admissions: settings.check_admissions,
            signatures: signature_rules,
            on_unverified: settings.on_unverified,
            verifiers,
            verifiers_unreadable: None,
            verifiers_reader,
            fill_job_usernames: settings.fill_job_usernames.clone(),
        })
    }
}

/// `policyServerServiceAccount`: `<namespace>/<name>`, each a DNS label or subdomain as the
/// API server names ServiceAccounts, and only with `verifiers`, whose reading it guards.
fn policy_server_service_account(
    settings: &Settings,
    errors: &mut Vec<String>,
) -> Option<ServiceAccount> {
    let written = settings.policy_server_service_account.as_ref()?;
    if settings.verifiers.is_empty() {
        errors.push("policyServerServiceAccount: only used with verifiers, which is empty (it is asked whether it may list and watch the verifier policies); set verifiers, or remove policyServerServiceAccount".to_string());
        return None;
    }
    let name_like = |part: &str| {
        !part.is_empty()
            && part.len() <= 253
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && part.starts_with(|c: char| c.is_ascii_alphanumeric())
            && part.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    match written.split_once('/') {
        Some((namespace, name)) if name_like(namespace) && name_like(name) => {
            Some(ServiceAccount {
                namespace: namespace.to_string(),
                name: name.to_string(),
            })
        }
        _ => {
            errors.push(format!("policyServerServiceAccount: {written:?} is not <namespace>/<name> of a ServiceAccount, e.g. \"kubewarden/policy-server\" (the service account of the PolicyServer that runs this policy)"));
            None
        }
    }
}

/// `fillJobUsernames`: names as the API server gives them in `userInfo.username`, for the one
/// role that writes the record's Pods (`swap`).
fn check_fill_job_usernames(settings: &Settings, errors: &mut Vec<String>) {
    for (i, name) in settings.fill_job_usernames.iter().enumerate() {
        if name.trim().is_empty() || name.trim() != name {
            errors.push(format!("fillJobUsernames[{i}]: {name:?} is not a username; write it as the API server names the fill job, e.g. \"system:serviceaccount:kubewarden:fill-mirror\""));
        }
    }
    if !settings.fill_job_usernames.is_empty() && settings.action == Action::Check {
        errors.push("fillJobUsernames: only used with action: swap (the record of unmirrored images is the swapping role's); remove it from the check role's settings".to_string());
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
    fn parse_errors_name_the_field_and_value(#[case] json: &str, #[case] message: &str) {
        let error = parse_settings(json.as_bytes()).expect_err("invalid settings");
        assert!(
            error.starts_with(message),
            "{error:?} should start with {message:?}"
        );
    }

    #[rstest]
    #[case::nothing_configured(r#"{}"#, "mirrors: no mirror is configured")]
    #[case::missing_target(
        r#"{"mirrors":[{"source":"docker.io"}]}"#,
        "mirrors[0]: no target; set target, or targets for several mirrors tried in order"
    )]
    #[case::target_and_targets(
        r#"{"mirrors":[{"source":"docker.io","target":"m.io/a","targets":[{"target":"n.io/a"}]}]}"#,
        "mirrors[0]: both target and targets are set"
    )]
    #[case::pull_secret_beside_targets(
        r#"{"mirrors":[{"source":"docker.io","pullSecret":"s","targets":[{"target":"n.io/a"}]}]}"#,
        "mirrors[0].pullSecret: \"s\" beside targets: give each entry of targets its own pullSecret"
    )]
    #[case::pull_through_beside_targets(
        r#"{"mirrors":[{"source":"docker.io","pullThrough":true,"targets":[{"target":"n.io/a"}]}]}"#,
        "mirrors[0].pullThrough: true beside targets: mark the entry of targets that is a pull-through cache with its own pullThrough"
    )]
    #[case::bad_second_target(
        r#"{"mirrors":[{"source":"docker.io","targets":[{"target":"m.io/a"},{"target":"n/a","pullSecret":"Bad"}]}]}"#,
        "mirrors[0].targets[1].pullSecret: \"Bad\" is not a valid Secret name"
    )]
    #[case::targets_colliding_across_lists(
        r#"{"mirrors":[{"source":"docker.io","targets":[{"target":"m.io/hub"},{"target":"n.io/hub"}]},{"source":"quay.io","targets":[{"target":"n.io:443/hub"}]}]}"#,
        "mirrors[1].target: \"n.io:443/hub\" is also the target of mirrors[0].targets[1], so two images would share one mirror image: \"quay.io/app\" (via mirrors[1]) and \"docker.io/app\" (via mirrors[0].targets[1])"
    )]
    #[case::one_target_twice_in_a_list(
        r#"{"mirrors":[{"source":"docker.io","targets":[{"target":"m.io/hub"},{"target":"m.io/hub"}]}]}"#,
        "mirrors[0].targets[1].target: \"m.io/hub\" is also the target of mirrors[0].targets[0]"
    )]
    #[case::default_mirror_registry_and_registries(
        r#"{"defaultMirror":{"registry":"m.io/c","registries":["n.io/c"]}}"#,
        "defaultMirror: both registry and registries are set"
    )]
    #[case::default_mirror_registries_nested(
        r#"{"defaultMirror":{"registries":["m.io/c","m.io/c/d"]}}"#,
        "defaultMirror.registries[1]: \"m.io/c/d\" lies under defaultMirror.registries[0]'s target \"m.io/c\""
    )]
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
        r#"{"defaultMirror":{"registry":"m.io"},"exclude":["*/ok:*","*/pause:[0-9]"]}"#,
        "exclude[1]: \"*/pause:[0-9]\": '[' is not supported, use"
    )]
    #[case::empty_glob(
        r#"{"defaultMirror":{"registry":"m.io"},"exclude":[""]}"#,
        "exclude[0]: \"\": a pattern cannot be empty"
    )]
    #[case::exclude_as_the_pod_spells_it(
        r#"{"defaultMirror":{"registry":"m.io"},"exclude":["registry.k8s.io/pause:*","bitnami/*"]}"#,
        "exclude[1]: \"bitnami/*\" can never match: patterns are matched against the normalised reference (registry host, repository, then :tag or @digest, e.g. \"docker.io/library/nginx:1.27\"); write \"docker.io/bitnami/*\""
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
    #[case::fill_job_username_empty(
        r#"{"defaultMirror":{"registry":"m.io"},"fillJobUsernames":["system:serviceaccount:kubewarden:fill-mirror",""]}"#,
        "fillJobUsernames[1]: \"\" is not a username"
    )]
    #[case::fill_job_username_padded(
        r#"{"defaultMirror":{"registry":"m.io"},"fillJobUsernames":[" system:serviceaccount:kubewarden:fill-mirror"]}"#,
        "fillJobUsernames[0]: \" system:serviceaccount:kubewarden:fill-mirror\" is not a username"
    )]
    #[case::policy_server_service_account_without_verifiers(
        r#"{"defaultMirror":{"registry":"m.io"},"policyServerServiceAccount":"kubewarden/policy-server"}"#,
        "policyServerServiceAccount: only used with verifiers, which is empty"
    )]
    #[case::policy_server_service_account_without_namespace(
        r#"{"defaultMirror":{"registry":"m.io"},"verifiers":[{}],"policyServerServiceAccount":"policy-server"}"#,
        "policyServerServiceAccount: \"policy-server\" is not <namespace>/<name> of a ServiceAccount, e.g. \"kubewarden/policy-server\""
    )]
    #[case::policy_server_service_account_as_a_username(
        r#"{"defaultMirror":{"registry":"m.io"},"verifiers":[{}],"policyServerServiceAccount":"system:serviceaccount:kubewarden/policy-server"}"#,
        "policyServerServiceAccount: \"system:serviceaccount:kubewarden/policy-server\" is not <namespace>/<name>"
    )]
    #[case::fill_job_usernames_on_the_check_role(
        r#"{"action":"check","defaultMirror":{"registry":"m.io"},"fillJobUsernames":["system:serviceaccount:kubewarden:fill-mirror"]}"#,
        "fillJobUsernames: only used with action: swap"
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
    #[case::one_registry_spelled_with_its_default_port(
        r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"},{"source":"quay.io","target":"m.io:443/hub"}]}"#,
        "mirrors[1].target: \"m.io:443/hub\" is also the target of mirrors[0], so two images would share one mirror image: \"quay.io/app\" (via mirrors[1]) and \"docker.io/app\" (via mirrors[0]) would both become \"m.io:443/hub/app\""
    )]
    #[case::docker_hub_under_another_name(
        r#"{"mirrors":[{"source":"quay.io","target":"registry-1.docker.io/org"},{"source":"ghcr.io","target":"docker.io/org/ghcr"}]}"#,
        "mirrors[1].target: \"docker.io/org/ghcr\" lies under mirrors[0]'s target \"registry-1.docker.io/org\""
    )]
    #[case::bare_docker_hub_target(
        r#"{"mirrors":[{"source":"quay.io","target":"docker.io"}]}"#,
        "mirrors[0].target: \"docker.io\" is Docker Hub without a path: runtimes read a one-segment name there as library/<name>, so \"quay.io/app\" and \"quay.io/library/app\" would both become \"docker.io/library/app\""
    )]
    #[case::bare_docker_hub_alias_target(
        r#"{"mirrors":[{"source":"quay.io","target":"registry-1.docker.io"}]}"#,
        "mirrors[0].target: \"registry-1.docker.io\" is Docker Hub without a path"
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
    #[case::upper_case_source_without_a_dot_is_refused_for_its_capitals(
        r#"{"mirrors":[{"source":"FOO","target":"m.io/foo"}]}"#,
        "mirrors[0].source: \"FOO\": registry host \"FOO\" has upper-case letters, and image references are matched as written (in lower case): write the registry's host name in lower case with its domain or port (\"foo\" alone would be read as docker.io/foo)"
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
    #[case::ordered_targets(
        r#"{"mirrors":[{"source":"docker.io","targets":[{"target":"eu.m.io/hub","pullSecret":"eu"},{"target":"us.m.io/hub"}]}],"defaultMirror":{"registries":["eu.m.io/all","us.m.io/all"]}}"#
    )]
    #[case::budget_bounds(
        r#"{"defaultMirror":{"registry":"m.io"},"lookupBudgetMilliseconds":28000}"#
    )]
    fn valid_settings_are_accepted(#[case] json: &str) {
        assert!(policy(json).is_ok(), "{:?}", policy(json).err());
    }

    #[test]
    fn the_policy_servers_service_account_is_read_as_namespace_and_name() {
        let read = policy(
            r#"{"defaultMirror":{"registry":"m.io"},"verifiers":[{}],"policyServerServiceAccount":"kubewarden/policy-server.swap-1"}"#,
        )
        .expect("valid");
        assert_eq!(
            read.verifiers_reader.map(|account| account.username()),
            Some("system:serviceaccount:kubewarden:policy-server.swap-1".to_string())
        );
    }
}
