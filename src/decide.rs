//! The decision for one image: the table of DESIGN.md as one pure function over [`Registry`].

use crate::reference::{Reference, parse_digest};
use crate::rules::{Destination, Route};
use crate::settings::{Fallback, Policy, SwapPolicy};

/// The registry lookups a decision needs; Kubewarden's OCI host capabilities in the policy
/// module, an in-memory table in unit tests.
pub trait Registry {
    /// The manifest digest the registry serves for `image` (`v1/manifest_digest`).
    fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError>;
}

/// Why a lookup gave no digest. Only a registry's explicit "unknown" is [`LookupError::Absent`];
/// anything the policy cannot recognise is [`LookupError::Failed`], so that an outage is never
/// mistaken for a pruned image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LookupError {
    Absent(String),
    Failed(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Not the policy's business: no rule matches, or an `exclude` pattern does.
    Unchanged,
    /// Already under a mirror target: admitting a swapped Pod again changes nothing.
    AlreadySwapped,
    /// Write `image`; add `pull_secret` to the Pod when it has one.
    Swap {
        image: String,
        pull_secret: Option<String>,
    },
    /// Keep the original image, and tell the user why.
    Keep { warning: String },
    /// Refuse the Pod, with this reason.
    Reject { message: String },
}

/// The longest image string quoted in a message; Kubernetes truncates long warnings anyway.
const QUOTE_MAX: usize = 200;

/// An image string for a message: quoted, escaped, and cut to a readable length.
pub fn quote(image: &str) -> String {
    match image.char_indices().nth(QUOTE_MAX) {
        Some((cut, _)) => format!("{:?}…", &image[..cut]),
        None => format!("{image:?}"),
    }
}

pub fn decide(image: &str, policy: &Policy, registry: &mut impl Registry) -> Decision {
    let reference = match Reference::parse(image) {
        Ok(reference) => reference,
        Err(error) => {
            return Decision::Keep {
                warning: format!(
                    "image {}: not swapped, not a valid image reference: {error}",
                    quote(image)
                ),
            };
        }
    };
    match policy.route(&reference) {
        Route::NotMatched | Route::Excluded(_) => Decision::Unchanged,
        Route::AlreadySwapped => Decision::AlreadySwapped,
        Route::Unroutable { rule, reason } => Decision::Keep {
            warning: format!("image {}: not swapped, {rule}: {reason}", quote(image)),
        },
        Route::Mirror(destination) => {
            decide_mirror(image, &reference, &destination, policy, registry)
        }
    }
}

fn decide_mirror(
    image: &str,
    reference: &Reference,
    destination: &Destination<'_>,
    policy: &Policy,
    registry: &mut impl Registry,
) -> Decision {
    let repository = &destination.repository;
    let tagged = match reference.tag() {
        Some(tag) => format!("{repository}:{tag}"),
        None => repository.clone(),
    };
    let swap = |image: String| Decision::Swap {
        image,
        pull_secret: destination.pull_secret.map(str::to_string),
    };
    match (policy.swap_policy, reference.digest()) {
        (SwapPolicy::Always, Some(digest)) => swap(format!("{tagged}@{digest}")),
        (SwapPolicy::Always, None) => swap(tagged),
        // The digest names the content: the mirror must serve exactly it.
        (SwapPolicy::Exists, Some(digest)) => {
            let lookup = format!("{repository}@{digest}");
            match verified_digest(registry, &lookup) {
                Ok(answer) if answer == digest => swap(format!("{tagged}@{digest}")),
                Ok(answer) => fallback(
                    policy.on_lookup_error,
                    image,
                    &lookup,
                    &format!("could not verify it: the mirror answered digest {answer} for it"),
                    "onLookupError",
                ),
                Err(error) => lookup_fallback(policy, image, &lookup, error),
            }
        }
        (SwapPolicy::Exists, None) => match verified_digest(registry, &tagged) {
            Ok(digest) if policy.pin_digest => swap(format!("{tagged}@{digest}")),
            Ok(_) => swap(tagged),
            Err(error) => lookup_fallback(policy, image, &tagged, error),
        },
    }
}

/// A digest the host answered, checked to be a digest: a malformed answer verifies nothing.
fn verified_digest(registry: &mut impl Registry, image: &str) -> Result<String, LookupError> {
    let answer = registry.manifest_digest(image)?;
    parse_digest(&answer).map_err(|error| {
        LookupError::Failed(format!("the host answered {}: {error}", quote(&answer)))
    })
}

