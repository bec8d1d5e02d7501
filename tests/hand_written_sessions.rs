//! The e2e cases whose sessions were not recorded by kwctl under the names they use, held against
//! the real tools (kwctl and policy-server 1.35, kube-apiserver 1.36). A case's session is
//! recorded by real kwctl where kwctl can record it (its first line says so); the others are
//! listed in [`HAND_WRITTEN`], each with why kwctl cannot record it as written, and each has a
//! test here that makes the real tool meet what the session stands for (a registry answering as
//! ECR or a two-error envelope does, an API server holding the verifier policies, a policy-server
//! refusing a capability) and compares the real tool's words and the policy's answer with the
//! case's, the loopback host names and digests aside.

mod rig;

use std::path::{Path, PathBuf};

use rig::front;
use rig::images::Image;
use rig::registry::TestRegistry;
use rig::tools::{ControlPlane, PolicyServer, PolicyServerOptions, RealTools, scratch_dir};
use serde_json::{Value, json};

/// The cases kwctl did not record as they stand, and why it cannot.
const HAND_WRITTEN: [(&str, &str); 6] = [
    (
        "capability-not-granted",
        "kwctl run grants every host capability (--allowed-host-capabilities defaults to *): the refusal is policy-server's",
    ),
    (
        "digest-pinned-first-pull",
        "the answer is an ECR pull-through cache's, under ECR's host name, which no loopback registry holds",
    ),
    (
        "envelope-not-only-absent",
        "no registry at the case's host name answers an envelope of two errors",
    ),
    (
        "verifiers-namespaced-signed-swapped",
        "its Kubernetes answers need a cluster holding the verifier policies and its OCI answers registries at fixed ports",
    ),
    (
        "verifiers-namespaced-unsigned-kept",
        "its Kubernetes answers need a cluster holding the verifier policies and its OCI answers registries at fixed ports",
    ),
    (
        "verifiers-unreadable-kept",
        "its Kubernetes answer needs a cluster without Kubewarden's CRDs",
    ),
];

const RECORDED: &str = "# Recorded by real kwctl";

fn case_dir(name: &str) -> PathBuf {
    rig::root().join("e2e/cases").join(name)
}

fn expect(name: &str) -> Value {
    rig::read_json(&case_dir(name).join("expect.json"))
}

fn session(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(case_dir(name).join("session.yml")).expect("session.yml");
    exchanges(&text)
}

/// A session's exchanges as `{"tag", "request", "ok", "answer"}`: the request's tag and fields,
/// and the answer's payload or error message.
fn exchanges(text: &str) -> Vec<Value> {
    let entries: Vec<serde_yaml::Value> = serde_yaml::from_str(text).expect("session YAML");
    entries
        .into_iter()
        .map(|entry| {
            let request = entry["request"].as_str().expect("request text").to_string();
            let (tag, fields) = request.split_once('\n').expect("a tag line");
            let fields: Value = serde_yaml::from_str(fields).expect("request fields");
            let response = &entry["response"];
            let ok = response["type"].as_str() == Some("Success");
            let answer = if ok {
                response["payload"].as_str()
            } else {
                response["message"].as_str()
            };
            json!({"tag": tag.trim(), "request": fields, "ok": ok, "answer": answer.unwrap_or_default()})
        })
        .collect()
}

/// `text` with every `from` written as `to`, in the order given (a URL before its host).
fn renamed(text: &str, names: &[(String, String)]) -> String {
    names
        .iter()
        .fold(text.to_string(), |text, (from, to)| text.replace(from, to))
}

/// What of kwctl's AdmissionResponse the e2e suite compares, in expect.json's form.
fn as_expected(answer: &Value) -> Value {
    let mut said = json!({
        "allowed": answer["allowed"],
        "warnings": answer["warnings"].as_array().cloned().unwrap_or_default(),
        "message": answer["status"]["message"],
    });
    said["patch"] = match answer["patch"].as_str() {
        None => Value::Null,
        Some(patch) => {
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(patch)
                .expect("base64");
            // The whole JSON patch: operations, paths, values and their order.
            serde_json::from_slice(&bytes).expect("JSON patch")
        }
    };
    said
}

fn expected(name: &str) -> Value {
    let expect = expect(name);
    json!({
        "allowed": expect["allowed"],
        "warnings": expect["warnings"].as_array().cloned().unwrap_or_default(),
        "message": expect["message"],
        "patch": expect["patch"],
    })
}

