//! `fill-mirror prune --unanchor-only` against a real registry (Debian's `docker-registry`,
//! deletions enabled) 5 ms away through the rig's latency proxy. That registry is distribution
//! 2.8, which refuses to delete a tag (`DELETE /v2/<name>/manifests/<tag>` answers 400
//! `DIGEST_INVALID`); distribution 3.0 removes the tag's folder from its storage and nothing else
//! (registry/storage/tagstore.go `Untag`). The runs that remove anchors go through a front that
//! does what 3.0 does on the very registry's storage; the refusal is shown on 2.8 itself. The
//! sets are written here by hand as JSON, the anchors put with the rig's own requests, and every
//! check of what is there is the test's own request to the registry.

mod rig;

use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use rig::images::Image;
use rig::proxy::LatencyProxy;
use rig::registry::TestRegistry;
use rig::{run, text};

const AWAY: Duration = Duration::from_millis(5);
const DAY: i64 = 86_400;
const SET_TYPE: &str = "application/vnd.kubewarden.image-swapper.in-use.v1+json";
const LEDGER_TYPE: &str = "application/vnd.kubewarden.image-swapper.prune-ledger.v1+json";
const LEDGER: &str = "_prune-ledger";
const IN_USE: &str = "image-swapper/in-use";

fn ago(seconds: i64) -> String {
    Timestamp::from_second(Timestamp::now().as_second() - seconds)
        .expect("a time")
        .to_string()
}

/// The front that deletes a tag as distribution 3.0 does: the tag's folder
/// (`repositories/<name>/_manifests/tags/<tag>`) removed, 202; 404 `MANIFEST_UNKNOWN` when there
/// is none. Everything else, a deletion by digest included, goes on to `upstream`.
fn untagging_front(registry: &TestRegistry, upstream: &str) -> (String, Arc<AtomicBool>) {
    let root = registry.storage().join("docker/registry/v2/repositories");
    rig::front::relay("deleting tags", upstream, move |method, url| {
        let path = url.split('?').next().unwrap_or(url);
        let (name, reference) = path.strip_prefix("/v2/")?.rsplit_once("/manifests/")?;
        if method != "DELETE" || reference.starts_with("sha256:") {
            return None;
        }
        let folder = root.join(format!("{name}/_manifests/tags/{reference}"));
        Some(match std::fs::remove_dir_all(&folder) {
            Ok(()) => (202, String::new()),
            Err(_) => (
                404,
                r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#
                    .to_string(),
            ),
        })
    })
    .expect("the front")
}

struct World {
    registry: TestRegistry,
    /// The registry 5 ms away.
    far: LatencyProxy,
    /// What fill-mirror is given: the front that deletes tags before `far`, or `far` itself.
    mirror: String,
    front: Option<Arc<AtomicBool>>,
    /// Name -> (repository, image).
    images: Vec<(String, String, Image)>,
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(stop) = &self.front {
            stop.store(true, Ordering::Relaxed);
        }
    }
}

