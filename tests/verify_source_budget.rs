//! verifySource at the default lookup budget (800 ms), the source and the mirror real
//! registries 50 ms away (a lookup costs four round trips, about 200 ms, as one against a
//! plain-HTTP registry the host first tries over HTTPS). Each comparison runs by steps that can
//! conclude, started only when the step is likely to fit.

mod rig;

use std::time::Duration;

use rig::hosts::LiveHost;
use rig::images::{Image, Index};
use rig::proxy::LatencyProxy;
use rig::registry::TestRegistry;
use rig::{Response, pod_request, shared, validate};
use serde_json::{Value, json};

const REPOSITORY: &str = "library/app";
const ROUND_TRIP: Duration = Duration::from_millis(50);

struct Far {
    upstream: TestRegistry,
    mirror: TestRegistry,
    upstream_far: LatencyProxy,
    mirror_far: LatencyProxy,
}

impl Far {
    fn start(name: &str) -> Far {
        let upstream = TestRegistry::start(&format!("{name}-upstream")).expect("upstream");
        let mirror = TestRegistry::start(&format!("{name}-mirror")).expect("mirror");
        Far {
            upstream_far: LatencyProxy::start(&upstream.host, ROUND_TRIP).expect("proxy"),
            mirror_far: LatencyProxy::start(&mirror.host, ROUND_TRIP).expect("proxy"),
            upstream,
            mirror,
        }
    }

    fn settings(&self, extra: Value) -> Value {
        let mut settings = json!({
            "mirrors": [{"source": self.upstream_far.host, "target": format!("{}/up", self.mirror_far.host)}],
            "verifySource": true,
        });
        if let (Some(settings), Some(extra)) = (settings.as_object_mut(), extra.as_object()) {
            settings.extend(extra.clone());
        }
        settings
    }

    /// Admits a Pod running `<upstream>/library/app:1`: the answer and the lookups made.
    fn admit(&self, extra: Value) -> (Response, Vec<String>) {
        let image = format!("{}/{REPOSITORY}:1", self.upstream_far.host);
        let request = pod_request(
            "CREATE",
            json!({"containers": [{"name": "app", "image": image}]}),
        );
        let host = shared(LiveHost::default());
        let response = validate(&self.settings(extra), &request, host.clone());
        let lookups = host.lock().unwrap().lookups();
        (response, lookups)
    }

    fn swapped_to(&self, digest: &str) -> String {
        format!("{}/up/{REPOSITORY}:1@{digest}", self.mirror_far.host)
    }
}

fn default_budget() -> Value {
    json!({})
}

#[test]
fn an_identical_copy_is_swapped_after_the_two_digests() {
    let r = Far::start("vs-same");
    let image = Image::new("app v1", "linux/amd64");
    image.push(&r.upstream, REPOSITORY, Some("1"));
    let digest = image.push(&r.mirror, &format!("up/{REPOSITORY}"), Some("1"));
    let (response, lookups) = r.admit(default_budget());
    assert_eq!(
        response.image("containers", 0),
        Some(r.swapped_to(&digest).as_str()),
        "{response:?}"
    );
    assert_eq!(lookups.len(), 2, "{lookups:?}");
}

/// The clearest row: the source refuses at once, which concludes (the mirror serves);
/// the old plan gave up after the mirror's lookup, four lookups being predicted.
#[test]
fn the_source_down_swaps_with_the_warning_after_two_lookups() {
    let mut r = Far::start("vs-down");
    let image = Image::new("app v1", "linux/amd64");
    image.push(&r.upstream, REPOSITORY, Some("1"));
    let digest = image.push(&r.mirror, &format!("up/{REPOSITORY}"), Some("1"));
    r.upstream.stop();
    let (response, lookups) = r.admit(default_budget());
    assert_eq!(
        response.image("containers", 0),
        Some(r.swapped_to(&digest).as_str()),
        "{response:?}"
    );
    assert!(
        response.warned("without comparing it with the source, which could not be looked up"),
        "{:?}",
        response.warnings
    );
    assert_eq!(lookups.len(), 2, "{lookups:?}");
}

/// A copy of one platform of a multi-platform source: the source's index lists the mirror's
/// digest, so three lookups conclude (the mirror's manifest is not needed).
#[test]
fn a_single_platform_copy_that_covers_the_wanted_platform_is_swapped_after_three_lookups() {
    let r = Far::start("vs-subset");
    let amd64 = Image::new("app v1", "linux/amd64");
    let arm64 = Image::new("app v1", "linux/arm64");
    Index::new(vec![amd64.clone(), arm64]).push(&r.upstream, REPOSITORY, "1");
    let digest = amd64.push(&r.mirror, &format!("up/{REPOSITORY}"), Some("1"));
    let (response, lookups) = r.admit(json!({"platforms": ["linux/amd64"]}));
    assert_eq!(
        response.image("containers", 0),
        Some(r.swapped_to(&digest).as_str()),
        "{response:?}"
    );
    assert!(response.warnings.is_empty(), "{:?}", response.warnings);
    assert_eq!(lookups.len(), 3, "{lookups:?}");
}

/// Content compared across manifest formats needs both manifests: four lookups, about 810 ms
/// here, which the default budget cannot hold. The image is kept with the budget's reason,
/// and the warning says what was learned: the digests differ.
#[test]
fn a_reencoded_copy_that_would_not_fit_is_kept_saying_the_digests_differ() {
    let r = Far::start("vs-reencoded");
    let image = Image::new("app v1", "linux/amd64");
    let source = image.push(&r.upstream, REPOSITORY, Some("1"));
    let converted = image
        .as_docker_v2()
        .push(&r.mirror, &format!("up/{REPOSITORY}"), Some("1"));
    let (response, lookups) = r.admit(default_budget());
    assert!(
        response.accepted && response.mutated.is_none(),
        "{response:?}"
    );
    let expected =
        format!("(its digest differs from the mirror's: source {source}, mirror {converted})");
    assert!(
        response.warned("lookup budget of 800 ms spent") && response.warned(&expected),
        "{:?}",
        response.warnings
    );
    assert_eq!(
        lookups.len(),
        3,
        "no lookup is started that would end past the budget: {lookups:?}"
    );
    // With the budget such a comparison needs (four lookups), it is swapped.
    let (response, lookups) = r.admit(json!({"lookupBudgetMilliseconds": 2000}));
    assert_eq!(
        response.image("containers", 0),
        Some(r.swapped_to(&converted).as_str()),
        "{response:?}"
    );
    assert_eq!(lookups.len(), 4, "{lookups:?}");
}
