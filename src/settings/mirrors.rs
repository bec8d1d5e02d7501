//! The `mirrors` and `defaultMirror` sections: where images go. Each rule names one `target`,
//! or `targets` tried in order (as containerd's `hosts.toml` and RKE2's `registries.yaml` list
//! mirrors); `defaultMirror` names one `registry` or `registries` in order.

use serde::{Deserialize, Serialize};

use crate::rules::{Prefix, Rule, Target};

use super::prefix::{is_bare_docker_hub, is_secret_name, parse_prefix};

#[derive(Deserialize, Serialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MirrorSetting {
    pub source: String,
    /// One mirror; or `targets`, several tried in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<TargetSetting>,
    /// With `target`: the secret the Pod needs to pull from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret: Option<String>,
    /// With `target`: it is a pull-through cache, filled by a pull through it (by
    /// tag), never pushed to.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pull_through: bool,
}

/// One entry of `targets`: the same fields a one-target rule has.
#[derive(Deserialize, Serialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TargetSetting {
    pub target: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pull_through: bool,
}

#[derive(Deserialize, Serialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DefaultMirrorSetting {
    /// One registry; or `registries`, several tried in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub registries: Vec<String>,
}

/// Validates every rule; the valid ones, in settings order.
pub(super) fn rules(mirrors: &[MirrorSetting], errors: &mut Vec<String>) -> Vec<Rule> {
    let mut rules: Vec<Rule> = Vec::new();
    for (index, mirror) in mirrors.iter().enumerate() {
        let field = |name: &str| format!("mirrors[{index}].{name}");
        let source = parse_prefix(&field("source"), &mirror.source)
            .map_err(|e| errors.push(e))
            .ok();
        // `target` and `pullSecret` and `pullThrough` beside it are the one-element list.
        let written: Vec<(String, &str, Option<&String>, bool)> = match (
            &mirror.target,
            &mirror.targets[..],
        ) {
            (Some(target), []) => vec![(
                field("target"),
                target.as_str(),
                mirror.pull_secret.as_ref(),
                mirror.pull_through,
            )],
            (None, []) => {
                errors.push(format!(
                    "mirrors[{index}]: no target; set target, or targets for several mirrors tried in order"
                ));
                Vec::new()
            }
            (Some(_), _) => {
                errors.push(format!(
                    "mirrors[{index}]: both target and targets are set; write the one mirror as the first entry of targets"
                ));
                Vec::new()
            }
            (None, targets) => {
                if let Some(secret) = &mirror.pull_secret {
                    errors.push(format!(
                        "{}: {secret:?} beside targets: give each entry of targets its own pullSecret",
                        field("pullSecret")
                    ));
                }
                if mirror.pull_through {
                    errors.push(format!(
                        "{}: true beside targets: mark the entry of targets that is a pull-through cache with its own pullThrough",
                        field("pullThrough")
                    ));
                }
                targets
                    .iter()
                    .enumerate()
                    .map(|(k, t)| {
                        (
                            field(&format!("targets[{k}].target")),
                            t.target.as_str(),
                            t.pull_secret.as_ref(),
                            t.pull_through,
                        )
                    })
                    .collect()
            }
        };
        let mut targets = Vec::new();
        for (target_field, written_target, pull_secret, pull_through) in written {
            let secret_field = format!(
                "{}.pullSecret",
                target_field
                    .strip_suffix(".target")
                    .unwrap_or(&target_field)
            );
            if let Some(secret) = pull_secret.filter(|s| !is_secret_name(s)) {
                errors.push(format!(
                    "{secret_field}: {secret:?} is not a valid Secret name (lower-case letters, digits, '-' and '.', at most 253 characters)"
                ));
            }
            let Ok(target) =
                parse_prefix(&target_field, written_target).map_err(|e| errors.push(e))
            else {
                continue;
            };
            if is_bare_docker_hub(&target) {
                errors.push(format!(
                    "{target_field}: {written_target:?} is Docker Hub without a path: runtimes read a one-segment name there as library/<name>, so \"{}/app\" and \"{}/library/app\" would both become \"docker.io/library/app\"; write a Docker Hub namespace, e.g. \"docker.io/myorg\"",
                    mirror.source, mirror.source,
                ));
            }
            if let Some(source) = &source
                && target.is_within(source)
            {
                errors.push(format!(
                    "{target_field}: {written_target:?} is inside its own source {:?}: swapped images would match the rule again",
                    mirror.source
                ));
            }
            targets.push(Target {
                prefix: target,
                pull_secret: pull_secret.cloned(),
                pull_through,
            });
        }
        if let Some(source) = source
            && !targets.is_empty()
        {
            if let Some(other) = rules.iter().find(|other| other.source == source) {
                errors.push(format!(
                    "mirrors[{index}].source: {:?} is the same source as mirrors[{}], so one of the two rules would never apply",
                    mirror.source, other.index
                ));
            }
            rules.push(Rule {
                index,
                source,
                targets,
            });
        }
    }
    rules
}

/// Validates `defaultMirror`: its registries, in order.
pub(super) fn default_mirrors(
    default_mirror: Option<&DefaultMirrorSetting>,
    errors: &mut Vec<String>,
) -> Vec<Prefix> {
    let Some(setting) = default_mirror else {
        return Vec::new();
    };
    let written: Vec<(String, &String)> = match (&setting.registry, &setting.registries[..]) {
        (Some(registry), []) => vec![("defaultMirror.registry".to_string(), registry)],
        (None, []) => {
            errors.push("defaultMirror: no registry; set registry, or registries for several tried in order".to_string());
            Vec::new()
        }
        (Some(_), _) => {
            errors.push("defaultMirror: both registry and registries are set; write the one registry as the first entry of registries".to_string());
            Vec::new()
        }
        (None, registries) => registries
            .iter()
            .enumerate()
            .map(|(k, registry)| (format!("defaultMirror.registries[{k}]"), registry))
            .collect(),
    };
    written
        .into_iter()
        .filter_map(|(field, registry)| {
            parse_prefix(&field, registry)
                .map_err(|e| errors.push(e))
                .ok()
        })
        .collect()
}
