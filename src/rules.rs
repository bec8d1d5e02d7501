//! Which mirror an image goes to: the most specific rule whose source is a prefix of the image's
//! repository on whole path segments, else `defaultMirror`.
//!
//! This module knows nothing of the settings' form: `settings` validates them and builds a
//! [`Router`]; `decide` asks it where an image goes. Data flows one way: settings -> rules.

use std::borrow::Cow;

use crate::glob::Glob;
use crate::reference::{
    DOCKER_HUB, DOCKER_HUB_ALIASES, NAME_MAX_LEN, Reference, is_path_component,
};

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

    /// The registry host, with its port.
    pub fn host(&self) -> &str {
        self.0
            .split_once('/')
            .map_or(self.0.as_str(), |(host, _)| host)
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

    /// This prefix as a container runtime resolves it, for comparing: the default ports (`:443`
    /// for HTTPS, `:80` for a plain-HTTP registry) dropped and Docker Hub's names made one, so
    /// that two spellings of one registry compare equal. Messages keep the spelling written.
    pub fn resolved(&self) -> Prefix {
        Prefix(resolved_name(&self.0).into_owned())
    }

    pub fn join(&self, rest: &str) -> String {
        let mut joined = String::with_capacity(self.0.len() + 1 + rest.len());
        joined.push_str(&self.0);
        if !rest.is_empty() {
            joined.push('/');
            joined.push_str(rest);
        }
        joined
    }
}

/// `host[:port][/path]` as a runtime resolves it (see [`Prefix::resolved`]); borrowed when
/// it is already so spelled, as nearly every image is, so routing allocates nothing for it.
pub(crate) fn resolved_name(name: &str) -> Cow<'_, str> {
    let (written, path) = match name.split_once('/') {
        Some((host, path)) => (host, Some(path)),
        None => (name, None),
    };
    let host = written
        .strip_suffix(":443")
        .or_else(|| written.strip_suffix(":80"))
        .unwrap_or(written);
    let host = if DOCKER_HUB_ALIASES.contains(&host) {
        DOCKER_HUB
    } else {
        host
    };
    match path {
        _ if host == written => Cow::Borrowed(name),
        Some(path) => Cow::Owned(format!("{host}/{path}")),
        None => Cow::Owned(host.to_string()),
    }
}

/// One mirror an image may be swapped to: a registry prefix, and the pull secret the Pod needs
/// for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub prefix: Prefix,
    pub pull_secret: Option<String>,
    /// A pull-through cache: it fills itself on a pull through it, and cannot be
    /// pushed to.
    pub pull_through: bool,
}

/// One `mirrors` entry, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Its position in the settings, for messages.
    pub index: usize,
    pub source: Prefix,
    /// Tried in order: the first that holds the image wins. Never empty.
    pub targets: Vec<Target>,
}

/// The validated routing table.
#[derive(Clone, Debug, Default)]
pub struct Router {
    /// Longest source first, so the first match is the most specific.
    pub rules: Vec<Rule>,
    /// `defaultMirror`'s registries, tried in order.
    pub default_mirrors: Vec<Prefix>,
    /// Every target, so that an image already swapped is recognised and left alone.
    pub targets: Vec<Prefix>,
    /// The same, as runtimes resolve them: an image under `m.io:443/hub` is under `m.io/hub`.
    resolved_targets: Vec<Prefix>,
    /// Beside each of `targets`: whether it is a pull-through cache.
    pull_through: Vec<bool>,
    pub exclude: Vec<Glob>,
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
    /// A rule matched, but none of the mirror repositories it names is a valid name.
    Unroutable {
        rule: RuleName,
        reason: String,
    },
    Mirror(Destination<'p>),
}

#[derive(Debug, PartialEq, Eq)]
pub struct Destination<'p> {
    /// The mirror repositories, in the order they are tried; never empty.
    pub targets: Vec<MirrorRepository<'p>>,
    pub rule: RuleName,
}

/// One mirror repository an image may be swapped to, without tag or digest.
#[derive(Debug, PartialEq, Eq)]
pub struct MirrorRepository<'p> {
    pub repository: String,
    pub pull_secret: Option<&'p str>,
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

impl Router {
    /// Sorts the rules most specific first and collects the targets.
    pub fn new(mut rules: Vec<Rule>, default_mirrors: Vec<Prefix>, exclude: Vec<Glob>) -> Router {
        rules.sort_by_key(|rule| std::cmp::Reverse(rule.source.as_str().len()));
        let targets = rules
            .iter()
            .flat_map(|r| r.targets.iter().map(|t| t.prefix.clone()))
            .chain(default_mirrors.iter().cloned())
            .collect::<Vec<Prefix>>();
        let resolved_targets = targets.iter().map(Prefix::resolved).collect();
        let pull_through = rules
            .iter()
            .flat_map(|r| r.targets.iter().map(|t| t.pull_through))
            .chain(default_mirrors.iter().map(|_| false))
            .collect();
        Router {
            rules,
            default_mirrors,
            targets,
            resolved_targets,
            pull_through,
            exclude,
        }
    }

