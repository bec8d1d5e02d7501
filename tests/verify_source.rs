//! verifySource against two real registries on loopback, an upstream and its mirror; and at the
//! default lookup budget with both 50 ms away, where each step of a comparison starts only when
//! it is likely to fit.

mod rig;

use std::time::Duration;

use rig::hosts::LiveHost;
use rig::images::{Artifact, Image, Index};
use rig::proxy::LatencyProxy;
use rig::registry::TestRegistry;
use rig::{Response, pod_request, shared, validate};
use serde_json::{Value, json};

const REPOSITORY: &str = "library/app";

struct Registries {
    upstream: TestRegistry,
    mirror: TestRegistry,
    /// With [`Registries::far`], the ways to them at a distance.
    upstream_far: Option<LatencyProxy>,
    mirror_far: Option<LatencyProxy>,
}

impl Registries {
    fn start(name: &str) -> Registries {
        Registries {
            upstream: TestRegistry::start(&format!("{name}-upstream")).expect("upstream registry"),
            mirror: TestRegistry::start(&format!("{name}-mirror")).expect("mirror registry"),
            upstream_far: None,
            mirror_far: None,
        }
    }

    /// Both registries as far as makes a lookup cost about 205 ms under the rig's host model
    /// (50 ms away on policy-server 1.31; about 27 ms on 1.35, whose lookups cost two round trips
    /// more), as one against a plain-HTTP registry the host first tries over HTTPS: the
    /// comparison's plans are chosen by the lookups' time, whatever the release.
    fn far(name: &str) -> Registries {
        let mut r = Registries::start(name);
        let model = rig::proxy::HostModel::from_env();
        let round_trip = model.round_trip_for(Duration::from_millis(205));
        r.upstream_far = Some(LatencyProxy::start(&r.upstream.host, round_trip).expect("proxy"));
        r.mirror_far = Some(LatencyProxy::start(&r.mirror.host, round_trip).expect("proxy"));
        r
    }

    /// The source registry as Pods and settings name it.
    fn source_host(&self) -> &str {
        self.upstream_far
            .as_ref()
            .map_or(&self.upstream.host, |far| &far.host)
    }

    fn mirror_host(&self) -> &str {
        self.mirror_far
            .as_ref()
            .map_or(&self.mirror.host, |far| &far.host)
    }

    fn mirror_repository(&self) -> String {
        format!("up/{REPOSITORY}")
    }

    /// Admits a Pod running `upstream/library/app:1`; returns the answer and the lookups made.
    fn admit(&self, platforms: &[&str]) -> (Response, Vec<String>) {
        self.admit_with(json!({ "platforms": platforms }))
    }

    /// The same, with `extra` settings.
    fn admit_with(&self, extra: Value) -> (Response, Vec<String>) {
        let mut settings = json!({
            "mirrors": [{"source": self.source_host(), "target": format!("{}/up", self.mirror_host())}],
            "verifySource": true,
        });
        if let (Some(settings), Some(extra)) = (settings.as_object_mut(), extra.as_object()) {
            settings.extend(extra.clone());
        }
        let image = format!("{}/{REPOSITORY}:1", self.source_host());
        let request = pod_request(
            "CREATE",
            json!({"containers": [{"name": "app", "image": image}]}),
        );
        let host = shared(LiveHost::default());
        let response = validate(&settings, &request, host.clone());
        let lookups = host.lock().unwrap().lookups();
        (response, lookups)
    }

    fn swapped_to(&self, digest: &str) -> String {
        format!("{}/up/{REPOSITORY}:1@{digest}", self.mirror_host())
    }
}

fn kept(response: &Response) -> bool {
    response.accepted && response.mutated.is_none()
}

