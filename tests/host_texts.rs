//! The host's error texts in both shapes, through the built module: policy-server up to 1.37
//! writes an error's chain as anyhow's debug form (first line, `Caused by:` list), 1.38 on one
//! line (`outer: cause: cause`, its caches' `anyhow!("{e:#}")`), either with a backtrace under
//! `RUST_BACKTRACE=1`. Each failure the policy classifies, asked of a real registry on loopback
//! in every shape, ends in the same warnings, message and audit annotations, which say what the
//! registry said.

mod rig;

use rig::cosign::Signer;
use rig::hanging::HangingRegistry;
use rig::hosts::{ErrorShape, Fork, LiveHost};
use rig::images::Image;
use rig::registry::TestRegistry;
use rig::wapc::Host;
use rig::{Response, pod_request, shared, validate};
use serde_json::{Value, json};
use std::time::Duration;

const REPOSITORY: &str = "hub/library/nginx";

fn pod(image: &str) -> Value {
    pod_request(
        "CREATE",
        json!({"containers": [{"name": "web", "image": image}]}),
    )
}

fn settings(mirror: &str, extra: Value) -> Value {
    let mut settings =
        json!({"mirrors": [{"source": "docker.io", "target": format!("{mirror}/hub")}]});
    if let (Some(settings), Some(extra)) = (settings.as_object_mut(), extra.as_object()) {
        settings.extend(extra.clone());
    }
    settings
}

/// Every shape a host may write: 1.31/1.35's and 1.38's, each with and without a backtrace.
const SHAPES: [(ErrorShape, bool); 4] = [
    (ErrorShape::Debug, false),
    (ErrorShape::Debug, true),
    (ErrorShape::Alternate, false),
    (ErrorShape::Alternate, true),
];

/// What a person and the audit log see of an answer, without the timings (which differ from
/// run to run).
fn said(response: &Response) -> (bool, Option<String>, Vec<String>, Value) {
    let mut audit = Value::Object(response.audit.clone());
    if let Some(summary) = audit.get_mut("summary").and_then(Value::as_object_mut) {
        summary.retain(|key, _| !key.ends_with("Milliseconds"));
    }
    (
        response.accepted,
        response.message.clone(),
        response.warnings.clone(),
        audit,
    )
}

/// The host text one shape gives for `image`, to show the shapes differ where they should.
fn text(host: &LiveHost, image: &str) -> String {
    host.fork()
        .call(
            "kubewarden",
            "oci",
            "v1/manifest_digest",
            json!(image).to_string().as_bytes(),
        )
        .expect_err("a failure")
}

/// Admits `request` under `settings` in every shape; asserts the answers say the same, and
/// returns it. The texts themselves differ: the one-line shape has no `Caused by:`.
fn in_every_shape(settings: &Value, request: &Value, asked: &str) -> Response {
    let mut first: Option<(Response, String)> = None;
    for (shape, backtrace) in SHAPES {
        let host = LiveHost {
            error_shape: shape,
            backtrace,
            ..LiveHost::default()
        };
        let written = text(&host, asked);
        assert_eq!(
            written.contains("\n\nCaused by:"),
            shape == ErrorShape::Debug,
            "{shape:?}: {written:?}"
        );
        let response = validate(settings, request, shared(host));
        match &first {
            None => first = Some((response, written)),
            Some((seen, seen_text)) => assert_eq!(
                said(&response),
                said(seen),
                "{shape:?}, backtrace {backtrace}, from {written:?}, against {seen_text:?}"
            ),
        }
    }
    first.map(|(response, _)| response).expect("four shapes")
}

#[test]
fn an_absent_image_is_missing_in_every_shape() {
    let mirror = TestRegistry::start("texts-absent").expect("registry");
    let request = pod("nginx:1.27");
    let response = in_every_shape(
        &settings(&mirror.host, json!({})),
        &request,
        &format!("{}/{REPOSITORY}:1.27", mirror.host),
    );
    assert!(response.accepted && response.images_unchanged(&request));
    assert!(
        response.warned("the mirror does not have it (registry: manifest unknown)"),
        "{:?}",
        response.warnings
    );
    assert_eq!(response.audit["kept"][0]["reason"], json!("absent"));
}

