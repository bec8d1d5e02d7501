//! `fill-mirror prune` against a real registry (Debian's `docker-registry`, deletions enabled)
//! 5 ms away through the rig's latency proxy. The clusters' in-use sets are written here by
//! hand, as JSON text, and pushed with the rig's own requests: the crate's writer is not the
//! oracle. Images A, B, C, D are named fresh by cluster "one", F only by cluster "two", E last by
//! "one" 40 days ago; A and E carry cosign signature tags. Every check of what is gone or there
//! is the test's own request to the registry.

mod rig;

use std::process::Output;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use rig::alerts;
use rig::images::{Artifact, Image};
use rig::plane::{ControlPlane, find_tools};
use rig::proxy::LatencyProxy;
use rig::registry::{TestRegistry, basic_auth};
use rig::replica::{Replica, eventually};
use rig::{run, settings, text};
use serde_json::Value;

/// The registry's round trip.
const AWAY: Duration = Duration::from_millis(5);
const DAY: i64 = 86_400;
const SET_TYPE: &str = "application/vnd.kubewarden.image-swapper.in-use.v1+json";
const LEDGER_TYPE: &str = "application/vnd.kubewarden.image-swapper.prune-ledger.v1+json";
const IN_USE: &str = "image-swapper/in-use";

/// `seconds` before now, as RFC 3339.
fn ago(seconds: i64) -> String {
    Timestamp::from_second(Timestamp::now().as_second() - seconds)
        .expect("a time")
        .to_string()
}

/// Pushes `json` as the artifact `image-swapper/in-use:<tag>` (the empty config, one layer
/// of `media_type`), with the rig's own HTTP requests.
fn push_artifact(registry: &TestRegistry, tag: &str, media_type: &str, json: &str) {
    let empty = registry.push_blob(IN_USE, b"{}").expect("empty config");
    let layer = registry.push_blob(IN_USE, json.as_bytes()).expect("layer");
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":"{media_type}","config":{{"mediaType":"application/vnd.oci.empty.v1+json","digest":"{empty}","size":2}},"layers":[{{"mediaType":"{media_type}","digest":"{layer}","size":{}}}]}}"#,
        json.len()
    );
    registry
        .push_manifest(
            IN_USE,
            tag,
            "application/vnd.oci.image.manifest.v1+json",
            manifest.as_bytes(),
        )
        .expect("push the artifact");
}

/// One image entry of a hand-written set.
fn entry(repository: &str, digest: &str, last_seen: &str, used_by: &str) -> String {
    format!(
        r#"{{"repository":"{repository}","digest":"{digest}","lastSeen":"{last_seen}","usedBy":["{used_by}"]}}"#
    )
}

fn push_set(registry: &TestRegistry, cluster: &str, published: &str, entries: &[String]) {
    let json = format!(
        r#"{{"cluster":"{cluster}","published":"{published}","periodSeconds":600,"images":[{}]}}"#,
        entries.join(",")
    );
    push_artifact(registry, cluster, SET_TYPE, &json);
}

/// The mirror: images A-F under `hub/`, signatures of A and E, and the two clusters' sets.
struct World {
    registry: TestRegistry,
    far: LatencyProxy,
    /// Name -> (repository, digest).
    images: Vec<(&'static str, String, String)>,
}

impl World {
    /// "two"'s set published `two_published` seconds ago.
    fn start(name: &str, two_published: i64) -> World {
        World::on(TestRegistry::start(name).expect("registry"), two_published)
    }

