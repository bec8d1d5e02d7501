//! The check role (`action: check`): its steps in order, as the swapping role's are in `mod.rs`:
//! the candidates, the verifiers' rules, the lookups (`checks`), and the answer (`check_report`).

use std::time::Duration;

use kubewarden_policy_sdk::request::KubernetesAdmissionRequest;

use crate::budget::{Budgeted, Clock};
use crate::decide::images::mirror_image;
use crate::policy::Policy;
use crate::registry::Registry;
use crate::verifiers::Cluster;

use super::candidates::changed_containers;
use super::check_report::{Found, check_outcome};
use super::checks::check_all;
use super::outcome::{Outcome, Verdict};
use super::record::recorded_originals;
use super::request::Operation;
use super::running::running_digests;
use super::verifier_read::{tell_unmatched, with_verifier_rules};

/// The check role: every container (on update, every changed one) whose image is a mirror
/// image is looked up as a node would pull it. Static Pods' mirror Pods are checked too: their
/// node pulls the same image.
pub(super) fn check(
    request: &KubernetesAdmissionRequest,
    operation: Operation,
    policy: &Policy,
    registry: &mut impl Registry,
    cluster: &mut impl Cluster,
    clock: &impl Clock,
) -> Outcome {
    let candidates = changed_containers(request, operation);
    // The verifiers' rules, read as the swap reads them, once there is an image to check.
    let with_verifiers;
    let mut unmatched = None;
    let policy = if policy.verifiers.is_empty() || candidates.is_empty() {
        policy
    } else {
        let read;
        (read, unmatched) = with_verifier_rules(policy, &request.namespace, cluster);
        with_verifiers = read;
        &with_verifiers
    };
    if let Some(why) = &policy.verifiers_unreadable {
        let checked = candidates
            .iter()
            .any(|c| mirror_image(c.image, &policy.router).is_some());
        if checked {
            return Outcome::of(Verdict::Error(format!(
                "not checked: could not read the verifier policies whose signatures the check applies ({why})"
            )));
        }
    }
    let limit = Duration::from_millis(policy.lookup_budget_ms);
    let mut budgeted = Budgeted::new(registry, clock, limit);
    let originals = recorded_originals(&request.object);
    let checked = check_all(&candidates, &originals, policy, &mut budgeted);
    let report = budgeted.report();
    let found = Found {
        originals: &originals,
        running: &running_digests(&request.object),
    };
    let mut outcome = check_outcome(&checked, &candidates, &found, policy, &report);
    tell_unmatched(&mut outcome.warnings, &mut outcome.audit, unmatched);
    outcome
}
