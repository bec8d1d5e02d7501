//! The e2e cases of `e2e/cases/`, replayed in the project's own wasm host: the same requests,
//! settings, recorded host interactions and expectations that `e2e/policy.bats` gives to kwctl.

mod rig;

use std::collections::BTreeSet;
use std::path::Path;

use rig::hosts::ReplayHost;
use rig::{read_json, read_yaml, shared, validate, validate_settings};
use serde_json::Value;

/// Text a person reads: one line, no backtrace, no cause list.
fn assert_one_line(name: &str, text: &str) {
    assert!(
        !text.contains('\n') && !text.contains("Stack backtrace") && !text.contains("Caused by"),
        "{name}: {text:?}"
    );
}

/// A case, then its sibling (the case its `sibling` file names) under the case's settings.
fn check_case(dir: &Path, backtrace: bool) {
    check_answer(dir, &dir.join("settings.yml"), backtrace);
    if let Some(sibling) = sibling_of(dir) {
        check_answer(&sibling, &dir.join("settings.yml"), backtrace);
    }
}

/// The case named in `dir/sibling`: a request that, under this case's settings, a policy that
/// accepts everything unchanged would answer wrongly. Shown with the cases that such a policy
/// would pass, so that each of them fails when the policy does not run.
fn sibling_of(dir: &Path) -> Option<std::path::PathBuf> {
    let name = std::fs::read_to_string(dir.join("sibling")).ok()?;
    Some(rig::root().join("e2e/cases").join(name.trim()))
}