/// Every case whose session kwctl did not record is listed above with its reason, and every
/// listed case is still written by hand: a new hand-written session needs a test here.
#[test]
fn every_session_kwctl_did_not_record_is_held_here() {
    let listed: Vec<&str> = HAND_WRITTEN.iter().map(|(name, _)| *name).collect();
    let mut unrecorded = Vec::new();
    for entry in std::fs::read_dir(rig::root().join("e2e/cases")).expect("e2e/cases") {
        let dir = entry.expect("case").path();
        let session = std::fs::read_to_string(dir.join("session.yml")).unwrap_or_default();
        if !session.starts_with(RECORDED) && !exchanges(&session).is_empty() {
            unrecorded.push(
                dir.file_name()
                    .expect("name")
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    unrecorded.sort();
    assert_eq!(unrecorded, listed, "the sessions not recorded by kwctl");
    for (name, why) in HAND_WRITTEN {
        let session =
            std::fs::read_to_string(case_dir(name).join("session.yml")).expect("session.yml");
        assert!(
            session.starts_with("# Written"),
            "{name}: its first line says it was written by hand ({why})"
        );
    }
}

/// policy-server 1.35 with a `policies.yml` entry that grants no host capability: the policy's
/// lookup is refused in the words the case's session holds, and the policy answers what the case
/// expects.
#[test]
fn capability_not_granted_is_policy_servers_refusal() {
    let Some(tools) = RealTools::find("capability_not_granted_is_policy_servers_refusal") else {
        return;
    };
    let name = "capability-not-granted";
    let settings = rig::read_yaml(&case_dir(name).join("settings.yml"));
    let request = rig::read_json(&case_dir(name).join("request.json"));
    let policies = json!({
        "image-swapper": {
            "module": format!("file://{}", tools.annotated_policy().display()),
            "allowedToMutate": true,
            "settings": settings,
        }
    });
    let server = PolicyServer::start(
        &tools,
        &serde_yaml::to_string(&policies).expect("YAML"),
        PolicyServerOptions::default(),
    );
    let (answer, _) = server.post("validate/image-swapper", &PolicyServer::review(&request));
    let response = &answer["response"];
    let written = session(name);
    assert_eq!(written.len(), 1, "{name}: one exchange");
    let expect = expect(name);
    assert_eq!(response["allowed"], expect["allowed"], "{answer}");
    assert_eq!(
        response["warnings"], expect["warnings"],
        "{name}: policy-server's refusal, as the policy words it"
    );
    assert!(response["patch"].is_null(), "{answer}");
    // The session's text is the refusal the policy read: the warning quotes the capability.
    assert!(
        written[0]["answer"]
            .as_str()
            .is_some_and(|text| text.contains("'oci/v1/manifest_digest' host capability")),
        "{written:?}"
    );
}

/// A registry relay on loopback that answers manifest requests whose path ends with `refused`
/// with `status` and the error envelope `errors`, and relays the rest to `registry`.
fn refusing_front(
    registry: &TestRegistry,
    refused: &str,
    status: u16,
    errors: Value,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    let refused = refused.to_string();
    let body = json!({"errors": errors}).to_string();
    front::relay("hand-written", &registry.host, move |_, url| {
        url.ends_with(&refused).then(|| (status, body.clone()))
    })
    .expect("relay")
}

/// kwctl, live, recording: what it answered and what it recorded.
fn kwctl_live(
    tools: &RealTools,
    settings: &Value,
    request: &Value,
    insecure: &[&str],
    env: &[(&str, &Path)],
) -> (Value, Vec<Value>) {
    let dir = scratch_dir("hand-written");
    let sources = dir.join("sources.yml");
    std::fs::write(&sources, format!("insecure_sources: {}\n", json!(insecure))).expect("sources");
    let recording = dir.join("session.yml");
    let mut extra: Vec<&std::ffi::OsStr> = vec![
        "--sources-path".as_ref(),
        sources.as_os_str(),
        "--record-host-capabilities-interactions".as_ref(),
        recording.as_os_str(),
    ];
    if !env.is_empty() {
        extra.push("--allow-context-aware".as_ref());
    }
    let (answer, _) = tools.kwctl_run(&tools.annotated_policy(), settings, request, &extra, env);
    let recorded = exchanges(&std::fs::read_to_string(&recording).expect("kwctl's recording"));
    let _ = std::fs::remove_dir_all(&dir);
    (answer, recorded)
}

/// An ECR pull-through cache asked by digest for an image it has not stored answers "Requested
/// image not found": against a relay answering so, real kwctl records the case's first exchange
/// (the first line of the error, as kwctl records an error).
#[test]
fn an_ecr_pull_through_caches_first_answer_is_kwctls() {
    let Some(tools) = RealTools::find("an_ecr_pull_through_caches_first_answer_is_kwctls") else {
        return;
    };
    let name = "digest-pinned-first-pull";
    let registry = TestRegistry::start("hand-written-ecr").expect("registry (make deps)");
    let image = Image::new("nginx 1.27", "linux/amd64");
    let digest = image.push(&registry, "docker-hub/library/nginx", Some("1.27"));
    let (host, stop) = refusing_front(
        &registry,
        &format!("/manifests/{digest}"),
        404,
        json!([{"code": "MANIFEST_UNKNOWN", "message": "Requested image not found"}]),
    );
    let written = session(name);
    let case_digest = "sha256:3a25d2cf1dfc34e2a6cbe33f4b8e0f2ff0a7c1d3e5b7f9a1c3e5d7f9b1a3c5e7";
    let ecr = "123456789012.dkr.ecr.eu-west-1.amazonaws.com";
    let names = [
        (format!("http://{host}"), format!("https://{ecr}")),
        (host.clone(), ecr.to_string()),
        (digest.clone(), case_digest.to_string()),
    ];
    let settings =
        json!({"mirrors": [{"source": "docker.io", "target": format!("{host}/docker-hub")}]});
    let mut request = rig::read_json(&case_dir(name).join("request.json"));
    request["object"]["spec"]["containers"][0]["image"] = json!(format!("nginx:1.27@{digest}"));
    // On a loopback host the policy does not take the mirror for ECR's pull-through cache, so
    // it asks nothing after the refusal: only the refusal is compared. What the policy answers
    // on ECR's host, the e2e suite replays.
    let (_, recorded) = kwctl_live(&tools, &settings, &request, &[&host], &[]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let real: Value =
        serde_json::from_str(&renamed(&recorded[0].to_string(), &names)).expect("JSON");
    let ours = &written[0];
    assert_eq!(real["tag"], ours["tag"]);
    assert_eq!(real["request"], ours["request"]);
    assert_eq!(real["ok"], ours["ok"]);
    assert_eq!(
        real["answer"].as_str(),
        ours["answer"]
            .as_str()
            .unwrap_or_default()
            .split("\n\n")
            .next(),
        "{name}: kwctl's words for ECR's answer"
    );
}

/// A registry whose error envelope holds two errors (authentication required, manifest unknown):
/// real kwctl joins them as the case's session writes them, and the policy answers the case's
/// warning.
#[test]
fn an_envelope_of_two_errors_is_kwctls() {
    let Some(tools) = RealTools::find("an_envelope_of_two_errors_is_kwctls") else {
        return;
    };
    let name = "envelope-not-only-absent";
    let registry = TestRegistry::start("hand-written-envelope").expect("registry (make deps)");
    let (host, stop) = refusing_front(
        &registry,
        "/manifests/1.27",
        404,
        json!([
            {"code": "UNAUTHORIZED", "message": "authentication required"},
            {"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"},
        ]),
    );
    let written = session(name);
    let names = [
        (
            format!("http://{host}"),
            "https://mirror.example.com".to_string(),
        ),
        (host.clone(), "mirror.example.com".to_string()),
    ];
    let settings = rig::read_yaml(&case_dir(name).join("settings.yml"));
    let settings: Value =
        serde_json::from_str(&settings.to_string().replace("mirror.example.com", &host))
            .expect("JSON");
    let request = rig::read_json(&case_dir(name).join("request.json"));
    let (answer, recorded) = kwctl_live(&tools, &settings, &request, &[&host], &[]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(recorded.len(), written.len(), "{recorded:?}");
    let real: Value =
        serde_json::from_str(&renamed(&recorded[0].to_string(), &names)).expect("JSON");
    assert_eq!(real["request"], written[0]["request"]);
    assert_eq!(
        real["answer"].as_str(),
        written[0]["answer"]
            .as_str()
            .unwrap_or_default()
            .split("\n\n")
            .next(),
        "{name}: kwctl's words for two errors"
    );
    let said: Value =
        serde_json::from_str(&renamed(&as_expected(&answer).to_string(), &names)).expect("JSON");
    assert_eq!(said, expected(name), "{name}: the policy's answer");
}

/// The policies a Kubernetes answer of the session lists, made objects of the API server again
/// (the fields the server sets dropped; the fields the CRD requires that the field masks left out
/// filled in).
fn objects_listed(written: &[Value]) -> Vec<Value> {
    let mut objects = Vec::new();
    for exchange in written {
        if !exchange["tag"]
            .as_str()
            .unwrap_or_default()
            .starts_with("!Kubernetes")
        {
            continue;
        }
        let list: Value = serde_json::from_str(exchange["answer"].as_str().unwrap_or("{}"))
            .unwrap_or(Value::Null);
        for item in list["items"].as_array().into_iter().flatten() {
            let mut object = item.clone();
            let metadata = &mut object["metadata"];
            for field in [
                "uid",
                "resourceVersion",
                "managedFields",
                "creationTimestamp",
            ] {
                if let Some(metadata) = metadata.as_object_mut() {
                    metadata.remove(field);
                }
            }
            object["spec"]["mutating"] = json!(false);
            object["spec"]["rules"] = json!([]);
            objects.push(object);
        }
    }
    objects
}

/// A Kubernetes list's answer with the fields the API server sets blanked, to compare a recorded
/// list with a written one.
fn list_without_server_fields(answer: &str) -> Value {
    let mut list: Value = serde_json::from_str(answer).unwrap_or(Value::Null);
    for item in list["items"].as_array_mut().into_iter().flatten() {
        if let Some(metadata) = item["metadata"].as_object_mut() {
            for field in [
                "uid",
                "resourceVersion",
                "managedFields",
                "creationTimestamp",
                "generation",
            ] {
                metadata.remove(field);
            }
        }
    }
    list
}

/// The Kubernetes exchanges of the `verifiers-*` sessions are what real kwctl records from a real
/// API server that holds the policies the session lists (or, for the unreadable case, lacks
/// Kubewarden's CRDs): the same requests in the same order, the same lists but for the fields
/// the server sets, the same refusal. (Their OCI exchanges are real kwctl's recordings of the
/// `signatures-*` cases, whose registries listened at the ports the sessions name.)
#[test]
fn the_verifiers_kubernetes_answers_are_kwctls() {
    let Some(tools) = RealTools::find("the_verifiers_kubernetes_answers_are_kwctls") else {
        return;
    };
    for name in [
        "verifiers-namespaced-signed-swapped",
        "verifiers-namespaced-unsigned-kept",
        "verifiers-unreadable-kept",
    ] {
        let plane = ControlPlane::start(&tools, false);
        let written = session(name);
        let kubernetes: Vec<&Value> = written
            .iter()
            .filter(|e| {
                e["tag"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("!Kubernetes"))
            })
            .collect();
        if name != "verifiers-unreadable-kept" {
            plane.kubectl_ok(
                &[
                    "apply",
                    "-f",
                    &rig::root()
                        .join("scripts/kubewarden-crds")
                        .to_string_lossy(),
                ],
                None,
            );
            plane.kubectl_ok(
                &[
                    "wait",
                    "--for=condition=Established",
                    "crd",
                    "--all",
                    "--timeout=60s",
                ],
                None,
            );
            for exchange in &kubernetes {
                if let Some(namespace) = exchange["request"]["namespace"].as_str() {
                    let _ = plane.kubectl(&["create", "namespace", namespace], None);
                }
            }
            for object in objects_listed(&written) {
                plane.kubectl_ok(&["create", "-f", "-"], Some(&object.to_string()));
            }
        }
        let settings = rig::read_yaml(&case_dir(name).join("settings.yml"));
        let request = rig::read_json(&case_dir(name).join("request.json"));
        let (_, recorded) = kwctl_live(
            &tools,
            &settings,
            &request,
            &[],
            &[("KUBECONFIG", &plane.kubeconfig)],
        );
        let recorded: Vec<&Value> = recorded
            .iter()
            .filter(|e| {
                e["tag"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("!Kubernetes"))
            })
            .collect();
        assert_eq!(
            recorded.len(),
            kubernetes.len(),
            "{name}: kwctl's Kubernetes calls {recorded:?}"
        );
        for (real, ours) in recorded.iter().zip(&kubernetes) {
            assert_eq!(real["tag"], ours["tag"], "{name}");
            assert_eq!(real["request"], ours["request"], "{name}");
            assert_eq!(real["ok"], ours["ok"], "{name}: {real}");
            if ours["ok"] == json!(true) {
                assert_eq!(
                    list_without_server_fields(real["answer"].as_str().unwrap_or_default()),
                    list_without_server_fields(ours["answer"].as_str().unwrap_or_default()),
                    "{name}: the list"
                );
            } else {
                assert_eq!(real["answer"], ours["answer"], "{name}: the refusal");
            }
        }
    }
}
