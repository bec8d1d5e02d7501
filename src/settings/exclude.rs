//! `exclude` patterns, checked against the form they are matched with. Images are matched as
//! normalised references (`docker.io/library/nginx:1.27`: registry host first, `library/` for
//! Docker Hub's official images, a tag or digest always present), so a pattern written the way
//! a Pod spells an image (`pause:*`, `bitnami/*`, `docker.io/nginx:*`, `registry.k8s.io/pause`)
//! would exclude nothing, and the images it was meant for would be swapped or even refused.
//! Such a pattern is refused with the spelling that matches.

use crate::reference::{DOCKER_HUB, DOCKER_HUB_ALIASES, looks_like_registry_host};

/// The spelling of `pattern` that matches what it was meant to, when `pattern` itself can never
/// match a normalised reference; `None` when it can.
pub(super) fn matching_spelling(pattern: &str) -> Option<String> {
    let mut spelling = pattern.to_string();
    // A reference always has a '/' after its registry host: `pause:*` names a short image.
    if !spelling.contains('/') && !spelling.starts_with(['*', '?']) {
        spelling.insert_str(0, "*/");
    }
    if let Some((host, rest)) = spelling.split_once('/')
        && !host.contains(['*', '?'])
    {
        let rest = rest.to_string();
        if !looks_like_registry_host(host) {
            // `bitnami/*`: a first segment that is not a host is a Docker Hub path.
            spelling = format!("{DOCKER_HUB}/{host}/{rest}");
        } else if DOCKER_HUB_ALIASES.contains(&host) {
            spelling = format!("{DOCKER_HUB}/{rest}");
        }
        if let Some(rest) = spelling.strip_prefix("docker.io/")
            && single_literal_segment(rest)
        {
            // `docker.io/nginx:*`: official images are `docker.io/library/<name>`.
            spelling = format!("{DOCKER_HUB}/library/{rest}");
        }
    }
    // `registry.k8s.io/pause`: a normalised reference always ends in a tag or a digest.
    let last = spelling.rsplit('/').next().unwrap_or_default();
    if !last.contains([':', '@', '*', '?']) {
        spelling.push_str(":*");
    }
    (spelling != pattern).then_some(spelling)
}

/// Whether `rest` (a Docker Hub path with its tag or digest) names a repository of one literal
/// segment: no '/', and no wildcard before the tag or digest that could stand for one.
fn single_literal_segment(rest: &str) -> bool {
    let repository = rest.split([':', '@']).next().unwrap_or_default();
    !rest.contains('/') && !repository.contains(['*', '?'])
}

#[cfg(test)]
mod tests {
    use super::matching_spelling;
    use crate::glob::Glob;
    use crate::reference::Reference;
    use rstest::rstest;

    #[rstest]
    #[case::short_name_with_tag("pause:*", Some("*/pause:*"))]
    #[case::short_name("nginx", Some("*/nginx:*"))]
    #[case::docker_hub_path("bitnami/*", Some("docker.io/bitnami/*"))]
    #[case::docker_hub_path_without_tag("myorg/app", Some("docker.io/myorg/app:*"))]
    #[case::official_image_without_library("docker.io/nginx:*", Some("docker.io/library/nginx:*"))]
    #[case::docker_hub_alias("index.docker.io/library/nginx:*", Some("docker.io/library/nginx:*"))]
    #[case::docker_hub_alias_official(
        "registry-1.docker.io/nginx@*",
        Some("docker.io/library/nginx@*")
    )]
    #[case::no_tag_or_digest("registry.k8s.io/pause", Some("registry.k8s.io/pause:*"))]
    #[case::normalised("registry.k8s.io/pause:*", None)]
    #[case::digest_only("docker.io/library/busybox@*", None)]
    #[case::any_host("*/pause:*", None)]
    #[case::any_reference_with_tag("*:latest", None)]
    #[case::wildcard_in_docker_hub_repository("docker.io/nginx*", None)]
    #[case::docker_hub_namespace("docker.io/bitnami/*", None)]
    #[case::host_with_port("localhost:5000/app:*", None)]
    #[case::wildcard_host("*.example.com/team/*", None)]
    #[case::question_mark_for_the_tag_separator("registry.k8s.io/pause?3.9", None)]
    fn patterns_that_cannot_match_get_the_spelling_that_does(
        #[case] pattern: &str,
        #[case] spelling: Option<&str>,
    ) {
        assert_eq!(matching_spelling(pattern).as_deref(), spelling);
    }

    /// Each suggested spelling matches the image the pattern was written for, and is itself
    /// accepted.
    #[rstest]
    #[case::pause("pause:*", "registry.k8s.io/pause:3.10")]
    #[case::bitnami("bitnami/*", "bitnami/redis:7")]
    #[case::official("docker.io/nginx:*", "nginx:1.27")]
    #[case::no_tag("registry.k8s.io/pause", "registry.k8s.io/pause:3.10")]
    fn the_suggested_spelling_matches_the_image_meant(#[case] pattern: &str, #[case] image: &str) {
        let normalised = Reference::parse(image).expect("valid image");
        let written = Glob::new(pattern).expect("glob");
        assert!(!written.matches(normalised.as_str()), "{pattern} matched");
        let spelling = matching_spelling(pattern).expect("refused");
        assert!(
            Glob::new(&spelling)
                .expect("glob")
                .matches(normalised.as_str())
        );
        assert_eq!(matching_spelling(&spelling), None, "{spelling}");
    }
}
