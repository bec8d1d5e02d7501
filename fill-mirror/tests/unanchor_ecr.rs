//! `fill-mirror prune --unanchor-only` on ECR: the real binary against the rig's ECR (moto's
//! server for the repositories, the registry front on Debian's `docker-registry` for the
//! registry endpoint, and the API front that answers `DescribeImages` and `BatchDeleteImage`
//! from that registry's storage as ECR's API reference describes them), both 5 ms away
//! through the latency proxy. The sets and ledger are written here by hand as JSON, the images
//! and anchors pushed with the rig's own requests, and every check of what is there is the
//! test's own request to the registry's storage.

mod rig;

use std::process::Output;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use rig::ecr::{EcrRegistry, Moto};
use rig::ecr_api::EcrApi;
use rig::images::Image;
use rig::proxy::LatencyProxy;
use rig::registry::TestRegistry;
use rig::{fill_mirror, text};
use serde_json::json;

const AWAY: Duration = Duration::from_millis(5);
const DAY: i64 = 86_400;
const SET_TYPE: &str = "application/vnd.kubewarden.image-swapper.in-use.v1+json";
const LEDGER_TYPE: &str = "application/vnd.kubewarden.image-swapper.prune-ledger.v1+json";
const IN_USE: &str = "image-swapper/in-use";

/// The environment variables of registry access the binary reads, cleared so that the test's
/// own environment cannot lend it anything.
const ACCESS_ENV: [&str; 6] = [
    "REGISTRY_AUTH_FILE",
    "FILL_MIRROR_ECR_REGISTRIES",
    "KUBEWARDEN_SOURCES_PATH",
    "AWS_ENDPOINT_URL_ECR",
    "AWS_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
];

fn ago(seconds: i64) -> String {
    Timestamp::from_second(Timestamp::now().as_second() - seconds)
        .expect("a time")
        .to_string()
}

struct World {
    storage: TestRegistry,
    moto: Moto,
    _front: EcrRegistry,
    _api: EcrApi,
    /// The registry endpoint 5 ms away: the `--ecr-registry` and the mirror's host.
    far: LatencyProxy,
    /// ECR's API 5 ms away.
    api_far: LatencyProxy,
    /// Name -> (repository, image).
    images: Vec<(String, String, Image)>,
}