impl World {
    /// A named fresh by "one", anchored by "one"; F named fresh by "two", anchored by "two"; E
    /// anchored by "one" and by "two", named by no set now, and last by "one" 40 days ago as the
    /// prune's ledger remembers (its watch dropped it since); then `old` more images anchored by
    /// "one" that the ledger remembers "one" named that many days ago. C anchored by "one",
    /// whose set still names it, last 40 days ago (its watch keeps it longer than the prune's
    /// age); D anchored by "one", dropped from its set, named 10 days ago by the ledger. Each
    /// tagged 1.0 too.
    /// "two"'s set published `two_published` seconds ago. `untags`: through the front
    /// that deletes tags, else straight to distribution 2.8.
    fn start(name: &str, two_published: i64, old: &[i64], untags: bool) -> World {
        let registry = TestRegistry::start(name).expect("registry");
        let far = LatencyProxy::network(&registry.host, AWAY).expect("latency proxy");
        let (mirror, front) = if untags {
            let (host, stop) = untagging_front(&registry, &far.host);
            (host, Some(stop))
        } else {
            (far.host.clone(), None)
        };
        let mut world = World {
            registry,
            far,
            mirror,
            front,
            images: Vec::new(),
        };
        let olds = old.iter().map(|days| (format!("old-{days}"), *days));
        let mut remembered = Vec::new();
        for (name, days) in [("E".to_string(), 40)].into_iter().chain(olds) {
            world.add(
                &name,
                if name == "E" {
                    &["one", "two"]
                } else {
                    &["one"]
                },
            );
            remembered.push(world.remembered(&name, days));
        }
        world.add("A", &["one"]);
        world.add("C", &["one"]);
        world.add("D", &["one"]);
        remembered.push(world.remembered("D", 10));
        world.add("F", &["two"]);
        let one = [world.entry("A", 0), world.entry("C", 40)];
        world.push_set("one", 30, &one);
        world.push_set("two", two_published, &[world.entry("F", 0)]);
        let ledger = format!(r#"{{"images":[{}]}}"#, remembered.join(","));
        world.push_artifact(LEDGER, LEDGER_TYPE, &ledger);
        world
    }

    /// Pushes image `name` to `hub/app-<name>` tagged 1.0, and an anchor of each of `clusters`
    /// (`inuse-<cluster>-<hex>`, written here from the retention page's form).
    fn add(&mut self, name: &str, clusters: &[&str]) {
        let repository = format!("hub/app-{}", name.to_lowercase());
        let image = Image::new(&format!("image {name}"), "linux/amd64");
        let digest = image.push(&self.registry, &repository, Some("1.0"));
        for cluster in clusters {
            let tag = format!("inuse-{cluster}-{}", digest.trim_start_matches("sha256:"));
            (self.registry)
                .push_manifest(&repository, &tag, image.media_type, &image.manifest)
                .expect("an anchor");
        }
        self.images.push((name.to_string(), repository, image));
    }

    fn image(&self, name: &str) -> (&str, String) {
        let (_, repository, image) = (self.images.iter())
            .find(|i| i.0 == name)
            .expect("an image of the world");
        (repository, image.digest())
    }

    fn entry(&self, name: &str, days: i64) -> String {
        let (repository, digest) = self.image(name);
        format!(
            r#"{{"repository":"{repository}","digest":"{digest}","lastSeen":"{}","usedBy":["Deployment shop/{name}"]}}"#,
            ago(days * DAY + 60)
        )
    }

    /// The prune ledger's entry of `name`: named last by "one" `days` ago.
    fn remembered(&self, name: &str, days: i64) -> String {
        let (repository, digest) = self.image(name);
        format!(
            r#"{{"repository":"{repository}","digest":"{digest}","since":"{}","namedBy":"one"}}"#,
            ago(days * DAY + 60)
        )
    }

    fn push_set(&self, cluster: &str, published: i64, entries: &[String]) {
        let json = format!(
            r#"{{"cluster":"{cluster}","published":"{}","periodSeconds":600,"images":[{}]}}"#,
            ago(published),
            entries.join(",")
        );
        self.push_artifact(cluster, SET_TYPE, &json);
    }

    /// `json` as the artifact `image-swapper/in-use:<tag>` (the empty config, one layer).
    fn push_artifact(&self, tag: &str, media_type: &str, json: &str) {
        let registry = &self.registry;
        let empty = registry.push_blob(IN_USE, b"{}").expect("empty config");
        let layer = registry.push_blob(IN_USE, json.as_bytes()).expect("layer");
        let manifest = format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":"{media_type}","config":{{"mediaType":"application/vnd.oci.empty.v1+json","digest":"{empty}","size":2}},"layers":[{{"mediaType":"{media_type}","digest":"{layer}","size":{}}}]}}"#,
            json.len()
        );
        let oci = "application/vnd.oci.image.manifest.v1+json";
        (registry.push_manifest(IN_USE, tag, oci, manifest.as_bytes())).expect("an artifact");
    }

