//! A rule with several mirrors, tried in order, through the built module against real
//! registries on loopback: the first mirror that holds the image wins.

mod rig;

use rig::hosts::LiveHost;
use rig::images::Image;
use rig::registry::TestRegistry;
use rig::{Response, pod_request, shared, validate, validate_settings};
use serde_json::{Value, json};

const REPOSITORY: &str = "hub/library/nginx";

/// Two mirrors of Docker Hub, `first` tried before `second`.
struct Mirrors {
    first: TestRegistry,
    second: TestRegistry,
}

impl Mirrors {
    fn start(name: &str) -> Mirrors {
        Mirrors {
            first: TestRegistry::start(&format!("{name}-first")).expect("registry"),
            second: TestRegistry::start(&format!("{name}-second")).expect("registry"),
        }
    }

    fn settings(&self, extra: Value) -> Value {
        let mut settings = json!({"mirrors": [{"source": "docker.io", "targets": [
            {"target": format!("{}/hub", self.first.host)},
            {"target": format!("{}/hub", self.second.host), "pullSecret": "second-pull"},
        ]}]});
        if let (Some(settings), Some(extra)) = (settings.as_object_mut(), extra.as_object()) {
            settings.extend(extra.clone());
        }
        settings
    }

    fn admit(&self, extra: Value, image: &str) -> (Response, Vec<String>) {
        let host = shared(LiveHost::default());
        let request = pod_request(
            "CREATE",
            json!({"containers": [{"name": "web", "image": image}]}),
        );
        let response = validate(&self.settings(extra), &request, host.clone());
        let lookups = host.lock().unwrap().lookups();
        (response, lookups)
    }

    fn tag(&self, registry: &TestRegistry) -> String {
        format!("{}/{REPOSITORY}:1.27", registry.host)
    }
}

fn nginx() -> Image {
    Image::new("nginx 1.27", "linux/amd64")
}

#[test]
fn the_first_mirror_pruned_and_the_second_holding_it_swaps_to_the_second() {
    let m = Mirrors::start("pruned");
    let pruned = nginx().push(&m.first, REPOSITORY, Some("1.27"));
    m.first.delete_manifest(REPOSITORY, &pruned).expect("prune");
    let digest = nginx().push(&m.second, REPOSITORY, Some("1.27"));
    let (response, lookups) = m.admit(json!({}), "nginx:1.27");
    let swapped = format!("{}@{digest}", m.tag(&m.second));
    assert_eq!(response.image("containers", 0), Some(swapped.as_str()));
    assert!(response.warnings.is_empty(), "{:?}", response.warnings);
    assert_eq!(lookups.len(), 2, "{lookups:?}");
    let pod = response.mutated.as_ref().expect("mutated");
    assert_eq!(
        pod["spec"]["imagePullSecrets"],
        json!([{"name": "second-pull"}]),
        "the chosen mirror's pull secret"
    );
    assert_eq!(
        response.audit["swapped"],
        json!([{"container": "web", "from": "nginx:1.27", "to": swapped}])
    );
}

#[test]
fn the_first_mirror_refusing_connections_swaps_to_the_second_with_a_warning() {
    let mut m = Mirrors::start("refused");
    m.first.stop();
    let digest = nginx().push(&m.second, REPOSITORY, Some("1.27"));
    let (response, lookups) = m.admit(json!({}), "nginx:1.27");
    let swapped = format!("{}@{digest}", m.tag(&m.second));
    assert_eq!(response.image("containers", 0), Some(swapped.as_str()));
    assert_eq!(
        response.warnings,
        [format!(
            "image \"nginx:1.27\": swapped to \"{swapped}\", a later mirror of its list: \"{first}\": could not look it up (error sending request for url (http://{host}/v2/{REPOSITORY}/manifests/1.27): Connection refused (os error 111))",
            first = m.tag(&m.first),
            host = m.first.host,
        )]
    );
    assert_eq!(lookups.len(), 2, "{lookups:?}");
    assert_eq!(
        response.audit["swapped"][0]["reason"],
        json!("earlier-mirror-failed")
    );
}

