//! A stand-in for `kwctl run`, for machines where kwctl cannot be installed: it runs a policy
//! module in the test rig's wasm host and answers as kwctl 1.31 does, so that `e2e/*.bats`
//! runs here and in CI (`KWCTL=target/debug/examples/kwctl-standin bats e2e/`).
//!
//! What it reproduces (read from kwctl's `run` command and policy-evaluator's
//! `admission_response.rs`):
//! - `run [-r|--request-path F] [--settings-path F | --settings-json J]
//!   [--replay-host-capabilities-interactions F] MODULE`; the request file holds an
//!   AdmissionRequest or an AdmissionReview (its `request` is taken);
//! - settings validated first; when refused: `{"valid":false,"message":...}` on stdout,
//!   `Error: Provided settings are not valid: Some("...")` on stderr, exit status 1;
//! - otherwise one line on stdout, the AdmissionResponse: `uid`, `allowed`, `patchType` and
//!   `patch` (base64 of the JSON Patch that `json_patch::diff` computes between the request's
//!   object and the mutated one; absent when empty), `status` (message, code), and
//!   `auditAnnotations` and `warnings` (null when absent); exit status 0, refusals included;
//! - replayed host interactions consumed strictly in order, an unexpected request answered
//!   `Replay error: unexpected request ...`; with `RUST_BACKTRACE=1` a stack backtrace is
//!   appended to every replayed error text, as kwctl's anyhow errors are printed;
//! - without a replay file, lookups go to the registries named in the images, over plain HTTP.
//!
//! What it does not: pulling modules from registries, `--sources-path`, credentials, TLS,
//! verifying a module's own signature, policy metadata (`kwctl annotate`), and any subcommand but `run`.

#[path = "../tests/rig/mod.rs"]
mod rig;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use base64::Engine;
use rig::hosts::{LiveHost, ReplayHost, backtrace_from_env};
use rig::wapc::{SharedHost, WasmPolicy};
use serde_json::{Value, json};

#[derive(Default)]
struct Run {
    request: Option<PathBuf>,
    settings: Option<Value>,
    replay: Option<PathBuf>,
    module: Option<PathBuf>,
}

fn parse_args() -> Result<Run, String> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("run") => {}
        Some(other) => return Err(format!("unsupported subcommand {other:?}: only `run`")),
        None => {
            return Err(
                "usage: kwctl-standin run --request-path F [--settings-path F] MODULE".to_string(),
            );
        }
    }
    let mut run = Run::default();
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "-r" | "--request-path" => run.request = Some(PathBuf::from(value()?)),
            "--settings-path" => {
                let path = PathBuf::from(value()?);
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                let settings: Value =
                    serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
                run.settings = Some(settings);
            }
            "--settings-json" => {
                run.settings = Some(
                    serde_json::from_str(&value()?).map_err(|e| format!("--settings-json: {e}"))?,
                )
            }
            "--replay-host-capabilities-interactions" => run.replay = Some(PathBuf::from(value()?)),
            // The module's metadata lists every kind `verifiers` reads; the stand-in grants
            // them with or without the flag (replayed sessions hold the answers).
            "--allow-context-aware" => {}
            flag if flag.starts_with('-') => {
                return Err(format!("the stand-in does not support {flag}"));
            }
            module => run.module = Some(PathBuf::from(module)),
        }
    }
    Ok(run)
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(error) => {
            eprintln!("Error: {error}");
            ExitCode::from(1)
        }
    }
}

fn run() -> Result<ExitCode, String> {
    let run = parse_args()?;
    let module = run.module.ok_or("no policy module given")?;
    let module = module
        .to_str()
        .and_then(|m| m.strip_prefix("file://"))
        .map_or(module.clone(), PathBuf::from);
    let policy = WasmPolicy::load(&module).map_err(|e| format!("{}: {e:#}", module.display()))?;
    let request_path = run.request.ok_or("--request-path is required")?;
    let request = rig::read_json(&request_path);
    let request = match request.get("kind").and_then(Value::as_str) {
        Some("AdmissionReview") => request
            .get("request")
            .cloned()
            .ok_or("invalid admission review object")?,
        _ => request,
    };
    let settings = run.settings.unwrap_or_else(|| json!({}));
    let backtrace = backtrace_from_env();

    let idle: SharedHost = Arc::new(Mutex::new(LiveHost::default()));
    let validity = policy
        .call("validate_settings", settings.to_string().as_bytes(), idle)
        .result?;
    let validity: Value = serde_json::from_slice(&validity).map_err(|e| e.to_string())?;
    if validity["valid"] != json!(true) {
        let message = validity["message"].as_str().map(str::to_string);
        // kwctl prints the SDK's SettingsValidationResponse: `valid`, then `message`.
        #[derive(serde::Serialize)]
        struct Refused<'m> {
            valid: bool,
            message: &'m Option<String>,
        }
        let refused = Refused {
            valid: false,
            message: &message,
        };
        println!(
            "{}",
            serde_json::to_string(&refused).map_err(|e| e.to_string())?
        );
        return Err(format!("Provided settings are not valid: {message:?}"));
    }

    let host: SharedHost = match run.replay {
        Some(path) => {
            let mut replay =
                ReplayHost::load(&path).map_err(|e| format!("{}: {e:#}", path.display()))?;
            replay.backtrace = backtrace;
            Arc::new(Mutex::new(replay))
        }
        None => Arc::new(Mutex::new(LiveHost {
            backtrace,
            ..LiveHost::default()
        })),
    };
    let payload = json!({"settings": settings, "request": request}).to_string();
    let answer = policy.call("validate", payload.as_bytes(), host).result?;
    let answer: Value = serde_json::from_slice(&answer).map_err(|e| e.to_string())?;
    println!("{}", admission_response(&request, &answer)?);
    Ok(ExitCode::SUCCESS)
}

/// policy-evaluator's `AdmissionResponse`, fields in its order: `patchType`, `patch` and
/// `status` are left out when absent; `auditAnnotations` and `warnings` are printed as null.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionResponse {
    uid: Value,
    allowed: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<Status>,
    audit_annotations: Value,
    warnings: Value,
}

#[derive(serde::Serialize)]
struct Status {
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<Value>,
}

/// policy-evaluator's `AdmissionResponse::from_policy_validation_response`.
fn admission_response(request: &Value, answer: &Value) -> Result<String, String> {
    let present = |key: &str| answer.get(key).filter(|v| !v.is_null()).cloned();
    let patch = match present("mutated_object") {
        Some(mutated) => {
            let diff = json_patch::diff(&request["object"], &mutated);
            if diff.0.is_empty() {
                None
            } else {
                let text = serde_json::to_string(&diff).map_err(|e| e.to_string())?;
                Some(base64::engine::general_purpose::STANDARD.encode(text))
            }
        }
        None => None,
    };
    let (message, code) = (present("message"), present("code"));
    let response = AdmissionResponse {
        uid: request["uid"].clone(),
        allowed: answer["accepted"].clone(),
        patch_type: patch.is_some().then_some("JSONPatch"),
        patch,
        status: (message.is_some() || code.is_some()).then_some(Status { message, code }),
        audit_annotations: present("audit_annotations").unwrap_or(Value::Null),
        warnings: present("warnings").unwrap_or(Value::Null),
    };
    serde_json::to_string(&response).map_err(|e| e.to_string())
}