impl World {
    /// K tagged 1.0 and anchored by "one", dropped from its set 40 days ago as the ledger
    /// remembers; L anchored by "one" and "two" and tagged nothing else, last named by "one"
    /// 45 days ago; A anchored by "one" and named by its fresh set now (the ledger, of a prune
    /// that last ran 40 days ago, remembers it then); F anchored by "two", named by its set.
    /// Then each of `old` anchored by "one" only, named that many days ago. "two"'s set
    /// published `two_published` seconds ago.
    fn start(name: &str, two_published: i64, old: &[i64]) -> World {
        let storage = TestRegistry::start(name).expect("storage registry");
        let moto = Moto::start().expect("moto_server (scripts/ensure-python-tools.sh)");
        let front = EcrRegistry::start(&storage, &moto).expect("ECR front");
        let api = EcrApi::start(&storage, &moto).expect("ECR API front");
        let far = LatencyProxy::network(&front.host, AWAY).expect("latency proxy");
        let api_host = api.endpoint.trim_start_matches("http://").to_string();
        let api_far = LatencyProxy::network(&api_host, AWAY).expect("latency proxy");
        let mut world = World {
            storage,
            moto,
            _front: front,
            _api: api,
            far,
            api_far,
            images: Vec::new(),
        };
        world.create(IN_USE);
        let mut remembered = Vec::new();
        world.add("K", &["1.0"], &["one"]);
        remembered.push(world.remembered("K", 40));
        world.add("L", &[], &["one", "two"]);
        remembered.push(world.remembered("L", 45));
        world.add("A", &["1.0"], &["one"]);
        remembered.push(world.remembered("A", 40));
        world.add("F", &[], &["two"]);
        for days in old {
            let name = format!("old-{days}");
            world.add(&name, &[], &["one"]);
            remembered.push(world.remembered(&name, *days));
        }
        world.push_set("one", 30, &[world.entry("A")]);
        world.push_set("two", two_published, &[world.entry("F")]);
        let ledger = format!(r#"{{"images":[{}]}}"#, remembered.join(","));
        world.push_artifact("_prune-ledger", LEDGER_TYPE, &ledger);
        world
    }

    fn create(&self, repository: &str) {
        (self.moto)
            .ecr("CreateRepository", &json!({"repositoryName": repository}))
            .expect("CreateRepository");
    }

    /// Pushes image `name` to `hub/app-<name>` under `tags` and an anchor of each of
    /// `clusters` (`inuse-<cluster>-<hex>`, written here from the retention page's form).
    fn add(&mut self, name: &str, tags: &[&str], clusters: &[&str]) {
        let repository = format!("hub/app-{}", name.to_lowercase());
        self.create(&repository);
        let image = Image::new(&format!("image {name}"), "linux/amd64");
        let digest = image.push(&self.storage, &repository, None);
        let anchors = clusters
            .iter()
            .map(|cluster| format!("inuse-{cluster}-{}", digest.trim_start_matches("sha256:")));
        for tag in tags.iter().map(|t| t.to_string()).chain(anchors) {
            (self.storage)
                .push_manifest(&repository, &tag, image.media_type, &image.manifest)
                .expect("a tag");
        }
        self.images.push((name.to_string(), repository, image));
    }

    fn image(&self, name: &str) -> (&str, String) {
        let (_, repository, image) = (self.images.iter())
            .find(|i| i.0 == name)
            .expect("an image of the world");
        (repository, image.digest())
    }

    fn entry(&self, name: &str) -> String {
        let (repository, digest) = self.image(name);
        format!(
            r#"{{"repository":"{repository}","digest":"{digest}","lastSeen":"{}","usedBy":["Deployment shop/{name}"]}}"#,
            ago(60)
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
        let registry = &self.storage;
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
        self.storage.digest_of(repository, &tag) == Some(digest)
    }

    /// Whether `name`'s manifest is still served by digest, its very bytes.
    fn pullable(&self, name: &str) -> bool {
        let (_, repository, image) = (self.images.iter()).find(|i| i.0 == name).expect("image");
        let url = format!(
            "http://{}/v2/{repository}/manifests/{}",
            self.storage.host,
            image.digest()
        );
        let Ok(reply) = ureq::get(&url).set("Accept", image.media_type).call() else {
            return false;
        };
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut reply.into_reader(), &mut bytes).is_ok()
            && bytes == image.manifest
    }

    fn unanchor(&self, extra: &[&str]) -> Output {
        let mirror = format!("{}/hub", self.far.host);
        let mut command = fill_mirror();
        command
            .args([
                "prune",
                "--unanchor-only",
                "--insecure",
                "--mirror",
                &mirror,
            ])
            .args(["--ecr-registry", &self.far.host, "--keep-for", "30d"])
            .args(extra)
            .args(["--log-format", "text"]);
        for name in ACCESS_ENV {
            command.env_remove(name);
        }
        command.envs(self.moto.environment());
        command.env("AWS_ENDPOINT_URL", format!("http://{}", self.api_far.host));
        command.output().expect("run fill-mirror")
    }
}

fn out(output: &Output) -> String {
    format!("{}{}", text(&output.stdout), text(&output.stderr))
}

#[test]
fn a_delete_run_removes_stale_anchors_deletes_an_image_with_its_last_tags_and_keeps_what_a_fresh_set_names()
 {
    let world = World::start("ecr-unanchor-delete", 60, &[]);
    let output = world.unanchor(&["--delete"]);
    let said = out(&output);
    assert_eq!(output.status.code(), Some(0), "{said}");
    assert!(!world.anchored("K", "one"), "K's anchor stays: {said}");
    let (repository, k) = world.image("K");
    assert_eq!(
        world.storage.digest_of(repository, "1.0"),
        Some(k),
        "K's own tag: {said}"
    );
    assert!(world.pullable("K"), "K no longer pulls by digest: {said}");
    assert!(
        !world.pullable("L"),
        "L outlived its last tags, which ECR deletes it with: {said}"
    );
    assert!(world.anchored("A", "one"), "A's anchor went: {said}");
    assert!(world.anchored("F", "two"), "F's anchor went: {said}");
    assert!(world.pullable("A") && world.pullable("F"), "{said}");
}

#[test]
fn a_dry_run_removes_nothing_and_lists_both_kinds_with_their_reasons() {
    let world = World::start("ecr-unanchor-dry", 60, &[]);
    let output = world.unanchor(&[]);
    let said = text(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{}", out(&output));
    let line_of = |name: &str, cluster: &str| {
        let (repository, digest) = world.image(name);
        let tag = format!("inuse-{cluster}-{}", digest.trim_start_matches("sha256:"));
        let line = (said.lines())
            .find(|line| line.starts_with(&format!("would remove the anchor {tag} of ")))
            .unwrap_or_else(|| panic!("no line for {tag}: {said}"))
            .to_string();
        assert!(line.contains(&format!("{repository}@{digest}")), "{line}");
        line
    };
    let k = line_of("K", "one");
    assert!(
        k.contains("named last by cluster \"one\"")
            && k.contains("40d ago")
            && k.contains("the registry's own rules decide the rest"),
        "{k}"
    );
    for cluster in ["one", "two"] {
        let l = line_of("L", cluster);
        assert!(
            l.contains("45d ago") && l.contains("its last tags: the image goes with them"),
            "{l}"
        );
    }
    for (name, cluster) in [("K", "one"), ("L", "one"), ("L", "two")] {
        assert!(
            world.anchored(name, cluster),
            "a dry run removed {cluster}'s anchor of {name}: {said}"
        );
    }
    assert!(world.pullable("L"), "a dry run deleted L: {said}");
    assert!(
        said.contains("3 anchors of 2 digests (1 of them images that go with their last tags) would be removed"),
        "{said}"
    );
}

#[test]
fn an_image_deleted_with_its_last_tags_counts_under_max_deletions_oldest_first() {
    let world = World::start("ecr-unanchor-max", 60, &[60]);
    let output = world.unanchor(&["--delete", "--max-deletions", "2"]);
    let said = out(&output);
    assert_eq!(output.status.code(), Some(0), "{said}");
    assert!(
        !world.pullable("old-60") && !world.pullable("L"),
        "the two oldest go first, each with its last tags: {said}"
    );
    assert!(
        world.anchored("K", "one"),
        "a third removal in a run of --max-deletions 2: {said}"
    );
    assert!(
        said.lines()
            .any(|line| line.starts_with("held (beyond --max-deletions 2")),
        "{said}"
    );
}

#[test]
fn another_clusters_stale_set_blocks_every_removal_and_every_image_stays() {
    let world = World::start("ecr-unanchor-stale", 3 * 3600, &[]);
    let output = world.unanchor(&["--delete", "--stale-after", "1h"]);
    let said = text(&output.stdout);
    assert_eq!(output.status.code(), Some(3), "{}", out(&output));
    let blocked = (said.lines())
        .find(|line| line.starts_with("blocked:"))
        .unwrap_or_else(|| panic!("no blocked line: {said}"));
    assert!(
        blocked.contains("cluster \"two\"") && blocked.contains("3h ago"),
        "{blocked}"
    );
    for (name, cluster) in [("K", "one"), ("L", "one"), ("L", "two"), ("A", "one")] {
        assert!(
            world.anchored(name, cluster),
            "{cluster}'s anchor of {name} went: {said}"
        );
    }
    assert!(world.pullable("L"), "L was deleted: {said}");
}
