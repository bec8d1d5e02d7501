//! The check role's answer, whose message becomes the audit scanner's report: findings under a
//! head of their kind (gone from the mirror; not in the mirror), with what to do and the copy
//! that fixes each, and the images that could not be checked.

use std::collections::BTreeMap;

use serde_json::json;

use crate::budget::BudgetReport;
use crate::decide::check::CheckedImage;
use crate::decide::images::MirrorImage;
use crate::decide::presence::Presence;
use crate::policy::Policy;
use crate::reference::Reference;
use crate::text::quote;

use super::candidates::Candidate;
use super::checks::Checked;
use super::outcome::{Outcome, Verdict};
use super::report::{capped, time_spent};
use crate::plan::copies::{fill_command, refill_command, signature_command, signature_tag};

/// The check role's answer: accepted when every mirror image is there and every source image
/// is in a mirror; rejected when any mirror image is gone or any source image is in none of its
/// mirrors (findings: the report's `fail`), with one entry per container under a head of its
/// own kind; rejected with code 500 when nothing was found but some image could not be checked
/// (the report's `error`: nothing is known). A Pod with findings and unchecked images is a
/// finding, and its message names both.
pub(super) fn check_outcome(
    checked: &[Checked],
    candidates: &[Candidate<'_>],
    found: &Found<'_>,
    policy: &Policy,
    report: &BudgetReport,
) -> Outcome {
    if checked.is_empty() {
        return Outcome::unchanged();
    }
    let mut gone = Vec::new();
    let mut revoked = Vec::new();
    let mut unsigned_copies = Vec::new();
    let mut unmirrored = Vec::new();
    let mut not_checked = Vec::new();
    let mut over_budget = Vec::new();
    // Containers, for the audit figures; `not_checked` holds messages, one for all the budget's.
    let mut unchecked = 0;
    for entry in checked {
        let Some(candidate) = candidates.get(entry.candidate) else {
            continue;
        };
        let image = candidate.image;
        let container = format!("{} {}", candidate.list, quote(candidate.name));
        let asked = entry.image.first_lookup();
        match (&entry.presence, &entry.image) {
            (Presence::Present, _) => {}
            (
                Presence::RevokedAtSource { answer, digest },
                CheckedImage::SignedMirror { mirror, source, .. },
            ) => {
                let stale = signature_tag(mirror.repository(), digest);
                revoked.push(format!(
                    "{container}: image {} no longer verifies at its source (asked for {}, it answered: {answer}), while the mirror's signature tag {} may still verify digest {digest} there; remove it (skopeo delete docker://{stale}), so that no Pod is swapped to it again, and roll out the Pods that run it",
                    quote(image),
                    quote(source),
                    quote(&stale),
                ));
            }
            (Presence::Drifted { digest, now }, checked) => {
                let source_tag = match checked {
                    CheckedImage::SignedMirror { source_tag, .. } => source_tag.as_deref(),
                    _ => None,
                };
                revoked.push(format!(
                    "{container}: image {} runs digest {digest}, but the source's tag {} now names {now}, which verifies there; refill the mirror's tag from the source and roll out the Pods that run it",
                    quote(image),
                    quote(source_tag.unwrap_or_default()),
                ));
            }
            (
                Presence::SignatureNotCopied { why, digest },
                CheckedImage::SignedMirror { mirror, source, .. },
            ) => {
                let source_name = source
                    .split_once('@')
                    .map_or(source.as_str(), |(name, _)| name);
                unsigned_copies.push(format!(
                    "{container}: image {} verifies at its source, but a rule covers the mirror's name too and {why}; copy the source's signature ({}), so that a verifier after this policy admits it",
                    quote(image),
                    signature_command(source_name, mirror.repository(), digest)
                ));
            }
            (
                Presence::Gone(answer),
                CheckedImage::Mirror(mirror) | CheckedImage::SignedMirror { mirror, .. },
            ) => {
                let origin = found.origin(candidate.name, image, policy);
                let running = found.running.get(candidate.name).map(String::as_str);
                gone.push(format!(
                    "{container}: image {} is gone from the mirror (asked for {}, it answered: {answer}); {}",
                    quote(image),
                    quote(asked),
                    what_to_do(origin.as_ref(), mirror, running)
                ));
            }
            (Presence::Gone(answer), CheckedImage::Source(source)) => {
                let asked = match &source.targets[..] {
                    [_] => format!("asked for {}, it answered: {answer}", quote(asked)),
                    _ => format!("asked each of its mirrors: {answer}"),
                };
                unmirrored.push(format!(
                    "{container}: image {} is not in the mirror ({asked}); fill the mirror ({}), and the next Pods that name it are swapped",
                    quote(image),
                    fill_command(source)
                ));
            }
            (
                Presence::Unverified {
                    target,
                    answer,
                    digest,
                },
                CheckedImage::Source(source),
            ) => {
                let Some(mirror) = source.targets.get(*target) else {
                    continue;
                };
                let what_to_do = match digest {
                    Some(digest) => format!(
                        "copy its signature ({}), and the next Pods that name it are swapped",
                        signature_command(&source.name, mirror.repository(), digest)
                    ),
                    None => format!(
                        "copy its signature, tag sha256-<hex>.sig of the digest {} serves (the lookup budget left no time to ask which)",
                        quote(&mirror.lookup)
                    ),
                };
                unmirrored.push(format!(
                    "{container}: image {} is in the mirror without a signature that verifies (asked {}, it answered: {answer}); {what_to_do}",
                    quote(image),
                    quote(&mirror.lookup),
                ));
            }
            (Presence::NotChecked(why), _)
            | (Presence::Unverified { answer: why, .. }, _)
            | (Presence::RevokedAtSource { answer: why, .. }, _)
            | (Presence::SignatureNotCopied { why, .. }, _) => {
                unchecked += 1;
                not_checked.push(format!(
                    "{container}: image {} not checked: could not ask the mirror for {} ({why})",
                    quote(image),
                    quote(asked)
                ));
            }
            (Presence::OverBudget(refusal), _) => {
                unchecked += 1;
                over_budget.push(format!(
                    "{container} image {} ({})",
                    quote(image),
                    refusal.describe()
                ));
            }
        }
    }
    if !over_budget.is_empty() {
        not_checked.push(format!(
            "not checked in time, within the lookup budget of {} ms ({}): {}",
            report.limit_ms(),
            time_spent(report),
            capped(over_budget, "containers").join(", ")
        ));
    }
    let audit = check_audit(
        checked.len(),
        (
            gone.len() + revoked.len() + unsigned_copies.len(),
            unmirrored.len(),
        ),
        unchecked,
        report,
    );
    let findings: Vec<String> = [
        under_head(
            gone,
            "a mirror image the Pod runs is gone from the mirror",
            "mirror images the Pod runs are gone from the mirror",
        ),
        under_head(
            revoked,
            "a mirror image the Pod runs no longer verifies at its source",
            "mirror images the Pod runs no longer verify at their sources",
        ),
        under_head(
            unsigned_copies,
            "a mirror image the Pod runs lacks its source's signature in the mirror",
            "mirror images the Pod runs lack their sources' signatures in the mirror",
        ),
        under_head(
            unmirrored,
            "a source image the Pod runs is not in the mirror",
            "source images the Pod runs are not in the mirror",
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    let verdict = match (findings.is_empty(), not_checked.is_empty()) {
        (true, true) => Verdict::Accept,
        (true, false) => Verdict::Error(format!(
            "the Pod's mirror images could not all be checked: {}",
            capped(not_checked, "containers").join("; ")
        )),
        (false, _) => {
            let mut message = findings.join("; and ");
            if !not_checked.is_empty() {
                message.push_str("; also ");
                message.push_str(&capped(not_checked, "containers").join("; "));
            }
            Verdict::Reject(message)
        }
    };
    Outcome {
        verdict,
        warnings: Vec::new(),
        audit,
    }
}

/// One kind of finding, under the head that names it (singular, or plural with the count), so
/// that reports can be filtered by kind; `None` when there is none of that kind.
fn under_head(entries: Vec<String>, one: &str, several: &str) -> Option<String> {
    let head = match entries.len() {
        0 => return None,
        1 => one.to_string(),
        n => format!("{n} {several}"),
    };
    Some(format!(
        "{head}: {}",
        capped(entries, "containers").join("; ")
    ))
}

/// What the check read off the Pod beside its images: the record of what each container was
/// swapped from, and the digest each container runs (its status).
pub(super) struct Found<'a> {
    pub(super) originals: &'a BTreeMap<String, String>,
    pub(super) running: &'a BTreeMap<String, String>,
}

/// Where a gone mirror image came from.
enum Origin {
    /// The Pod's record names it: this policy swapped it.
    Recorded(String),
    /// No record names it (another swapper put it there, k8s-image-swapper say, or the Pod was
    /// written under the mirror's name), but exactly one source routes to its repository: the
    /// layout is inverted (`Router::sources_of`), as for a mirror-spelled image's signatures.
    Layout(String),
}

impl Found<'_> {
    fn origin(&self, container: &str, image: &str, policy: &Policy) -> Option<Origin> {
        if let Some(original) = self
            .originals
            .get(container)
            .filter(|original| policy.router.is_swap_of(original, image))
        {
            return Some(Origin::Recorded(original.clone()));
        }
        let reference = Reference::parse(image).ok()?;
        let sources = policy.router.sources_of(&reference);
        let mut forward = sources.iter().filter(|source| source.forward);
        // Two sources routing to one repository leave its origin unknown: no copy is guessed.
        match (forward.next(), forward.next()) {
            (Some(only), None) => Some(Origin::Layout(only.reference.as_str().to_string())),
            _ => None,
        }
    }
}

/// What the operator can do about a mirror image that is gone: put it back (when the Pod's
/// record names the image it was swapped from, or the mirror's layout names the one source it
/// can have come from; the message names it), at the digest the container runs when the Pod
/// names a tag and its status says which, or roll the workload out so that its new Pods are
/// decided afresh (the swapping policy then keeps the source image, or swaps to what the mirror
/// holds now).
fn what_to_do(origin: Option<&Origin>, image: &MirrorImage, running: Option<&str>) -> String {
    const ROLL_OUT: &str = "roll the workload out so that its new Pods are decided afresh";
    let (original, from) = match origin {
        Some(Origin::Recorded(original)) => (original, "it was swapped from"),
        Some(Origin::Layout(original)) => (
            original,
            "no record names its source; by the mirror's layout it is a copy of",
        ),
        None => return format!("{ROLL_OUT}, or refill the mirror from the image's source"),
    };
    let Some(refill) = refill_command(original, image, running) else {
        return format!("{ROLL_OUT}, or refill the mirror from the image's source");
    };
    let at = match (image.digest(), running) {
        (None, Some(digest)) => format!(", at the digest the container runs ({digest})"),
        _ => String::new(),
    };
    format!(
        "{from} {}: refill the mirror{at} ({refill}) or {ROLL_OUT}",
        quote(original)
    )
}

/// The check's figures for the API server's audit log.
fn check_audit(
    checked: usize,
    (gone, unmirrored): (usize, usize),
    not_checked: usize,
    report: &BudgetReport,
) -> BTreeMap<String, String> {
    let summary = json!({
        "checked": checked,
        "gone": gone,
        "unmirrored": unmirrored,
        "notChecked": not_checked,
        "lookups": report.lookups,
        "lookupMilliseconds": report.lookup_ms(),
        "evaluationMilliseconds": report.elapsed_ms(),
        "budgetMilliseconds": report.limit_ms(),
    });
    BTreeMap::from([("check".to_string(), summary.to_string())])
}
