//! Retention in one real chain, from the Pods to the deletion: kube-apiserver with
//! kube-controller-manager (the real tools), policy-server 1.35 serving the built module as the
//! namespace's mutating webhook, `fill-mirror watch` run with deploy/base's arguments and
//! environment (the test adds only `--insecure`, for plain-HTTP registries on loopback, and a
//! loopback `--listen`), a second control plane whose own watch publishes for its own cluster id
//! (`FILL_MIRROR_CLUSTER_ID=auto`: each plane's kube-system UID), and `fill-mirror prune` with
//! deploy/registry/mirror-prune.yaml's arguments (its mirror replaced, as the overlay does). The
//! source registry is 30 ms and the mirror 20 ms away behind the rig's relays.
//!
//! The workloads: a Deployment running A (its Pod swapped to the mirror by the policy once the
//! watch filled it), a Deployment scaled to zero naming B, a CronJob naming C, a Deployment
//! rolled out by kube-controller-manager from D to D2 (its older ReplicaSet names D), an image E
//! the watch copied for a Deployment deleted before any set named it, G named by a Deployment
//! deleted after the sets named it, and F, which only the second cluster's Deployment names.
//!
//! A month is not waited for: the later runs of the watches and the prune are the same binary
//! under libfaketime (`FAKETIME=+31d`, Debian's `faketime`), whose clock reads 31 days on; the
//! API server, the registries and the policy keep the real one. Outcomes: at first, nothing is
//! deleted (every image is within `--keep-for 30d`); 31 days on, with the second cluster's set
//! 31 days old, nothing is deleted and the run says why (exit 3); once it publishes again a dry
//! run deletes nothing and lists E and G alone, each with its reason, and `--delete` deletes E
//! and G alone (A, B, C, D, D2 and F pulled by digest after). The same mirror under
//! deploy/eks-ecr's lifecycle rules, evaluated as ECR documents it (`rig::lifecycle`) over the
//! tags the watches wrote, keeps A to F but E, which it expires. Each outcome is checked and all
//! the failed ones are reported together.

mod rig;

#[allow(dead_code)] // the record's reading half is the prune's
#[path = "../fill-mirror/src/in_use_set.rs"]
mod in_use_set;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use in_use_set::InUseSet;
use rig::chain::{self, Entry, Webhook};
use rig::images::Image;
use rig::lifecycle;
use rig::proxy::LatencyProxy;
use rig::registry::TestRegistry;
use rig::tools::{ControlPlane, PolicyServer, PolicyServerOptions, RealTools, free_port};
use serde_json::{Value, json};

const TEST: &str = "retention_chain";
/// The namespace of the workloads, which the webhook covers.
const SHOP: &str = "shop";
/// Where libfaketime is (Debian's `libfaketime`, pulled in by `faketime`).
const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
/// A month on: past the prune's `--keep-for 30d`, and far past its `--stale-after 1h`.
const MONTH_ON: &str = "+31d";
const MONTH_ON_DAYS: f64 = 31.0;
const ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.index.v1+json";

/// One of the two clusters: its control plane, its id (kube-system's UID) and its watch.
struct Cluster {
    name: &'static str,
    plane: ControlPlane,
    id: String,
    watch: Option<Child>,
    runs: usize,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut child) = self.watch.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The outcomes that failed, each with what was seen; reported together at the end.
#[derive(Default)]
struct Outcomes(Vec<String>);

impl Outcomes {
    fn check(&mut self, outcome: &str, held: bool, seen: impl FnOnce() -> String) {
        eprintln!("{} {outcome}", if held { "held:" } else { "FAILED:" });
        if !held {
            self.0.push(format!("{outcome}\n{}", seen()));
        }
    }
}