#[test]
fn neither_mirror_holding_it_follows_on_missing() {
    let m = Mirrors::start("neither");
    let (kept, _) = m.admit(json!({}), "nginx:1.27");
    assert!(
        kept.accepted && kept.image("containers", 0) == Some("nginx:1.27"),
        "{kept:?}"
    );
    // The record names the copy that fills the first mirror of the list.
    assert_eq!(
        kept.unmirrored().map(|r| r["web"]["copy"].clone()),
        Some(json!(format!(
            "skopeo copy --all --preserve-digests docker://docker.io/library/nginx:1.27 docker://{}",
            m.tag(&m.first)
        )))
    );
    assert_eq!(
        kept.warnings,
        [format!(
            "image \"nginx:1.27\": kept, not swapped to any of 2 mirrors: \"{}\": the mirror does not have it (registry: manifest unknown); \"{}\": the mirror does not have it (registry: manifest unknown)",
            m.tag(&m.first),
            m.tag(&m.second)
        )]
    );
    assert_eq!(
        kept.audit["kept"],
        json!([{"image": "nginx:1.27", "reason": "absent", "mirrors": [
            {"mirror": m.tag(&m.first), "reason": "absent"},
            {"mirror": m.tag(&m.second), "reason": "absent"},
        ]}])
    );
    let (rejected, _) = m.admit(json!({"onMissing": "reject"}), "nginx:1.27");
    assert!(!rejected.accepted);
    let message = rejected.message.unwrap_or_default();
    assert!(
        message.starts_with("image \"nginx:1.27\": cannot be swapped to any of 2 mirrors: ")
            && message.ends_with("; onMissing is reject"),
        "{message}"
    );
}

#[test]
fn one_mirror_absent_and_one_erroring_follows_on_lookup_error() {
    let mut m = Mirrors::start("mixed");
    m.second.stop();
    // onMissing would refuse; a mirror that could not be asked may hold the image.
    let (kept, lookups) = m.admit(json!({"onMissing": "reject"}), "nginx:1.27");
    assert!(kept.accepted && kept.mutated.is_none(), "{kept:?}");
    assert!(
        kept.warned("the mirror does not have it") && kept.warned("Connection refused"),
        "{:?}",
        kept.warnings
    );
    assert_eq!(kept.audit["kept"][0]["reason"], json!("lookup-error"));
    assert_eq!(lookups.len(), 2);
    let (rejected, _) = m.admit(json!({"onLookupError": "reject"}), "nginx:1.27");
    assert!(!rejected.accepted);
    assert!(
        rejected
            .message
            .as_deref()
            .is_some_and(|m| m.ends_with("; onLookupError is reject")),
        "{rejected:?}"
    );
}

/// verifySource: the first mirror holds a copy the tag no longer names upstream, the second
/// the current one.
#[test]
fn with_verify_source_a_stale_first_mirror_gives_way_to_the_second() {
    let m = Mirrors::start("stale");
    let upstream = TestRegistry::start("stale-upstream").expect("registry");
    let settings = json!({
        "mirrors": [{"source": upstream.host, "targets": [
            {"target": format!("{}/hub", m.first.host)},
            {"target": format!("{}/hub", m.second.host)},
        ]}],
        "verifySource": true,
    });
    let current = Image::new("app v2", "linux/amd64");
    current.push(&upstream, "library/app", Some("1"));
    Image::new("app v1", "linux/amd64").push(&m.first, "hub/library/app", Some("1"));
    let digest = current.push(&m.second, "hub/library/app", Some("1"));
    let host = shared(LiveHost::default());
    let request = pod_request(
        "CREATE",
        json!({"containers": [{"name": "app", "image": format!("{}/library/app:1", upstream.host)}]}),
    );
    let response = validate(&settings, &request, host.clone());
    assert_eq!(
        response.image("containers", 0),
        Some(format!("{}/hub/library/app:1@{digest}", m.second.host).as_str()),
        "{response:?}"
    );
    assert!(response.warnings.is_empty(), "{:?}", response.warnings);
}

/// `defaultMirror` would route the image (it routes whatever no rule matches, and its host is not
/// the second mirror's): only "already under a target" leaves it alone, with no lookup.
#[test]
fn an_image_already_under_the_second_mirror_is_left_alone() {
    let m = Mirrors::start("already");
    let digest = nginx().push(&m.second, REPOSITORY, Some("1.27"));
    let image = format!("{}@{digest}", m.tag(&m.second));
    let default_mirror = json!({"defaultMirror": {"registry": format!("{}/cache", m.first.host)}});
    let (response, lookups) = m.admit(default_mirror, &image);
    assert!(
        response.accepted && response.mutated.is_none(),
        "{response:?}"
    );
    assert!(lookups.is_empty(), "{lookups:?}");
    assert!(response.audit.is_empty(), "{:?}", response.audit);
}

#[test]
fn targets_that_collide_across_lists_are_refused_naming_both() {
    let (valid, message) = validate_settings(&json!({"mirrors": [
        {"source": "docker.io", "targets": [{"target": "eu.m.io/hub"}, {"target": "us.m.io/shared"}]},
        {"source": "quay.io", "targets": [{"target": "eu.m.io/quay"}, {"target": "us.m.io:443/shared"}]},
    ]}));
    assert!(!valid);
    let message = message.unwrap_or_default();
    assert!(
        message.contains("mirrors[1].targets[1].target: \"us.m.io:443/shared\" is also the target of mirrors[0].targets[1]"),
        "{message}"
    );
}