fn check_answer(dir: &Path, settings: &Path, backtrace: bool) {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string();
    let expect = read_json(&dir.join("expect.json"));
    let settings = read_yaml(settings);
    if expect["settingsValid"] == Value::Bool(false) {
        let (valid, message) = validate_settings(&settings);
        assert!(!valid, "{name}: settings should be refused");
        let want = expect["message"].as_str().unwrap_or_default();
        assert!(
            message.as_deref().is_some_and(|m| m.contains(want)),
            "{name}: {message:?} lacks {want:?}"
        );
        return;
    }
    assert_eq!(
        validate_settings(&settings),
        (true, None),
        "{name}: settings should be valid"
    );
    let mut replay = ReplayHost::load(&dir.join("session.yml")).expect("session file");
    replay.backtrace = backtrace;
    let recorded = replay.remaining();
    let replay = shared(replay);
    let request = read_json(&dir.join("request.json"));
    let response = validate(&settings, &request, replay.clone());
    assert_eq!(
        Value::Bool(response.accepted),
        expect["allowed"],
        "{name}: allowed; {response:?}"
    );
    match expect["patch"].as_array() {
        None => assert!(
            response.mutated.is_none(),
            "{name}: expected no patch, got {:?}",
            response.mutated
        ),
        Some(operations) => {
            let mutated = response
                .mutated
                .as_ref()
                .unwrap_or_else(|| panic!("{name}: expected a patch"));
            // The whole patch as kwctl computes it (`json_patch::diff` of the request's object
            // and the answer's): every operation, its op, path and value, in order, no more and
            // no fewer.
            let patch = serde_json::to_value(json_patch::diff(&request["object"], mutated))
                .expect("a JSON patch");
            assert_eq!(
                patch.as_array(),
                Some(operations),
                "{name}: the whole patch"
            );
        }
    }
    // The record of unmirrored images is on the Pod exactly when the case expects it.
    let labelled = expect["patch"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|operation| {
            operation["path"] == "/metadata/labels"
                && operation["value"]["image-swapper.kubewarden.io/unmirrored"].is_string()
        });
    assert_eq!(
        response.unmirrored().is_some(),
        labelled,
        "{name}: the unmirrored record {:?}",
        response.unmirrored()
    );
    for text in response.warnings.iter().chain(&response.message) {
        assert_one_line(&name, text);
    }
    // Audit annotations: the same keys, each value the JSON expected; of an object (the
    // summary), the fields expected, so that the times it carries may differ.
    let want = expect["auditAnnotations"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        response.audit.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{name}: audit annotation keys"
    );
    for (key, value) in &want {
        let got = &response.audit[key];
        match value.as_object() {
            Some(fields) => {
                for (field, wanted) in fields {
                    assert_eq!(got.get(field), Some(wanted), "{name}: {key}.{field}");
                }
            }
            None => assert_eq!(got, value, "{name}: {key}"),
        }
    }
    // The whole list of warnings, each to the letter: an extra warning fails.
    let warnings: Vec<&str> = expect["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| w.as_str().unwrap_or_default())
        .collect();
    assert_eq!(response.warnings, warnings, "{name}: warnings");
    if let Some(message) = expect["message"].as_str() {
        assert!(
            response
                .message
                .as_deref()
                .is_some_and(|m| m.contains(message)),
            "{name}: {:?} lacks {message:?}",
            response.message
        );
    }
    // The audit scanner reports a rejection with code 500 as `error`, any other as `fail`.
    match expect["code"].as_u64() {
        Some(code) => assert_eq!(response.code, Some(code), "{name}: code"),
        None if !response.accepted => {
            assert_ne!(
                response.code,
                Some(500),
                "{name}: a finding is not an error"
            )
        }
        None => {}
    }
    let replay = replay.lock().unwrap();
    assert_eq!(
        replay.remaining(),
        0,
        "{name}: recorded lookups left unused; made {:?}",
        replay.calls
    );
    assert_eq!(
        replay.calls.len(),
        recorded,
        "{name}: lookups beyond the recording: {:?}",
        replay.calls
    );
}

fn cases() -> Vec<std::path::PathBuf> {
    let mut dirs: Vec<_> = std::fs::read_dir(rig::root().join("e2e/cases"))
        .expect("e2e/cases")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// The cases of `e2e/cases/`, every one with its recording: a case removed fails here (lower it
/// only in the commit that removes one, saying why; raise it with the cases you add).
const CASES: usize = 53;

/// What a case holds: the request, the settings, the recorded host interactions, the answer.
const CASE_FILES: [&str; 4] = ["request.json", "settings.yml", "session.yml", "expect.json"];

#[test]
fn every_e2e_case_holds_in_the_rig() {
    let cases = cases();
    assert_eq!(cases.len(), CASES, "the e2e cases");
    for dir in &cases {
        for file in CASE_FILES {
            assert!(
                dir.join(file).is_file(),
                "{}: {file} is missing",
                dir.display()
            );
        }
    }
    for dir in cases {
        check_case(&dir, false);
    }
}

/// kwctl under `RUST_BACKTRACE=1` appends a stack backtrace to every replayed error text: the
/// answers a person reads do not change.
#[test]
fn every_e2e_case_holds_with_host_backtraces() {
    for dir in cases() {
        check_case(&dir, true);
    }
}

/// Whether a policy that accepts everything unchanged (no patch, no warning, no message, no
/// audit annotation) answers as `expect` says.
fn a_no_op_policy_passes(expect: &Value) -> bool {
    expect["settingsValid"] != Value::Bool(false)
        && expect["allowed"] == Value::Bool(true)
        && expect["patch"].is_null()
        && expect["message"].is_null()
        && expect["warnings"].as_array().is_none_or(Vec::is_empty)
        && expect["auditAnnotations"]
            .as_object()
            .is_none_or(serde_json::Map::is_empty)
}

/// A case that a policy doing nothing would pass names a sibling that such a policy fails, run
/// under the case's settings (by bats and by `every_e2e_case_holds_in_the_rig`): the case then
/// fails when the policy did not run, not only when it decided wrongly.
#[test]
fn every_case_a_no_op_policy_passes_has_a_sibling_it_fails() {
    let mut passable = Vec::new();
    for dir in cases() {
        if !a_no_op_policy_passes(&read_json(&dir.join("expect.json"))) {
            continue;
        }
        let name = dir.file_name().and_then(|n| n.to_str()).map(str::to_string);
        passable.push(name.clone().unwrap_or_default());
        let sibling = sibling_of(&dir).unwrap_or_else(|| panic!("{name:?}: no sibling"));
        let expect = read_json(&sibling.join("expect.json"));
        assert!(
            !a_no_op_policy_passes(&expect),
            "{name:?}: its sibling {} passes with a no-op policy too",
            sibling.display()
        );
    }
    assert!(passable.len() >= 9, "{passable:?}");
}

#[test]
fn the_bats_suite_runs_every_case_and_only_existing_ones() {
    let bats =
        std::fs::read_to_string(rig::root().join("e2e/policy.bats")).expect("e2e/policy.bats");
    let in_bats: BTreeSet<String> = bats
        .lines()
        .filter_map(|line| line.trim().strip_prefix("check_case "))
        .map(|name| name.trim().to_string())
        .collect();
    let on_disk: BTreeSet<String> = cases()
        .iter()
        .filter_map(|dir| dir.file_name().and_then(|n| n.to_str()).map(str::to_string))
        .collect();
    assert_eq!(in_bats, on_disk);
}

#[test]
fn the_example_session_replays_exactly() {
    let replay =
        shared(ReplayHost::load(&rig::root().join("examples/session.yml")).expect("session"));
    let settings = read_yaml(&rig::root().join("examples/settings.yml"));
    let response = validate(
        &settings,
        &read_json(&rig::root().join("examples/pod.json")),
        replay.clone(),
    );
    assert!(
        response.image("containers", 0).is_some_and(
            |i| i.starts_with("mirror.example.com/dockerhub/library/nginx:1.27@sha256:")
        )
    );
    assert_eq!(
        response.image("containers", 2),
        Some("registry.k8s.io/pause:3.10"),
        "excluded"
    );
    assert_eq!(
        response.image("initContainers", 0),
        Some("busybox:1.36"),
        "missing from the mirror"
    );
    assert_eq!(replay.lock().unwrap().remaining(), 0);
}

/// The expectations of the signature cases follow from the documented table (docs/decisions.md,
/// "Signatures") and the host's recorded answers alone, not from this module's output: a case
/// whose every verification the host trusted at digest D swaps container `web` to the verified
/// repository at the Pod's tag, pinned to D; a case whose verification the host refused keeps
/// (or, with `onUnverified: reject`, refuses) the image, reason `unverified`, in words that
/// carry the host's refusal.
#[test]
fn signature_cases_expect_what_the_table_and_the_recorded_host_say() {
    let mut derived = 0;
    for dir in cases() {
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        if !(name.starts_with("signatures-") || name.starts_with("verifiers-")) {
            continue;
        }
        let expect = read_json(&dir.join("expect.json"));
        let session = std::fs::read_to_string(dir.join("session.yml")).expect("session.yml");
        let exchanges: Vec<Value> = serde_yaml::from_str(&session).expect("session YAML");
        let verifications: Vec<(String, Result<String, String>)> = exchanges
            .iter()
            .filter(|e| {
                e["request"]
                    .as_str()
                    .is_some_and(|r| r.starts_with("!Sigstore"))
            })
            .map(|e| {
                let request: serde_yaml::Value =
                    serde_yaml::from_str(e["request"].as_str().unwrap_or_default())
                        .expect("request");
                let serde_yaml::Value::Tagged(tagged) = request else {
                    panic!("{name}: an untagged request");
                };
                let image = tagged.value["image"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let answer = match e["response"]["type"].as_str() {
                    Some("Success") => {
                        let payload: Value = serde_json::from_str(
                            e["response"]["payload"].as_str().unwrap_or_default(),
                        )
                        .expect("payload");
                        assert_eq!(payload["is_trusted"], Value::Bool(true), "{name}");
                        Ok(payload["digest"].as_str().unwrap_or_default().to_string())
                    }
                    _ => Err(e["response"]["message"]
                        .as_str()
                        .unwrap_or_default()
                        .trim()
                        .to_string()),
                };
                (image, answer)
            })
            .collect();
        let Some((verified, _)) = verifications.first() else {
            continue; // nothing verified: not a case of this table
        };
        let request = read_json(&dir.join("request.json"));
        let written = request["object"]["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap_or_default();
        let swapped = expect["patch"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|operation| operation["path"] == "/spec/containers/0/image")
            .and_then(|operation| operation["value"].as_str());
        match verifications.iter().find_map(|(_, a)| a.as_ref().err()) {
            None => {
                let digests: BTreeSet<&String> = verifications
                    .iter()
                    .filter_map(|(_, a)| a.as_ref().ok())
                    .collect();
                assert_eq!(digests.len(), 1, "{name}: one verified digest");
                let digest = digests.into_iter().next().expect("a digest");
                let repository = verified.split('@').next().unwrap_or_default();
                let repository = match repository.rsplit_once(':') {
                    Some((name, tag)) if !tag.contains('/') => name,
                    _ => repository,
                };
                let tag = written.split('@').next().unwrap_or_default();
                let tag = tag
                    .rsplit_once(':')
                    .map(|(_, t)| t)
                    .filter(|t| !t.contains('/'));
                let wanted = match tag {
                    Some(tag) => format!("{repository}:{tag}@{digest}"),
                    None => format!("{repository}@{digest}"),
                };
                assert_eq!(
                    swapped,
                    Some(wanted.as_str()),
                    "{name}: swapped at the verified digest"
                );
                assert_eq!(expect["allowed"], Value::Bool(true), "{name}");
            }
            Some(refusal) => {
                assert_eq!(swapped, None, "{name}: never swapped past a refusal");
                let settings = read_yaml(&dir.join("settings.yml"));
                let rejected = settings["onUnverified"] == "reject";
                assert_eq!(expect["allowed"], Value::Bool(!rejected), "{name}");
                let (list, text) = if rejected {
                    ("rejected", expect["message"].as_str())
                } else {
                    ("kept", expect["warnings"][0].as_str())
                };
                assert_eq!(
                    expect["auditAnnotations"][list][0]["reason"],
                    Value::from("unverified"),
                    "{name}"
                );
                assert!(
                    text.is_some_and(|t| t.contains(refusal.as_str()) && t.contains(written)),
                    "{name}: {text:?} names the image and the host's {refusal:?}"
                );
            }
        }
        derived += 1;
    }
    // The seven signatures-* cases recorded by real kwctl 1.35, and verifiers-* with sessions.
    assert!(derived >= 9, "only {derived} signature cases derived");
}