/// The chain's parts the steps share.
struct World {
    tools: RealTools,
    /// Kept alive for the chain: the watches copy from it through `source_far`.
    _source: TestRegistry,
    mirror: TestRegistry,
    source_far: LatencyProxy,
    mirror_far: LatencyProxy,
    scratch: PathBuf,
    /// An empty docker config: the registries ask for no login (REGISTRY_AUTH_FILE's file).
    auth_file: PathBuf,
    /// Name (A, B, C, D, D2, E, F) -> (mirror repository, digest).
    images: BTreeMap<&'static str, (String, String)>,
}

#[test]
fn the_prune_and_the_ecr_rules_keep_what_two_clusters_use_and_drop_e_alone() {
    let Some(tools) = RealTools::find(TEST) else {
        return;
    };
    if !Path::new(FAKETIME_LIB).exists() {
        let how = format!("no {FAKETIME_LIB}: `scripts/ensure-packages.sh faketime`");
        assert!(
            std::env::var("CI").map_or(true, |ci| ci != "true"),
            "{TEST}: libfaketime is required in CI: {how}"
        );
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "SKIPPED {TEST}: did not run: {how}");
        return;
    }
    // Built before the clock starts: the chain's time is the chain's.
    rig::fill_mirror();
    let started = Instant::now();
    let world = World::start(tools);
    let mut outcomes = Outcomes::default();
    run_chain(&world, &mut outcomes);
    eprintln!("{TEST}: {:.1} s", started.elapsed().as_secs_f64());
    assert!(
        outcomes.0.is_empty(),
        "{} outcome(s) failed:\n\n{}",
        outcomes.0.len(),
        outcomes.0.join("\n\n")
    );
}