    /// The target `reference` lies under, in any spelling a runtime resolves to it (default
    /// ports, Docker Hub's names), as the settings wrote it: the image is a mirror image.
    /// Resolving both sides keeps a prefix a prefix, so one comparison covers every spelling.
    pub fn target_of(&self, reference: &Reference) -> Option<&Prefix> {
        let resolved = resolved_name(reference.name());
        self.resolved_targets
            .iter()
            .position(|t| t.strip_from(&resolved).is_some())
            .and_then(|at| self.targets.get(at))
    }

    /// Whether `reference` lies under a target marked `pullThrough`: a cache that fills itself
    /// on a pull through it, which nothing may push to. Any marked target that holds it counts,
    /// not only the nearest: an unmarked target nested in a cache's (a rule for
    /// `docker.io/bitnami` to `cache/hub/bitnami` beside `docker.io` to `cache/hub`) is inside
    /// that cache too.
    pub fn is_pull_through(&self, reference: &Reference) -> bool {
        let resolved = resolved_name(reference.name());
        self.resolved_targets
            .iter()
            .zip(&self.pull_through)
            .any(|(target, marked)| *marked && target.strip_from(&resolved).is_some())
    }

    pub fn route(&self, reference: &Reference) -> Route<'_> {
        let name = reference.name();
        if self.target_of(reference).is_some() {
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
        let (candidates, rule): (Vec<MirrorRepository<'_>>, RuleName) = match matched {
            Some((rule, rest)) => (
                rule.targets
                    .iter()
                    .map(|target| MirrorRepository {
                        repository: target.prefix.join(rest),
                        pull_secret: target.pull_secret.as_deref(),
                    })
                    .collect(),
                RuleName::Mirror(rule.index),
            ),
            None if self.default_mirrors.is_empty() => return Route::NotMatched,
            // An image of a default mirror's own registry is not routed there: it would land at
            // `<registry>/<its own host>/...`, which nobody fills (k8s-image-swapper skips
            // these too).
            None if self
                .default_mirrors
                .iter()
                .any(|registry| registry.host() == reference.domain()) =>
            {
                return Route::NotMatched;
            }
            None => {
                // k8s-image-swapper's layout keeps the source host as a path segment, which a
                // host with a port or upper-case letters cannot be.
                if !is_path_component(reference.domain()) {
                    return Route::Unroutable {
                        rule: RuleName::DefaultMirror,
                        reason: format!(
                            "registry host {:?} cannot be a repository path segment under {:?}",
                            reference.domain(),
                            self.default_mirrors
                                .first()
                                .map_or("", |registry| registry.as_str())
                        ),
                    };
                }
                (
                    self.default_mirrors
                        .iter()
                        .map(|registry| MirrorRepository {
                            repository: registry.join(name),
                            pull_secret: None,
                        })
                        .collect(),
                    RuleName::DefaultMirror,
                )
            }
        };
        // A mirror whose repository name would be too long is skipped; the others are tried.
        let (targets, too_long): (Vec<_>, Vec<_>) = candidates
            .into_iter()
            .partition(|target| target.repository.len() <= NAME_MAX_LEN);
        match too_long.first() {
            Some(target) if targets.is_empty() => Route::Unroutable {
                rule,
                reason: format!(
                    "the mirror repository {:?} is longer than {NAME_MAX_LEN} characters",
                    target.repository
                ),
            },
            _ => Route::Mirror(Destination { targets, rule }),
        }
    }

