//! Why one mirror of a rule cannot be used, and what to say when none serves: the note that
//! names each mirror's outcome, and the setting that decides (`onLookupError` when any could
//! not be asked, then `onUnverified`, then `onMissing`). The walk (`walk`) gathers the
//! failures; this file words them.

use crate::policy::{Fallback, Policy};
use crate::registry::{LookupError, Refusal};
use crate::text::quote;

use super::{Decision, Note, Reason};

/// Why one mirror cannot be used, and so which setting decides.
pub(super) enum Failure {
    /// `onMissing`: the mirror lacks the image.
    Missing(String),
    /// `onMissing`: the mirror holds a stale copy.
    Stale(String),
    /// `onUnverified`: the mirror's copy does not verify under `signatures`; the digest it
    /// serves, when known.
    Unverified(String, Option<String>),
    /// Kept whatever `onUnverified` says: the copy does not verify under a rule that matches
    /// only its mirror name, while no rule covers the source as the Pod writes it, which a
    /// verifier with that rule admits unverified; the digest swapped to, when known.
    UnverifiedAtMirrorName(String, Option<String>),
    /// `onUnverified`: the source itself does not verify under `signatures` (`verifySource`),
    /// so no mirror copy is asked; copying it would not help.
    UnverifiedAtSource(String),
    /// `onLookupError`: the answer could not be had or could not be trusted.
    LookupError(String),
    /// `onLookupError`: the lookup (or comparison) was not made within the budget: what was
    /// not done, for a comparison cut short the digests that were learned to differ, and the
    /// budget's reason (the registry, what it would need, what was left).
    Budget {
        not_done: &'static str,
        digests: Option<String>,
        refusal: Refusal,
    },
    /// Kept whatever the settings say: the Pod cannot gain the secret this mirror needs.
    NoPullSecret(String),
}

impl From<LookupError> for Failure {
    fn from(error: LookupError) -> Self {
        match error {
            LookupError::Absent(why) => {
                Failure::Missing(format!("the mirror does not have it ({why})"))
            }
            LookupError::Failed(why) => {
                Failure::LookupError(format!("could not look it up ({why})"))
            }
            LookupError::Unverified(why) => Failure::unverified(why, None),
            LookupError::OverBudget(refusal) => Failure::not_looked_up(refusal),
        }
    }
}

impl Failure {
    pub(super) fn unverified(why: String, digest: Option<String>) -> Failure {
        Failure::Unverified(format!("its copy there does not verify ({why})"), digest)
    }

    pub(super) fn not_looked_up(refusal: Refusal) -> Failure {
        Failure::Budget {
            not_done: "not looked up",
            digests: None,
            refusal,
        }
    }

    fn reason(&self) -> Reason {
        match self {
            Failure::Missing(_) => Reason::Absent,
            Failure::Stale(_) => Reason::Stale,
            Failure::Unverified(..) | Failure::UnverifiedAtMirrorName(..) => Reason::Unverified,
            Failure::UnverifiedAtSource(_) => Reason::UnverifiedAtSource,
            Failure::LookupError(_) => Reason::LookupError,
            Failure::Budget { .. } => Reason::Budget,
            Failure::NoPullSecret(_) => Reason::NoPullSecret,
        }
    }

    fn text(&self, policy: &Policy) -> String {
        match self {
            Failure::Missing(text)
            | Failure::Stale(text)
            | Failure::Unverified(text, _)
            | Failure::UnverifiedAtMirrorName(text, _)
            | Failure::LookupError(text)
            | Failure::NoPullSecret(text) => text.clone(),
            Failure::UnverifiedAtSource(why) => {
                format!("it does not verify at its source ({why})")
            }
            Failure::Budget {
                not_done,
                digests,
                refusal,
            } => {
                let learned = digests
                    .as_deref()
                    .map(differing_digests)
                    .unwrap_or_default();
                format!(
                    "{not_done}{learned} within the lookup budget of {} ms: {}",
                    policy.lookup_budget_ms,
                    refusal.describe()
                )
            }
        }
    }
}

/// What a comparison cut short by the budget had learned, as a clause.
fn differing_digests(digests: &str) -> String {
    format!(
        ", whose digest differs from the mirror's ({digests}), so their content must be compared"
    )
}

/// A swap to a later mirror after an earlier one could not be asked: worth a warning, since
/// that mirror may be down. An earlier mirror that lacks the image is the walk working as meant.
pub(super) fn earlier_failures(
    image: &str,
    swapped: &str,
    failures: &[(String, Failure)],
    policy: &Policy,
) -> Option<Note> {
    let failed: Vec<String> = failures
        .iter()
        .filter(|(_, failure)| matches!(failure, Failure::LookupError(_)))
        .map(|(lookup, failure)| format!("{}: {}", quote(lookup), failure.text(policy)))
        .collect();
    (!failed.is_empty()).then(|| {
        Note::new(
            Reason::EarlierMirrorFailed,
            format!(
                "image {}: swapped to {}, a later mirror of its list: {}",
                quote(image),
                quote(swapped),
                failed.join("; ")
            ),
        )
    })
}

