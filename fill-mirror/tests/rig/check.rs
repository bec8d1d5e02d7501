//! The policy's two roles on a Pod, natively: the policy crate's own `admit` (what the module
//! runs), asking real registries on loopback for a manifest's digest as the host's lookup does
//! (a HEAD of the manifest, plain HTTP). The swap gives a Pod as admission leaves it; the check,
//! under `action: check` and as the audit scanner asks it, gives the result a report carries, so
//! the reports the fill job reads hold the messages the check role writes.

use image_swapper_policy::budget::MonotonicClock;
use image_swapper_policy::pod::{Verdict, admit};
use image_swapper_policy::policy::Policy;
use image_swapper_policy::reference::Reference;
use image_swapper_policy::registry::{LookupError, Manifest, Registry};
use image_swapper_policy::settings::parse_settings;
use image_swapper_policy::signatures::Verification;
use image_swapper_policy::verifiers::NoCluster;
use serde_json::{Value, json};

/// Registries on loopback, over plain HTTP.
struct Loopback {
    agent: ureq::Agent,
}

impl Registry for Loopback {
    fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError> {
        let reference =
            Reference::parse(image).map_err(|e| LookupError::Failed(format!("{image}: {e:?}")))?;
        let name = reference.name();
        let (host, repository) = name.split_once('/').unwrap_or((name, ""));
        let at = reference
            .digest()
            .or(reference.tag())
            .unwrap_or("latest")
            .to_string();
        let url = format!("http://{host}/v2/{repository}/manifests/{at}");
        let accept = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json";
        match self.agent.head(&url).set("Accept", accept).call() {
            Ok(response) => response
                .header("Docker-Content-Digest")
                .map(str::to_string)
                .ok_or_else(|| LookupError::Failed(format!("{url}: no Docker-Content-Digest"))),
            Err(ureq::Error::Status(404, _)) => {
                Err(LookupError::Absent(format!("{image}: manifest unknown")))
            }
            Err(error) => Err(LookupError::Failed(format!("{url}: {error}"))),
        }
    }

    fn manifest(&mut self, image: &str) -> Result<Manifest, LookupError> {
        Err(LookupError::Failed(format!(
            "{image}: this rig asks for digests only"
        )))
    }

    fn verify(
        &mut self,
        image: &str,
        _verification: &Verification<'_>,
    ) -> Result<String, LookupError> {
        Err(LookupError::Failed(format!(
            "{image}: this rig does not verify"
        )))
    }
}

fn policy_of(settings: &Value) -> Policy {
    let parsed = parse_settings(settings.to_string().as_bytes()).expect("settings");
    Policy::from_settings(&parsed).expect("valid settings")
}

fn run(settings: &Value, request: Value) -> Verdict {
    let request = serde_json::from_value(request).expect("an admission request");
    let mut registry = Loopback {
        agent: ureq::AgentBuilder::new().build(),
    };
    admit(
        request,
        &policy_of(settings),
        &mut registry,
        &mut NoCluster,
        &MonotonicClock::start(),
    )
    .verdict
}

/// The Pod of `spec` as the swap admits it (a CREATE by a user): swapped, or as it was.
pub fn swapped(settings: &Value, name: &str, spec: Value) -> Value {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"}, "spec": spec});
    let request = json!({
        "uid": format!("admission-{name}"),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE", "namespace": "default", "name": name,
        "userInfo": {"username": "alice"},
        "object": pod,
    });
    match run(settings, request) {
        Verdict::Mutate(object) => object,
        _ => pod,
    }
}

/// The check's result for the running `pod`, as the audit scanner writes it in a report under
/// the policy id `policy`: `pass`, `fail` (a finding) or `error` (code 500), with the message.
pub fn scanned(settings: &Value, policy: &str, pod: &Value) -> Value {
    let name = pod["metadata"]["name"].as_str().unwrap_or("pod");
    let uid = format!("uid-{name}");
    let mut object = pod.clone();
    object["metadata"]["uid"] = json!(uid);
    // The scanner's replay: the Pod's own uid as the request's, and no user.
    let request = json!({
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE", "namespace": "default", "name": name,
        "userInfo": {},
        "object": object,
    });
    let (outcome, message) = match run(settings, request) {
        Verdict::Accept | Verdict::Mutate(_) => ("pass", None),
        Verdict::Reject(message) => ("fail", Some(message)),
        Verdict::Error(message) => ("error", Some(message)),
    };
    let mut result = json!({
        "source": "kubewarden", "policy": policy, "category": "Image", "severity": "info",
        "timestamp": {"seconds": 1_780_300_800, "nanos": 0}, "result": outcome, "scored": true,
        "resourceSelector": {},
        "properties": {"validating": "true", "policy-name": "image-swapper-check"},
    });
    if let Some(message) = message {
        result["message"] = json!(message);
    }
    result
}
