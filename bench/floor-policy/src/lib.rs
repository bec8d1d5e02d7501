//! The floor of `make bench`: what any Rust policy pays to be instantiated, parse the request
//! and answer, with nothing else. image-swapper-policy is measured against it.

use guest::prelude::*;
use kubewarden_policy_sdk::request::ValidationRequest;
use kubewarden_policy_sdk::wapc_guest as guest;
use kubewarden_policy_sdk::{accept_request, protocol_version_guest};

#[unsafe(no_mangle)]
pub extern "C" fn wapc_init() {
    register_function("validate", validate);
    register_function("validate_settings", validate_settings);
    register_function("protocol_version", protocol_version_guest);
}

fn validate(payload: &[u8]) -> CallResult {
    let request = ValidationRequest::<serde_json::Value>::new(payload)?;
    // Touch the object so the parse cannot be optimised away.
    std::hint::black_box(&request.request.object);
    accept_request()
}

fn validate_settings(_payload: &[u8]) -> CallResult {
    Ok(br#"{"valid":true}"#.to_vec())
}
