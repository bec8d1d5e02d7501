//! The decision for one image: the table of DESIGN.md as one pure function over [`Registry`].
//!
//! `decide` routes the image and looks it up in the mirror; `verify_source` compares the
//! mirror's copy with the source when `verifySource` asks for it. `check` is the check role's
//! decision, which shares routing and lookups and nothing else (`images`: what it asks about,
//! which the plan of copies names too; `presence`: what the mirror said).

pub mod check;
mod check_signed;
mod failure;
pub mod images;
mod mirror_signature;
mod mirror_spelled;
pub mod presence;
mod verify_source;
mod walk;

use crate::policy::{Policy, SwapPolicy};
use crate::reference::{Reference, parse_digest};
use crate::registry::{LookupError, Registry, registry_host};
use crate::rules::{Destination, Route};
use crate::signatures::{Verification, covers};
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
    /// The mirror's copy does not verify under `signatures` (unsigned, or its signature not
    /// copied to the mirror).
    Unverified,
    /// The source itself does not verify under `signatures` (`verifySource`): no mirror copy
    /// was asked, and the record does not name it, since no copy would verify.
    UnverifiedAtSource,
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
            Reason::Unverified => "unverified",
            Reason::UnverifiedAtSource => "unverified-at-source",
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
    /// When the mirror's copy did not verify: the digest it serves, when known, which names
    /// the signature tag the fill job copies.
    pub unverified_digest: Option<String>,
    /// When the image verified at its source and no mirror served it: the digest that
    /// verified, the only one an image written under a mirror's name may be written back at.
    pub verified_digest: Option<String>,
}