/// No mirror serves the image: one note that names each mirror's outcome. Any lookup error
/// makes it `onLookupError`'s case (a mirror that could not be asked may hold the image);
/// otherwise `onMissing`'s; a mirror the Pod cannot pull from keeps the image whatever they say.
pub(super) fn fallback(policy: &Policy, image: &str, failures: Vec<(String, Failure)>) -> Decision {
    let worst = failures
        .iter()
        .map(|(_, failure)| failure.reason())
        .max_by_key(|reason| match reason {
            Reason::Budget | Reason::LookupError => 4,
            Reason::Unverified | Reason::UnverifiedAtSource => 3,
            Reason::Stale => 2,
            Reason::Absent => 1,
            _ => 0,
        })
        .unwrap_or(Reason::Absent);
    // Copies unverified only at a mirror name no rule of the source's shares leave the source
    // as the verifier alone would see it: uncovered, admitted.
    let only_at_mirror_names = failures.iter().all(|(_, failure)| {
        !matches!(
            failure,
            Failure::Unverified(..) | Failure::UnverifiedAtSource(_)
        )
    });
    let (action, setting) = match worst {
        Reason::Budget | Reason::LookupError => (policy.on_lookup_error, "onLookupError"),
        Reason::Unverified if only_at_mirror_names => (Fallback::Keep, ""),
        Reason::Unverified | Reason::UnverifiedAtSource => (policy.on_unverified, "onUnverified"),
        Reason::Stale | Reason::Absent => (policy.on_missing, "onMissing"),
        _ => (Fallback::Keep, ""),
    };
    let (to, text) = match &failures[..] {
        [(lookup, failure)] => (quote(lookup), failure.text(policy)),
        several => (
            format!("any of {} mirrors", several.len()),
            several
                .iter()
                .map(|(lookup, failure)| format!("{}: {}", quote(lookup), failure.text(policy)))
                .collect::<Vec<_>>()
                .join("; "),
        ),
    };
    let mirrors = match &failures[..] {
        [_] | [] => Vec::new(),
        several => several
            .iter()
            .map(|(lookup, failure)| (lookup.clone(), failure.reason()))
            .collect(),
    };
    let learned = failures.iter().find_map(|(_, failure)| match failure {
        Failure::Budget {
            digests: Some(digests),
            ..
        } => Some(digests.clone()),
        _ => None,
    });
    let refusal = failures.iter().find_map(|(_, failure)| match failure {
        Failure::Budget { refusal, .. } => Some(refusal.clone()),
        _ => None,
    });
    let unverified_digest = failures.iter().find_map(|(_, failure)| match failure {
        Failure::Unverified(_, digest) | Failure::UnverifiedAtMirrorName(_, digest) => {
            digest.clone()
        }
        _ => None,
    });
    let note = |text: String| Note {
        reason: worst,
        text,
        mirrors: mirrors.clone(),
        learned: learned.clone(),
        refusal: refusal.clone(),
        unverified_digest: unverified_digest.clone(),
        verified_digest: None,
    };
    match action {
        Fallback::Keep => Decision::Keep(note(format!(
            "image {}: kept, not swapped to {to}: {text}",
            quote(image)
        ))),
        Fallback::Reject => Decision::Reject(note(format!(
            "image {}: cannot be swapped to {to}: {text}; {setting} is reject",
            quote(image)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::policy_from;
    use super::*;

    fn note(decision: Decision) -> Note {
        match decision {
            Decision::Keep(note) | Decision::Reject(note) => note,
            _ => panic!("a fallback keeps or refuses"),
        }
    }

    fn refusal() -> Refusal {
        Refusal {
            registry: "m.io".into(),
            needed_ms: 300,
            left_ms: 100,
        }
    }

    /// The note's reason is the worst mirror's: a stale copy over an absent one, an absent one
    /// over a mirror the Pod cannot pull from, in any order.
    #[rstest::rstest]
    #[case::stale_then_absent(vec![Failure::Stale("stale".into()), Failure::Missing("absent".into())], Reason::Stale)]
    #[case::absent_then_stale(vec![Failure::Missing("absent".into()), Failure::Stale("stale".into())], Reason::Stale)]
    #[case::absent_then_no_secret(vec![Failure::Missing("absent".into()), Failure::NoPullSecret("no secret".into())], Reason::Absent)]
    #[case::no_secret_then_absent(vec![Failure::NoPullSecret("no secret".into()), Failure::Missing("absent".into())], Reason::Absent)]
    fn the_worst_mirror_names_the_reason(#[case] failures: Vec<Failure>, #[case] expected: Reason) {
        let policy = policy_from(r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"}]}"#);
        let failures = failures
            .into_iter()
            .enumerate()
            .map(|(i, failure)| (format!("m{i}.io/hub/library/nginx:1.27"), failure))
            .collect();
        assert_eq!(
            note(fallback(&policy, "nginx:1.27", failures)).reason,
            expected
        );
    }

    /// A comparison the budget cut short passes on the digests it had learned, for the budget's
    /// message.
    #[test]
    fn a_comparison_cut_short_passes_on_what_it_learned() {
        let policy = policy_from(r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"}]}"#);
        let failures = vec![(
            "m.io/hub/library/nginx:1.27".to_string(),
            Failure::Budget {
                not_done: "not compared",
                digests: Some("sha256:a and sha256:b".into()),
                refusal: refusal(),
            },
        )];
        let note = note(fallback(&policy, "nginx:1.27", failures));
        assert_eq!(
            (note.learned.as_deref(), note.refusal),
            (Some("sha256:a and sha256:b"), Some(refusal()))
        );
    }
}
