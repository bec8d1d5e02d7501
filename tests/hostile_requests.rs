//! Requests no API server should send, and some it will: each gets a defined answer from the
//! built module, never a trap. Targets come only from the settings.

mod rig;

use rig::hosts::InstantHost;
use rig::wapc::SharedHost;
use rig::{Response, pod_request, shared};
use serde_json::{Value, json};

const MIRROR_NGINX: &str = "mirror.example.com/dockerhub/library/nginx:1.27";
const ORIGINALS: &str = "image-swapper.kubewarden.io/original-images";
const DIGEST: &str = "sha256:3a25d2cf1dfc34e2a6cbe33f4b8e0f2ff0a7c1d3e5b7f9a1c3e5d7f9b1a3c5e7";

fn settings() -> Value {
    json!({"mirrors": [{"source": "docker.io", "target": "mirror.example.com/dockerhub"}]})
}

fn host() -> SharedHost {
    let mut host = InstantHost::default();
    host.digests
        .insert(MIRROR_NGINX.to_string(), DIGEST.to_string());
    shared(host)
}

/// Calls `validate` and insists on an answer: a trap or a guest error fails the test.
fn answer(request: &Value) -> Response {
    answer_with(&settings(), request)
}

fn answer_with(settings: &Value, request: &Value) -> Response {
    let payload = json!({"settings": settings, "request": request}).to_string();
    let evaluation = rig::policy().call("validate", payload.as_bytes(), host());
    match evaluation.result {
        Ok(bytes) => rig::parse_response(&bytes),
        Err(error) => panic!(
            "no answer for {}: {error}",
            &request.to_string().chars().take(200).collect::<String>()
        ),
    }
}

fn with_object(object: Value) -> Value {
    let mut request = pod_request("CREATE", json!({}));
    request["object"] = object;
    request
}

#[test]
fn malformed_pods_are_accepted_unchanged() {
    let cases = [
        with_object(Value::Null),
        with_object(json!("a pod")),
        with_object(json!([1, 2])),
        with_object(json!({"kind": "Pod"})),
        with_object(json!({"spec": null})),
        with_object(json!({"spec": []})),
        with_object(json!({"spec": {"containers": null}})),
        with_object(json!({"spec": {"containers": {"name": "web"}}})),
        with_object(json!({"spec": {"containers": [null, 7, "nginx", [], {}]}})),
        with_object(
            json!({"spec": {"containers": [{"name": "web"}, {"image": null}, {"image": 5}, {"image": ["nginx"]}]}}),
        ),
    ];
    for request in cases {
        let response = answer(&request);
        assert!(
            response.accepted && response.mutated.is_none(),
            "{request}: {response:?}"
        );
    }
}

/// A container without a name is swapped like any other, and left out of the original-images
/// record: the record is keyed by container name, and the re-apply rule finds a container's
/// entry by its name, so an entry under no name could be matched to no container (and several
/// nameless containers would share it). The API server refuses a Pod whose containers lack
/// names, so such a container only comes from a hand-made request.
#[test]
fn containers_without_names_are_swapped_and_left_out_of_the_record() {
    let response = answer(&pod_request(
        "CREATE",
        json!({"containers": [{"image": "nginx:1.27"}]}),
    ));
    assert_eq!(
        response.image("containers", 0),
        Some(format!("{MIRROR_NGINX}@{DIGEST}").as_str())
    );
    let pod = response.mutated.as_ref().expect("mutated");
    assert_eq!(
        pod["metadata"]["annotations"].get(ORIGINALS),
        None,
        "no record for a nameless container: {pod}"
    );
}

