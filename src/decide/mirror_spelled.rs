//! An image the Pod writes under a mirror's name, when `signatures` or `verifiers` is set. A
//! verifier keyed on sources does not match the mirror's name, so the image is judged as the
//! source spellings that route there (`crate::inverse`): when a rule covers any of them, it
//! is verified as that source would be on its way to this mirror, and one that does not
//! verify never runs under the mirror's name: it is refused, whatever `onUnverified` and
//! `onLookupError` say, since a verifier that ran before this policy judged only the mirror's
//! name. A source that verified but that no mirror serves is written back pinned at the digest
//! that verified. Without `signatures` and `verifiers` such an image is left alone, unlooked-up.

use crate::inverse::SourceSpelling;
use crate::policy::Policy;
use crate::reference::Reference;
use crate::registry::Registry;
use crate::rules::{Destination, MirrorRepository, Route, RuleName, resolved_name};
use crate::signatures::rules_covering;
use crate::text::quote;

use super::walk::{decide_verified, unreadable_verifiers};
use super::{Decision, Note, PullSecrets, Reason};

/// The decision for `image` (parsed as `reference`), which lies under a target.
pub(super) fn decide_mirror_spelled(
    image: &str,
    reference: &Reference,
    policy: &Policy,
    secrets: PullSecrets<'_>,
    registry: &mut impl Registry,
) -> Decision {
    let sources = policy.router.sources_of(reference);
    // A source that routes here is what the Pod means; without one, the plain inverse is what
    // a pull-through cache at this target serves.
    let Some(chosen) = sources
        .iter()
        .find(|source| source.forward)
        .or_else(|| sources.first())
    else {
        return Decision::AlreadySwapped;
    };
    let spellings: Vec<String> = sources.iter().flat_map(SourceSpelling::spellings).collect();
    let source = chosen.reference.as_str();
    let destination = written_target(reference, chosen, policy);
    if policy.verifiers_unreadable.is_some() {
        let decision = unreadable_verifiers(source, &chosen.reference, &destination, policy);
        return judged(
            image,
            &chosen.reference,
            "",
            decision.unwrap_or(Decision::AlreadySwapped),
        );
    }
    let (rules, verifications) = rules_covering(&policy.signatures, &spellings);
    if rules.is_empty() {
        return Decision::AlreadySwapped;
    }
    let mut origins: Vec<&str> = rules.iter().map(|rule| rule.origin.as_str()).collect();
    origins.dedup();
    let covered = format!(" (covered by {})", origins.join(", "));
    let decision = decide_verified(
        source,
        &chosen.reference,
        &destination,
        &verifications,
        policy,
        secrets,
        registry,
    );
    judged(image, &chosen.reference, &covered, decision)
}

/// The one mirror the Pod wrote, as the settings spell it and with its pull secret, so the
/// verification asks the copy the Pod names and no other.
fn written_target<'p>(
    reference: &Reference,
    chosen: &SourceSpelling,
    policy: &'p Policy,
) -> Destination<'p> {
    let written = resolved_name(reference.name());
    let routed = match policy.router.route(&chosen.reference) {
        Route::Mirror(destination) if chosen.forward => destination
            .targets
            .into_iter()
            .find(|target| resolved_name(&target.repository) == written)
            .map(|target| (target, destination.rule)),
        _ => None,
    };
    let (target, rule) = routed.unwrap_or_else(|| {
        let target = MirrorRepository {
            repository: reference.name().to_string(),
            pull_secret: None,
        };
        (target, RuleName::DefaultMirror)
    });
    Destination {
        targets: vec![target],
        rule,
    }
}