    /// Whether `image` is what this policy would have written for `original`: routing the
    /// original names the image's repository (under any of its targets) and tag, and the image's digest is the original's
    /// when the original names one (any digest otherwise, since pinning adds one). This is how
    /// an UPDATE that re-sends a recorded original is recognised; it never looks anything up.
    pub fn is_swap_of(&self, original: &str, image: &str) -> bool {
        let (Ok(original), Ok(image)) = (Reference::parse(original), Reference::parse(image))
        else {
            return false;
        };
        match self.route(&original) {
            Route::Mirror(destination) => {
                destination
                    .targets
                    .iter()
                    .any(|target| target.repository == image.name())
                    && original.tag() == image.tag()
                    && original
                        .digest()
                        .is_none_or(|digest| image.digest() == Some(digest))
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::tests::policy_from;
    use rstest::rstest;

    fn route(settings: &str, image: &str) -> String {
        let policy = policy_from(settings);
        let reference = Reference::parse(image).expect("valid reference");
        match policy.router.route(&reference) {
            Route::NotMatched => "not matched".to_string(),
            Route::Excluded(glob) => format!("excluded by {}", glob.as_str()),
            Route::AlreadySwapped => "already swapped".to_string(),
            Route::Unroutable { rule, reason } => format!("{rule}: {reason}"),
            Route::Mirror(d) => {
                let targets: Vec<String> = d
                    .targets
                    .iter()
                    .map(|t| format!("{} via {} secret {:?}", t.repository, d.rule, t.pull_secret))
                    .collect();
                targets.join(", then ")
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
    #[case::own_registry_is_not_rerouted(
        "123456789012.dkr.ecr.eu-west-1.amazonaws.com/team/app:1.0",
        "not matched"
    )]
    fn default_mirror_uses_k8s_image_swapper_layout(#[case] image: &str, #[case] expected: &str) {
        assert_eq!(route(DEFAULT, image), expected);
    }

    /// k8s-image-swapper's default layout: no prefix, the source host as the first path
    /// component at the registry's root (what a migrating user's repositories are named).
    const ROOT: &str =
        r#"{"defaultMirror": {"registry": "123456789012.dkr.ecr.eu-west-1.amazonaws.com"}}"#;

    #[rstest]
    #[case::docker_hub(
        "nginx:1.27",
        "123456789012.dkr.ecr.eu-west-1.amazonaws.com/docker.io/library/nginx via defaultMirror secret None"
    )]
    #[case::quay(
        "quay.io/argoproj/argocd:v2",
        "123456789012.dkr.ecr.eu-west-1.amazonaws.com/quay.io/argoproj/argocd via defaultMirror secret None"
    )]
    #[case::already_at_the_root(
        "123456789012.dkr.ecr.eu-west-1.amazonaws.com/docker.io/library/nginx:1.27",
        "already swapped"
    )]
    // The whole registry is the target: the account's own repositories lie under it, and are
    // left as they are, as an image already swapped.
    #[case::the_accounts_own_repository(
        "123456789012.dkr.ecr.eu-west-1.amazonaws.com/team/app:1.0",
        "already swapped"
    )]
    fn default_mirror_at_the_registry_root_is_k8s_image_swapper_s_default_layout(
        #[case] image: &str,
        #[case] expected: &str,
    ) {
        assert_eq!(route(ROOT, image), expected);
    }

    /// The whole decision at the root: a lookup of exactly the repository k8s-image-swapper
    /// wrote, and the swap pinned to the digest it answered.
    #[test]
    fn an_image_at_the_registry_root_is_swapped_pinned() {
        use crate::decide::tests::{DIGEST_A, FakeRegistry, policy_from};
        use crate::decide::{Decision, decide};
        let at_root = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/docker.io/library/nginx:1.27";
        let mut registry = FakeRegistry::default().with(at_root, Ok(DIGEST_A));
        let decision = decide("nginx:1.27", &policy_from(ROOT), &mut registry);
        assert_eq!(
            decision,
            Decision::Swap {
                image: format!("{at_root}@{DIGEST_A}"),
                pull_secret: None,
                note: None
            }
        );
        assert_eq!(registry.asked, [at_root.to_string()]);
    }

    #[test]
    fn too_long_a_mirror_name_is_unroutable() {
        let image = format!("quay.io/{}", "a".repeat(240));
        assert!(route(DEFAULT, &image).starts_with("mirrors[0]: the mirror repository"));
    }
}

#[cfg(test)]
mod swap_of_tests {
    use crate::decide::tests::policy_from;
    use rstest::rstest;

    const SETTINGS: &str = r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"},{"source":"quay.io","targets":[{"target":"m.io/quay"},{"target":"n.io/quay"}]}],"exclude":["docker.io/library/pause:*"]}"#;
    const D: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const E: &str = "sha256:eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";

    #[rstest]
    #[case::pinned_swap("nginx:1.27", &format!("m.io/hub/library/nginx:1.27@{D}"), true)]
    #[case::unpinned_swap("nginx:1.27", "m.io/hub/library/nginx:1.27", true)]
    #[case::digest_original(&format!("nginx@{D}"), &format!("m.io/hub/library/nginx@{D}"), true)]
    #[case::digest_original_other_digest(&format!("nginx@{D}"), &format!("m.io/hub/library/nginx@{E}"), false)]
    #[case::tag_and_digest_original_other_digest(&format!("nginx:1.27@{D}"), &format!("m.io/hub/library/nginx:1.27@{E}"), false)]
    #[case::swap_to_a_later_mirror_of_the_list("quay.io/org/app:1", "n.io/quay/org/app:1", true)]
    #[case::tag_and_digest_original_same_digest(&format!("nginx:1.27@{D}"), &format!("m.io/hub/library/nginx:1.27@{D}"), true)]
    #[case::other_tag("nginx:1.27", "m.io/hub/library/nginx:1.26", false)]
    #[case::other_repository("nginx:1.27", "m.io/hub/library/httpd:1.27", false)]
    #[case::not_under_a_target("nginx:1.27", "nginx:1.27", false)]
    #[case::excluded_original("pause:3.9", "m.io/hub/library/pause:3.9", false)]
    #[case::invalid_original("::", "m.io/hub/library/nginx:1.27", false)]
    fn a_recorded_swap_is_recognised_without_a_lookup(
        #[case] original: &str,
        #[case] image: &str,
        #[case] expected: bool,
    ) {
        let policy = policy_from(SETTINGS);
        assert_eq!(policy.router.is_swap_of(original, image), expected);
    }
}