fn lookup_fallback(policy: &Policy, image: &str, lookup: &str, error: LookupError) -> Decision {
    match error {
        LookupError::Absent(why) => fallback(
            policy.on_missing,
            image,
            lookup,
            &format!("the mirror does not have it ({why})"),
            "onMissing",
        ),
        LookupError::Failed(why) => fallback(
            policy.on_lookup_error,
            image,
            lookup,
            &format!("could not look it up ({why})"),
            "onLookupError",
        ),
    }
}

fn fallback(action: Fallback, image: &str, lookup: &str, reason: &str, setting: &str) -> Decision {
    match action {
        Fallback::Keep => Decision::Keep {
            warning: format!(
                "image {}: kept, not swapped to {}: {reason}",
                quote(image),
                quote(lookup)
            ),
        },
        Fallback::Reject => Decision::Reject {
            message: format!(
                "image {}: cannot be swapped to {}: {reason}; {setting} is reject",
                quote(image),
                quote(lookup)
            ),
        },
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::settings::parse_settings;
    use rstest::rstest;
    use std::collections::BTreeMap;

    pub const DIGEST_A: &str =
        "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    pub const DIGEST_B: &str =
        "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    /// A registry in memory that records the lookups it was asked for.
    #[derive(Default)]
    pub struct FakeRegistry {
        pub answers: BTreeMap<String, Result<String, LookupError>>,
        pub asked: Vec<String>,
    }

    impl FakeRegistry {
        pub fn with(mut self, image: &str, answer: Result<&str, LookupError>) -> Self {
            self.answers
                .insert(image.to_string(), answer.map(str::to_string));
            self
        }
    }

    impl Registry for FakeRegistry {
        fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError> {
            self.asked.push(image.to_string());
            self.answers
                .get(image)
                .cloned()
                .unwrap_or_else(|| Err(LookupError::Absent("manifest unknown".to_string())))
        }
    }

    pub fn policy_from(json: &str) -> Policy {
        Policy::from_settings(&parse_settings(json.as_bytes()).expect("valid settings"))
            .expect("valid settings")
    }

    const HUB: &str = r#""mirrors":[{"source":"docker.io","target":"mirror.example.com/dockerhub","pullSecret":"pull"}]"#;

    fn absent() -> LookupError {
        LookupError::Absent("manifest unknown".to_string())
    }

    fn failed() -> LookupError {
        LookupError::Failed("connection refused".to_string())
    }

    fn swap(image: &str) -> Decision {
        Decision::Swap {
            image: image.to_string(),
            pull_secret: Some("pull".to_string()),
        }
    }

    fn tag_at(d: &str) -> String {
        format!("mirror.example.com/dockerhub/library/nginx:1.27@{d}")
    }

    #[rstest]
    #[case::no_rule(
        "",
        "ghcr.io/org/app:1",
        FakeRegistry::default(),
        Decision::Unchanged,
        0
    )]
    #[case::excluded(
        r#","exclude":["docker.io/library/nginx:*"]"#,
        "nginx:1.27",
        FakeRegistry::default(),
        Decision::Unchanged,
        0
    )]
    #[case::already_swapped(
        "",
        "mirror.example.com/dockerhub/library/nginx:1.27",
        FakeRegistry::default(),
        Decision::AlreadySwapped,
        0
    )]
    #[case::always_tag(
        r#","swapPolicy":"always""#,
        "nginx:1.27",
        FakeRegistry::default(),
        swap("mirror.example.com/dockerhub/library/nginx:1.27"),
        0
    )]
    #[case::always_keeps_source_digest(r#","swapPolicy":"always""#, &format!("nginx:1.27@{DIGEST_A}"), FakeRegistry::default(), swap(&tag_at(DIGEST_A)), 0)]
    #[case::tag_found_is_pinned("", "nginx:1.27", FakeRegistry::default().with("mirror.example.com/dockerhub/library/nginx:1.27", Ok(DIGEST_B)), swap(&tag_at(DIGEST_B)), 1)]
    #[case::tag_found_unpinned(r#","pinDigest":false"#, "nginx:1.27", FakeRegistry::default().with("mirror.example.com/dockerhub/library/nginx:1.27", Ok(DIGEST_B)), swap("mirror.example.com/dockerhub/library/nginx:1.27"), 1)]
    #[case::digest_found("", &format!("nginx:1.27@{DIGEST_A}"), FakeRegistry::default().with(&format!("mirror.example.com/dockerhub/library/nginx@{DIGEST_A}"), Ok(DIGEST_A)), swap(&tag_at(DIGEST_A)), 1)]
    #[case::digest_only_found("", &format!("nginx@{DIGEST_A}"), FakeRegistry::default().with(&format!("mirror.example.com/dockerhub/library/nginx@{DIGEST_A}"), Ok(DIGEST_A)), swap(&format!("mirror.example.com/dockerhub/library/nginx@{DIGEST_A}")), 1)]
    fn swaps_only_to_what_was_verified(
        #[case] extra: &str,
        #[case] image: &str,
        #[case] mut registry: FakeRegistry,
        #[case] expected: Decision,
        #[case] lookups: usize,
    ) {
        let policy = policy_from(&format!("{{{HUB}{extra}}}"));
        assert_eq!(decide(image, &policy, &mut registry), expected);
        assert_eq!(
            registry.asked.len(),
            lookups,
            "lookups: {:?}",
            registry.asked
        );
    }

    #[rstest]
    #[case::missing_kept(
        "",
        Err(absent()),
        "image \"nginx:1.27\": kept, not swapped to \"mirror.example.com/dockerhub/library/nginx:1.27\": the mirror does not have it (manifest unknown)"
    )]
    #[case::missing_rejected(
        r#","onMissing":"reject""#,
        Err(absent()),
        "image \"nginx:1.27\": cannot be swapped to \"mirror.example.com/dockerhub/library/nginx:1.27\": the mirror does not have it (manifest unknown); onMissing is reject"
    )]
    #[case::error_kept(
        "",
        Err(failed()),
        "image \"nginx:1.27\": kept, not swapped to \"mirror.example.com/dockerhub/library/nginx:1.27\": could not look it up (connection refused)"
    )]
    #[case::error_rejected(
        r#","onLookupError":"reject""#,
        Err(failed()),
        "image \"nginx:1.27\": cannot be swapped to \"mirror.example.com/dockerhub/library/nginx:1.27\": could not look it up (connection refused); onLookupError is reject"
    )]
    #[case::error_is_not_missing(
        r#","onMissing":"reject""#,
        Err(failed()),
        "image \"nginx:1.27\": kept, not swapped to \"mirror.example.com/dockerhub/library/nginx:1.27\": could not look it up (connection refused)"
    )]
    #[case::malformed_answer_is_an_error(
        "",
        Ok("latest"),
        "image \"nginx:1.27\": kept, not swapped to \"mirror.example.com/dockerhub/library/nginx:1.27\": could not look it up (the host answered \"latest\": invalid digest format)"
    )]
    fn falls_back_as_configured(
        #[case] extra: &str,
        #[case] answer: Result<&str, LookupError>,
        #[case] message: &str,
    ) {
        let policy = policy_from(&format!("{{{HUB}{extra}}}"));
        let mut registry =
            FakeRegistry::default().with("mirror.example.com/dockerhub/library/nginx:1.27", answer);
        let decision = decide("nginx:1.27", &policy, &mut registry);
        let text = match decision {
            Decision::Keep { warning } => warning,
            Decision::Reject { message } => message,
            other => panic!("expected a fallback, got {other:?}"),
        };
        assert_eq!(text, message);
    }

    #[test]
    fn a_digest_lookup_answered_with_another_digest_is_not_trusted() {
        let policy = policy_from(&format!("{{{HUB}}}"));
        let lookup = format!("mirror.example.com/dockerhub/library/nginx@{DIGEST_A}");
        let mut registry = FakeRegistry::default().with(&lookup, Ok(DIGEST_B));
        let decision = decide(&format!("nginx@{DIGEST_A}"), &policy, &mut registry);
        assert!(
            matches!(&decision, Decision::Keep { warning } if warning.contains(DIGEST_B)),
            "{decision:?}"
        );
    }

    #[rstest]
    #[case::empty("")]
    #[case::garbage("::not an image::")]
    #[case::upper_case("NGINX")]
    fn invalid_images_are_kept_with_a_warning(#[case] image: &str) {
        let policy = policy_from(&format!("{{{HUB}}}"));
        let mut registry = FakeRegistry::default();
        let decision = decide(image, &policy, &mut registry);
        assert!(
            matches!(&decision, Decision::Keep { warning } if warning.contains("not a valid image reference"))
        );
        assert!(registry.asked.is_empty());
    }

    #[test]
    fn long_images_are_cut_in_messages() {
        let quoted = quote(&"a".repeat(10_000));
        assert!(quoted.len() < 220 && quoted.ends_with('…'), "{quoted}");
    }
}