/// The walk's decision for the source, as it applies to the image written under the mirror's
/// name: a verified copy is written pinned; a source that verified but that no mirror serves is
/// written back at the digest that verified; anything else is refused, whatever `onUnverified`
/// and `onLookupError` say. A verifier that ran before this policy judged only the mirror's
/// name (its rules on the sources do not match it), so a source written back unverified, or at
/// a tag that can move, would run with no verifier having seen it.
fn judged(image: &str, source: &Reference, covered: &str, decision: Decision) -> Decision {
    match decision {
        Decision::Keep(note) => match &note.verified_digest {
            Some(digest) => {
                let written = match source.tag() {
                    Some(tag) => format!("{}:{tag}@{digest}", source.name()),
                    None => format!("{}@{digest}", source.name()),
                };
                let text = format!(
                    "image {}: written back to its source {}{covered}, at the digest that verified there, since no mirror serves that digest: {}",
                    quote(image),
                    quote(&written),
                    note.text
                );
                // A budget's note is told in the message that names the budget, which takes
                // only images kept: this one is written back, so it says it on its own.
                let reason = match note.reason {
                    Reason::Budget => Reason::LookupError,
                    reason => reason,
                };
                Decision::Swap {
                    image: written,
                    pull_secret: None,
                    note: Some(Note {
                        reason,
                        text,
                        ..note
                    }),
                }
            }
            None => Decision::Reject(Note {
                text: format!(
                    "image {} is the mirror copy of {}{covered} and did not verify, so it is refused whatever onUnverified and onLookupError say (a verifier that ran before this policy saw only the mirror's name): {}",
                    quote(image),
                    quote(source.as_str()),
                    note.text
                ),
                reason: match note.reason {
                    Reason::Budget => Reason::LookupError,
                    reason => reason,
                },
                ..note
            }),
        },
        Decision::Reject(note) => Decision::Reject(Note {
            text: format!(
                "image {} is the mirror copy of {}{covered}: {}",
                quote(image),
                quote(source.as_str()),
                note.text
            ),
            ..note
        }),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{DIGEST_A, DIGEST_B, FakeRegistry, policy_from};
    use super::super::{Decision, Reason, decide};
    use crate::registry::LookupError;
    use rstest::rstest;

    const KEY: &str = "-----BEGIN PUBLIC KEY-----\nKEY\n-----END PUBLIC KEY-----";
    const SOURCE: &str = "registry.example.com/org/app:pr-123";
    const MIRROR: &str = "mirror.example.com/cache/org/app:pr-123";

    /// The organisation's registry to its mirror; rules on the sources as a verifier writes
    /// them; `extra` adds settings.
    fn policy(extra: &str) -> crate::policy::Policy {
        policy_from(&format!(
            r#"{{"mirrors":[{{"source":"registry.example.com/org","target":"mirror.example.com/cache/org"}},
            {{"source":"docker.io","target":"m.io/hub"}}],
            "signatures":[{{"image":"registry.example.com/org/*","pubKeys":[{KEY:?}]}},{{"image":"nginx*","pubKeys":[{KEY:?}]}}]{extra}}}"#
        ))
    }

    fn unsigned() -> Result<String, LookupError> {
        Err(LookupError::Unverified(format!(
            "no signatures found for image: {SOURCE}"
        )))
    }

    fn note_of(decision: &Decision) -> &super::Note {
        match decision {
            Decision::Swap {
                note: Some(note), ..
            }
            | Decision::Keep(note)
            | Decision::Reject(note) => note,
            other => panic!("no note: {other:?}"),
        }
    }

    /// Refused, with the mirror copy's and the source's names; where the settings said `keep`,
    /// saying it is refused whatever they say.
    fn assert_refused(decision: &Decision, source: &str) {
        match decision {
            Decision::Reject(note) => assert!(
                note.text
                    .contains(&format!("is the mirror copy of \"{source}\""))
                    && (note
                        .text
                        .contains("refused whatever onUnverified and onLookupError say")
                        || note.text.ends_with(" is reject")),
                "{}",
                note.text
            ),
            other => panic!("not refused: {other:?}"),
        }
    }

    /// An unsigned source copied into the mirror and written under the mirror's name: never
    /// admitted there, and never written back to a source no verifier may see again (one
    /// placed before this policy saw only the mirror's name), whatever `onUnverified` says.
    #[rstest]
    #[case::keep("")]
    #[case::reject(r#","onUnverified":"reject""#)]
    #[case::keep_both(r#","onUnverified":"keep","onLookupError":"keep""#)]
    fn an_unsigned_source_written_under_the_mirrors_name_is_refused(#[case] extra: &str) {
        let mut registry = FakeRegistry::default().with(MIRROR, Ok(DIGEST_A));
        registry
            .verifications
            .insert(SOURCE.to_string(), unsigned());
        let decision = decide(MIRROR, &policy(extra), &mut registry);
        assert_eq!(note_of(&decision).reason, Reason::UnverifiedAtSource);
        assert_refused(&decision, SOURCE);
        assert!(
            note_of(&decision)
                .text
                .contains("(covered by signatures[0] (image \"registry.example.com/org/*\"))"),
            "{}",
            note_of(&decision).text
        );
        assert_eq!(registry.asked, [format!("verify {SOURCE}")]);
    }

    /// A source that verified at digest B, whose copy no mirror holds: written back at B, the
    /// digest that verified, never at the tag, which could name other content by the time the
    /// kubelet pulls.
    #[rstest]
    #[case::by_tag(MIRROR, format!("{SOURCE}@{DIGEST_B}"))]
    #[case::by_name_only(
        "mirror.example.com/cache/org/app",
        format!("registry.example.com/org/app:latest@{DIGEST_B}")
    )]
    fn a_verified_source_the_mirror_lacks_is_written_back_at_the_digest_that_verified(
        #[case] image: &str,
        #[case] written: String,
    ) {
        let mut registry = FakeRegistry::default().with(image, Ok(DIGEST_A));
        let source = written.split('@').next().unwrap_or_default().to_string();
        registry
            .verifications
            .insert(source, Ok(DIGEST_B.to_string()));
        let decision = decide(image, &policy(""), &mut registry);
        match &decision {
            Decision::Swap {
                image: swapped,
                note: Some(note),
                ..
            } => {
                assert_eq!(*swapped, written);
                assert_eq!(note.reason, Reason::Absent);
                assert!(
                    note.text.contains("at the digest that verified there"),
                    "{}",
                    note.text
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_signed_source_written_under_the_mirrors_name_is_pinned_to_the_digest_that_verified() {
        let pinned = format!("mirror.example.com/cache/org/app@{DIGEST_B}");
        let mut registry = FakeRegistry::default()
            .with(MIRROR, Ok(DIGEST_A))
            .with(&pinned, Ok(DIGEST_B));
        registry
            .verifications
            .insert(SOURCE.to_string(), Ok(DIGEST_B.to_string()));
        let decision = decide(MIRROR, &policy(""), &mut registry);
        assert_eq!(
            decision,
            Decision::Swap {
                image: format!("{MIRROR}@{DIGEST_B}"),
                pull_secret: None,
                note: None
            }
        );
        assert_eq!(registry.asked, [format!("verify {SOURCE}"), pinned]);
    }

    /// A Pod that pinned a digest is verified at that digest, and refused when it does not
    /// verify there.
    #[test]
    fn a_pinned_mirror_image_that_does_not_verify_at_its_digest_is_refused() {
        let image = format!("mirror.example.com/cache/org/app@{DIGEST_A}");
        let source = format!("registry.example.com/org/app@{DIGEST_A}");
        let mut registry = FakeRegistry::default().with(&image, Ok(DIGEST_A));
        registry.verifications.insert(source.clone(), unsigned());
        let decision = decide(&image, &policy(""), &mut registry);
        assert_refused(&decision, &source);
        assert_eq!(registry.asked, [format!("verify {source}")]);
    }

    /// A verification that cannot be made never leaves the image under the mirror's name, nor
    /// writes back a source nobody verified: refused under either `onLookupError`.
    #[rstest]
    #[case::keep("")]
    #[case::reject(r#","onLookupError":"reject""#)]
    fn a_verification_that_cannot_be_made_is_refused(#[case] extra: &str) {
        let mut registry = FakeRegistry::default();
        registry.verifications.insert(
            SOURCE.to_string(),
            Err(LookupError::Failed("connection refused".to_string())),
        );
        let decision = decide(MIRROR, &policy(extra), &mut registry);
        assert_eq!(note_of(&decision).reason, Reason::LookupError);
        assert_refused(&decision, SOURCE);
    }

    /// `verifySource: false`: the copy the Pod names verifies at the mirror, as a source's copy;
    /// one that does not is refused.
    #[test]
    fn with_the_mirrors_tags_trusted_the_copy_itself_must_verify() {
        let mut registry = FakeRegistry::default();
        registry
            .verifications
            .insert(MIRROR.to_string(), Ok(DIGEST_A.to_string()));
        let decision = decide(MIRROR, &policy(r#","verifySource":false"#), &mut registry);
        assert!(
            matches!(&decision, Decision::Swap { image, .. } if *image == format!("{MIRROR}@{DIGEST_A}")),
            "{decision:?}"
        );
        registry
            .verifications
            .insert(MIRROR.to_string(), unsigned());
        let decision = decide(MIRROR, &policy(r#","verifySource":false"#), &mut registry);
        assert_refused(&decision, SOURCE);
    }

    /// Docker Hub's short spellings count: `nginx*` covers `m.io/hub/library/nginx`.
    #[test]
    fn a_rule_on_a_short_spelling_covers_the_mirror_image() {
        let image = "m.io/hub/library/nginx:1.27";
        let mut registry = FakeRegistry::default();
        registry.verifications.insert(
            "docker.io/library/nginx:1.27".to_string(),
            Err(LookupError::Unverified("no signatures".to_string())),
        );
        let decision = decide(image, &policy(""), &mut registry);
        assert_refused(&decision, "docker.io/library/nginx:1.27");
    }

    /// Nothing to verify: no rule covers its sources, or no rule at all. No lookup.
    #[rstest]
    #[case::uncovered_source(&policy(""), "m.io/hub/org/tool:1")]
    #[case::without_signatures(
        &policy_from(r#"{"mirrors":[{"source":"registry.example.com/org","target":"mirror.example.com/cache/org"}]}"#),
        MIRROR
    )]
    fn an_image_no_rule_covers_is_left_alone(
        #[case] policy: &crate::policy::Policy,
        #[case] image: &str,
    ) {
        let mut registry = FakeRegistry::default();
        assert_eq!(
            decide(image, policy, &mut registry),
            Decision::AlreadySwapped
        );
        assert!(registry.asked.is_empty());
    }

    /// Verifier rules that could not be read may cover it: refused, never left unverified.
    #[test]
    fn unreadable_verifiers_refuse_it() {
        let mut policy = policy("");
        policy.verifiers_unreadable = Some("could not list AdmissionPolicy objects".to_string());
        let mut registry = FakeRegistry::default();
        let decision = decide(MIRROR, &policy, &mut registry);
        assert_refused(&decision, SOURCE);
        assert!(registry.asked.is_empty());
    }
}
