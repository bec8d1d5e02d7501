//! An image the Pod writes under a mirror's name, when `signatures` or `verifiers` is set. A
//! verifier keyed on sources does not match the mirror's name, so the image is judged as the
//! source spellings that route there (`crate::inverse`): when a rule covers any of them, it
//! is verified as that source would be on its way to this mirror, and one that does not
//! verify never runs under the mirror's name. `onUnverified: reject` refuses it; otherwise it
//! is written back to its source spelling, which a verifier on sources then judges as without
//! this policy. Without `signatures` and `verifiers` such an image is left alone, unlooked-up.

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
            source,
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
    judged(image, source, &covered, decision)
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
/// name: a verified copy is written pinned; a kept source is written back in place of the
/// mirror's name, with the reason; a refusal names both spellings.
fn judged(image: &str, source: &str, covered: &str, decision: Decision) -> Decision {
    match decision {
        Decision::Keep(note) => {
            let text = format!(
                "image {}: written back to its source {}{covered}, since it cannot run under the mirror's name unverified: {}",
                quote(image),
                quote(source),
                note.text
            );
            // A budget's note is told in the message that names the budget, which takes only
            // images kept: this one is written back, so it says it on its own.
            let reason = match note.reason {
                Reason::Budget => Reason::LookupError,
                reason => reason,
            };
            Decision::Swap {
                image: source.to_string(),
                pull_secret: None,
                note: Some(Note {
                    reason,
                    text,
                    ..note
                }),
            }
        }
        Decision::Reject(note) => Decision::Reject(Note {
            text: format!(
                "image {} is the mirror copy of {}{covered}: {}",
                quote(image),
                quote(source),
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

    /// An unsigned source copied into the mirror and written under the mirror's name: never
    /// admitted there. `keep` writes the source back, which a verifier on sources refuses.
    #[rstest]
    #[case::keep_writes_the_source_back("", false)]
    #[case::reject_refuses(r#","onUnverified":"reject""#, true)]
    fn an_unsigned_source_written_under_the_mirrors_name_never_runs_there(
        #[case] extra: &str,
        #[case] refused: bool,
    ) {
        let mut registry = FakeRegistry::default().with(MIRROR, Ok(DIGEST_A));
        registry
            .verifications
            .insert(SOURCE.to_string(), unsigned());
        let decision = decide(MIRROR, &policy(extra), &mut registry);
        let note = note_of(&decision);
        assert_eq!(note.reason, Reason::UnverifiedAtSource);
        match &decision {
            Decision::Swap { image, .. } if !refused => {
                assert_eq!(image, SOURCE);
                assert!(
                    note.text.starts_with(&format!("image \"{MIRROR}\": written back to its source \"{SOURCE}\" (covered by signatures[0] (image \"registry.example.com/org/*\"))")),
                    "{}",
                    note.text
                );
            }
            Decision::Reject(_) if refused => assert!(
                note.text
                    .contains(&format!("is the mirror copy of \"{SOURCE}\"")),
                "{}",
                note.text
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(registry.asked, [format!("verify {SOURCE}")]);
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

    /// A Pod that pinned a digest is verified at that digest and written back pinned.
    #[test]
    fn a_pinned_mirror_image_is_verified_at_its_digest_and_written_back_pinned() {
        let image = format!("mirror.example.com/cache/org/app@{DIGEST_A}");
        let source = format!("registry.example.com/org/app@{DIGEST_A}");
        let mut registry = FakeRegistry::default().with(&image, Ok(DIGEST_A));
        registry.verifications.insert(source.clone(), unsigned());
        let decision = decide(&image, &policy(""), &mut registry);
        assert!(
            matches!(&decision, Decision::Swap { image, .. } if *image == source),
            "{decision:?}"
        );
        assert_eq!(registry.asked, [format!("verify {source}")]);
    }

    /// A verification that cannot be made never leaves the image under the mirror's name.
    #[rstest]
    #[case::keep("", false)]
    #[case::reject(r#","onLookupError":"reject""#, true)]
    fn a_verification_that_cannot_be_made_writes_the_source_back(
        #[case] extra: &str,
        #[case] refused: bool,
    ) {
        let mut registry = FakeRegistry::default();
        registry.verifications.insert(
            SOURCE.to_string(),
            Err(LookupError::Failed("connection refused".to_string())),
        );
        let decision = decide(MIRROR, &policy(extra), &mut registry);
        match decision {
            Decision::Swap { image, note, .. } if !refused => {
                assert_eq!(image, SOURCE);
                assert_eq!(note.map(|n| n.reason), Some(Reason::LookupError));
            }
            Decision::Reject(note) if refused => assert_eq!(note.reason, Reason::LookupError),
            other => panic!("{other:?}"),
        }
    }

    /// `verifySource: false`: the copy the Pod names verifies at the mirror, as a source's copy.
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
        assert!(
            matches!(&decision, Decision::Swap { image, .. } if image == SOURCE),
            "{decision:?}"
        );
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
        assert!(
            matches!(&decision, Decision::Swap { image, .. } if image == "docker.io/library/nginx:1.27"),
            "{decision:?}"
        );
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

    /// Verifier rules that could not be read may cover it: written back, never left unverified.
    #[test]
    fn unreadable_verifiers_write_the_source_back() {
        let mut policy = policy("");
        policy.verifiers_unreadable = Some("could not list AdmissionPolicy objects".to_string());
        let mut registry = FakeRegistry::default();
        let decision = decide(MIRROR, &policy, &mut registry);
        assert!(
            matches!(&decision, Decision::Swap { image, .. } if image == SOURCE),
            "{decision:?}"
        );
        assert!(registry.asked.is_empty());
    }
}