#[test]
fn bad_image_strings_are_kept_with_a_warning() {
    let long = format!("nginx:{}", "a".repeat(1_000_000));
    for image in [
        "",
        " ",
        "NGINX",
        "nginx:1.27 ",
        "docker.io/../evil",
        "nginx@sha256:zz",
        "ñginx:1",
        "nginx:ta\u{0}g",
        "🐳/x:1",
        long.as_str(),
    ] {
        let response = answer(&pod_request(
            "CREATE",
            json!({"containers": [{"name": "web", "image": image}]}),
        ));
        assert!(
            response.accepted && response.mutated.is_none(),
            "{response:?}"
        );
        assert!(
            response.warned("not a valid image reference"),
            "{:?}",
            response.warnings
        );
        assert!(
            response.warnings.iter().all(|w| w.len() < 600),
            "warnings are cut to a readable length"
        );
    }
}

#[test]
fn unknown_kinds_operations_and_subresources_are_accepted_unchanged() {
    let pod = pod_request(
        "CREATE",
        json!({"containers": [{"name": "web", "image": "nginx:1.27"}]}),
    );
    let mut cases = Vec::new();
    for (field, value) in [
        (
            "kind",
            json!({"group": "", "version": "v1", "kind": "Service"}),
        ),
        (
            "kind",
            json!({"group": "example.com", "version": "v1", "kind": "Pod"}),
        ),
        ("operation", json!("DELETE")),
        ("operation", json!("CONNECT")),
        ("operation", json!("")),
        ("subResource", json!("status")),
        ("subResource", json!("binding")),
        ("subResource", json!("exec")),
    ] {
        let mut request = pod.clone();
        request[field] = value;
        cases.push(request);
    }
    for request in cases {
        let response = answer(&request);
        assert!(
            response.accepted && response.mutated.is_none(),
            "{request}: {response:?}"
        );
    }
}

#[test]
fn a_request_that_is_not_an_admission_request_is_rejected_with_a_short_reason() {
    let mut null_kind = pod_request(
        "CREATE",
        json!({"containers": [{"name": "web", "image": "nginx:1.27"}]}),
    );
    null_kind["kind"] = Value::Null;
    let null_kind = json!({"settings": settings(), "request": null_kind}).to_string();
    for payload in [
        "",
        "null",
        "[]",
        "{\"settings\": 5}",
        "{\"settings\": {}, \"request\": 5}",
        "\u{0}\u{1}",
        &null_kind,
    ] {
        let evaluation = rig::policy().call("validate", payload.as_bytes(), host());
        let response = rig::parse_response(
            &evaluation
                .result
                .unwrap_or_else(|e| panic!("{payload:?}: {e}")),
        );
        assert!(!response.accepted, "{payload:?}");
        let message = response.message.unwrap_or_default();
        assert!(
            message.starts_with("cannot read the admission request: ") && message.len() < 300,
            "{message}"
        );
    }
}

#[test]
fn ten_thousand_containers_get_an_answer() {
    let containers: Vec<Value> = (0..10_000)
        .map(|i| json!({"name": format!("c{i}"), "image": if i % 2 == 0 { "nginx:1.27".to_string() } else { format!("ghcr.io/x/app-{i}:1") }}))
        .collect();
    let evaluation = rig::policy().call(
        "validate",
        json!({"settings": settings(), "request": pod_request("CREATE", json!({"containers": containers}))}).to_string().as_bytes(),
        host(),
    );
    let response = rig::parse_response(&evaluation.result.expect("an answer"));
    assert_eq!(
        response.image("containers", 9_998),
        Some(format!("{MIRROR_NGINX}@{DIGEST}").as_str())
    );
    assert_eq!(
        response.image("containers", 9_999),
        Some("ghcr.io/x/app-9999:1")
    );
    assert!(
        evaluation.memory_bytes < 512 << 20,
        "{} bytes of guest memory",
        evaluation.memory_bytes
    );
}

#[test]
fn update_with_a_garbage_old_object_treats_every_image_as_new() {
    let mut request = pod_request(
        "UPDATE",
        json!({"containers": [{"name": "web", "image": "nginx:1.27"}]}),
    );
    request["oldObject"] = json!({"spec": {"containers": "garbage"}});
    let response = answer(&request);
    assert_eq!(
        response.image("containers", 0),
        Some(format!("{MIRROR_NGINX}@{DIGEST}").as_str())
    );
}

