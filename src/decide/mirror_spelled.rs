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
        return judged(image, source, "", decision.unwrap_or(Decision::AlreadySwapped));
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
