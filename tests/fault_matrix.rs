//! Every way a host answer can go wrong, through the built module: the policy follows
//! `onMissing` or `onLookupError`, never swaps to an image it did not verify, and says why.

mod rig;

use rig::hosts::anyhow_debug;
use rig::wapc::Host;
use rig::{pod_request, shared, validate};
use serde_json::{Value, json};

/// Answers every host call with the same bytes or the same error.
struct FixedHost {
    answer: Result<Vec<u8>, String>,
    calls: usize,
}

impl Host for FixedHost {
    fn call(&mut self, _: &str, _: &str, _: &str, _: &[u8]) -> Result<Vec<u8>, String> {
        self.calls += 1;
        self.answer.clone()
    }
}

const DIGEST: &str = "sha256:3a25d2cf1dfc34e2a6cbe33f4b8e0f2ff0a7c1d3e5b7f9a1c3e5d7f9b1a3c5e7";
const OTHER: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
const URL: &str = "https://mirror.example.com/v2/dockerhub/library/nginx/manifests/1.27";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    Missing,
    LookupError,
}

/// (name, host answer, what it means, what the message must quote)
type Fault = (&'static str, Result<Vec<u8>, String>, Expect, &'static str);

/// Each host text comes whole, as the real host writes it: the first line, the `Caused by:`
/// list, and the backtrace of a host under `RUST_BACKTRACE=1`.
fn faults() -> Vec<Fault> {
    let error = |text: String| {
        if text.is_empty() {
            return Err(text);
        }
        let cause = text
            .strip_prefix("Fail to interact with OCI registry: ")
            .unwrap_or(&text)
            .to_string();
        Err(anyhow_debug(&[text, cause], true))
    };
    let ok = |text: &str| Ok(text.as_bytes().to_vec());
    vec![
        (
            "absent",
            error(format!(
                "Fail to interact with OCI registry: Registry error: url {URL}, envelope: OCI API errors: [OCI API error: manifest unknown]"
            )),
            Expect::Missing,
            "the mirror does not have it (registry: manifest unknown)",
        ),
        (
            "absent repository",
            error(format!(
                "Fail to interact with OCI registry: Registry error: url {URL}, envelope: OCI API errors: [OCI API error: repository name not known to registry]"
            )),
            Expect::Missing,
            "repository name not known",
        ),
        (
            "bare 404",
            error(format!(
                "Fail to interact with OCI registry: Server error: url {URL}, code: 404, message: "
            )),
            Expect::Missing,
            "(HTTP 404 from https://mirror.example.com/v2/dockerhub/library/nginx/manifests/1.27)",
        ),
        (
            // The host keeps a registry's error envelope for any status but 401 (oci-client's
            // `validate_registry_response`): UNAUTHORIZED sent with a 403, as some proxies do.
            "unauthorised envelope",
            error(format!(
                "Fail to interact with OCI registry: Registry error: url {URL}, envelope: OCI API errors: [OCI API error: authentication required]"
            )),
            Expect::LookupError,
            "could not look it up (registry mirror.example.com refused policy-server's credentials for it, or policy-server has none (registry: authentication required): lookups use the docker config in the PolicyServer's imagePullSecret",
        ),
        (
            "credentials refused (any 401)",
            error(format!(
                "Fail to interact with OCI registry: Not authorized: url {URL}\n\nCaused by:\n    Not authorized: url {URL}"
            )),
            Expect::LookupError,
            "could not look it up (registry mirror.example.com refused policy-server's credentials for it, or policy-server has none (Not authorized: url https://mirror.example.com/v2/dockerhub/library/nginx/manifests/1.27): lookups use the docker config in the PolicyServer's imagePullSecret",
        ),
        (
            "forbidden",
            error(format!(
                "Fail to interact with OCI registry: Server error: url {URL}, code: 403, message: denied"
            )),
            Expect::LookupError,
            "refused policy-server's credentials for it, or policy-server has none (HTTP 403 from https://mirror.example.com/v2/dockerhub/library/nginx/manifests/1.27: denied)",
        ),
        (
            "rate limited",
            error(format!(
                "Fail to interact with OCI registry: Server error: url {URL}, code: 429, message: toomanyrequests"
            )),
            Expect::LookupError,
            "could not look it up (HTTP 429 from https://mirror.example.com/v2/dockerhub/library/nginx/manifests/1.27: toomanyrequests)",
        ),
        (
            "server error",
            error(format!(
                "Fail to interact with OCI registry: Server error: url {URL}, code: 503, message: unavailable"
            )),
            Expect::LookupError,
            "could not look it up (HTTP 503 from https://mirror.example.com/v2/dockerhub/library/nginx/manifests/1.27: unavailable)",
        ),
        (
            "timeout",
            error("Fail to interact with OCI registry: operation timed out".to_string()),
            Expect::LookupError,
            "could not look it up (operation timed out)",
        ),
        (
            "connection refused",
            error(format!(
                "Fail to interact with OCI registry: error sending request for url ({URL})"
            )),
            Expect::LookupError,
            "could not look it up (error sending request for url (https://mirror.example.com/v2/dockerhub/library/nginx/manifests/1.27))",
        ),
        (
            "empty error",
            error(String::new()),
            Expect::LookupError,
            "could not look it up (policy-server's host call failed with no text)",
        ),
        (
            "not JSON",
            ok("<html>502 Bad Gateway</html>"),
            Expect::LookupError,
            "could not look it up (policy-server's answer could not be read: error deserializing JSON data: expected value at line 1 column 1)",
        ),
        (
            "not UTF-8",
            Ok(vec![0xff, 0xfe, 0x00]),
            Expect::LookupError,
            "could not look it up (policy-server's answer could not be read: error deserializing JSON data: expected value at line 1 column 1)",
        ),
        (
            "no digest",
            ok("{}"),
            Expect::LookupError,
            "could not look it up (policy-server's answer could not be read: error deserializing JSON data: missing field `digest` at line 1 column 2)",
        ),
        (
            "digest not a string",
            ok(r#"{"digest": 42}"#),
            Expect::LookupError,
            "could not look it up (policy-server's answer could not be read: error deserializing JSON data: invalid type: integer `42`, expected a string at line 1 column 13)",
        ),
        (
            "digest without algorithm",
            ok(r#"{"digest":"3a25d2cf1dfc34e2a6cbe33f4b8e0f2ff0a7c1d3e5b7f9a1c3e5d7f9b1a3c5e7"}"#),
            Expect::LookupError,
            "invalid digest format",
        ),
        (
            "short digest",
            ok(r#"{"digest":"sha256:3a25d2cf"}"#),
            Expect::LookupError,
            "invalid digest format",
        ),
        (
            "digest of another length",
            ok(
                r#"{"digest":"sha256:3a25d2cf1dfc34e2a6cbe33f4b8e0f2ff0a7c1d3e5b7f9a1c3e5d7f9b1a3c5e7aa"}"#,
            ),
            Expect::LookupError,
            "wrong length",
        ),
        (
            "unsupported algorithm",
            ok(r#"{"digest":"md5:3a25d2cf1dfc34e2a6cbe33f4b8e0f2f"}"#),
            Expect::LookupError,
            "unsupported digest algorithm",
        ),
        (
            "digest with a path",
            ok(r#"{"digest":"sha256:../../evil/3a25d2cf1dfc34e2a6cbe33f4b8e0f2ff0a7c1d3e5b7f9"}"#),
            Expect::LookupError,
            "invalid digest format",
        ),
        (
            "digest with an injected reference",
            ok(&format!(r#"{{"digest":"{DIGEST} evil.io/x"}}"#)),
            Expect::LookupError,
            "invalid digest format",
        ),
    ]
}

fn settings(on_missing: &str, on_lookup_error: &str) -> Value {
    json!({
        "mirrors": [{"source": "docker.io", "target": "mirror.example.com/dockerhub"}],
        "onMissing": on_missing,
        "onLookupError": on_lookup_error,
    })
}

#[test]
fn every_fault_follows_its_setting_and_never_swaps() {
    let request = pod_request(
        "CREATE",
        json!({"containers": [{"name": "web", "image": "nginx:1.27"}]}),
    );
    for (name, answer, expect, reason) in faults() {
        for (on_missing, on_lookup_error) in [
            ("keep", "keep"),
            ("reject", "keep"),
            ("keep", "reject"),
            ("reject", "reject"),
        ] {
            let host = shared(FixedHost {
                answer: answer.clone(),
                calls: 0,
            });
            let response = validate(
                &settings(on_missing, on_lookup_error),
                &request,
                host.clone(),
            );
            let context = format!(
                "{name} with onMissing {on_missing}, onLookupError {on_lookup_error}: {response:?}"
            );
            assert!(
                response.images_unchanged(&request),
                "swapped to an unverified image: {context}"
            );
            // Only an image the mirror said it lacks is recorded for the fill job.
            assert_eq!(
                response.unmirrored().is_some(),
                expect == Expect::Missing && on_missing == "keep",
                "{context}"
            );
            assert_eq!(host.lock().unwrap().calls, 1, "{context}");
            let rejects = match expect {
                Expect::Missing => on_missing == "reject",
                Expect::LookupError => on_lookup_error == "reject",
            };
            let said = if rejects {
                assert!(!response.accepted, "{context}");
                response.message.clone().unwrap_or_default()
            } else {
                assert!(response.accepted, "{context}");
                response.warnings.join("\n")
            };
            assert!(
                !said.contains("Caused by") && !said.contains("backtrace"),
                "{context}: {said:?}"
            );
            for part in [
                "\"nginx:1.27\"",
                "\"mirror.example.com/dockerhub/library/nginx:1.27\"",
                reason,
            ] {
                assert!(said.contains(part), "{context}: {said:?} lacks {part:?}");
            }
            let setting = if expect == Expect::Missing {
                "onMissing"
            } else {
                "onLookupError"
            };
            assert_eq!(
                said.contains(&format!("{setting} is reject")),
                rejects,
                "{context}"
            );
        }
    }
}

#[test]
fn an_answer_for_another_digest_is_not_trusted() {
    let request = pod_request(
        "CREATE",
        json!({"containers": [{"name": "web", "image": format!("nginx@{DIGEST}")}]}),
    );
    let host = shared(FixedHost {
        answer: Ok(json!({"digest": OTHER}).to_string().into_bytes()),
        calls: 0,
    });
    let response = validate(&settings("keep", "keep"), &request, host);
    assert!(
        response.accepted && response.mutated.is_none(),
        "{response:?}"
    );
    assert!(
        response.warned(&format!("the mirror answered digest {OTHER}")),
        "{:?}",
        response.warnings
    );
}

#[test]
fn malformed_manifests_under_verify_source_are_lookup_errors() {
    // Both digest lookups answer, with different digests; the manifests that would settle it
    // are garbage.
    struct Scripted(Vec<Result<Vec<u8>, String>>);
    impl Host for Scripted {
        fn call(&mut self, _: &str, _: &str, _: &str, _: &[u8]) -> Result<Vec<u8>, String> {
            if self.0.is_empty() {
                Err("no more answers".to_string())
            } else {
                self.0.remove(0)
            }
        }
    }
    let answers = vec![
        Ok(json!({"digest": DIGEST}).to_string().into_bytes()),
        Ok(json!({"digest": OTHER}).to_string().into_bytes()),
        Ok(b"{\"schemaVersion\": \"two\"}".to_vec()),
        Ok(b"[]".to_vec()),
    ];
    let mut settings = settings("reject", "keep");
    settings["verifySource"] = json!(true);
    let request = pod_request(
        "CREATE",
        json!({"containers": [{"name": "web", "image": "nginx:1.27"}]}),
    );
    let response = validate(&settings, &request, shared(Scripted(answers)));
    assert!(
        response.accepted && response.mutated.is_none(),
        "{response:?}"
    );
    assert!(
        response.warned("could not compare it with the source"),
        "{:?}",
        response.warnings
    );
}
