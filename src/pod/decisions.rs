//! Step 2 of an admission: one decision per distinct image, and what it means for each container.
//! Separate because the order of the lookups is decided here: the first image of each registry
//! first, so that the budget times every registry while it is fresh (see `crate::budget`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::decide::{Decision, Note, PullSecrets, Reason, Routed, decide_routed, route};
use crate::object::container_mut;
use crate::policy::Policy;
use crate::registry::Registry;

use super::candidates::Candidate;
use super::look_once::LookOnce;
use super::reapply::running_swap;
use super::request::Operation;

/// One decision per distinct image, and what it means for each container, in container order.
pub(super) fn decide_all(
    candidates: &[Candidate<'_>],
    operation: Operation,
    existing_secrets: &[String],
    recorded: &BTreeMap<String, String>,
    policy: &Policy,
    registry: &mut impl Registry,
) -> Verdicts {
    let mut registry = LookOnce::new(registry);
    let secrets = PullSecrets {
        can_add: operation == Operation::Create,
        existing: existing_secrets,
    };
    let mut running: Vec<Option<&str>> = Vec::with_capacity(candidates.len());
    let mut routed: Vec<(&str, Routed<'_>)> = Vec::new();
    let mut routed_images: BTreeSet<&str> = BTreeSet::new();
    // Images written under a target that are judged as their sources: a swap of one to an
    // image under no target writes it back to its source.
    let mut mirror_spelled: BTreeSet<&str> = BTreeSet::new();
    for candidate in candidates {
        let swap = running_swap(candidate, recorded, &policy.router);
        // With `signatures` or `verifiers`, a re-applied swap is judged as any image written
        // under the mirror's name: the running image must still verify.
        let image = match swap {
            Some(old_image) if policy.verifies() => Some(old_image),
            Some(_) => None,
            None => Some(candidate.image),
        };
        if let Some(image) = image
            && routed_images.insert(image)
        {
            let routed_image = route(image, policy);
            if matches!(routed_image, Routed::MirrorSpelled { .. }) {
                mirror_spelled.insert(image);
            }
            routed.push((image, routed_image));
        }
        running.push(swap);
    }
    let order = lookup_order(&routed, policy);
    let mut routed: Vec<Option<(&str, Routed<'_>)>> = routed.into_iter().map(Some).collect();
    let mut decisions: BTreeMap<&str, Decision> = BTreeMap::new();
    for index in order {
        let Some((image, routed)) = routed.get_mut(index).and_then(Option::take) else {
            continue;
        };
        let decision = decide_routed(image, routed, policy, secrets, &mut registry);
        decisions.insert(image, decision);
    }
    let mut verdicts = Verdicts::default();
    let mut reported: BTreeSet<&str> = BTreeSet::new();
    for (candidate, running) in candidates.iter().zip(running) {
        let judged_as_mirror = mirror_spelled.contains(candidate.image)
            || running.is_some_and(|old_image| mirror_spelled.contains(old_image));
        let written_back = |image: &str| {
            judged_as_mirror
                && crate::reference::Reference::parse(image)
                    .is_ok_and(|parsed| policy.router.target_of(&parsed).is_none())
        };
        let swap = |image: &str, pull_secret: Option<&String>, reapplied| Swap {
            list: candidate.list,
            index: candidate.index,
            name: candidate.name.to_string(),
            original: candidate.image.to_string(),
            image: image.to_string(),
            pull_secret: pull_secret.cloned(),
            reapplied,
            written_back: written_back(image),
        };
        if let Some(old_image) = running {
            match decisions.get(old_image) {
                Some(decision) if policy.verifies() => {
                    reapplied(
                        old_image,
                        decision,
                        &mut reported,
                        &mut verdicts,
                        |image, secret| swap(image, secret, image == old_image),
                    );
                }
                _ => verdicts.swaps.push(swap(old_image, None, true)),
            }
            continue;
        }
        let Some(decision) = decisions.get(candidate.image) else {
            continue;
        };
        if reported.insert(candidate.image) {
            let image = candidate.image.to_string();
            match decision {
                Decision::Keep(note) => verdicts.kept.push((image, note.clone())),
                Decision::Reject(note) => verdicts.rejected.push((image, note.clone())),
                Decision::Swap {
                    note: Some(note), ..
                } => verdicts.swapped_with_note.push((image, note.clone())),
                _ => {}
            }
        }
        if let Decision::Swap {
            image, pull_secret, ..
        } = decision
            && image != candidate.image
        {
            verdicts
                .swaps
                .push(swap(image, pull_secret.as_ref(), false));
        }
    }
    verdicts
}

/// A re-applied original whose running swap (`old_image`) was judged as written under the
/// mirror's name: kept when it still verifies (or no rule covers it), re-pinned to the digest
/// that verified, refused, or (written back to its source) left at the original the manifest
/// re-sent.
fn reapplied<'i>(
    old_image: &'i str,
    decision: &Decision,
    reported: &mut BTreeSet<&'i str>,
    verdicts: &mut Verdicts,
    swap: impl Fn(&str, Option<&String>) -> Swap,
) {
    let first = reported.insert(old_image);
    let mut report = |note: &crate::decide::Note, list: fn(&mut Verdicts) -> &mut Vec<_>| {
        if first {
            list(verdicts).push((old_image.to_string(), note.clone()));
        }
    };
    match decision {
        Decision::Reject(note) => report(note, |v| &mut v.rejected),
        Decision::Keep(note) => {
            report(note, |v| &mut v.kept);
            verdicts.swaps.push(swap(old_image, None));
        }
        Decision::Swap {
            image,
            pull_secret,
            note,
        } => {
            if let Some(note) = note {
                report(note, |v| &mut v.swapped_with_note);
            }
            let swap = swap(image, pull_secret.as_ref());
            // Written back: the manifest's own original stays, as it re-sent it.
            if !swap.written_back {
                verdicts.swaps.push(swap);
            }
        }
        Decision::Unchanged | Decision::AlreadySwapped => {
            verdicts.swaps.push(swap(old_image, None));
        }
    }
}

/// The order the decisions are made in: first, for each registry in the order the Pod first
/// names it, the first image whose decision asks it; then every other image in container
/// order. Each registry is then timed while the budget is fresh, and every later lookup is
/// predicted from its own registry's timing, whatever order the Pod names its registries in.
/// The order is fixed by the Pod and the settings alone, so recorded lookups replay exactly.
fn lookup_order(routed: &[(&str, Routed<'_>)], policy: &Policy) -> Vec<usize> {
    first_of_each_registry(
        routed
            .iter()
            .map(|(image, routed)| routed.first_hosts(image, policy)),
    )
}

/// The indexes of `asks` (the registry hosts each decision asks first, in container order) in
/// the order described at [`lookup_order`]; shared with the check role.
pub(super) fn first_of_each_registry<'h>(
    asks: impl IntoIterator<Item = Vec<&'h str>>,
) -> Vec<usize> {
    let mut timed: BTreeSet<&str> = BTreeSet::new();
    let mut first = Vec::new();
    let mut rest = Vec::new();
    for (index, hosts) in asks.into_iter().enumerate() {
        if hosts.iter().any(|host| !timed.contains(host)) {
            timed.extend(hosts);
            first.push(index);
        } else {
            rest.push(index);
        }
    }
    first.extend(rest);
    first
}

/// A container image this admission rewrites.
pub(super) struct Swap {
    pub(super) list: &'static str,
    pub(super) index: usize,
    pub(super) name: String,
    pub(super) original: String,
    pub(super) image: String,
    pub(super) pull_secret: Option<String>,
    /// Put back to the swap recorded for it: a re-applied manifest re-sent the original.
    pub(super) reapplied: bool,
    /// An image the Pod wrote under a mirror's name, written back to its source because it
    /// does not verify there: not a swap the record of originals names.
    pub(super) written_back: bool,
}

/// What the decisions say of the candidates.
#[derive(Default)]
pub(super) struct Verdicts {
    pub(super) swaps: Vec<Swap>,
    /// One note per distinct image kept, rejected, or swapped with a warning, in container
    /// order.
    pub(super) kept: Vec<(String, Note)>,
    pub(super) rejected: Vec<(String, Note)>,
    pub(super) swapped_with_note: Vec<(String, Note)>,
}

impl Verdicts {
    /// Images kept because no target of their rule holds them, or holds a copy that verifies
    /// (with the digest it serves, when known): the record the fill job reads.
    pub(super) fn unmirrored(&self) -> BTreeMap<String, Option<String>> {
        self.kept
            .iter()
            .filter(|(_, note)| matches!(note.reason, Reason::Absent | Reason::Unverified))
            .map(|(image, note)| (image.clone(), note.unverified_digest.clone()))
            .collect()
    }

    /// Writes each swap's image into its container of `object`; says whether it changed any.
    pub(super) fn write_images(&self, object: &mut Value) -> bool {
        let mut changed = false;
        for swap in &self.swaps {
            if let Some(container) = container_mut(object, swap.list, swap.index) {
                container.insert("image".to_string(), Value::String(swap.image.clone()));
                changed = true;
            }
        }
        changed
    }
}
