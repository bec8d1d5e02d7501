//! The last step of an admission: what it tells people. Warnings and rejection messages for
//! kubectl, audit annotations for the API server's audit log; for the check role, the whole
//! answer, whose message becomes the audit scanner's report.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::budget::BudgetReport;
use crate::decide::check::{CheckedImage, MirrorImage, Presence, SourceImage};
use crate::decide::{Note, Reason};
use crate::policy::{Fallback, Policy};
use crate::reference::Reference;
use crate::registry::Refusal;
use crate::text::{quote, truncated};

use super::candidates::Candidate;
use super::checks::Checked;
use super::{Outcome, Verdict, Verdicts};

/// The warnings and the rejection reasons, one per distinct image, except that the images the
/// budget left unlooked-up share one message that names the budget.
pub(super) fn messages(
    verdicts: &Verdicts,
    policy: &Policy,
    report: &BudgetReport,
) -> (Vec<String>, Vec<String>) {
    let over_budget = |(_, note): &&(String, Note)| note.reason == Reason::Budget;
    let mut warnings: Vec<String> = verdicts
        .swapped_with_note
        .iter()
        .chain(&verdicts.kept)
        .filter(|entry| !over_budget(entry))
        .map(|(_, note)| note.text.clone())
        .collect();
    let mut rejections: Vec<String> = verdicts
        .rejected
        .iter()
        .filter(|entry| !over_budget(entry))
        .map(|(_, note)| note.text.clone())
        .collect();
    let budget_images: Vec<BudgetImage<'_>> = verdicts
        .kept
        .iter()
        .chain(&verdicts.rejected)
        .filter(over_budget)
        .map(|(image, note)| BudgetImage {
            image,
            learned: note.learned.as_deref(),
            why: note.refusal.as_ref().map(Refusal::describe),
        })
        .collect();
    if !budget_images.is_empty() {
        let message = budget_message(&budget_images, policy.on_lookup_error, report);
        match policy.on_lookup_error {
            Fallback::Keep => warnings.push(message),
            Fallback::Reject => rejections.push(message),
        }
    }
    (capped(warnings, "images not swapped"), rejections)
}

/// An image the budget left unlooked-up, for the message that names them all.
struct BudgetImage<'n> {
    image: &'n str,
    /// What a `verifySource` comparison cut short had learned: the two digests, which differ.
    learned: Option<&'n str>,
    /// Why its lookup was not started: the registry, what it would need, what was left.
    why: Option<String>,
}

