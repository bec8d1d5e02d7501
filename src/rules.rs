//! Which mirror an image goes to: the most specific rule whose source is a prefix of the image's
//! repository on whole path segments, else `defaultMirror`.

use crate::glob::Glob;
use crate::reference::{NAME_MAX_LEN, Reference, is_path_component};
use crate::settings::Policy;

/// A registry host with an optional path, e.g. `mirror.example.com/dockerhub`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prefix(String);

impl Prefix {
    pub fn new(prefix: String) -> Prefix {
        Prefix(prefix)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The rest of `name` below this prefix, if `name` is the prefix or lies under it on a path
    /// segment boundary: `docker.io` covers `docker.io/library/x`, never `docker.iox/y`.
    pub fn strip_from<'n>(&self, name: &'n str) -> Option<&'n str> {
        match name.strip_prefix(self.0.as_str())? {
            "" => Some(""),
            rest => rest.strip_prefix('/'),
        }
    }

    pub fn is_within(&self, other: &Prefix) -> bool {
        other.strip_from(&self.0).is_some()
    }

    fn join(&self, rest: &str) -> String {
        let mut joined = String::with_capacity(self.0.len() + 1 + rest.len());
        joined.push_str(&self.0);
        if !rest.is_empty() {
            joined.push('/');
            joined.push_str(rest);
        }
        joined
    }
}

/// One `mirrors` entry, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Its position in the settings, for messages.
    pub index: usize,
    pub source: Prefix,
    pub target: Prefix,
    pub pull_secret: Option<String>,
}

/// Where an image would go, before any lookup.
#[derive(Debug, PartialEq, Eq)]
pub enum Route<'p> {
    /// No rule and no default mirror covers it.
    NotMatched,
    /// An `exclude` pattern matched the normalised reference.
    Excluded(&'p Glob),
    /// It is already under a target: admitting twice changes nothing.
    AlreadySwapped,
    /// A rule matched, but the mirror repository it names is not a valid name.
    Unroutable {
        rule: RuleName,
        reason: String,
    },
    Mirror(Destination<'p>),
}

#[derive(Debug, PartialEq, Eq)]
pub struct Destination<'p> {
    /// The mirror repository, without tag or digest.
    pub repository: String,
    pub pull_secret: Option<&'p str>,
    pub rule: RuleName,
}

/// Which setting routed an image, named only when a message needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleName {
    Mirror(usize),
    DefaultMirror,
}

impl std::fmt::Display for RuleName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RuleName::Mirror(index) => write!(f, "mirrors[{index}]"),
            RuleName::DefaultMirror => f.write_str("defaultMirror"),
        }
    }
}