fn run_chain(world: &World, outcomes: &mut Outcomes) {
    let module = world.tools.annotated_policy();
    let (east, west) = std::thread::scope(|scope| {
        let east = scope.spawn(|| world.cluster("east", true));
        let west = world.cluster("west", false);
        (east.join().expect("east's control plane"), west)
    });
    let (mut east, mut west) = (east, west);
    let settings = world.settings();
    let sources = chain::insecure_sources(&[&world.source_far.host, &world.mirror_far.host]);
    let server = PolicyServer::start(
        &world.tools,
        &chain::policies_yml(
            &world.tools,
            &[Entry::new("image-swapper", &module, settings)],
        ),
        PolicyServerOptions {
            sources: Some(&sources),
            policy_timeout: Some(10),
            ..PolicyServerOptions::default()
        },
    );
    Webhook {
        name: "clusterwide-image-swapper.shop",
        server: &server,
        policy: "image-swapper",
        namespaces: &[SHOP],
        failure_policy: "Fail",
        timeout_seconds: 15,
    }
    .install(&east.plane);

    // The watches' first runs publish their (empty) sets at start; the next publication is a
    // period (600 s) away, so what is created after this is named only at the next start.
    world.start_watch(&mut east, None);
    world.start_watch(&mut west, None);
    world.published_after(&east, None);
    world.published_after(&west, None);

    let image = |name: &str| world.source_image(name);
    apply(&east, &deployment("a", &image("a:1"), 0));
    apply(&east, &deployment("b", &image("b:1"), 0));
    apply(&east, &cron_job("c", &image("c:1")));
    apply(&east, &deployment("d", &image("d:1"), 0));
    apply(&east, &deployment("e", &image("e:1"), 0));
    apply(&east, &deployment("g", &image("g:1"), 0));
    apply(&west, &deployment("f", &image("f:1"), 0));
    for name in ["a", "b", "c", "d", "e", "f", "g"] {
        world.filled(name, "1", &[&east, &west]);
    }
    // kube-controller-manager rolls d out from D to D2: its first ReplicaSet then names D only.
    east.plane.kubectl_ok(
        &[
            "set",
            "image",
            "-n",
            SHOP,
            "deployment/d",
            &format!("c={}", image("d:2")),
        ],
        None,
    );
    until(60, "d's second ReplicaSet", || {
        replica_sets(&east, "d") >= 2
    });
    world.filled("d", "2", &[&east]);
    // E was copied for a Deployment that is deleted before any set could name it.
    east.plane
        .kubectl_ok(&["delete", "deployment", "-n", SHOP, "e"], None);
    // A runs: its Pod, made by kube-controller-manager, is swapped to the filled mirror.
    east.plane
        .kubectl_ok(&["scale", "-n", SHOP, "deployment/a", "--replicas=1"], None);
    let (a_repository, a_digest) = world.images["A"].clone();
    let swapped = format!("{}/{a_repository}:1@{a_digest}", world.mirror_far.host);
    let mut pod_images = Vec::new();
    until(60, "a's Pod", || {
        pod_images = pods_of(&east, "a");
        !pod_images.is_empty()
    });
    outcomes.check(
        "A's Pod is swapped to the mirror the watch filled, pinned",
        pod_images == [swapped.clone()],
        || format!("Pods of a: {pod_images:?}, wanted [{swapped}]"),
    );

    // Restarts (a rollout of the Deployment): each run publishes at its start.
    world.restart_watch(&mut east, None);
    world.restart_watch(&mut west, None);

    // Today: a dry run (as deployed), then --delete: everything is within the age.
    let dry = world.prune(None, false);
    let deleting = world.prune(None, true);
    let all = ["A", "B", "C", "D", "D2", "E", "F", "G"];
    outcomes.check(
        "today, within --keep-for 30d, the prune deletes nothing",
        dry.status.code() == Some(0)
            && deleting.status.code() == Some(0)
            && world.lines(&dry, "would delete").is_empty()
            && world.lines(&deleting, "deleted").is_empty()
            && world.missing(&all).is_empty(),
        || {
            format!(
                "gone: {:?}\n{}\n{}",
                world.missing(&all),
                said(&dry),
                said(&deleting)
            )
        },
    );

    // G's Deployment goes: named today, by a month on its last naming is older than the age.
    east.plane
        .kubectl_ok(&["delete", "deployment", "-n", SHOP, "g"], None);

    // A month on. The first cluster's watch runs on; the second's has not run since.
    world.stop_watch(&mut west);
    world.restart_watch(&mut east, Some(MONTH_ON));
    let stale = world.prune(Some(MONTH_ON), true);
    let blocked = format!("blocked: the in-use set of cluster {:?}", west.id);
    outcomes.check(
        "with the second cluster's set stale, the prune deletes nothing and says why (exit 3)",
        stale.status.code() == Some(3)
            && said(&stale).contains(&blocked)
            && said(&stale).contains("longer ago than --stale-after 1h")
            && world.missing(&all).is_empty(),
        || {
            format!(
                "gone: {:?}, wanted a line {blocked:?}\n{}",
                world.missing(&all),
                said(&stale)
            )
        },
    );

    world.restart_watch(&mut west, Some(MONTH_ON));
    // The registry-side protection over the same mirror, before the prune touches it.
    // Over A to F: G, anchored while its cluster used it, keeps that anchor under ECR's rules
    // until something removes the tag, which no component does (the watch deletes nothing, the
    // prune deletes manifests by digest): G is the prune's case.
    let expired = world.ecr_expired();
    let ecr_expired: Vec<&str> = ["A", "B", "C", "D", "D2", "E", "F"]
        .into_iter()
        .filter(|name| expired.contains(&world.named(name)))
        .collect();
    outcomes.check(
        "deploy/eks-ecr's lifecycle rules, over the tags the watches wrote, keep A-D and F and expire E",
        ecr_expired == ["E"],
        || {
            format!(
                "expired: {expired:#?}\nwanted only {}\ntags: {:#?}",
                world.named("E"),
                world.tags()
            )
        },
    );

    let dry = world.prune(Some(MONTH_ON), false);
    let listed = world.lines(&dry, "would delete");
    let (e_repository, e_digest) = &world.images["E"];
    let (g_repository, g_digest) = &world.images["G"];
    let age = "(31d ago, longer than --keep-for 30d)";
    let never = "named by no cluster's set since first seen so at";
    let last = format!("named last by cluster {:?} at", east.id);
    let line = |image: &str, reason: &str| {
        listed
            .iter()
            .any(|line| line.contains(image) && line.contains(reason) && line.contains(age))
    };
    outcomes.check(
        "a dry run deletes nothing and lists E and G alone, each with its reason",
        dry.status.code() == Some(0)
            && listed.len() == 2
            && line(&format!("{e_repository}@{e_digest}"), never)
            && line(&format!("{g_repository}@{g_digest}"), &last)
            && world.missing(&all).is_empty(),
        || format!("gone: {:?}\n{}", world.missing(&all), said(&dry)),
    );

    let deleting = world.prune(Some(MONTH_ON), true);
    outcomes.check(
        "--delete deletes E and G alone; A, B, C, D, D2 and F are still pulled by digest",
        deleting.status.code() == Some(0)
            && world.missing(&all) == ["E", "G"]
            && world.lines(&deleting, "deleted").len() == 2,
        || {
            format!(
                "gone: {:?}, wanted [\"E\", \"G\"]\n{}",
                world.missing(&all),
                said(&deleting)
            )
        },
    );
    world.stop_watch(&mut east);
    world.stop_watch(&mut west);
}

