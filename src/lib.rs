//! image-swapper-policy: a Kubewarden policy that rewrites Pod images to a mirror registry, but
//! only to images the mirror was just seen to hold, pinned to the digest it answered.
//!
//! This file is the waPC wiring only: decode the request, run [`pod::admit`], encode the answer.
//!
//! The modules form layers, each importing only those below it, never two that import each
//! other (docs/development.md, Layout). From the top: the wiring and `host`; `settings`, whose
//! form validates into a [`policy::Policy`]; `pod`, one admission; `plan`, the plan of copies
//! that the fill controller (`fill-mirror`) reads too; `object`, the Pod's JSON; `decide`, the
//! decision for one image, and `inverse`; `budget`; `registry`; `policy`; `verifiers`; `rules`
//! and `signatures`; `reference`, `glob` and `text`. Settings sit above policy, and policy above
//! verifiers.

pub mod budget;
pub mod decide;
pub mod glob;
pub mod host;
pub mod inverse;
mod object;
pub mod plan;
pub mod pod;
pub mod policy;
pub mod reference;
pub mod registry;
pub mod rules;
pub mod settings;
pub mod signatures;
pub mod text;
pub mod verifiers;

use guest::prelude::*;
use kubewarden_policy_sdk::request::ValidationRequest;
use kubewarden_policy_sdk::response::ValidationResponse;
use kubewarden_policy_sdk::settings::{SettingsValidationResponse, Validatable};
use kubewarden_policy_sdk::wapc_guest as guest;
use kubewarden_policy_sdk::{protocol_version_guest, reject_request};

use crate::budget::MonotonicClock;
use crate::pod::{Outcome, Verdict};
use crate::policy::Policy;
use crate::settings::{Settings, parse_settings};

#[unsafe(no_mangle)]
pub extern "C" fn wapc_init() {
    register_function("validate", validate);
    register_function("validate_settings", validate_settings);
    register_function("protocol_version", protocol_version_guest);
}

fn validate(payload: &[u8]) -> CallResult {
    // The lookup budget counts from here: the evaluation timeout counts the whole call.
    let clock = MonotonicClock::start();
    // Not ValidationRequest::new: its error quotes the whole payload, which for a large Pod is
    // a message nobody can read.
    let request: ValidationRequest<Settings> = match serde_json::from_slice(payload) {
        Ok(request) => request,
        Err(error) => {
            let message = format!("cannot read the admission request: {error}");
            return reject_request(Some(message), Some(400), None, None);
        }
    };
    let policy = match Policy::from_settings(&request.settings) {
        Ok(policy) => policy,
        Err(error) => {
            let message = format!("invalid policy settings: {error}");
            return reject_request(Some(message), Some(500), None, None);
        }
    };
    respond(pod::admit(
        request.request,
        &policy,
        &mut host::KubewardenHost,
        &mut host::KubewardenCluster,
        &clock,
    ))
}

/// Answers `{"valid": false, "message": ...}` for every settings error, parse errors included,
/// with the path of the offending field.
fn validate_settings(payload: &[u8]) -> CallResult {
    let result = parse_settings(payload).and_then(|settings| settings.validate());
    let response = SettingsValidationResponse {
        valid: result.is_ok(),
        message: result.err(),
    };
    Ok(serde_json::to_vec(&response)?)
}

fn respond(outcome: Outcome) -> CallResult {
    let (accepted, message, code, mutated_object) = match outcome.verdict {
        Verdict::Accept => (true, None, None, None),
        Verdict::Mutate(object) => (true, None, None, Some(object)),
        Verdict::Reject(message) => (false, Some(message), None, None),
        // Kubewarden's audit scanner reports a rejection with code 500 as an `error`, not a
        // `fail`: the policy could not find out.
        Verdict::Error(message) => (false, Some(message), Some(500), None),
    };
    let audit = outcome.audit;
    let warnings = outcome.warnings;
    let response = ValidationResponse {
        accepted,
        message,
        code,
        mutated_object,
        audit_annotations: (!audit.is_empty()).then(|| audit.into_iter().collect()),
        warnings: (!warnings.is_empty()).then_some(warnings),
    };
    Ok(serde_json::to_vec(&response)?)
}