#[test]
fn a_registry_that_refuses_the_connection_is_a_lookup_error_in_every_shape() {
    let mut mirror = TestRegistry::start("texts-down").expect("registry");
    mirror.stop();
    let request = pod("nginx:1.27");
    let response = in_every_shape(
        &settings(&mirror.host, json!({"onLookupError": "reject"})),
        &request,
        &format!("{}/{REPOSITORY}:1.27", mirror.host),
    );
    assert!(!response.accepted);
    assert_eq!(
        response.message.as_deref().map(|m| m.ends_with(&format!(
            "could not look it up (error sending request for url (http://{}/v2/{REPOSITORY}/manifests/1.27): Connection refused (os error 111)); onLookupError is reject",
            mirror.host
        ))),
        Some(true),
        "{:?}",
        response.message
    );
    assert_eq!(
        response.audit["rejected"],
        json!([{"image": "nginx:1.27", "reason": "lookup-error"}])
    );
}

#[test]
fn refused_credentials_name_the_secret_in_every_shape() {
    let mirror =
        TestRegistry::start_with_basic_auth("texts-401", "puller", "s3cret").expect("registry");
    let request = pod("nginx:1.27");
    let response = in_every_shape(
        &settings(&mirror.host, json!({})),
        &request,
        &format!("{}/{REPOSITORY}:1.27", mirror.host),
    );
    assert!(response.accepted && response.images_unchanged(&request));
    assert!(
        response.warned(&format!(
            "could not look it up (registry {host} refused policy-server's credentials for it, or policy-server has none (Not authorized: url http://{host}/v2/{REPOSITORY}/manifests/1.27): lookups use the docker config in the PolicyServer's imagePullSecret",
            host = mirror.host
        )),
        "{:?}",
        response.warnings
    );
    assert_eq!(response.audit["kept"][0]["reason"], json!("lookup-error"));
}

#[test]
fn a_registry_that_hangs_up_is_a_lookup_error_in_every_shape() {
    let hanging = HangingRegistry::start(Duration::from_millis(200)).expect("hanging registry");
    let request = pod("nginx:1.27");
    let response = in_every_shape(
        &settings(&hanging.host, json!({})),
        &request,
        &format!("{}/{REPOSITORY}:1.27", hanging.host),
    );
    assert!(response.accepted && response.images_unchanged(&request));
    assert_eq!(
        response.warnings[0],
        format!(
            "image \"nginx:1.27\": kept, not swapped to \"{}/{REPOSITORY}:1.27\": could not look it up (error sending request for url (http://{}/v2/{REPOSITORY}/manifests/1.27): connection closed before message completed)",
            hanging.host, hanging.host
        )
    );
}

/// A verification's texts: a copy whose signature the mirror lacks (`no signatures found`, one
/// error) and a copy the mirror lacks (`failed to get image trusted layers: Cannot fetch
/// manifest of ...`, a chain whose first error repeats its cause), in every shape.
#[test]
fn verification_refusals_say_the_same_in_every_shape() {
    let signer = Signer::generate();
    let source = TestRegistry::start("texts-sig-source").expect("registry");
    let mirror = TestRegistry::start("texts-sig-mirror").expect("registry");
    let signed = Image::new("texts signed", "linux/amd64");
    let digest = signed.push(&source, "org/app", Some("signed"));
    signer.sign(&source, "org/app", &digest, &[]);
    signed.push(&mirror, "cache/org/app", Some("signed"));
    let settings = json!({
        "mirrors": [{"source": source.host, "target": format!("{}/cache", mirror.host)}],
        "signatures": [{"image": format!("{}/org/*", source.host), "pubKeys": [signer.public_pem]}],
        "verifySource": false,
    });

    let unsigned_copy = format!("{}/org/app:signed", source.host);
    let response = in_every_shape(
        &settings,
        &pod(&unsigned_copy),
        &format!("{}/cache/org/app:absent", mirror.host),
    );
    assert!(
        response.warned(&format!(
            "its copy there does not verify (not signed with its public key: no signatures found for image: {}/cache/org/app:signed)",
            mirror.host
        )),
        "{:?}",
        response.warnings
    );
    assert_eq!(response.audit["kept"][0]["reason"], json!("unverified"));

    let other = Image::new("texts other", "linux/amd64");
    let other_digest = other.push(&source, "org/app", Some("only-at-source"));
    signer.sign(&source, "org/app", &other_digest, &[]);
    let absent_copy = format!("{}/org/app:only-at-source", source.host);
    let response = in_every_shape(
        &settings,
        &pod(&absent_copy),
        &format!("{}/cache/org/app:only-at-source", mirror.host),
    );
    assert!(
        response.warned("the mirror does not have it (registry: manifest unknown)"),
        "{:?}",
        response.warnings
    );
    assert_eq!(response.audit["kept"][0]["reason"], json!("absent"));
}