impl Note {
    fn new(reason: Reason, text: String) -> Note {
        Note {
            reason,
            text,
            mirrors: Vec::new(),
            learned: None,
            refusal: None,
            unverified_digest: None,
            verified_digest: None,
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
    /// Written under a target while `signatures` or `verifiers` is set: judged as the sources
    /// that route there (`mirror_spelled`).
    MirrorSpelled { reference: Reference },
}

impl Routed<'_> {
    /// The registry hosts the decision asks first: the mirror's, and with `verifySource` and a
    /// tag, the source's. None when it looks nothing up.
    pub fn first_hosts(&self, image: &str, policy: &Policy) -> Vec<&str> {
        let (reference, destination) = match self {
            Routed::Mirror {
                reference,
                destination,
            } => (reference, destination),
            Routed::MirrorSpelled { reference } => return vec![registry_host(reference.name())],
            Routed::Settled(_) => return Vec::new(),
        };
        if policy.swap_policy == SwapPolicy::Always {
            return Vec::new();
        }
        let Some(first) = destination.targets.first() else {
            return Vec::new();
        };
        // A covered image is verified at its source before any mirror is asked.
        if policy.verify_covered_at_source && covers(&policy.signatures, image) {
            return vec![reference.domain(), registry_host(&first.repository)];
        }
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
        Route::AlreadySwapped if policy.verifies() => Routed::MirrorSpelled { reference },
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
        Routed::MirrorSpelled { reference } => {
            mirror_spelled::decide_mirror_spelled(image, &reference, policy, secrets, registry)
        }
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

/// The digest the mirror serves for `lookup`: an existence lookup, or, when `verifications` is
/// not empty (`signatures` has rules for the image), each verification of `lookup` in turn,
/// which all must hold and name one digest. A verification names the digest it verified, so it
/// stands in for the existence lookup: the copy is there, at that digest, and it verifies.
fn mirror_digest(
    registry: &mut impl Registry,
    lookup: &str,
    verifications: &[Verification<'_>],
) -> Result<String, LookupError> {
    let mut verified: Option<String> = None;
    for verification in verifications {
        // A rule that could not be read asks nothing: the image cannot be verified under it.
        if let Verification::Unreadable { why } = verification {
            return Err(LookupError::Failed((*why).to_string()));
        }
        let answer = match registry.verify(lookup, verification) {
            Ok(answer) => answer,
            Err(LookupError::Unverified(why)) => {
                return Err(LookupError::Unverified(format!(
                    "not {}: {why}",
                    verification.describe()
                )));
            }
            Err(error) => return Err(error),
        };
        if let Err(error) = parse_digest(&answer) {
            return Err(LookupError::Failed(format!(
                "the host's verification answered digest {}: {error}",
                quote(&answer)
            )));
        }
        match &verified {
            Some(first) if *first != answer => {
                return Err(LookupError::Failed(format!(
                    "its verifications answered two digests, {first} and {answer}"
                )));
            }
            Some(_) => {}
            None => verified = Some(answer),
        }
    }
    match verified {
        Some(digest) => Ok(digest),
        None => verified_digest(registry, lookup),
    }
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
        /// Verification answers by image; an image without one verifies as its digest
        /// lookup answers when that is a digest, else as that lookup's error.
        pub verifications: BTreeMap<String, Result<String, LookupError>>,
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
        fn verify(
            &mut self,
            image: &str,
            _verification: &Verification<'_>,
        ) -> Result<String, LookupError> {
            self.asked.push(format!("verify {image}"));
            match self.verifications.get(image) {
                Some(answer) => answer.clone(),
                None => self
                    .answers
                    .get(image)
                    .cloned()
                    .unwrap_or_else(|| Err(LookupError::Absent("manifest unknown".to_string()))),
            }
        }

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

    /// Docker Hub to one mirror, then another; `signatures` over the Hub's library images
    /// as the Pod writes them.
    const SIGNED: &str = r#""mirrors":[{"source":"docker.io","targets":[{"target":"eu.m.io/hub"},{"target":"us.m.io/hub"}]}],
        "signatures":[{"image":"nginx*","pubKeys":["-----BEGIN PUBLIC KEY-----\nKEY\n-----END PUBLIC KEY-----"]}]"#;
    const EU: &str = "eu.m.io/hub/library/nginx:1.27";
    const US: &str = "us.m.io/hub/library/nginx:1.27";

    fn unverified() -> LookupError {
        LookupError::Unverified(format!("no signatures found for image: {EU}"))
    }

    /// `verifySource: false`: covered images verified at the mirror, its tags trusted.
    const MIRROR_MODE: &str = r#","verifySource":false"#;

    fn signed(extra: &str) -> Policy {
        policy_from(&format!("{{{SIGNED}{extra}}}"))
    }

    #[test]
    fn a_copy_that_verifies_is_swapped_at_the_digest_that_verified_without_another_lookup() {
        let mut registry = FakeRegistry::default();
        registry
            .verifications
            .insert(EU.to_string(), Ok(DIGEST_B.to_string()));
        let decision = decide("nginx:1.27", &signed(MIRROR_MODE), &mut registry);
        assert_eq!(
            decision,
            Decision::Swap {
                image: format!("{EU}@{DIGEST_B}"),
                pull_secret: None,
                note: None
            }
        );
        assert_eq!(registry.asked, vec![format!("verify {EU}")]);
    }

    #[rstest]
    #[case::keep("", "kept, not swapped to")]
    #[case::reject(r#","onUnverified":"reject""#, "cannot be swapped to")]
    fn a_copy_that_does_not_verify_is_never_swapped_to(#[case] extra: &str, #[case] said: &str) {
        let mut registry = FakeRegistry::default()
            .with(EU, Ok(DIGEST_A))
            .with(US, Err(LookupError::Absent("manifest unknown".to_string())));
        registry
            .verifications
            .insert(EU.to_string(), Err(unverified()));
        let decision = decide(
            "nginx:1.27",
            &signed(&format!("{MIRROR_MODE}{extra}")),
            &mut registry,
        );
        let (Decision::Keep(note) | Decision::Reject(note)) = &decision else {
            panic!("swapped to a copy that did not verify: {decision:?}");
        };
        assert_eq!(note.reason, Reason::Unverified);
        assert!(note.text.contains(said), "{}", note.text);
        assert!(
            note.text.contains("does not verify (not signed with its public key: no signatures found for image: eu.m.io/hub/library/nginx:1.27)"),
            "{}",
            note.text
        );
        // The digest the mirror serves names the signature tag a copy must bring.
        assert_eq!(note.unverified_digest.as_deref(), Some(DIGEST_A));
        assert_eq!(
            matches!(decision, Decision::Reject(_)),
            extra.contains("reject")
        );
    }

    #[test]
    fn a_later_mirror_whose_copy_verifies_is_swapped_to() {
        let mut registry = FakeRegistry::default().with(EU, Ok(DIGEST_A));
        registry
            .verifications
            .insert(EU.to_string(), Err(unverified()));
        registry
            .verifications
            .insert(US.to_string(), Ok(DIGEST_A.to_string()));
        let decision = decide("nginx:1.27", &signed(MIRROR_MODE), &mut registry);
        assert!(
            matches!(&decision, Decision::Swap { image, .. } if *image == format!("{US}@{DIGEST_A}")),
            "{decision:?}"
        );
        // The first copy's digest is not asked for: that would only delay the failover.
        assert_eq!(
            registry.asked,
            vec![format!("verify {EU}"), format!("verify {US}")]
        );
    }

    #[test]
    fn a_pinned_image_verifies_its_digest_and_nothing_else() {
        let pinned = format!("eu.m.io/hub/library/nginx@{DIGEST_A}");
        let mut registry = FakeRegistry::default();
        registry
            .verifications
            .insert(pinned.clone(), Ok(DIGEST_A.to_string()));
        let image = format!("nginx:1.27@{DIGEST_A}");
        let decision = decide(&image, &signed(MIRROR_MODE), &mut registry);
        assert!(
            matches!(&decision, Decision::Swap { image, .. } if *image == format!("{EU}@{DIGEST_A}")),
            "{decision:?}"
        );
        // A verification that names another digest is never swapped to.
        registry
            .verifications
            .insert(pinned, Ok(DIGEST_B.to_string()));
        registry.verifications.insert(
            US.replace(":1.27", &format!("@{DIGEST_A}")),
            Ok(DIGEST_B.to_string()),
        );
        let decision = decide(&image, &signed(MIRROR_MODE), &mut registry);
        assert!(matches!(decision, Decision::Keep(_)), "{decision:?}");
    }

    #[rstest]
    #[case::absent_is_onmissing(LookupError::Absent("manifest unknown".to_string()), Reason::Absent)]
    #[case::failed_is_onlookuperror(LookupError::Failed("connection refused".to_string()), Reason::LookupError)]
    fn a_verification_that_could_not_be_made_is_not_a_refusal(
        #[case] error: LookupError,
        #[case] reason: Reason,
    ) {
        let mut registry = FakeRegistry::default();
        registry
            .verifications
            .insert(EU.to_string(), Err(error.clone()));
        registry.verifications.insert(US.to_string(), Err(error));
        let decision = decide("nginx:1.27", &signed(MIRROR_MODE), &mut registry);
        assert!(
            matches!(&decision, Decision::Keep(note) if note.reason == reason),
            "{decision:?}"
        );
    }

    const SOURCE: &str = "docker.io/library/nginx:1.27";

    /// verifySource with `signatures`: the source verifies at D, and the first mirror holding
    /// exactly D is swapped to, whatever its tag names and whatever signature it holds.
    #[test]
    fn with_verify_source_a_covered_image_is_verified_at_its_source_and_swapped_to_that_digest() {
        let mut registry = FakeRegistry::default()
            .with(
                &format!("eu.m.io/hub/library/nginx@{DIGEST_B}"),
                Err(absent()),
            )
            .with(EU, Ok(DIGEST_A))
            .with(
                &format!("us.m.io/hub/library/nginx@{DIGEST_B}"),
                Ok(DIGEST_B),
            );
        registry
            .verifications
            .insert(SOURCE.to_string(), Ok(DIGEST_B.to_string()));
        // The mirrors' own signatures are never asked: a stale one there must not count.
        registry
            .verifications
            .insert(EU.to_string(), Ok(DIGEST_A.to_string()));
        let decision = decide(
            "nginx:1.27",
            &signed(r#","verifySource":true"#),
            &mut registry,
        );
        assert_eq!(
            decision,
            Decision::Swap {
                image: format!("{US}@{DIGEST_B}"),
                pull_secret: None,
                note: None
            }
        );
        assert_eq!(
            registry.asked,
            vec![
                format!("verify {SOURCE}"),
                format!("eu.m.io/hub/library/nginx@{DIGEST_B}"),
                // A pull-through cache fills on its tag: asked, and it names another digest.
                EU.to_string(),
                format!("us.m.io/hub/library/nginx@{DIGEST_B}"),
            ]
        );
    }

    /// A signature removed at the source: the mirror's copy and its old signature are never
    /// asked, and the image is not recorded for a copy that could not help.
    #[rstest]
    #[case::keep("", false)]
    #[case::reject(r#","onUnverified":"reject""#, true)]
    fn with_verify_source_a_source_that_no_longer_verifies_is_never_swapped(
        #[case] extra: &str,
        #[case] rejected: bool,
    ) {
        let mut registry = FakeRegistry::default().with(EU, Ok(DIGEST_A));
        registry.verifications.insert(
            SOURCE.to_string(),
            Err(LookupError::Unverified(format!(
                "no signatures found for image: {SOURCE}"
            ))),
        );
        registry
            .verifications
            .insert(EU.to_string(), Ok(DIGEST_A.to_string()));
        let policy = signed(&format!(r#","verifySource":true{extra}"#));
        let decision = decide("nginx:1.27", &policy, &mut registry);
        let (Decision::Keep(note) | Decision::Reject(note)) = &decision else {
            panic!("swapped though the source does not verify: {decision:?}");
        };
        assert_eq!(matches!(decision, Decision::Reject(_)), rejected);
        assert_eq!(note.reason, Reason::UnverifiedAtSource);
        assert!(
            note.text.contains("it does not verify at its source (not signed with its public key: no signatures found for image: docker.io/library/nginx:1.27)"),
            "{}",
            note.text
        );
        assert_eq!(note.unverified_digest, None);
        assert_eq!(registry.asked, vec![format!("verify {SOURCE}")]);
    }

    #[rstest]
    #[case::source_down(
        Err(failed()),
        Reason::LookupError,
        "could not verify it at its source (connection refused)"
    )]
    #[case::source_lacks_it(
        Err(absent()),
        Reason::LookupError,
        "could not verify it at its source (manifest unknown)"
    )]
    #[case::mirror_lacks_the_digest(Ok(DIGEST_B), Reason::Absent, "the mirror does not have it")]
    fn with_verify_source_a_covered_image_is_kept_when_the_verified_digest_is_not_in_a_mirror(
        #[case] at_source: Result<&str, LookupError>,
        #[case] reason: Reason,
        #[case] said: &str,
    ) {
        // Both mirrors hold an older build under the tag, with its signature.
        let mut registry = FakeRegistry::default()
            .with(EU, Ok(DIGEST_A))
            .with(US, Ok(DIGEST_A));
        registry
            .verifications
            .insert(SOURCE.to_string(), at_source.map(str::to_string));
        registry
            .verifications
            .insert(EU.to_string(), Ok(DIGEST_A.to_string()));
        registry
            .verifications
            .insert(US.to_string(), Ok(DIGEST_A.to_string()));
        let decision = decide(
            "nginx:1.27",
            &signed(r#","verifySource":true"#),
            &mut registry,
        );
        let Decision::Keep(note) = &decision else {
            panic!("swapped to a copy the source does not vouch for: {decision:?}");
        };
        assert_eq!(note.reason, reason);
        assert!(note.text.contains(said), "{}", note.text);
    }

    #[test]
    fn with_verify_source_a_pinned_image_must_verify_at_its_own_digest() {
        let image = format!("nginx:1.27@{DIGEST_A}");
        let source = format!("docker.io/library/nginx:1.27@{DIGEST_A}");
        let mut registry = FakeRegistry::default().with(
            &format!("eu.m.io/hub/library/nginx@{DIGEST_A}"),
            Ok(DIGEST_A),
        );
        registry
            .verifications
            .insert(source.clone(), Ok(DIGEST_B.to_string()));
        let policy = signed(r#","verifySource":true"#);
        let decision = decide(&image, &policy, &mut registry);
        assert!(
            matches!(&decision, Decision::Keep(note) if note.reason == Reason::LookupError),
            "{decision:?}"
        );
        registry
            .verifications
            .insert(source, Ok(DIGEST_A.to_string()));
        let decision = decide(&image, &policy, &mut registry);
        assert!(
            matches!(&decision, Decision::Swap { image, .. } if *image == format!("{EU}@{DIGEST_A}")),
            "{decision:?}"
        );
    }

    #[test]
    fn images_no_rule_of_signatures_matches_are_looked_up_as_before() {
        let mut registry =
            FakeRegistry::default().with("eu.m.io/hub/library/busybox:1", Ok(DIGEST_A));
        let decision = decide("busybox:1", &signed(""), &mut registry);
        assert!(matches!(decision, Decision::Swap { .. }), "{decision:?}");
        assert_eq!(registry.asked, vec!["eu.m.io/hub/library/busybox:1"]);
    }

    /// Each rule's verification of one mirror image names the digest it verified: all must
    /// name one, or the host's answers cannot be trusted and nothing is swapped to either.
    #[rstest]
    #[case::one_digest(&[DIGEST_A, DIGEST_A], Ok(DIGEST_A.to_string()))]
    #[case::two_digests(&[DIGEST_A, DIGEST_B], Err(LookupError::Failed(format!(
        "its verifications answered two digests, {DIGEST_A} and {DIGEST_B}"))))]
    fn the_verifications_of_one_image_must_name_one_digest(
        #[case] answers: &[&'static str],
        #[case] expected: Result<String, LookupError>,
    ) {
        struct InTurn(Vec<&'static str>);
        impl Registry for InTurn {
            fn verify(&mut self, _: &str, _: &Verification<'_>) -> Result<String, LookupError> {
                Ok(self.0.remove(0).to_string())
            }
            fn manifest_digest(&mut self, _: &str) -> Result<String, LookupError> {
                Err(LookupError::Failed("not asked".to_string()))
            }
            fn manifest(&mut self, _: &str) -> Result<Manifest, LookupError> {
                Err(LookupError::Failed("not asked".to_string()))
            }
        }
        let keys = [String::from("key")];
        let verifications = [
            Verification::PubKeys {
                keys: &keys,
                annotations: None,
            },
            Verification::PubKeys {
                keys: &keys,
                annotations: None,
            },
        ];
        let mut registry = InTurn(answers.to_vec());
        assert_eq!(
            mirror_digest(&mut registry, "m.io/hub/library/nginx:1.27", &verifications),
            expected
        );
    }

    /// The registries a decision asks first: the mirror's, and the source's only for a tag
    /// under `verifySource` (a digest is compared at the mirror alone).
    #[rstest]
    #[case::tag(false, "nginx:1.27", &["m.io"])]
    #[case::digest(false, &format!("nginx@{DIGEST_A}"), &["m.io"])]
    #[case::tag_verified_at_the_source(true, "nginx:1.27", &["m.io", "docker.io"])]
    #[case::digest_verified_at_the_source(true, &format!("nginx@{DIGEST_A}"), &["m.io"])]
    fn the_first_hosts_are_the_mirrors_and_a_tags_source_under_verify_source(
        #[case] verify_source: bool,
        #[case] image: &str,
        #[case] expected: &[&str],
    ) {
        let policy = policy_from(&format!(
            r#"{{"verifySource":{verify_source},"mirrors":[{{"source":"docker.io","target":"m.io/hub"}}]}}"#
        ));
        assert_eq!(route(image, &policy).first_hosts(image, &policy), expected);
    }
}
