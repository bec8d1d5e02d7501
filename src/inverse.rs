//! Routing inverted: the sources an image written under a target may be the mirror copy of.
//! With `signatures` or `verifiers`, an image a Pod writes under a mirror's name is judged as
//! the source spellings that route there, so that a verifier keyed on sources is never passed
//! by writing the mirror's name. Separate from `rules` because only that path asks it.

use crate::reference::{DOCKER_HUB, Reference, looks_like_registry_host};
use crate::rules::{Route, Router, resolved_name};

/// A source an image under a target may be the mirror copy of ([`Router::sources_of`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceSpelling {
    /// Fully qualified, with the mirror image's tag and digest.
    pub reference: Reference,
    /// Routing it gives back the mirror image's repository.
    pub forward: bool,
}

impl SourceSpelling {
    /// Every string a Pod could write for this source, which a verifier's glob is matched
    /// against as written: fully qualified, and Docker Hub's short forms (`library/nginx`,
    /// `nginx`); each also without its tag when that is the `latest` a runtime adds.
    pub fn spellings(&self) -> Vec<String> {
        let reference = &self.reference;
        let mut names = vec![reference.name().to_string()];
        if reference.domain() == DOCKER_HUB {
            let path = reference.path();
            names.push(path.to_string());
            if let Some(short) = path.strip_prefix("library/") {
                names.push(short.to_string());
            }
        }
        let suffix = &reference.as_str()[reference.name().len()..];
        let mut spellings = Vec::with_capacity(names.len() * 2);
        for name in names {
            if suffix == ":latest" {
                spellings.push(name.clone());
            }
            spellings.push(format!("{name}{suffix}"));
        }
        spellings
    }
}

impl Router {
    /// The source references whose mirror copy `reference` (an image under a target) may be:
    /// each rule and `defaultMirror` whose target it lies under, inverted
    /// (`m.io/hub/org/app:1` <= `docker.io/org/app:1`), with its tag and digest. `forward` is
    /// set for those that route back to this very repository; a more specific rule or an
    /// `exclude` sends a plain inverse elsewhere. Deduplicated, in the router's order.
    pub fn sources_of(&self, reference: &Reference) -> Vec<SourceSpelling> {
        let resolved = resolved_name(reference.name());
        let mut names: Vec<String> = Vec::new();
        for rule in &self.rules {
            for target in &rule.targets {
                if let Some(rest) = target.prefix.resolved().strip_from(&resolved) {
                    names.push(rule.source.join(rest));
                }
            }
        }
        for registry in &self.default_mirrors {
            // k8s-image-swapper's layout: `<registry>/<source host>/<path>`.
            if let Some(rest) = registry.resolved().strip_from(&resolved)
                && rest
                    .split_once('/')
                    .is_some_and(|(host, _)| looks_like_registry_host(host))
            {
                names.push(rest.to_string());
            }
        }
        let mut sources: Vec<SourceSpelling> = Vec::new();
        for name in names {
            let mut text = name;
            if let Some(tag) = reference.tag() {
                text.push(':');
                text.push_str(tag);
            }
            if let Some(digest) = reference.digest() {
                text.push('@');
                text.push_str(digest);
            }
            let Ok(source) = Reference::parse(&text) else {
                continue;
            };
            if sources.iter().any(|known| known.reference == source) {
                continue;
            }
            let forward = match self.route(&source) {
                Route::Mirror(destination) => destination
                    .targets
                    .iter()
                    .any(|target| resolved_name(&target.repository) == resolved),
                _ => false,
            };
            sources.push(SourceSpelling {
                reference: source,
                forward,
            });
        }
        sources
    }
}

#[cfg(test)]
mod tests {
    use crate::decide::tests::policy_from;
    use crate::reference::Reference;
    use rstest::rstest;