/// The digests are equal: swapped without a warning, after `expected_lookups` (two by digests
/// first; three by manifests alone, when only two more lookups fit after the mirror's).
fn an_identical_copy_is_swapped(r: Registries, expected_lookups: usize) {
    let image = Image::new("app v1", "linux/amd64");
    image.push(&r.upstream, REPOSITORY, Some("1"));
    let digest = image.push(&r.mirror, &r.mirror_repository(), Some("1"));
    let (response, lookups) = r.admit(&[]);
    assert_eq!(
        response.image("containers", 0),
        Some(r.swapped_to(&digest).as_str()),
        "{response:?}"
    );
    assert!(response.warnings.is_empty(), "{:?}", response.warnings);
    assert_eq!(lookups.len(), expected_lookups, "{lookups:?}");
}

#[test]
fn same_digest_is_swapped_after_two_lookups() {
    an_identical_copy_is_swapped(Registries::start("same"), 2);
}

/// The tag names other content upstream: kept as stale, naming the mirror's digest, and the
/// source's when it was asked.
fn a_tag_moved_upstream_is_stale_and_kept(r: Registries, expected_lookups: usize) {
    let old =
        Image::new("app v1", "linux/amd64").push(&r.mirror, &r.mirror_repository(), Some("1"));
    let new = Image::new("app v2", "linux/amd64").push(&r.upstream, REPOSITORY, Some("1"));
    let (response, lookups) = r.admit(&[]);
    assert!(kept(&response), "{response:?}");
    assert!(
        response.warned("stale: the tag now names other content upstream")
            && response.warned(&old)
            // The source's digest is named only when it was asked (by digests first).
            && response.warned(&new) == (expected_lookups == 4),
        "{:?}",
        response.warnings
    );
    assert_eq!(lookups.len(), expected_lookups, "{lookups:?}");
}

#[test]
fn tag_moved_upstream_is_stale_and_kept() {
    a_tag_moved_upstream_is_stale_and_kept(Registries::start("moved"), 4);
}

fn single_platform_copy_of_two_platform_index(r: &Registries) -> String {
    let amd64 = Image::new("app v1", "linux/amd64");
    let arm64 = Image::new("app v1", "linux/arm64");
    Index::new(vec![amd64.clone(), arm64]).push(&r.upstream, REPOSITORY, "1");
    amd64.push(&r.mirror, &r.mirror_repository(), Some("1"))
}

/// The source's index lists the mirror's digest: the source's manifest concludes, without the
/// mirror's (three lookups by digests first, two by manifests alone).
fn a_single_platform_copy_covering_the_wanted_platform_is_swapped(
    r: Registries,
    expected_lookups: usize,
) {
    let digest = single_platform_copy_of_two_platform_index(&r);
    let (response, lookups) = r.admit(&["linux/amd64"]);
    assert_eq!(
        response.image("containers", 0),
        Some(r.swapped_to(&digest).as_str()),
        "{response:?}"
    );
    assert!(response.warnings.is_empty(), "{:?}", response.warnings);
    assert_eq!(
        lookups.len(),
        expected_lookups,
        "the source index names the mirror's digest: {lookups:?}"
    );
}

#[test]
fn single_platform_copy_is_swapped_when_it_covers_the_wanted_platforms() {
    a_single_platform_copy_covering_the_wanted_platform_is_swapped(Registries::start("subset"), 3);
}

#[test]
fn single_platform_copy_is_stale_when_every_platform_is_wanted() {
    let r = Registries::start("subset-all");
    single_platform_copy_of_two_platform_index(&r);
    let (response, lookups) = r.admit(&[]);
    assert!(kept(&response), "{response:?}");
    assert!(
        response.warned("stale: it lacks the source's manifest for linux/arm64"),
        "{:?}",
        response.warnings
    );
    assert_eq!(
        lookups.len(),
        3,
        "the source index names the mirror's digest: {lookups:?}"
    );
}

#[test]
fn a_full_index_copy_with_preserved_digests_is_swapped_after_two_lookups() {
    let r = Registries::start("index");
    let index = Index::new(vec![
        Image::new("app", "linux/amd64"),
        Image::new("app", "linux/arm64"),
    ]);
    index.push(&r.upstream, REPOSITORY, "1");
    let digest = index.push(&r.mirror, &r.mirror_repository(), "1");
    let (response, lookups) = r.admit(&[]);
    assert_eq!(
        response.image("containers", 0),
        Some(r.swapped_to(&digest).as_str())
    );
    assert_eq!(lookups.len(), 2, "{lookups:?}");
}

