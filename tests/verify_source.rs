//! verifySource against two real registries on loopback: an upstream and its mirror.

mod rig;

use rig::hosts::LiveHost;
use rig::images::{Artifact, Image, Index};
use rig::registry::TestRegistry;
use rig::{Response, pod_request, shared, validate};
use serde_json::json;

const REPOSITORY: &str = "library/app";

struct Registries {
    upstream: TestRegistry,
    mirror: TestRegistry,
}

impl Registries {
    fn start(name: &str) -> Registries {
        Registries {
            upstream: TestRegistry::start(&format!("{name}-upstream")).expect("upstream registry"),
            mirror: TestRegistry::start(&format!("{name}-mirror")).expect("mirror registry"),
        }
    }

    fn mirror_repository(&self) -> String {
        format!("up/{REPOSITORY}")
    }

    /// Admits a Pod running `upstream/library/app:1`; returns the answer and the lookups made.
    fn admit(&self, platforms: &[&str]) -> (Response, Vec<String>) {
        let settings = json!({
            "mirrors": [{"source": self.upstream.host, "target": format!("{}/up", self.mirror.host)}],
            "verifySource": true,
            "platforms": platforms,
        });
        let image = format!("{}/{REPOSITORY}:1", self.upstream.host);
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
        format!("{}/up/{REPOSITORY}:1@{digest}", self.mirror.host)
    }
}

fn kept(response: &Response) -> bool {
    response.accepted && response.mutated.is_none()
}

#[test]
fn same_digest_is_swapped_after_two_lookups() {
    let r = Registries::start("same");
    let image = Image::new("app v1", "linux/amd64");
    image.push(&r.upstream, REPOSITORY, Some("1"));
    let digest = image.push(&r.mirror, &r.mirror_repository(), Some("1"));
    let (response, lookups) = r.admit(&[]);
    assert_eq!(
        response.image("containers", 0),
        Some(r.swapped_to(&digest).as_str())
    );
    assert!(response.warnings.is_empty(), "{:?}", response.warnings);
    assert_eq!(lookups.len(), 2, "{lookups:?}");
}

#[test]
fn tag_moved_upstream_is_stale_and_kept() {
    let r = Registries::start("moved");
    let old =
        Image::new("app v1", "linux/amd64").push(&r.mirror, &r.mirror_repository(), Some("1"));
    let new = Image::new("app v2", "linux/amd64").push(&r.upstream, REPOSITORY, Some("1"));
    let (response, lookups) = r.admit(&[]);
    assert!(kept(&response), "{response:?}");
    assert!(
        response.warned("stale") && response.warned(&old) && response.warned(&new),
        "{:?}",
        response.warnings
    );
    assert_eq!(lookups.len(), 4, "{lookups:?}");
}

fn single_platform_copy_of_two_platform_index(r: &Registries) -> String {
    let amd64 = Image::new("app v1", "linux/amd64");
    let arm64 = Image::new("app v1", "linux/arm64");
    Index::new(vec![amd64.clone(), arm64]).push(&r.upstream, REPOSITORY, "1");
    amd64.push(&r.mirror, &r.mirror_repository(), Some("1"))
}

#[test]
fn single_platform_copy_is_swapped_when_it_covers_the_wanted_platforms() {
    let r = Registries::start("subset");
    let digest = single_platform_copy_of_two_platform_index(&r);
    let (response, lookups) = r.admit(&["linux/amd64"]);
    assert_eq!(
        response.image("containers", 0),
        Some(r.swapped_to(&digest).as_str())
    );
    assert_eq!(
        lookups.len(),
        3,
        "the source index names the mirror's digest: {lookups:?}"
    );
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

#[test]
fn a_copy_converted_to_another_manifest_format_is_swapped() {
    let r = Registries::start("converted");
    let image = Image::new("app v1", "linux/amd64");
    let source = image.push(&r.upstream, REPOSITORY, Some("1"));
    let converted = image
        .as_docker_v2()
        .push(&r.mirror, &r.mirror_repository(), Some("1"));
    assert_ne!(source, converted, "the copy has another manifest digest");
    let (response, lookups) = r.admit(&[]);
    assert_eq!(
        response.image("containers", 0),
        Some(r.swapped_to(&converted).as_str())
    );
    assert_eq!(lookups.len(), 4, "{lookups:?}");
}

#[test]
fn upstream_down_mirror_up_is_swapped_with_a_warning() {
    let mut r = Registries::start("upstream-down");
    let image = Image::new("app v1", "linux/amd64");
    image.push(&r.upstream, REPOSITORY, Some("1"));
    let digest = image.push(&r.mirror, &r.mirror_repository(), Some("1"));
    r.upstream.stop();
    let (response, lookups) = r.admit(&[]);
    assert_eq!(
        response.image("containers", 0),
        Some(r.swapped_to(&digest).as_str())
    );
    assert!(
        response.warned("without comparing it with the source, which could not be looked up"),
        "{:?}",
        response.warnings
    );
    assert_eq!(lookups.len(), 2, "{lookups:?}");
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