    /// Whether `cluster`'s anchor of `name` still names it (the test's own HEAD by tag).
    fn anchored(&self, name: &str, cluster: &str) -> bool {
        let (repository, digest) = self.image(name);
        let tag = format!("inuse-{cluster}-{}", digest.trim_start_matches("sha256:"));
        self.registry.digest_of(repository, &tag) == Some(digest)
    }

    /// Whether `name` still pulls by digest: its manifest's and its blobs' very bytes.
    fn pullable(&self, name: &str) -> bool {
        let (_, repository, image) = (self.images.iter()).find(|i| i.0 == name).expect("image");
        let get = |kind: &str, reference: &str| {
            let url = format!(
                "http://{}/v2/{repository}/{kind}/{reference}",
                self.registry.host
            );
            let reply = ureq::get(&url)
                .set("Accept", image.media_type)
                .call()
                .ok()?;
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut reply.into_reader(), &mut bytes).ok()?;
            Some(bytes)
        };
        get("manifests", &image.digest()).as_deref() == Some(&image.manifest[..])
            && get("blobs", &image.config_digest()).as_deref() == Some(&image.config[..])
            && get("blobs", &rig::registry::sha256(&image.layer)).as_deref()
                == Some(&image.layer[..])
    }

    fn unanchor(&self, extra: &[&str]) -> Output {
        let mirror = format!("{}/hub", self.mirror);
        let mut args = vec![
            "prune",
            "--unanchor-only",
            "--insecure",
            "--mirror",
            &mirror,
        ];
        args.extend_from_slice(&["--keep-for", "30d"]);
        args.extend_from_slice(extra);
        run(&args)
    }
}

fn out(output: &Output) -> String {
    format!("{}{}", text(&output.stdout), text(&output.stderr))
}

#[test]
fn a_delete_run_removes_every_stale_anchor_and_only_those_and_the_image_still_pulls() {
    let world = World::start("unanchor-delete", 60, &[], true);
    let output = world.unanchor(&["--delete"]);
    assert_eq!(output.status.code(), Some(0), "{}", out(&output));
    for cluster in ["one", "two"] {
        assert!(
            !world.anchored("E", cluster),
            "{cluster}'s anchor of E stays: {}",
            out(&output)
        );
    }
    assert!(
        world.anchored("A", "one"),
        "A's anchor went: {}",
        out(&output)
    );
    assert!(
        world.anchored("F", "two"),
        "F's anchor went: {}",
        out(&output)
    );
    let kept = |name: &str| world.anchored(name, "one");
    assert!(
        kept("C"),
        "C's anchor went while its set names it: {}",
        out(&output)
    );
    assert!(
        kept("D"),
        "D's anchor went within the age: {}",
        out(&output)
    );
    for name in ["E", "A", "F"] {
        assert!(
            world.pullable(name),
            "{name} no longer pulls by digest: {}",
            out(&output)
        );
    }
    let (repository, e) = world.image("E");
    assert_eq!(
        world.registry.digest_of(repository, "1.0"),
        Some(e.clone()),
        "E's own tag"
    );
    let said = text(&output.stdout);
    let removed = said
        .lines()
        .filter(|line| line.starts_with("removed the anchor") && line.contains(&e))
        .count();
    assert_eq!(removed, 2, "{said}");
}

#[test]
fn another_clusters_stale_set_blocks_every_removal_and_says_which_and_since_when() {
    let world = World::start("unanchor-stale", 3 * 3600, &[], true);
    let output = world.unanchor(&["--delete", "--stale-after", "1h"]);
    assert_eq!(output.status.code(), Some(3), "{}", out(&output));
    let said = text(&output.stdout);
    let blocked = (said.lines())
        .find(|line| line.starts_with("blocked:"))
        .unwrap_or_else(|| panic!("no blocked line: {said}"));
    assert!(
        blocked.contains("cluster \"two\"") && blocked.contains("3h ago"),
        "{blocked}"
    );
    for (name, cluster) in [("E", "one"), ("E", "two"), ("A", "one"), ("F", "two")] {
        assert!(
            world.anchored(name, cluster),
            "{cluster}'s anchor of {name} went: {said}"
        );
    }
}