#[test]
fn odd_annotations_and_pull_secrets_are_repaired_not_trusted() {
    let mut request = pod_request(
        "CREATE",
        json!({"imagePullSecrets": "not a list", "containers": [{"name": "web", "image": "nginx:1.27"}]}),
    );
    request["object"]["metadata"]["annotations"] = json!({
        "image-swapper.kubewarden.io/original-images": "{not json",
        "image-swapper.kubewarden.io/target": "evil.example.com",
    });
    let mut settings = settings();
    settings["mirrors"][0]["pullSecret"] = json!("mirror-pull");
    let response = answer_with(&settings, &request);
    let pod = response.mutated.as_ref().expect("swapped");
    assert_eq!(
        pod["spec"]["containers"][0]["image"],
        json!(format!("{MIRROR_NGINX}@{DIGEST}"))
    );
    assert_eq!(
        pod["spec"]["imagePullSecrets"],
        json!([{"name": "mirror-pull"}])
    );
    assert_eq!(
        pod["metadata"]["annotations"]["image-swapper.kubewarden.io/original-images"],
        json!(r#"{"web":"nginx:1.27"}"#)
    );
    assert_eq!(
        pod["metadata"]["annotations"]["image-swapper.kubewarden.io/target"],
        json!("evil.example.com"),
        "left as it was"
    );
}

/// A Pod cannot choose its mirror: whatever it carries, the swapped image is the settings'
/// target plus the digest the host verified, and an image under a target is looked up by nobody.
#[test]
fn the_pod_never_chooses_the_mirror() {
    let mut request = pod_request(
        "CREATE",
        json!({"containers": [
            {"name": "web", "image": "nginx:1.27", "mirror": "evil.example.com", "imageMirror": "evil.example.com/x"},
            {"name": "evil", "image": "evil.example.com/dockerhub/library/nginx:1.27"},
        ]}),
    );
    request["object"]["metadata"]["annotations"] =
        json!({"image-swapper.kubewarden.io/mirror": "evil.example.com"});
    let response = answer(&request);
    assert_eq!(
        response.image("containers", 0),
        Some(format!("{MIRROR_NGINX}@{DIGEST}").as_str())
    );
    assert_eq!(
        response.image("containers", 1),
        Some("evil.example.com/dockerhub/library/nginx:1.27")
    );
}

/// Nor through the live Pod's record of original images, the one thing of the Pod the policy
/// reads back (the re-apply rule): an UPDATE whose live Pod carries a record its author wrote
/// is decided afresh when the record does not describe what the container runs. `web` runs a
/// mirror the settings do not route to and records `nginx:1.27` as its original; `cache` runs
/// the settings' nginx mirror image and records `redis:7`. Trusting the record would keep
/// `evil.example.com` for `web` and nginx for a container that asks for redis.
#[test]
fn a_forged_record_of_original_images_chooses_nothing_on_update() {
    let forged = json!(r#"{"web":"nginx:1.27","cache":"redis:7"}"#);
    let mut request = pod_request(
        "UPDATE",
        json!({"containers": [
            {"name": "web", "image": "nginx:1.27"},
            {"name": "cache", "image": "redis:7"},
        ]}),
    );
    request["object"]["metadata"]["annotations"] = json!({ORIGINALS: forged});
    let mut old = request["object"].clone();
    old["spec"]["containers"] = json!([
        {"name": "web", "image": "evil.example.com/dockerhub/library/nginx:1.27"},
        {"name": "cache", "image": format!("{MIRROR_NGINX}@{DIGEST}")},
    ]);
    request["oldObject"] = old;
    let response = answer(&request);
    assert!(response.accepted, "{response:?}");
    assert_eq!(
        response.image("containers", 0),
        Some(format!("{MIRROR_NGINX}@{DIGEST}").as_str()),
        "web: decided afresh, swapped to the settings' target"
    );
    assert_eq!(
        response.image("containers", 1),
        Some("redis:7"),
        "cache: decided afresh (the mirror lacks redis), not kept on the nginx it ran: {:?}",
        response.warnings
    );
}