impl World {
    fn start(tools: RealTools) -> World {
        let source = TestRegistry::start("retention-chain-source").expect("source registry");
        let mirror = TestRegistry::start("retention-chain-mirror").expect("mirror registry");
        let source_far =
            LatencyProxy::network(&source.host, Duration::from_millis(30)).expect("relay");
        let mirror_far =
            LatencyProxy::network(&mirror.host, Duration::from_millis(20)).expect("relay");
        let scratch = rig::tools::scratch_dir("retention-chain");
        let auth_file = scratch.join("auth.json");
        std::fs::write(&auth_file, r#"{"auths":{}}"#).expect("auth file");
        let mut images = BTreeMap::new();
        for (name, repository, tag) in [
            ("A", "a", "1"),
            ("B", "b", "1"),
            ("C", "c", "1"),
            ("D", "d", "1"),
            ("D2", "d", "2"),
            ("E", "e", "1"),
            ("G", "g", "1"),
            ("F", "f", "1"),
        ] {
            let source_repository = format!("team/app-{repository}");
            let digest = Image::new(&format!("image {name}"), "linux/amd64").push(
                &source,
                &source_repository,
                Some(tag),
            );
            images.insert(name, (format!("hub/{source_repository}"), digest));
        }
        World {
            tools,
            _source: source,
            mirror,
            source_far,
            mirror_far,
            scratch,
            auth_file,
            images,
        }
    }

    /// The swapping policy's settings, for policy-server and the clusters' policy objects.
    fn settings(&self) -> Value {
        json!({"mirrors": [{"source": self.source_far.host,
            "target": format!("{}/hub", self.mirror_far.host)}],
            "lookupBudgetMilliseconds": 8000})
    }

    fn source_image(&self, name_tag: &str) -> String {
        format!("{}/team/app-{name_tag}", self.source_far.host)
    }

    /// A control plane with the namespace, Kubewarden's CRDs and the swapping policy's object
    /// (what the watch reads its settings from), and its kube-system UID.
    fn cluster(&self, name: &'static str, controller_manager: bool) -> Cluster {
        let plane = ControlPlane::start(&self.tools, controller_manager);
        chain::kubewarden_crds(&plane);
        chain::namespaces(&plane, &[SHOP, chain::MARKERS]);
        let policy = chain::kubewarden_policy(
            "ClusterAdmissionPolicy",
            None,
            "image-swapper",
            "registry://ghcr.io/image-swapper-policy/image-swapper:v0",
            true,
            self.settings(),
        );
        plane.kubectl_ok(&["apply", "-f", "-"], Some(&policy.to_string()));
        let id = plane.kubectl_ok(
            &[
                "get",
                "namespace",
                "kube-system",
                "-o",
                "jsonpath={.metadata.uid}",
            ],
            None,
        );
        Cluster {
            name,
            plane,
            id: id.trim().to_string(),
            watch: None,
            runs: 0,
        }
    }

    /// `fill-mirror watch` with the arguments and environment of deploy/base's Deployment, its
    /// paths in the scratch folder; under libfaketime at `clock` when given.
    fn start_watch(&self, cluster: &mut Cluster, clock: Option<&str>) {
        let container = deployed_container(
            "deploy/base/fill-mirror.yaml",
            "Deployment",
            "/spec/template/spec/containers/0",
        );
        let mut args = strings(&container["args"]);
        let listen = args.iter().position(|a| a == "--listen").expect("--listen") + 1;
        args[listen] = format!("127.0.0.1:{}", free_port());
        args.extend(["--insecure", "--log-format", "text"].map(String::from));
        cluster.runs += 1;
        let log = self
            .scratch
            .join(format!("watch-{}-{}.log", cluster.name, cluster.runs));
        let mut command = Command::new(rig::fill_mirror());
        command
            .args(&args)
            .env("KUBECONFIG", &cluster.plane.kubeconfig)
            .env(
                "HOSTNAME",
                format!("fill-mirror-{}-{}", cluster.name, cluster.runs),
            );
        self.deployed_env(&mut command, &container);
        if let Some(clock) = clock {
            command
                .env("LD_PRELOAD", FAKETIME_LIB)
                .env("FAKETIME", clock);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("start fill-mirror watch");
        cluster.watch = Some(child);
    }

    /// Stops the watch as Kubernetes does (SIGTERM: it gives up its Lease), then kills it.
    fn stop_watch(&self, cluster: &mut Cluster) {
        let Some(mut child) = cluster.watch.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// A new run of the watch (under `clock`), waited for until it published its set.
    fn restart_watch(&self, cluster: &mut Cluster, clock: Option<&str>) {
        let before = self.read_set(&cluster.id).map(|set| set.published);
        self.stop_watch(cluster);
        self.start_watch(cluster, clock);
        self.published_after(cluster, before);
    }

    fn published_after(&self, cluster: &Cluster, before: Option<k8s_openapi::jiff::Timestamp>) {
        until(90, &format!("{}'s set published", cluster.name), || {
            self.read_set(&cluster.id)
                .is_some_and(|set| before.is_none_or(|before| set.published > before))
        });
    }

    /// The environment of a deployed container, its mounted paths in the scratch folder: the
    /// docker config (a Secret's mount) is the empty auth file, `/tmp` the scratch folder.
    fn deployed_env(&self, command: &mut Command, container: &Value) {
        for env in container["env"].as_array().into_iter().flatten() {
            let (Some(name), Some(value)) = (env["name"].as_str(), env["value"].as_str()) else {
                continue;
            };
            let value = if value.ends_with("config.json") {
                self.auth_file.display().to_string()
            } else if value == "/tmp" {
                self.scratch.display().to_string()
            } else {
                value.to_string()
            };
            command.env(name, value);
        }
    }

    /// `fill-mirror prune` with deploy/registry/mirror-prune.yaml's arguments and environment
    /// (the mirror replaced, as the overlay does), `--delete` when asked, under `clock`.
    fn prune(&self, clock: Option<&str>, delete: bool) -> Output {
        let container = deployed_container(
            "deploy/registry/mirror-prune.yaml",
            "CronJob",
            "/spec/jobTemplate/spec/template/spec/containers/0",
        );
        let mut args = strings(&container["args"]);
        let mirror = args.iter().position(|a| a == "--mirror").expect("--mirror") + 1;
        args[mirror] = format!("{}/hub", self.mirror_far.host);
        args.extend(["--insecure", "--log-format", "text"].map(String::from));
        if delete {
            args.push("--delete".to_string());
        }
        let mut command = Command::new(rig::fill_mirror());
        command.args(&args);
        self.deployed_env(&mut command, &container);
        if let Some(clock) = clock {
            command
                .env("LD_PRELOAD", FAKETIME_LIB)
                .env("FAKETIME", clock);
        }
        let output = command.output().expect("fill-mirror prune");
        eprintln!(
            "fill-mirror {} ({}): exit {:?}\n{}",
            args.join(" "),
            clock.unwrap_or("now"),
            output.status.code(),
            said(&output)
        );
        output
    }

    /// The lines of a prune's output that start with `verb ` and name an image of the mirror.
    fn lines(&self, output: &Output, verb: &str) -> Vec<String> {
        let prefix = format!("{verb} {}/", self.mirror_far.host);
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|line| line.starts_with(&prefix))
            .map(str::to_string)
            .collect()
    }

    /// `repository:tag` of the mirror, waited for: the watch copied it from the source.
    fn filled(&self, app: &str, tag: &str, clusters: &[&Cluster]) {
        let repository = format!("hub/team/app-{app}");
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.mirror.digest_of(&repository, tag).is_none() {
            if Instant::now() > deadline {
                let logs: Vec<String> = clusters
                    .iter()
                    .map(|c| {
                        std::fs::read_to_string(
                            self.scratch
                                .join(format!("watch-{}-{}.log", c.name, c.runs)),
                        )
                        .unwrap_or_default()
                    })
                    .collect();
                panic!(
                    "{repository}:{tag} not in the mirror within 60 s:\n{}",
                    logs.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The set `cluster` published in the mirror, read with the test's own GETs.
    fn read_set(&self, cluster: &str) -> Option<InUseSet> {
        let repository = in_use_set::DEFAULT_REPOSITORY;
        let manifest: Value = serde_json::from_slice(&self.get(
            &format!("{repository}/manifests/{cluster}"),
            "application/vnd.oci.image.manifest.v1+json",
        )?)
        .ok()?;
        let layer = manifest.pointer("/layers/0/digest")?.as_str()?;
        serde_json::from_slice(&self.get(&format!("{repository}/blobs/{layer}"), "*/*")?).ok()
    }

    fn get(&self, path: &str, accept: &str) -> Option<Vec<u8>> {
        let url = format!("http://{}/v2/{path}", self.mirror.host);
        let response = ureq::get(&url).set("Accept", accept).call().ok()?;
        let mut body = Vec::new();
        std::io::Read::read_to_end(&mut response.into_reader(), &mut body).ok()?;
        Some(body)
    }

    /// `repository@digest` of the image `name`.
    fn named(&self, name: &str) -> String {
        let (repository, digest) = &self.images[name];
        format!("{repository}@{digest}")
    }

    /// The images of `names` the mirror no longer serves whole: its manifest by digest, then
    /// every blob the manifest names, each fetched.
    fn missing(&self, names: &[&'static str]) -> Vec<&'static str> {
        names
            .iter()
            .copied()
            .filter(|name| {
                let (repository, digest) = &self.images[*name];
                let Some(manifest) = self.get(&format!("{repository}/manifests/{digest}"), ACCEPT)
                else {
                    return true;
                };
                let manifest: Value = serde_json::from_slice(&manifest).unwrap_or_default();
                let blobs = std::iter::once(&manifest["config"])
                    .chain(manifest["layers"].as_array().into_iter().flatten())
                    .filter_map(|blob| blob["digest"].as_str());
                !blobs
                    .map(|blob| self.get(&format!("{repository}/blobs/{blob}"), "*/*"))
                    .all(|got| got.is_some())
            })
            .collect()
    }

    /// Every repository under `hub/` and, per digest, the tags that name it.
    fn tags(&self) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
        let catalog: Value = serde_json::from_slice(
            &self
                .get("_catalog?n=1000", "application/json")
                .expect("the catalog"),
        )
        .expect("the catalog's JSON");
        let mut repositories = BTreeMap::new();
        for repository in strings(&catalog["repositories"]) {
            if !repository.starts_with("hub/") {
                continue;
            }
            let listed: Value = serde_json::from_slice(
                &self
                    .get(
                        &format!("{repository}/tags/list?n=1000"),
                        "application/json",
                    )
                    .expect("tags"),
            )
            .expect("the tags' JSON");
            let mut by_digest: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for tag in strings(&listed["tags"]) {
                if let Some(digest) = self.mirror.digest_of(&repository, &tag) {
                    by_digest.entry(digest).or_default().push(tag);
                }
            }
            repositories.insert(repository, by_digest);
        }
        repositories
    }

    /// What deploy/eks-ecr's lifecycle policy expires of the mirror, repository by repository as
    /// ECR applies it, every image taken as pushed a month ago (the watch copied them today):
    /// `repository@digest` of each.
    fn ecr_expired(&self) -> BTreeSet<String> {
        let policy =
            std::fs::read_to_string(rig::root().join("deploy/eks-ecr/aws/lifecycle-policy.json"))
                .expect("deploy/eks-ecr/aws/lifecycle-policy.json");
        let mut expired = BTreeSet::new();
        for (repository, by_digest) in self.tags() {
            let images: Vec<lifecycle::Image> = by_digest
                .iter()
                .map(|(digest, tags)| {
                    let tags: Vec<&str> = tags.iter().map(String::as_str).collect();
                    lifecycle::Image::new(&format!("{repository}@{digest}"), &tags, MONTH_ON_DAYS)
                })
                .collect();
            expired.extend(lifecycle::expired(&policy, &images).expect("ECR takes the policy"));
        }
        expired
    }
}

/// The first container of the `kind` object of a deploy/ file, as JSON.
fn deployed_container(file: &str, kind: &str, pointer: &str) -> Value {
    let text = std::fs::read_to_string(rig::root().join(file)).expect(file);
    serde_yaml::Deserializer::from_str(&text)
        .filter_map(|document| <Value as serde::Deserialize>::deserialize(document).ok())
        .find(|object| object["kind"] == kind)
        .and_then(|object| object.pointer(pointer).cloned())
        .unwrap_or_else(|| panic!("no {kind} container in {file}"))
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

fn said(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn deployment(name: &str, image: &str, replicas: u32) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": SHOP},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": image}]}}}})
}

/// A CronJob whose schedule (once a year) makes no Job while the test runs.
fn cron_job(name: &str, image: &str) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": name, "namespace": SHOP},
        "spec": {"schedule": "0 0 1 1 *", "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": image}]}}}}}})
}

fn apply(cluster: &Cluster, object: &Value) {
    cluster
        .plane
        .kubectl_ok(&["apply", "-f", "-"], Some(&object.to_string()));
}

fn replica_sets(cluster: &Cluster, app: &str) -> usize {
    let listed = cluster
        .plane
        .get_json(&["replicasets", "-n", SHOP, "-l", &format!("app={app}")]);
    listed["items"].as_array().map_or(0, Vec::len)
}

/// The images of the Pods of `app`, as the API server stored them.
fn pods_of(cluster: &Cluster, app: &str) -> Vec<String> {
    let listed = cluster
        .plane
        .get_json(&["pods", "-n", SHOP, "-l", &format!("app={app}")]);
    listed["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|pod| chain::image_of(pod, 0).to_string())
        .collect()
}

fn until(seconds: u64, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while !condition() {
        assert!(Instant::now() < deadline, "{what}: not within {seconds} s");
        std::thread::sleep(Duration::from_millis(200));
    }
}