/// The source's image, and its copy converted to Docker v2 in the mirror: the same config, another
/// manifest digest. Returns both digests.
fn reencoded_copy(r: &Registries) -> (String, String) {
    let image = Image::new("app v1", "linux/amd64");
    let source = image.push(&r.upstream, REPOSITORY, Some("1"));
    let converted = image
        .as_docker_v2()
        .push(&r.mirror, &r.mirror_repository(), Some("1"));
    assert_ne!(source, converted, "the copy has another manifest digest");
    (source, converted)
}

#[test]
fn a_copy_converted_to_another_manifest_format_is_swapped() {
    let r = Registries::start("converted");
    let (_, converted) = reencoded_copy(&r);
    let (response, lookups) = r.admit(&[]);
    assert_eq!(
        response.image("containers", 0),
        Some(r.swapped_to(&converted).as_str())
    );
    assert_eq!(lookups.len(), 4, "{lookups:?}");
}

/// The source refuses at once, which concludes: the mirror serves. Two lookups.
fn the_source_down_swaps_with_a_warning(mut r: Registries) {
    let image = Image::new("app v1", "linux/amd64");
    image.push(&r.upstream, REPOSITORY, Some("1"));
    let digest = image.push(&r.mirror, &r.mirror_repository(), Some("1"));
    r.upstream.stop();
    let (response, lookups) = r.admit(&[]);
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

#[test]
fn upstream_down_mirror_up_is_swapped_with_a_warning() {
    the_source_down_swaps_with_a_warning(Registries::start("upstream-down"));
}

#[test]
fn lookups_are_the_documented_ones() {
    let r = Registries::start("lookups");
    let old =
        Image::new("app v1", "linux/amd64").push(&r.mirror, &r.mirror_repository(), Some("1"));
    let new = Image::new("app v2", "linux/amd64").push(&r.upstream, REPOSITORY, Some("1"));
    let (_, lookups) = r.admit(&[]);
    let (up, mirror) = (&r.upstream.host, &r.mirror.host);
    assert_eq!(
        lookups,
        [
            format!("OciManifestDigest {mirror}/up/{REPOSITORY}:1"),
            format!("OciManifestDigest {up}/{REPOSITORY}:1"),
            format!("OciManifest {up}/{REPOSITORY}@{new}"),
            format!("OciManifest {mirror}/up/{REPOSITORY}@{old}"),
        ]
    );
}

/// OCI artifacts all share the empty config: "same config" says nothing of their content, so
/// an artifact whose layers differ from the source's is a stale copy.
#[test]
fn an_artifact_with_other_layers_is_stale_though_its_config_is_the_same() {
    let r = Registries::start("artifact");
    let old = Artifact::new("chart 1.0").push(&r.mirror, &r.mirror_repository(), "1");
    let new = Artifact::new("chart 1.1").push(&r.upstream, REPOSITORY, "1");
    let (response, lookups) = r.admit(&[]);
    assert!(kept(&response), "{response:?}");
    assert!(
        response.warned("stale: the tag now names other content upstream")
            && response.warned(&old)
            && response.warned(&new),
        "{:?}",
        response.warnings
    );
    assert_eq!(lookups.len(), 4, "{lookups:?}");
}

/// A mirror index that lists the source's manifests under other platforms holds none of them
/// for the platform a node would pull.
#[test]
fn an_index_that_lists_the_manifests_under_other_platforms_is_stale() {
    let r = Registries::start("crossed");
    let amd64 = Image::new("app", "linux/amd64");
    let arm64 = Image::new("app", "linux/arm64");
    Index::new(vec![amd64.clone(), arm64.clone()]).push(&r.upstream, REPOSITORY, "1");
    let mut amd64_listed_as_arm64 = amd64;
    amd64_listed_as_arm64.architecture = "arm64".to_string();
    let mut arm64_listed_as_amd64 = arm64;
    arm64_listed_as_amd64.architecture = "amd64".to_string();
    Index::new(vec![arm64_listed_as_amd64, amd64_listed_as_arm64]).push(
        &r.mirror,
        &r.mirror_repository(),
        "1",
    );
    let (response, lookups) = r.admit(&[]);
    assert!(kept(&response), "{response:?}");
    assert!(
        response.warned("stale: it lacks the source's manifest for linux/amd64, linux/arm64"),
        "{:?}",
        response.warnings
    );
    assert_eq!(lookups.len(), 4, "{lookups:?}");
}

// At the default budget (800 ms), both registries 50 ms away (about 205 ms a lookup): after
// the mirror's digest two more lookups fit, not three, so the comparison goes by manifests
// alone (the source's by tag, then the mirror's), which concludes every case. Planning the
// worst case (four lookups) before asking the source gave up on every one of these; digests
// first kept the re-encoded and stale copies by the budget.

#[test]
fn far_an_identical_copy_is_swapped_after_three_lookups() {
    an_identical_copy_is_swapped(Registries::far("far-same"), 3);
}

/// The clearest row: the old plan gave up after the mirror's lookup.
#[test]
fn far_the_source_down_swaps_with_the_warning_after_two_lookups() {
    the_source_down_swaps_with_a_warning(Registries::far("far-down"));
}

#[test]
fn far_a_single_platform_copy_that_covers_the_wanted_platform_is_swapped_after_two_lookups() {
    a_single_platform_copy_covering_the_wanted_platform_is_swapped(
        Registries::far("far-subset"),
        2,
    );
}

#[test]
fn far_a_tag_moved_upstream_is_stale_and_kept_after_three_lookups() {
    a_tag_moved_upstream_is_stale_and_kept(Registries::far("far-moved"), 3);
}

/// By manifests alone: the source's manifest by its tag, the mirror's by the digest it answered.
#[test]
fn far_lookups_are_the_documented_ones() {
    let r = Registries::far("far-lookups");
    let (_, converted) = reencoded_copy(&r);
    let (_, lookups) = r.admit(&[]);
    let (up, mirror) = (r.source_host(), r.mirror_host());
    assert_eq!(
        lookups,
        [
            format!("OciManifestDigest {mirror}/up/{REPOSITORY}:1"),
            format!("OciManifest {up}/{REPOSITORY}:1"),
            format!("OciManifest {mirror}/up/{REPOSITORY}@{converted}"),
        ]
    );
}

/// Content compared across manifest formats, by manifests alone: three lookups, about 620 ms,
/// swapped to the mirror's digest at the default budget.
#[test]
fn far_a_reencoded_copy_is_swapped_at_the_default_budget() {
    let r = Registries::far("far-reencoded");
    let (_, converted) = reencoded_copy(&r);
    let (response, lookups) = r.admit(&[]);
    assert_eq!(
        response.image("containers", 0),
        Some(r.swapped_to(&converted).as_str()),
        "{response:?}"
    );
    assert!(response.warnings.is_empty(), "{:?}", response.warnings);
    assert_eq!(lookups.len(), 3, "{lookups:?}");
}

/// A budget of 600 ms holds one more lookup after the mirror's, not two: the source's digest,
/// which differs. The comparison that would need two more is not started; the image is kept
/// with the budget's reason, the warning saying what was learned.
#[test]
fn far_a_reencoded_copy_whose_comparison_would_not_fit_is_kept_saying_the_digests_differ() {
    let r = Registries::far("far-reencoded-600");
    let (source, converted) = reencoded_copy(&r);
    let (response, lookups) = r.admit_with(json!({"lookupBudgetMilliseconds": 600}));
    assert!(kept(&response), "{response:?}");
    let learned =
        format!("(its digest differs from the mirror's: source {source}, mirror {converted})");
    assert!(
        response.warned("lookup budget of 600 ms: ") && response.warned(&learned),
        "{:?}",
        response.warnings
    );
    assert_eq!(
        lookups.len(),
        2,
        "no lookup is started that would end past the budget: {lookups:?}"
    );
}
