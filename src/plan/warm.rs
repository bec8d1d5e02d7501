//! How a copy into a pull-through cache is made: it is not. A rule's target marked
//! `pullThrough` fills itself when asked for a manifest it lacks, and cannot be pushed to, so
//! the fill job pulls the image through the cache in the form the cache fills on. Here,
//! beside the copies the policy writes, so that the fill job derives the request from the very
//! routing the module swaps with.

use crate::policy::Policy;
use crate::reference::Reference;

/// The pull that fills a pull-through cache with a copy's source: `reference` under the
/// cache, by the source's tag where it names one (ECR's pull-through cache fills on a tag, and
/// answers "not found" for a digest it has not stored), else by its digest; and the digest the
/// answer must name when the source is pinned to one.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Warm {
    pub reference: String,
    pub digest: Option<String>,
}

/// The warming that stands for the copy of `source` to `destination`, or `None` when the
/// destination is not under a target marked `pullThrough` (or either side is not a reference:
/// then it is copied, or refused, as any other). `image` is what the Pod or template names, when known: a copy of a pinned image
/// is by digest alone, and the cache fills on the tag beside that digest.
pub(super) fn warm_for(
    source: &str,
    destination: &str,
    image: Option<&str>,
    policy: &Policy,
) -> Option<Warm> {
    let destination = Reference::parse(destination).ok()?;
    if !policy.router.is_pull_through(&destination) {
        return None;
    }
    let source = Reference::parse(source).ok()?;
    let named = image.and_then(|image| Reference::parse(image).ok());
    let tag = source
        .tag()
        .or_else(|| named.as_ref().and_then(|named| named.tag()));
    let repository = destination.name();
    let digest = source.digest().map(str::to_string);
    let reference = match (tag, &digest) {
        (Some(tag), _) => format!("{repository}:{tag}"),
        (None, Some(digest)) => format!("{repository}@{digest}"),
        (None, None) => return None,
    };
    Some(Warm { reference, digest })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::tests::policy_from;
    use rstest::rstest;

    const CACHE: &str = r#"{"mirrors":[
        {"source":"docker.io","target":"cache.example/docker-hub","pullThrough":true},
        {"source":"quay.io","target":"m.example/quay"}]}"#;

    #[rstest]
    #[case::a_tag_is_asked_by_its_tag(
        None,
        "docker.io/library/nginx:1.27",
        "cache.example/docker-hub/library/nginx:1.27",
        Some(("cache.example/docker-hub/library/nginx:1.27", None))
    )]
    #[case::a_pinned_tag_is_asked_by_the_tag_its_pod_names_and_checked_against_its_digest(
        Some("nginx:1.27@sha256:1111111111111111111111111111111111111111111111111111111111111111"),
        "docker.io/library/nginx@sha256:1111111111111111111111111111111111111111111111111111111111111111",
        "cache.example/docker-hub/library/nginx:sha256-1111111111111111111111111111111111111111111111111111111111111111",
        Some(("cache.example/docker-hub/library/nginx:1.27", Some("sha256:1111111111111111111111111111111111111111111111111111111111111111")))
    )]
    #[case::a_digest_alone_is_asked_by_its_digest(
        Some("nginx@sha256:2222222222222222222222222222222222222222222222222222222222222222"),
        "docker.io/library/nginx@sha256:2222222222222222222222222222222222222222222222222222222222222222",
        "cache.example/docker-hub/library/nginx:sha256-2222222222222222222222222222222222222222222222222222222222222222",
        Some(("cache.example/docker-hub/library/nginx@sha256:2222222222222222222222222222222222222222222222222222222222222222", Some("sha256:2222222222222222222222222222222222222222222222222222222222222222")))
    )]
    #[case::a_report_s_copy_by_digest_names_no_tag_and_is_asked_by_its_digest(
        None,
        "docker.io/library/nginx@sha256:2222222222222222222222222222222222222222222222222222222222222222",
        "cache.example/docker-hub/library/nginx:sha256-2222222222222222222222222222222222222222222222222222222222222222",
        Some(("cache.example/docker-hub/library/nginx@sha256:2222222222222222222222222222222222222222222222222222222222222222", Some("sha256:2222222222222222222222222222222222222222222222222222222222222222")))
    )]
    #[case::a_signature_tag_is_asked_by_its_tag(
        None,
        "docker.io/library/nginx:sha256-3333333333333333333333333333333333333333333333333333333333333333.sig",
        "cache.example/docker-hub/library/nginx:sha256-3333333333333333333333333333333333333333333333333333333333333333.sig",
        Some(("cache.example/docker-hub/library/nginx:sha256-3333333333333333333333333333333333333333333333333333333333333333.sig", None))
    )]
    #[case::a_target_without_the_mark_is_copied(
        Some("quay.io/team/app:1"),
        "quay.io/team/app:1",
        "m.example/quay/team/app:1",
        None
    )]
    #[case::a_destination_under_no_target_is_copied(
        None,
        "docker.io/library/nginx:1.27",
        "elsewhere.example/library/nginx:1.27",
        None
    )]
    fn a_pull_through_target_is_warmed_in_the_form_the_cache_fills_on(
        #[case] image: Option<&str>,
        #[case] source: &str,
        #[case] destination: &str,
        #[case] expected: Option<(&str, Option<&str>)>,
    ) {
        let policy = policy_from(CACHE);
        let expected = expected.map(|(reference, digest)| Warm {
            reference: reference.to_string(),
            digest: digest.map(str::to_string),
        });
        assert_eq!(warm_for(source, destination, image, &policy), expected);
    }

    /// The marks stay with their targets whatever the order the rules are written in (the
    /// router sorts them, most specific source first), on an entry of `targets`, and on a target
    /// nested in a cache's.
    #[rstest]
    #[case::a_marked_second_entry_of_targets(
        "quay.io/team/app:1",
        "cache.example/quay/team/app:1",
        true
    )]
    #[case::the_unmarked_first_entry("quay.io/team/app:1", "m.example/quay/team/app:1", false)]
    #[case::a_shorter_marked_source_written_first(
        "docker.io/library/nginx:1",
        "cache.example/hub/library/nginx:1",
        true
    )]
    #[case::an_unmarked_target_nested_in_the_cache(
        "docker.io/bitnami/redis:7",
        "cache.example/hub/bitnami/redis:7",
        true
    )]
    #[case::an_unmarked_rule_elsewhere("ghcr.io/org/app:1", "m.example/ghcr/org/app:1", false)]
    fn marks_stay_with_their_targets(
        #[case] source: &str,
        #[case] destination: &str,
        #[case] warmed: bool,
    ) {
        let policy = policy_from(
            r#"{"mirrors":[
            {"source":"docker.io","target":"cache.example/hub","pullThrough":true},
            {"source":"quay.io","targets":[{"target":"m.example/quay"},{"target":"cache.example/quay","pullThrough":true}]},
            {"source":"docker.io/bitnami","target":"cache.example/hub/bitnami"},
            {"source":"ghcr.io","target":"m.example/ghcr"}]}"#,
        );
        assert_eq!(
            warm_for(source, destination, None, &policy).is_some(),
            warmed
        );
    }

    #[test]
    fn the_mark_follows_the_spelling_a_runtime_resolves() {
        let policy = policy_from(
            r#"{"mirrors":[{"source":"docker.io","target":"cache.example:443/hub","pullThrough":true}]}"#,
        );
        let warm = warm_for(
            "docker.io/library/app:1",
            "cache.example/hub/library/app:1",
            None,
            &policy,
        );
        assert_eq!(
            warm.map(|w| w.reference).as_deref(),
            Some("cache.example/hub/library/app:1")
        );
    }
}
