//! The decision for one image: the table of DESIGN.md as one pure function over [`Registry`].
//!
//! `decide` routes the image and looks it up in the mirror; `verify_source` compares the
//! mirror's copy with the source when `verifySource` asks for it. `check` is the check role's
//! decision, which shares routing and lookups and nothing else.

pub mod check;
mod verify_source;
mod walk;

use crate::policy::{Policy, SwapPolicy};
use crate::reference::{Reference, parse_digest};
use crate::registry::{LookupError, Registry, registry_host};
use crate::rules::{Destination, Route};
use crate::text::quote;

/// Why an image was not swapped as asked, in a word: the audit annotations' reason codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// The mirror said it lacks the image.
    Absent,
    /// The mirror's copy differs from the source's content (`verifySource`).
    Stale,
    /// The registry could not be asked, or its answer could not be trusted.
    LookupError,
    /// Not looked up (or not compared): the lookup budget was spent.
    Budget,
    /// The mirror needs a pull secret the Pod lacks and cannot gain after creation.
    NoPullSecret,
    /// The image string is not a reference a runtime would pull.
    InvalidReference,
    /// A rule matched but names no valid mirror repository.
    Unroutable,
    /// Swapped without comparing with the source, which could not be asked (`verifySource`).
    SourceUnverified,
    /// Swapped to a later mirror of the list: an earlier one could not be asked.
    EarlierMirrorFailed,
}

impl Reason {
    pub fn code(self) -> &'static str {
        match self {
            Reason::Absent => "absent",
            Reason::Stale => "stale",
            Reason::LookupError => "lookup-error",
            Reason::Budget => "budget",
            Reason::NoPullSecret => "no-pull-secret",
            Reason::InvalidReference => "invalid-reference",
            Reason::Unroutable => "unroutable",
            Reason::SourceUnverified => "source-unverified",
            Reason::EarlierMirrorFailed => "earlier-mirror-failed",
        }
    }
}

/// A reason and the sentence that explains it to a person.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub reason: Reason,
    pub text: String,
    /// When a rule lists several mirrors and none served: each mirror tried, and why not.
    pub mirrors: Vec<(String, Reason)>,
    /// What a comparison the budget cut short had learned (`verifySource`: the two digests,
    /// which differ), for the one message that names the budget's images.
    pub learned: Option<String>,
    /// Why the budget did not start the lookup, for the same message.
    pub refusal: Option<crate::registry::Refusal>,
}

impl Note {
    fn new(reason: Reason, text: String) -> Note {
        Note {
            reason,
            text,
            mirrors: Vec::new(),
            learned: None,
            refusal: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Not the policy's business: no rule matches, or an `exclude` pattern does.
    Unchanged,
    /// Already under a mirror target: admitting a swapped Pod again changes nothing.
    AlreadySwapped,
    /// Write `image`; add `pull_secret` to the Pod when it has one; tell `note` if any.
    Swap {
        image: String,
        pull_secret: Option<String>,
        note: Option<Note>,
    },
    /// Keep the original image, and tell the user why.
    Keep(Note),
    /// Refuse the Pod, for this reason.
    Reject(Note),
}

/// An image parsed and routed: where its decision starts. Routing asks no registry, so an
/// admission can order its decisions by the registries they will ask before asking any.
pub enum Routed<'p> {
    /// Decided without a lookup: no rule, excluded, already swapped, or not routable.
    Settled(Decision),
    /// Bound for the mirror.
    Mirror {
        reference: Reference,
        destination: Destination<'p>,
    },
}

impl Routed<'_> {
    /// The registry hosts the decision asks first: the mirror's, and with `verifySource` and a
    /// tag, the source's. None when it looks nothing up.
    pub fn first_hosts(&self, policy: &Policy) -> Vec<&str> {
        let Routed::Mirror {
            reference,
            destination,
        } = self
        else {
            return Vec::new();
        };
        if policy.swap_policy == SwapPolicy::Always {
            return Vec::new();
        }
        let Some(first) = destination.targets.first() else {
            return Vec::new();
        };
        let mut hosts = vec![registry_host(&first.repository)];
        if policy.verify_source && reference.digest().is_none() {
            hosts.push(reference.domain());
        }
        hosts
    }
}

