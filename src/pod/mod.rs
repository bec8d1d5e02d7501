//! One admission, in the order its steps run:
//!
//! 1. `request`: what the request is (its operation, the audit scanner's replay, a static Pod's
//!    mirror); `candidates`: which containers to decide on (on update, only changed images);
//! 2. `reapply`: the running swap a re-applied manifest keeps; `decisions`: one decision per
//!    distinct image (`crate::decide`), the first image of each registry first, each lookup
//!    asked once (`look_once`) within the lookup budget (`crate::budget`);
//! 3. `pull_secrets`: whether a mirror's secret can be added, and adding it;
//! 4. `record`: the original-images annotation; `crate::plan::unmirrored`: the record of source
//!    images the mirror lacks, which the fill job reads;
//! 5. `report`: warnings, the rejection message, audit annotations; `outcome`: the answer.
//!
//! The check role (`action: check`, `check_role`) runs steps 1, 2 (`checks`: one lookup per
//! mirror image, within the same budget) and 5 (`check_report`), and changes nothing. The copies
//! both roles suggest are `crate::plan`'s, in the one form the fill job reads. The swapping role
//! answers the audit scanner's replay of a running Pod unchanged, without a lookup.

mod candidates;
mod check_report;
mod check_role;
mod checks;
mod decisions;
mod look_once;
mod outcome;
mod pull_secrets;
mod reapply;
mod record;
mod report;
mod request;
mod running;
#[cfg(test)]
mod signed_check_tests;
#[cfg(test)]
mod signed_tests;
#[cfg(test)]
mod tests;
mod verifier_read;

use std::collections::BTreeMap;
use std::time::Duration;

use kubewarden_policy_sdk::request::KubernetesAdmissionRequest;

use crate::budget::{Budgeted, Clock};
use crate::object::annotation;
use crate::plan::unmirrored::{Requester, record_unmirrored};
use crate::policy::{Action, Policy};
use crate::registry::Registry;
use crate::verifiers::Cluster;

use candidates::changed_containers;
use check_role::check;
use decisions::decide_all;
pub use outcome::{Outcome, Verdict};
use pull_secrets::{add_pull_secrets, pull_secret_names};
pub use record::ORIGINAL_IMAGES_ANNOTATION;
use record::{record_original_images, recorded_originals};
use report::{audit_annotations, fill_job_may_not_set_images, messages, rejection};
pub use request::STATIC_POD_MIRROR_ANNOTATION;
use request::{Operation, is_audit_scan};
pub use verifier_read::VERIFIERS_UNMATCHED;
use verifier_read::{tell_unmatched, with_verifier_rules};

/// Takes the request by value: the mutated Pod is the request's own object, changed in place,
/// so a large Pod is neither copied nor compared.
pub fn admit(
    mut request: KubernetesAdmissionRequest,
    policy: &Policy,
    registry: &mut impl Registry,
    cluster: &mut impl Cluster,
    clock: &impl Clock,
) -> Outcome {
    if request.kind.kind != "Pod" || !request.kind.group.is_empty() {
        return Outcome::unchanged();
    }
    let Some(operation) = Operation::of(&request) else {
        return Outcome::unchanged();
    };
    match policy.action {
        // The monitor deployment's check is for the scanner: an admission it answers at once
        // and without a lookup, so that no Pod waits on its mirror (nor on a hanging one).
        Action::Check if !policy.check_admissions && !is_audit_scan(&request) => {
            return Outcome::unchanged();
        }
        Action::Check => return check(&request, operation, policy, registry, cluster, clock),
        // The scanner's answer is a report, never applied: a swap there changes nothing, and
        // its lookups would queue every admission behind the host's lock (hundreds of Pods
        // each hour).
        Action::Swap if is_audit_scan(&request) => return Outcome::unchanged(),
        Action::Swap => {}
    }
    if annotation(&request.object, STATIC_POD_MIRROR_ANNOTATION).is_some() {
        return Outcome::unchanged();
    }
    let requester = Requester::of(&request.user_info.username, policy);
    let candidates = changed_containers(&request, operation);
    if candidates.is_empty() {
        // Nothing to decide, but the record of unmirrored images stays the policy's own: one
        // written by hand in a metadata update goes, since the fill job acts on it, and one
        // removed by hand comes back; only the fill job drops the entries it filled.
        let previous = std::mem::take(&mut request.old_object);
        let mut object = std::mem::take(&mut request.object);
        if operation.may_change_metadata()
            && record_unmirrored(
                &mut object,
                Some(&previous),
                requester,
                &BTreeMap::new(),
                policy,
            )
        {
            return Outcome::of(Verdict::Mutate(object));
        }
        return Outcome::unchanged();
    }
    // The fill job's identity may drop entries of the record and do nothing else: its token
    // sits in the fill job's Pods, and an image it wrote would run with the Pod's own rights.
    if requester == Requester::FillJob {
        let message = fill_job_may_not_set_images(&request.user_info.username, &candidates);
        return Outcome::of(Verdict::Reject(message));
    }
    // The live Pod's record: what this policy swapped, and from what.
    let recorded = match operation {
        Operation::Update => recorded_originals(&request.old_object),
        _ => BTreeMap::new(),
    };
    // The verifiers' rules, read once the admission has images to decide on.
    let with_verifiers;
    let mut unmatched = None;
    let policy = if policy.verifiers.is_empty() {
        policy
    } else {
        let read;
        (read, unmatched) = with_verifier_rules(policy, &request.namespace, cluster);
        with_verifiers = read;
        &with_verifiers
    };
    let existing_secrets = pull_secret_names(&request.object);
    let limit = Duration::from_millis(policy.lookup_budget_ms);
    let mut budgeted = Budgeted::new(registry, clock, limit);
    let verdicts = decide_all(
        &candidates,
        operation,
        &existing_secrets,
        &recorded,
        policy,
        &mut budgeted,
    );
    let report = budgeted.report();
    let (mut warnings, rejections) = messages(&verdicts, policy, &report);
    let mut audit = audit_annotations(&verdicts, &report);
    tell_unmatched(&mut warnings, &mut audit, unmatched);
    if let Some(message) = rejection(rejections) {
        return Outcome {
            verdict: Verdict::Reject(message),
            warnings,
            audit,
        };
    }
    let previous = match operation {
        Operation::Update => Some(std::mem::take(&mut request.old_object)),
        _ => None,
    };
    let mut object = std::mem::take(&mut request.object);
    let mut changed = verdicts.write_images(&mut object);
    if operation.may_change_metadata() {
        changed |= record_original_images(&mut object, &verdicts.swaps, &policy.router);
        changed |= record_unmirrored(
            &mut object,
            previous.as_ref(),
            requester,
            &verdicts.unmirrored(),
            policy,
        );
    }
    if operation == Operation::Create {
        let secrets = verdicts
            .swaps
            .iter()
            .filter_map(|s| s.pull_secret.as_deref());
        changed |= add_pull_secrets(&mut object, secrets, &existing_secrets);
    }
    let verdict = if changed {
        Verdict::Mutate(object)
    } else {
        Verdict::Accept
    };
    Outcome {
        verdict,
        warnings,
        audit,
    }
}
