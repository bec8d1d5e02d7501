//! The last step of an admission of the swapping role: what it tells people. Warnings and
//! rejection messages for kubectl, audit annotations for the API server's audit log. The check
//! role's answer is `check_report`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::budget::BudgetReport;
use crate::decide::{Note, Reason};
use crate::policy::{Fallback, Policy};
use crate::registry::Refusal;
use crate::text::{quote, truncated};

use super::candidates::Candidate;
use super::decisions::Verdicts;

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
pub(super) fn time_spent(report: &BudgetReport) -> String {
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

/// The rejection message of an admission with `rejections` (one per distinct image), or `None`
/// when there is none: one image's reason as it is, several counted and capped.
pub(super) fn rejection(rejections: Vec<String>) -> Option<String> {
    match rejections.len() {
        0 => None,
        1 => rejections.into_iter().next(),
        n => Some(format!(
            "{n} images cannot be admitted: {}",
            capped(rejections, "images").join("; ")
        )),
    }
}

/// Why a request from `fillJobUsernames` that sets images is refused, naming each container.
pub(super) fn fill_job_may_not_set_images(username: &str, candidates: &[Candidate<'_>]) -> String {
    let containers: Vec<String> = candidates
        .iter()
        .map(|c| format!("{}[{}] {:?}: {:?}", c.list, c.index, c.name, c.image))
        .collect();
    format!(
        "{username:?} is in fillJobUsernames, which may only drop entries of the record of unmirrored images; this request sets the image of {}",
        capped(containers, "containers").join(", ")
    )
}