/// "lookup budget of 800 ms: 28 images were not looked up or compared in time and kept as
/// they were (onLookupError is keep): "a", "b" (m.io would need about 406 ms, 170 ms were
/// left), and 26 more; the evaluation had run 630 ms, 626 ms of it in 2 lookups (the slowest
/// 406 ms)". Each image named says why its lookup was not started (images refused for the same
/// reason share it), so that a budget mostly left is never called spent. An image whose
/// `verifySource` comparison was cut short says what it had learned: "a" (its digest differs
/// from the mirror's: source sha256:…, mirror sha256:…). Both figures at the end say what they
/// measure: the budget counts the whole evaluation, as policy-server's timeout does; the
/// lookups are their part.
fn budget_message(images: &[BudgetImage<'_>], action: Fallback, report: &BudgetReport) -> String {
    const NAMED: usize = 5;
    // Consecutive images refused for the same reason, named together before it.
    let mut groups: Vec<(Vec<String>, Option<&str>)> = Vec::new();
    for entry in images.iter().take(NAMED) {
        let named = match entry.learned {
            Some(digests) => format!(
                "{} (its digest differs from the mirror's: {digests})",
                quote(entry.image)
            ),
            None => quote(entry.image),
        };
        match groups.last_mut() {
            Some((names, why)) if *why == entry.why.as_deref() => names.push(named),
            _ => groups.push((vec![named], entry.why.as_deref())),
        }
    }
    let mut named = groups
        .iter()
        .map(|(names, why)| match why {
            Some(why) => format!("{} ({why})", names.join(", ")),
            None => names.join(", "),
        })
        .collect::<Vec<_>>()
        .join(", ");
    if images.len() > NAMED {
        named.push_str(&format!(", and {} more", images.len() - NAMED));
    }
    let count = match images.len() {
        1 => "1 image was".to_string(),
        n => format!("{n} images were"),
    };
    let outcome = match action {
        Fallback::Keep => "kept as they were",
        Fallback::Reject => "refused",
    };
    format!(
        "lookup budget of {} ms: {count} not looked up or compared in time and {outcome} (onLookupError is {}): {named}; {} (the slowest {} ms)",
        report.limit_ms(),
        action.as_str(),
        time_spent(report),
        report.slowest_ms(),
    )
}

/// "the evaluation had run 612 ms, 605 ms of it in 3 lookups": what the budget counts (the whole
/// evaluation, as policy-server's timeout does) and the lookups' part of it.
fn time_spent(report: &BudgetReport) -> String {
    let lookups = match report.lookups {
        1 => "1 lookup".to_string(),
        n => format!("{n} lookups"),
    };
    format!(
        "the evaluation had run {} ms, {} ms of it in {lookups}",
        report.elapsed_ms(),
        report.lookup_ms()
    )
}

/// The most entries listed under one audit annotation key; the summary counts them all.
pub(super) const AUDITED_MAX: usize = 20;
/// The longest image or container name quoted in an audit annotation.
pub(super) const AUDITED_CHARS_MAX: usize = 200;

/// What the admission did, for the API server's audit log: `swapped` (container, from, to),
/// `kept` and `rejected` (image, reason code, and each mirror's reason when a rule has several), and a `summary` with the counts, the lookups'
/// own time and the evaluation's time at the last lookup. Empty when there is nothing to report.
pub(super) fn audit_annotations(
    verdicts: &Verdicts,
    report: &BudgetReport,
) -> BTreeMap<String, String> {
    let mut audit = BTreeMap::new();
    if verdicts.swaps.is_empty()
        && verdicts.kept.is_empty()
        && verdicts.rejected.is_empty()
        && report.lookups == 0
    {
        return audit;
    }
    let cut = |text: &str| truncated(text, AUDITED_CHARS_MAX);
    let notes: BTreeMap<&str, &Note> = verdicts
        .swapped_with_note
        .iter()
        .map(|(image, note)| (image.as_str(), note))
        .collect();
    let swapped: Vec<Value> = verdicts
        .swaps
        .iter()
        .take(AUDITED_MAX)
        .map(|swap| {
            let mut entry = json!({
                "container": cut(&swap.name),
                "from": cut(&swap.original),
                "to": cut(&swap.image),
            });
            if swap.reapplied {
                entry["reapplied"] = json!(true);
            }
            if let Some(note) = notes.get(swap.original.as_str()) {
                entry["reason"] = json!(note.reason.code());
            }
            entry
        })
        .collect();
    let by_image = |list: &[(String, Note)]| -> Vec<Value> {
        list.iter()
            .take(AUDITED_MAX)
            .map(|(image, note)| {
                let mut entry = json!({"image": cut(image), "reason": note.reason.code()});
                // A rule with several mirrors: what each one said.
                if !note.mirrors.is_empty() {
                    let mirrors: Vec<Value> = note
                        .mirrors
                        .iter()
                        .map(|(mirror, reason)| json!({"mirror": cut(mirror), "reason": reason.code()}))
                        .collect();
                    entry["mirrors"] = Value::Array(mirrors);
                }
                entry
            })
            .collect()
    };
    for (key, entries) in [
        ("swapped", swapped),
        ("kept", by_image(&verdicts.kept)),
        ("rejected", by_image(&verdicts.rejected)),
    ] {
        if !entries.is_empty() {
            audit.insert(key.to_string(), Value::Array(entries).to_string());
        }
    }
    // A re-applied container keeps the image it runs: counted apart, since nothing changed.
    let reapplied = verdicts.swaps.iter().filter(|swap| swap.reapplied).count();
    let summary = json!({
        "swapped": verdicts.swaps.len() - reapplied,
        "reapplied": reapplied,
        "kept": verdicts.kept.len(),
        "rejected": verdicts.rejected.len(),
        "lookups": report.lookups,
        "lookupMilliseconds": report.lookup_ms(),
        "evaluationMilliseconds": report.elapsed_ms(),
        "budgetMilliseconds": report.limit_ms(),
        "notLookedUp": report.refused,
    });
    audit.insert("summary".to_string(), summary.to_string());
    audit
}

/// Kubernetes truncates long warning lists; past this many entries, the rest are counted.
pub(super) const LISTED_MAX: usize = 20;

pub(super) fn capped(mut items: Vec<String>, what: &str) -> Vec<String> {
    if items.len() > LISTED_MAX {
        let more = items.len() - LISTED_MAX;
        items.truncate(LISTED_MAX);
        items.push(format!("… and {more} more {what}"));
    }
    items
}

/// The check role's answer: accepted when every mirror image is there and every source image
/// is in a mirror; rejected when any mirror image is gone or any source image is in none of its
/// mirrors (findings: the report's `fail`), with one entry per container under a head of its
/// own kind; rejected with code 500 when nothing was found but some image could not be checked
/// (the report's `error`: nothing is known). A Pod with findings and unchecked images is a
/// finding, and its message names both.
pub(super) fn check_outcome(
    checked: &[Checked],
    candidates: &[Candidate<'_>],
    originals: &BTreeMap<String, String>,
    policy: &Policy,
    report: &BudgetReport,
) -> Outcome {
    if checked.is_empty() {
        return Outcome::unchanged();
    }
    let mut gone = Vec::new();
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
            (Presence::Gone(answer), CheckedImage::Mirror(mirror)) => {
                let original = originals
                    .get(candidate.name)
                    .filter(|original| policy.router.is_swap_of(original, image));
                gone.push(format!(
                    "{container}: image {} is gone from the mirror (asked for {}, it answered: {answer}); {}",
                    quote(image),
                    quote(asked),
                    what_to_do(original.map(String::as_str), mirror)
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
            (Presence::NotChecked(why), _) => {
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
        (gone.len(), unmirrored.len()),
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

/// What the operator can do about a mirror image that is gone: put it back (when the Pod's
/// record names the image it was swapped from, which the message names), or roll the workload
/// out so that its new Pods are decided afresh (the swapping policy then keeps the source
/// image, or swaps to what the mirror holds now).
fn what_to_do(original: Option<&str>, image: &MirrorImage) -> String {
    const ROLL_OUT: &str = "roll the workload out so that its new Pods are decided afresh";
    let Some((original, refill)) =
        original.and_then(|original| Some((original, refill_command(original, image)?)))
    else {
        return format!("{ROLL_OUT}, or refill the mirror from the image's source");
    };
    format!(
        "it was swapped from {}: refill the mirror ({refill}) or {ROLL_OUT}",
        quote(original)
    )
}

/// The copy that puts a gone mirror image back, safe to run unread: exactly what the kubelet
/// pulls, and never a mirror tag moved to other content. A pinned image copies its digest from
/// the source (which a copy with preserved digests shares) to a tag of its own
/// (`sha256-<hex>`): the tag beside the digest may name newer content in the mirror now, and a
/// tag keeps "delete untagged" rules off the copy. An image by tag copies the source's tag to
/// the mirror's, which the mirror just said it lacks.
fn refill_command(original: &str, image: &MirrorImage) -> Option<String> {
    let original = Reference::parse(original).ok()?;
    let source = match (image.digest(), original.tag()) {
        (Some(digest), _) => format!("{}@{digest}", original.name()),
        (None, Some(tag)) => format!("{}:{tag}", original.name()),
        (None, None) => original.as_str().to_string(),
    };
    let destination = match image.digest() {
        Some(digest) => own_tag(image.repository(), digest),
        None => image.lookup.clone(),
    };
    Some(copy_command(&source, &destination))
}

/// The copy that fills the first target with a source image no target holds: by digest to a
/// tag of its own, or by tag to the same tag (which every target just said it lacks).
fn fill_command(source: &SourceImage) -> String {
    let Some(first) = source.targets.first() else {
        return String::new();
    };
    let destination = match first.digest() {
        Some(digest) => own_tag(first.repository(), digest),
        None => first.lookup.clone(),
    };
    copy_command(&source.source, &destination)
}

/// `repository:sha256-<hex>`: the tag a copy by digest is pushed to.
fn own_tag(repository: &str, digest: &str) -> String {
    format!("{repository}:{}", digest.replacen(':', "-", 1))
}

/// The form the fill job finds in a report's message, and a person can run as it is:
/// `skopeo copy --all --preserve-digests docker://SOURCE docker://DESTINATION`, both references
/// in the reference grammar's characters only, so the copy ends at the first other character.
pub const COPY_COMMAND: &str = "skopeo copy --all --preserve-digests";

fn copy_command(source: &str, destination: &str) -> String {
    format!("{COPY_COMMAND} docker://{source} docker://{destination}")
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