impl Policy {
    pub fn route(&self, reference: &Reference) -> Route<'_> {
        let name = reference.name();
        if self
            .targets
            .iter()
            .any(|target| target.strip_from(name).is_some())
        {
            return Route::AlreadySwapped;
        }
        if let Some(glob) = self
            .exclude
            .iter()
            .find(|glob| glob.matches(reference.as_str()))
        {
            return Route::Excluded(glob);
        }
        let matched = self
            .rules
            .iter()
            .find_map(|rule| Some((rule, rule.source.strip_from(name)?)));
        let (repository, pull_secret, rule) = match (matched, &self.default_mirror) {
            (Some((rule, rest)), _) => (
                rule.target.join(rest),
                rule.pull_secret.as_deref(),
                RuleName::Mirror(rule.index),
            ),
            (None, Some(registry)) => {
                // k8s-image-swapper's layout keeps the source host as a path segment, which a
                // host with a port or upper-case letters cannot be.
                if !is_path_component(reference.domain()) {
                    return Route::Unroutable {
                        rule: RuleName::DefaultMirror,
                        reason: format!(
                            "registry host {:?} cannot be a repository path segment under {:?}",
                            reference.domain(),
                            registry.as_str()
                        ),
                    };
                }
                (registry.join(name), None, RuleName::DefaultMirror)
            }
            (None, None) => return Route::NotMatched,
        };
        if repository.len() > NAME_MAX_LEN {
            return Route::Unroutable {
                rule,
                reason: format!(
                    "the mirror repository {repository:?} is longer than {NAME_MAX_LEN} characters"
                ),
            };
        }
        Route::Mirror(Destination {
            repository,
            pull_secret,
            rule,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{Settings, parse_settings};
    use rstest::rstest;

    fn route(settings: &str, image: &str) -> String {
        let settings: Settings = parse_settings(settings.as_bytes()).expect("valid settings");
        let policy = Policy::from_settings(&settings).expect("valid settings");
        let reference = Reference::parse(image).expect("valid reference");
        match policy.route(&reference) {
            Route::NotMatched => "not matched".to_string(),
            Route::Excluded(glob) => format!("excluded by {}", glob.as_str()),
            Route::AlreadySwapped => "already swapped".to_string(),
            Route::Unroutable { rule, reason } => format!("{rule}: {reason}"),
            Route::Mirror(d) => {
                format!("{} via {} secret {:?}", d.repository, d.rule, d.pull_secret)
            }
        }
    }

    const RULES: &str = r#"{
        "mirrors": [
            {"source": "docker.io", "target": "mirror.example.com/dockerhub", "pullSecret": "mirror-pull"},
            {"source": "quay.io/argoproj", "target": "harbor.example.com/quay/argoproj"},
            {"source": "docker.io/library", "target": "mirror.example.com/official"},
            {"source": "localhost:5000", "target": "127.0.0.1:5001/local"}
        ],
        "exclude": ["registry.k8s.io/pause:*", "docker.io/library/busybox@*"]
    }"#;

    #[rstest]
    #[case::most_specific_rule_wins(
        "nginx:1.27",
        "mirror.example.com/official/nginx via mirrors[2] secret None"
    )]
    #[case::broader_rule(
        "bitnami/redis",
        "mirror.example.com/dockerhub/bitnami/redis via mirrors[0] secret Some(\"mirror-pull\")"
    )]
    #[case::path_prefix(
        "quay.io/argoproj/argocd:v2",
        "harbor.example.com/quay/argoproj/argocd via mirrors[1] secret None"
    )]
    #[case::whole_segments_only("quay.io/argoproj-labs/x", "not matched")]
    #[case::host_with_port(
        "localhost:5000/app",
        "127.0.0.1:5001/local/app via mirrors[3] secret None"
    )]
    #[case::no_rule("ghcr.io/org/app:1", "not matched")]
    #[case::excluded_by_tag_glob(
        "registry.k8s.io/pause:3.9",
        "excluded by registry.k8s.io/pause:*"
    )]
    #[case::excluded(
        "docker.io/library/busybox@sha256:3a25d2cf3a25d2cf3a25d2cf3a25d2cf3a25d2cf3a25d2cf3a25d2cf3a25d2cf",
        "excluded by docker.io/library/busybox@*"
    )]
    #[case::exclude_sees_normalised_reference(
        "busybox:1",
        "mirror.example.com/official/busybox via mirrors[2] secret None"
    )]
    #[case::already_swapped("mirror.example.com/dockerhub/bitnami/redis:7", "already swapped")]
    #[case::already_swapped_other_rule(
        "harbor.example.com/quay/argoproj/argocd@sha256:3a25d2cf3a25d2cf3a25d2cf3a25d2cf3a25d2cf3a25d2cf3a25d2cf3a25d2cf",
        "already swapped"
    )]
    fn routes_by_most_specific_rule(#[case] image: &str, #[case] expected: &str) {
        assert_eq!(route(RULES, image), expected);
    }

    const DEFAULT: &str = r#"{"defaultMirror": {"registry": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/cache"},
        "mirrors": [{"source": "quay.io", "target": "harbor.example.com/quay"}]}"#;

    #[rstest]
    #[case::keeps_the_source_host(
        "nginx:1.27",
        "123456789012.dkr.ecr.eu-west-1.amazonaws.com/cache/docker.io/library/nginx via defaultMirror secret None"
    )]
    #[case::rule_before_default(
        "quay.io/a/b",
        "harbor.example.com/quay/a/b via mirrors[0] secret None"
    )]
    #[case::host_with_port(
        "localhost:5000/app",
        "defaultMirror: registry host \"localhost:5000\" cannot be a repository path segment under \"123456789012.dkr.ecr.eu-west-1.amazonaws.com/cache\""
    )]
    #[case::already_in_default(
        "123456789012.dkr.ecr.eu-west-1.amazonaws.com/cache/docker.io/library/nginx:1",
        "already swapped"
    )]
    fn default_mirror_uses_k8s_image_swapper_layout(#[case] image: &str, #[case] expected: &str) {
        assert_eq!(route(DEFAULT, image), expected);
    }

    #[test]
    fn too_long_a_mirror_name_is_unroutable() {
        let image = format!("quay.io/{}", "a".repeat(240));
        assert!(route(DEFAULT, &image).starts_with("mirrors[0]: the mirror repository"));
    }
}
