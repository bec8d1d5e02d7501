//! `validate` as a whole, natively: an arbitrary admission request with arbitrary host answers.
//! No panic, and every image the policy writes lies under a configured target and carries only
//! digests the host answered or the Pod already had; the check role writes nothing.
#![no_main]

use std::cell::Cell;
use std::time::Duration;

use image_swapper_policy::budget::Clock;
use image_swapper_policy::pod::{Verdict, admit};
use image_swapper_policy::policy::{Action, Policy, SwapPolicy};
use image_swapper_policy::registry::{ImageManifest, IndexEntry, LookupError, Manifest, Registry};
use image_swapper_policy::settings::Settings;
use kubewarden_policy_sdk::request::ValidationRequest;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// Time that passes only in lookups, as much as the script says.
#[derive(Default)]
struct FuzzClock(Cell<Duration>);

impl Clock for FuzzClock {
    fn now(&self) -> Duration {
        self.0.get()
    }
}

/// Answers chosen by the first bytes of the input, call after call; each call also takes
/// (byte × 7) ms, so the lookup budget runs out on some inputs.
struct FuzzRegistry<'a> {
    script: &'a [u8],
    clock: &'a FuzzClock,
    calls: usize,
    answered: Vec<String>,
}

impl FuzzRegistry<'_> {
    fn next(&mut self) -> u8 {
        let byte = self
            .script
            .get(self.calls % self.script.len().max(1))
            .copied()
            .unwrap_or(0);
        self.calls += 1;
        let took = Duration::from_millis(u64::from(byte) * 7);
        self.clock.0.set(self.clock.0.get() + took);
        byte
    }
}

impl Registry for FuzzRegistry<'_> {
    fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError> {
        let byte = self.next();
        match byte % 5 {
            0 | 1 => {
                let digest = format!("sha256:{:064x}", image.len() * 31 + usize::from(byte));
                self.answered.push(digest.clone());
                Ok(digest)
            }
            2 => Err(LookupError::Absent("manifest unknown".to_string())),
            3 => Err(LookupError::Failed("timeout".to_string())),
            _ => Ok(image.chars().rev().collect()),
        }
    }

    fn manifest(&mut self, _image: &str) -> Result<Manifest, LookupError> {
        let byte = self.next();
        let digest = format!("sha256:{:064x}", byte / 5);
        match byte % 4 {
            0 => Ok(Manifest::Image(ImageManifest {
                config_digest: digest.clone(),
                layers: vec![digest],
                artifact_type: (byte % 3 == 0).then(|| "application/vnd.example".to_string()),
            })),
            1 => Ok(Manifest::Index {
                entries: vec![IndexEntry {
                    digest,
                    os: "linux".to_string(),
                    architecture: "amd64".to_string(),
                    variant: None,
                    os_version: (byte % 3 == 0).then(|| "10.0.17763.1".to_string()),
                    os_features: Vec::new(),
                }],
            }),
            2 => Err(LookupError::Absent("manifest unknown".to_string())),
            _ => Err(LookupError::Failed("refused".to_string())),
        }
    }

    /// Verifications answer like digest lookups, and sometimes refuse.
    fn verify(
        &mut self,
        image: &str,
        _verification: &image_swapper_policy::signatures::Verification<'_>,
    ) -> Result<String, LookupError> {
        if self.script.get(self.calls % self.script.len().max(1)) == Some(&255) {
            self.next();
            return Err(LookupError::Unverified("no signatures found".to_string()));
        }
        self.manifest_digest(image)
    }
}

fn images(object: &Value) -> Vec<(String, String)> {
    let mut images = Vec::new();
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        if let Some(containers) = object
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
        {
            for (i, container) in containers.iter().enumerate() {
                if let Some(image) = container.get("image").and_then(Value::as_str) {
                    images.push((format!("{list}/{i}"), image.to_string()));
                }
            }
        }
    }
    images
}

fuzz_target!(|data: &[u8]| {
    let (script, json) = data.split_at(data.len().min(8));
    let Ok(request) = serde_json::from_slice::<ValidationRequest<Settings>>(json) else {
        return;
    };
    let Ok(policy) = Policy::from_settings(&request.settings) else {
        return;
    };
    let before = images(&request.request.object);
    // A re-applied original gets back the image the live Pod runs: no digest is verified then.
    let running = images(&request.request.old_object);
    let clock = FuzzClock::default();
    let mut registry = FuzzRegistry {
        script,
        clock: &clock,
        calls: 0,
        answered: Vec::new(),
    };
    // No verifier policies in the cluster: `verifiers` settings keep every image (a lookup
    // error), which the invariants below hold for too.
    let outcome = admit(
        request.request,
        &policy,
        &mut registry,
        &mut image_swapper_policy::verifiers::NoCluster,
        &clock,
    );
    if policy.action == Action::Check {
        assert!(
            !matches!(outcome.verdict, Verdict::Mutate(_)),
            "the check role rewrote the Pod"
        );
    }
    let Verdict::Mutate(object) = outcome.verdict else {
        return;
    };
    for (path, after) in images(&object) {
        let Some((_, original)) = before.iter().find(|(p, _)| *p == path) else {
            panic!("{path} appeared");
        };
        if *original == after {
            continue;
        }
        assert!(
            policy
                .router
                .targets
                .iter()
                .any(|t| after.starts_with(&format!("{}/", t.as_str()))),
            "{after} is under no target"
        );
        if running.iter().any(|(_, image)| *image == after) {
            continue;
        }
        if let Some((_, digest)) = after.split_once('@') {
            let known = registry.answered.iter().any(|d| d == digest) || original.contains(digest);
            assert!(known, "{after} carries a digest nobody verified");
        } else {
            assert!(
                policy.swap_policy == SwapPolicy::Always || !policy.pin_digest,
                "{after} is not pinned"
            );
        }
    }
});