/// Parses and routes `image`.
pub fn route<'p>(image: &str, policy: &'p Policy) -> Routed<'p> {
    let reference = match Reference::parse(image) {
        Ok(reference) => reference,
        Err(error) => {
            return Routed::Settled(Decision::Keep(Note::new(
                Reason::InvalidReference,
                format!(
                    "image {}: not swapped, not a valid image reference: {error}",
                    quote(image)
                ),
            )));
        }
    };
    match policy.router.route(&reference) {
        Route::NotMatched | Route::Excluded(_) => Routed::Settled(Decision::Unchanged),
        Route::AlreadySwapped => Routed::Settled(Decision::AlreadySwapped),
        Route::Unroutable { rule, reason } => Routed::Settled(Decision::Keep(Note::new(
            Reason::Unroutable,
            format!("image {}: not swapped, {rule}: {reason}", quote(image)),
        ))),
        Route::Mirror(destination) => Routed::Mirror {
            reference,
            destination,
        },
    }
}

/// Which mirrors the Pod can pull from: on creation any, since a mirror's pull secret is added
/// then; afterwards only those whose secret the Pod has, since the API server refuses new
/// `imagePullSecrets` after creation and a swap would only end in ImagePullBackOff.
#[derive(Clone, Copy, Debug)]
pub struct PullSecrets<'a> {
    pub can_add: bool,
    pub existing: &'a [String],
}

impl PullSecrets<'_> {
    /// A Pod being created: any mirror will do.
    pub const ANY: PullSecrets<'static> = PullSecrets {
        can_add: true,
        existing: &[],
    };

    /// Whether the Pod can pull with `secret`: it has it, or it can still gain it.
    fn allow(&self, secret: &str) -> bool {
        self.can_add || self.existing.iter().any(|e| e == secret)
    }
}

/// The decision for `image`, once routed.
pub fn decide_routed(
    image: &str,
    routed: Routed<'_>,
    policy: &Policy,
    secrets: PullSecrets<'_>,
    registry: &mut impl Registry,
) -> Decision {
    match routed {
        Routed::Settled(decision) => decision,
        Routed::Mirror {
            reference,
            destination,
        } => walk::decide_mirror(image, &reference, &destination, policy, secrets, registry),
    }
}

/// The decision for `image` in a Pod being created: [`route`], then [`decide_routed`].
pub fn decide(image: &str, policy: &Policy, registry: &mut impl Registry) -> Decision {
    decide_routed(
        image,
        route(image, policy),
        policy,
        PullSecrets::ANY,
        registry,
    )
}

/// `left` `separator` `right`, without the formatting machinery: this runs for every image.
fn joined(left: &str, separator: char, right: &str) -> String {
    let mut text = String::with_capacity(left.len() + 1 + right.len());
    text.push_str(left);
    text.push(separator);
    text.push_str(right);
    text
}

/// A digest the host answered, checked to be a digest: a malformed answer verifies nothing.
fn verified_digest(registry: &mut impl Registry, image: &str) -> Result<String, LookupError> {
    let answer = registry.manifest_digest(image)?;
    match parse_digest(&answer) {
        Ok(_) => Ok(answer),
        Err(error) => Err(LookupError::Failed(format!(
            "the host answered {}: {error}",
            quote(&answer)
        ))),
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::policy::Policy;
    use crate::registry::Manifest;
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
        pub manifests: BTreeMap<String, Manifest>,
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

        /// Manifests are held by `name@digest`; a tag resolves through its digest's answer,
        /// as a registry resolves it, so a tag the registry refuses refuses its manifest too.
        fn manifest(&mut self, image: &str) -> Result<Manifest, LookupError> {
            self.asked.push(format!("manifest {image}"));
            let by_digest = match (image.rsplit_once(':'), self.answers.get(image)) {
                (Some((name, _)), Some(Ok(digest))) if !image.contains('@') => {
                    format!("{name}@{digest}")
                }
                (_, Some(Err(error))) => return Err(error.clone()),
                _ => image.to_string(),
            };
            self.manifests
                .get(&by_digest)
                .cloned()
                .ok_or_else(|| LookupError::Absent("manifest unknown".to_string()))
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
            note: None,
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
            Decision::Keep(note) | Decision::Reject(note) => note.text,
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
            matches!(&decision, Decision::Keep(note) if note.text.contains(DIGEST_B)),
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
            matches!(&decision, Decision::Keep(note) if note.text.contains("not a valid image reference") && note.reason == Reason::InvalidReference)
        );
        assert!(registry.asked.is_empty());
    }

    #[test]
    fn long_images_are_cut_in_messages() {
        let quoted = quote(&"a".repeat(10_000));
        assert!(quoted.len() < 220 && quoted.ends_with('…'), "{quoted}");
    }
}