    /// The same world on `registry`.
    fn on(registry: TestRegistry, two_published: i64) -> World {
        let far = LatencyProxy::network(&registry.host, AWAY).expect("latency proxy");
        let mut images = Vec::new();
        for name in ["A", "B", "C", "D", "E", "F"] {
            let repository = format!("hub/app-{}", name.to_lowercase());
            let digest = Image::new(&format!("image {name}"), "linux/amd64").push(
                &registry,
                &repository,
                Some("1.0"),
            );
            images.push((name, repository, digest));
        }
        for name in ["A", "E"] {
            let (_, repository, digest) =
                images.iter().find(|i| i.0 == name).expect("image").clone();
            let tag = format!("{}.sig", digest.replacen(':', "-", 1));
            let sig =
                Artifact::new(&format!("signature of {name}")).push(&registry, &repository, &tag);
            images.push((if name == "A" { "A.sig" } else { "E.sig" }, repository, sig));
        }
        let world = World {
            registry,
            far,
            images,
        };
        let fresh = ago(60);
        let one: Vec<String> = ["A", "B", "C", "D"]
            .iter()
            .map(|n| world.entry(n, &fresh))
            .chain([world.entry("E", &ago(40 * DAY))])
            .collect();
        push_set(&world.registry, "one", &ago(30), &one);
        push_set(
            &world.registry,
            "two",
            &ago(two_published),
            &[world.entry("F", &fresh)],
        );
        world
    }

    fn image(&self, name: &str) -> (&str, &str) {
        let (_, repository, digest) = self
            .images
            .iter()
            .find(|i| i.0 == name)
            .expect("an image of the world");
        (repository, digest)
    }

    fn entry(&self, name: &str, last_seen: &str) -> String {
        let (repository, digest) = self.image(name);
        entry(
            repository,
            digest,
            last_seen,
            &format!("Deployment shop/{name}"),
        )
    }

    /// Whether the registry still serves `name`'s manifest (the test's own HEAD by digest).
    fn serves(&self, name: &str) -> bool {
        let (repository, digest) = self.image(name);
        self.registry.digest_of(repository, digest).is_some()
    }