    const SETTINGS: &str = r#"{"mirrors":[
        {"source":"docker.io","target":"m.io/hub"},
        {"source":"docker.io/library","target":"m.io/official"},
        {"source":"registry.example.com/org","targets":[{"target":"mirror.example.com/cache/org"},{"target":"backup.example.com/org"}]}],
        "defaultMirror":{"registry":"ecr.example.com/cache"},
        "exclude":["registry.example.com/org/*:pr-*"]}"#;

    fn sources(image: &str) -> Vec<String> {
        let policy = policy_from(SETTINGS);
        let reference = Reference::parse(image).expect("valid reference");
        policy
            .router
            .sources_of(&reference)
            .iter()
            .map(|s| {
                format!(
                    "{}{}",
                    s.reference,
                    if s.forward { "" } else { " (elsewhere)" }
                )
            })
            .collect()
    }

    #[rstest]
    #[case::a_rule_inverted("mirror.example.com/cache/org/app:1", &["registry.example.com/org/app:1"])]
    #[case::a_later_target_of_the_rule("backup.example.com/org/app:1", &["registry.example.com/org/app:1"])]
    #[case::exclude_sends_it_nowhere(
        "mirror.example.com/cache/org/app:pr-123",
        &["registry.example.com/org/app:pr-123 (elsewhere)"]
    )]
    #[case::a_more_specific_rule_sends_it_elsewhere(
        "m.io/hub/library/nginx:1.27",
        &["docker.io/library/nginx:1.27 (elsewhere)"]
    )]
    #[case::the_specific_rule("m.io/official/nginx:1.27", &["docker.io/library/nginx:1.27"])]
    #[case::a_pinned_image_keeps_its_digest(
        "m.io/official/nginx@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        &["docker.io/library/nginx@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"]
    )]
    #[case::a_default_port_spelling("m.io:443/hub/org/app:1", &["docker.io/org/app:1"])]
    #[case::the_default_mirror_layout(
        "ecr.example.com/cache/quay.io/org/app:1",
        &["quay.io/org/app:1"]
    )]
    #[case::a_default_mirror_path_without_a_host("ecr.example.com/cache/org/app:1", &[])]
    fn an_image_under_a_target_names_the_sources_that_route_there(
        #[case] image: &str,
        #[case] expected: &[&str],
    ) {
        assert_eq!(sources(image), expected);
    }

    /// k8s-image-swapper's default layout, `defaultMirror` at a registry's root: the first path
    /// component is the source host; a repository of the registry's own, with no host there,
    /// inverts to nothing.
    #[rstest]
    #[case::docker_hub("docker.io/library/nginx:1.27", &["docker.io/library/nginx:1.27"])]
    #[case::another_host("quay.io/org/app:2", &["quay.io/org/app:2"])]
    #[case::the_registry_s_own("team/app:1", &[])]
    fn a_default_mirror_at_a_registry_root_inverts_to_the_source_host(
        #[case] path: &str,
        #[case] expected: &[&str],
    ) {
        const ROOT: &str = "123456789012.dkr.ecr.eu-west-1.amazonaws.com";
        let policy = policy_from(&format!(r#"{{"defaultMirror":{{"registry":"{ROOT}"}}}}"#));
        let image = Reference::parse(&format!("{ROOT}/{path}")).expect("valid reference");
        let sources: Vec<String> = policy
            .router
            .sources_of(&image)
            .iter()
            .filter(|source| source.forward)
            .map(|source| source.reference.to_string())
            .collect();
        assert_eq!(sources, expected);
    }

    #[test]
    fn the_docker_hub_short_forms_are_spellings_of_a_source() {
        let policy = policy_from(SETTINGS);
        let image = Reference::parse("m.io/official/nginx").expect("valid reference");
        let sources = policy.router.sources_of(&image);
        let spellings: Vec<String> = sources.iter().flat_map(|s| s.spellings()).collect();
        assert_eq!(
            spellings,
            [
                "docker.io/library/nginx",
                "docker.io/library/nginx:latest",
                "library/nginx",
                "library/nginx:latest",
                "nginx",
                "nginx:latest"
            ]
        );
        let image = Reference::parse("mirror.example.com/cache/org/app:1").expect("valid");
        let spellings = policy.router.sources_of(&image)[0].spellings();
        assert_eq!(spellings, ["registry.example.com/org/app:1"]);
    }
}