#[test]
fn a_dry_run_removes_nothing_and_lists_each_anchor_with_its_reason() {
    let world = World::start("unanchor-dry", 60, &[], true);
    let output = world.unanchor(&[]);
    assert_eq!(output.status.code(), Some(0), "{}", out(&output));
    let said = text(&output.stdout);
    let (repository, e) = world.image("E");
    for cluster in ["one", "two"] {
        let tag = format!("inuse-{cluster}-{}", e.trim_start_matches("sha256:"));
        let line = (said.lines())
            .find(|line| line.starts_with(&format!("would remove the anchor {tag} of ")))
            .unwrap_or_else(|| panic!("no line for {tag}: {said}"));
        assert!(line.contains(&format!("{repository}@{e}")), "{line}");
        assert!(
            line.contains("named last by cluster \"one\"") && line.contains("40d ago"),
            "{line}"
        );
        assert!(
            world.anchored("E", cluster),
            "a dry run removed {tag}: {said}"
        );
    }
    let (_, a) = world.image("A");
    let (_, f) = world.image("F");
    assert!(
        !(said.lines())
            .any(|l| l.starts_with("would remove") && (l.contains(&a) || l.contains(&f))),
        "the anchors of what is in use are listed to go: {said}"
    );
}

#[test]
fn max_deletions_bounds_the_digests_unanchored_in_a_run_oldest_first() {
    let world = World::start("unanchor-max", 60, &[50, 60, 70], true);
    let output = world.unanchor(&["--delete", "--max-deletions", "2"]);
    assert_eq!(output.status.code(), Some(0), "{}", out(&output));
    assert!(
        !world.anchored("old-70", "one") && !world.anchored("old-60", "one"),
        "the two oldest go first: {}",
        out(&output)
    );
    assert!(
        world.anchored("old-50", "one") && world.anchored("E", "one") && world.anchored("E", "two"),
        "two digests at most: {}",
        out(&output)
    );
}

#[test]
fn a_registry_that_refuses_to_delete_a_tag_is_named_and_no_manifest_is_deleted_instead() {
    let world = World::start("unanchor-refused", 60, &[], false);
    let output = world.unanchor(&["--delete"]);
    assert_eq!(output.status.code(), Some(1), "{}", out(&output));
    let said = text(&output.stdout);
    let (repository, e) = world.image("E");
    let line = (said.lines())
        .find(|line| {
            line.starts_with("FAILED to remove") && line.contains(&format!("{repository}@{e}"))
        })
        .unwrap_or_else(|| panic!("no line for E: {said}"));
    assert!(
        line.contains("400 DIGEST_INVALID") && line.contains("refuses to delete a tag"),
        "{line}"
    );
    assert!(world.pullable("E"), "E was deleted: {said}");
    assert!(
        world.anchored("E", "one") && world.anchored("E", "two"),
        "{said}"
    );
    let deletions: Vec<String> = (world.far.seen.lock().expect("the proxy's log").iter())
        .filter(|request| request.starts_with("DELETE"))
        .cloned()
        .collect();
    assert!(
        !deletions.is_empty() && deletions.iter().all(|d| d.contains("/manifests/inuse-")),
        "only anchor tags are asked to go: {deletions:?}"
    );
}

#[test]
fn an_ecr_registry_not_named_by_ecr_registry_is_refused_before_any_request_saying_why() {
    let mirror = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/hub";
    let output = run(&["prune", "--unanchor-only", "--mirror", mirror, "--delete"]);
    assert_eq!(output.status.code(), Some(2), "{}", out(&output));
    let said = out(&output);
    assert!(
        said.contains("123456789012.dkr.ecr.eu-west-1.amazonaws.com")
            && said.contains("not named by --ecr-registry")
            && said.contains("through ECR's API"),
        "{said}"
    );
}