    fn prune(&self, extra: &[&str]) -> Output {
        let mirror = format!("{}/hub", self.far.host);
        let mut args = vec![
            "prune",
            "--insecure",
            "--mirror",
            &mirror,
            "--keep-for",
            "30d",
        ];
        args.extend_from_slice(extra);
        run(&args)
    }
}

fn out(output: &Output) -> String {
    format!("{}{}", text(&output.stdout), text(&output.stderr))
}

#[test]
fn a_delete_run_deletes_the_image_named_last_past_the_age_and_its_signature_only() {
    let world = World::start("prune-delete", 60);
    let output = world.prune(&["--delete"]);
    assert_eq!(output.status.code(), Some(0), "{}", out(&output));
    for gone in ["E", "E.sig"] {
        assert!(
            !world.serves(gone),
            "{gone} is still there: {}",
            out(&output)
        );
    }
    for kept in ["A", "B", "C", "D", "F", "A.sig"] {
        assert!(world.serves(kept), "{kept} was deleted: {}", out(&output));
    }
    assert!(
        world.registry.digest_of(IN_USE, "one").is_some(),
        "the sets stay"
    );
}

#[test]
fn a_stale_set_blocks_every_deletion_and_says_which_cluster() {
    let world = World::start("prune-stale", 3 * 3600);
    let output = world.prune(&["--delete", "--stale-after", "1h"]);
    assert_eq!(output.status.code(), Some(3), "{}", out(&output));
    let said = text(&output.stdout);
    assert!(said.contains("cluster \"two\""), "{said}");
    for kept in ["A", "B", "C", "D", "E", "F", "A.sig", "E.sig"] {
        assert!(world.serves(kept), "{kept} was deleted: {said}");
    }
}

#[test]
fn a_dry_run_deletes_nothing_and_lists_e_with_its_reason() {
    let world = World::start("prune-dry", 60);
    let output = world.prune(&[]);
    assert_eq!(output.status.code(), Some(0), "{}", out(&output));
    let said = text(&output.stdout);
    let (repository, e) = world.image("E");
    let line = said
        .lines()
        .find(|line| {
            line.starts_with("would delete") && line.contains(&format!("{repository}@{e}"))
        })
        .unwrap_or_else(|| panic!("no line for E: {said}"));
    assert!(line.contains("named last by cluster \"one\""), "{line}");
    assert!(line.contains("40d ago"), "{line}");
    for kept in ["A", "B", "C", "D", "E", "F", "A.sig", "E.sig"] {
        assert!(
            world.serves(kept),
            "{kept} was deleted by a dry run: {said}"
        );
    }
    let json = world.prune(&["--output", "json"]);
    let report: Value = serde_json::from_slice(&json.stdout).expect("one JSON object");
    assert_eq!(report["dryRun"], true);
    let delete = &report["registries"][0]["delete"];
    let listed: Vec<&str> = delete
        .as_array()
        .expect("delete")
        .iter()
        .filter_map(|d| d["digest"].as_str())
        .collect();
    assert!(listed.contains(&e), "{report}");
    assert!(world.serves("E"));
}

#[test]
fn max_deletions_bounds_a_run_oldest_first() {
    let world = World::start("prune-max", 60);
    // Three more images "one" named last 50, 60 and 70 days ago: with E, four to delete.
    let mut entries: Vec<String> = ["A", "B", "C", "D"]
        .iter()
        .map(|n| world.entry(n, &ago(60)))
        .collect();
    entries.push(world.entry("E", &ago(40 * DAY)));
    let mut old = Vec::new();
    for days in [50, 60, 70] {
        let repository = format!("hub/old-{days}");
        let digest = Image::new(&format!("old {days}"), "linux/amd64").push(
            &world.registry,
            &repository,
            Some("1"),
        );
        entries.push(entry(
            &repository,
            &digest,
            &ago(days * DAY),
            "Job shop/old",
        ));
        old.push((repository, digest));
    }
    push_set(&world.registry, "one", &ago(30), &entries);
    let output = world.prune(&["--delete", "--max-deletions", "2"]);
    assert_eq!(output.status.code(), Some(0), "{}", out(&output));
    let serves = |(repository, digest): &(String, String)| {
        world.registry.digest_of(repository, digest).is_some()
    };
    assert!(
        !serves(&old[2]) && !serves(&old[1]),
        "the two oldest go first: {}",
        out(&output)
    );
    assert!(
        serves(&old[0]) && world.serves("E"),
        "two deletions at most: {}",
        out(&output)
    );
}

#[test]
fn an_image_never_named_is_deleted_only_once_unnamed_for_the_age() {
    let world = World::start("prune-ledger", 60);
    let repository = "hub/hand-copied";
    let g =
        Image::new("copied by hand", "linux/amd64").push(&world.registry, repository, Some("1"));
    let first = world.prune(&["--delete"]);
    assert_eq!(first.status.code(), Some(0), "{}", out(&first));
    assert!(
        world.registry.digest_of(repository, &g).is_some(),
        "deleted at first sight: {}",
        out(&first)
    );
    assert!(text(&first.stdout).contains(&format!(
        "kept {}/{repository}@{g}: named by no set",
        world.far.host
    )));
    // The ledger, by hand: first seen unnamed 29 days ago, then 31.
    for (days, stays) in [(29, true), (31, false)] {
        let ledger = format!(
            r#"{{"images":[{{"repository":"{repository}","digest":"{g}","since":"{}"}}]}}"#,
            ago(days * DAY)
        );
        push_artifact(&world.registry, "_prune-ledger", LEDGER_TYPE, &ledger);
        let output = world.prune(&["--delete"]);
        assert_eq!(output.status.code(), Some(0), "{}", out(&output));
        let there = world.registry.digest_of(repository, &g).is_some();
        assert_eq!(there, stays, "unnamed for {days} days: {}", out(&output));
    }
}

/// The stale-set signal: `fill-mirror watch` (a real kube-apiserver, the swapping policy routing
/// to the mirror) reads every cluster's set from the mirror each period and serves each one's
/// age; the alert on it fires for the stale one only.
#[test]
fn the_watch_serves_each_clusters_set_age_and_the_alert_names_the_stale_one() {
    let Some(tools) = find_tools("prune: the watch's set ages") else {
        return;
    };
    let plane = ControlPlane::start(tools);
    let world = World::start("prune-ages", 3 * 3600);
    plane.install_policy_crd();
    plane.apply_swapping_policy(
        "image-swapper",
        &settings("source.example.com", &world.far.host),
    );
    let dir = tempfile::tempdir().expect("a temporary folder");
    let watch = Replica::start(
        &plane.kubeconfig,
        "ages",
        &["--no-election", "--period", "2"],
        dir.path(),
    );
    let age = |cluster: &str| {
        watch.metric(&format!(
            "fill_mirror_in_use_set_age_seconds{{registry=\"{}\",cluster=\"{cluster}\"}}",
            world.far.host
        ))
    };
    assert!(
        eventually(60, || age("two").is_some_and(|a| a >= 3.0 * 3600.0)),
        "two's age: {:?}\n{}",
        age("two"),
        watch.log()
    );
    let one = age("one").expect("one's age");
    assert!((30.0..600.0).contains(&one), "one's age {one}");
    let exposition = watch.metrics().expect("/metrics");
    let two = serde_json::json!({"registry": world.far.host, "cluster": "two"});
    alerts::after_scrapes(&exposition, 35, "ImageSwapperInUseSetStale", Some(two))
        .unwrap_or_else(|said| panic!("on\n{exposition}\npromtool: {said}"));
}

#[test]
fn a_deletion_the_registry_refuses_fails_the_run_and_names_it() {
    let world = World::start("prune-refused", 60);
    let (_, e) = world.image("E");
    let refused = format!("/manifests/{e}");
    let (front, stop) = rig::front::relay("refusing deletions", &world.registry.host, move |method, url| {
        (method == "DELETE" && url.ends_with(&refused)).then(|| {
            (405, r#"{"errors":[{"code":"UNSUPPORTED","message":"The operation is unsupported."}]}"#.to_string())
        })
    })
    .expect("relay");
    let mirror = format!("{front}/hub");
    let output = run(&[
        "prune",
        "--insecure",
        "--mirror",
        &mirror,
        "--keep-for",
        "30d",
        "--delete",
    ]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(output.status.code(), Some(1), "{}", out(&output));
    let said = text(&output.stdout);
    let line = said
        .lines()
        .find(|line| line.contains(&format!("@{e}")))
        .unwrap_or_else(|| panic!("no line for E: {said}"));
    assert!(
        line.starts_with("FAILED to delete") && line.contains("405"),
        "{line}"
    );
    assert!(world.serves("E"));
    for kept in ["A", "B", "C", "D", "F", "A.sig"] {
        assert!(world.serves(kept), "{kept} was deleted: {said}");
    }
}

#[test]
fn the_prune_deletes_with_its_own_login_and_cannot_run_without_one() {
    let registry = TestRegistry::start_with_basic_auth("prune-login", "pruner", "may-delete")
        .expect("registry with basic auth");
    let world = World::on(registry, 60);
    let without = world.prune(&["--delete"]);
    assert_eq!(without.status.code(), Some(2), "{}", out(&without));
    assert!(out(&without).contains("credentials"), "{}", out(&without));
    assert!(world.serves("E"));
    let dir = tempfile::tempdir().expect("a temporary folder");
    let auth = dir.path().join("auth.json");
    let login = basic_auth("pruner", "may-delete");
    let token = login.trim_start_matches("Basic ");
    std::fs::write(
        &auth,
        format!(
            r#"{{"auths":{{"{}":{{"auth":"{token}"}}}}}}"#,
            world.far.host
        ),
    )
    .expect("the auth file");
    let with = world.prune(&["--delete", "--auth-file", &auth.display().to_string()]);
    assert_eq!(with.status.code(), Some(0), "{}", out(&with));
    assert!(!world.serves("E") && world.serves("A"), "{}", out(&with));
}
