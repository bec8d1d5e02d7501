//! The in-use set `fill-mirror watch --cluster-id` publishes, against a real kube-apiserver and
//! kube-controller-manager (Deployments roll out ReplicaSets) and a real registry on loopback
//! behind a relay that adds a network's round trip: what Pods, templates (a Deployment scaled
//! to zero included, a CronJob) and a rollback ReplicaSet name is in the set with its digest
//! and anchored (`inuse-<cluster>-<hex>`); what nothing names is not; a restart forgets nothing;
//! two clusters publish two sets into one registry. The set is read back with the test's own
//! HTTP GETs and parsed into the record's own type.

mod rig;

#[path = "../src/in_use_set.rs"]
#[allow(dead_code)]
mod in_use_set;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use in_use_set::{InUseSet, anchor_tag};
use k8s_openapi::jiff::Timestamp;
use rig::fill_mirror;
use rig::images::{Artifact, Image};
use rig::plane::{ControlPlane, find_tools};
use rig::proxy::LatencyProxy;
use rig::registry::TestRegistry;
use serde_json::{Value, json};

/// The running watch, killed on drop; its log in a file, shown when a wait fails.
struct Watch {
    child: Child,
    log: PathBuf,
}

impl Watch {
    fn start(kubeconfig: &Path, cluster: &str, log: PathBuf, auth_file: Option<&Path>) -> Watch {
        let mut command = fill_mirror();
        command.arg("watch");
        if let Some(auth_file) = auth_file {
            command.arg("--auth-file").arg(auth_file);
        }
        let child = command
            .args(["--insecure", "--log-format", "text", "--no-reports"])
            .args(["--no-templates", "--period", "2", "--listen", "127.0.0.1:0"])
            .args([
                "--cluster-id",
                cluster,
                "--lease",
                &format!("fill-{cluster}"),
            ])
            .env("KUBECONFIG", kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).expect("log")))
            .spawn()
            .expect("start fill-mirror watch");
        Watch { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The test's own login to the registries that ask for one (`Authorization`).
static LOGIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// `GET http://host/v2/<path>` with `accept`: the body, or None on any other status than 200.
fn get(host: &str, path: &str, accept: &str) -> Option<Vec<u8>> {
    let mut request = ureq::get(&format!("http://{host}/v2/{path}")).set("Accept", accept);
    if let Some(login) = LOGIN.get() {
        request = request.set("Authorization", login);
    }
    let response = request.call().ok()?;
    let mut body = Vec::new();
    std::io::Read::read_to_end(&mut response.into_reader(), &mut body).ok()?;
    Some(body)
}

/// The set `cluster` published in `host` (the default in-use repository), read as a reader
/// would: the artifact's manifest, then its one layer.
fn read_set(host: &str, cluster: &str) -> Option<InUseSet> {
    let repository = in_use_set::DEFAULT_REPOSITORY;
    let manifest = get(
        host,
        &format!("{repository}/manifests/{cluster}"),
        "application/vnd.oci.image.manifest.v1+json",
    )?;
    let manifest: Value = serde_json::from_slice(&manifest).ok()?;
    assert_eq!(
        manifest["artifactType"],
        in_use_set::MEDIA_TYPE,
        "{manifest}"
    );
    assert_eq!(
        manifest["config"]["mediaType"], "application/vnd.oci.empty.v1+json",
        "{manifest}"
    );
    let layer = manifest.pointer("/layers/0/digest")?.as_str()?;
    let bytes = get(host, &format!("{repository}/blobs/{layer}"), "*/*")?;
    Some(serde_json::from_slice(&bytes).expect("the set parses as InUseSet"))
}

/// Waits for a set of `cluster` published after `after`.
fn set_after(host: &str, cluster: &str, after: Timestamp, watch: &Watch) -> InUseSet {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(set) = read_set(host, cluster).filter(|set| set.published > after) {
            return set;
        }
        assert!(
            Instant::now() < deadline,
            "no set of {cluster} published after {after} in 90 s; the watch said:\n{}",
            watch.log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The digest the set names in `repository`, for each of `digests` (None where it names none).
fn named<'a>(set: &InUseSet, repository: &str, digests: &[&'a str]) -> Vec<(&'a str, bool)> {
    digests
        .iter()
        .map(|digest| {
            let found = set
                .images
                .iter()
                .any(|i| i.repository == repository && i.digest == *digest);
            (*digest, found)
        })
        .collect()
}

fn deployment(name: &str, image: &str, replicas: u32) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": image}]},
            },
        },
    })
}

fn cron_job(name: &str, image: &str) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "schedule": "0 0 1 1 *",
            "jobTemplate": {"spec": {"template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": image}],
            }}}},
        },
    })
}

fn apply(plane: &ControlPlane, object: &Value) {
    plane.kubectl(&["apply", "-f", "-"], Some(&object.to_string()));
}

/// The rig: a control plane (with kube-controller-manager when asked), the mirror registry and
/// the relay the watch reaches it through, and the swapping policy routing `src.example` there.
struct Rig {
    plane: ControlPlane,
    mirror: TestRegistry,
    far: LatencyProxy,
    scratch: PathBuf,
    /// With a registry that asks for a login: the auth file the watch reads it from.
    auth_file: Option<PathBuf>,
}

/// The rig; with `login`, a mirror that accepts only that user and password (htpasswd, Basic).
fn rig(test: &str, controller_manager: bool, login: Option<(&str, &str)>) -> Option<Rig> {
    let tools = find_tools(test)?;
    if controller_manager && !tools.join("bin/kube-controller-manager").exists() {
        assert!(
            std::env::var("CI").map_or(true, |ci| ci != "true"),
            "{test}: kube-controller-manager is required in CI"
        );
        eprintln!("SKIPPED {test}: did not run: no bin/kube-controller-manager in {tools:?}");
        return None;
    }
    let plane = if controller_manager {
        ControlPlane::start_with_controller_manager(tools)
    } else {
        ControlPlane::start(tools)
    };
    let mirror = match login {
        Some((user, password)) => {
            TestRegistry::start_with_basic_auth(&format!("{test}-mirror"), user, password)
        }
        None => TestRegistry::start(&format!("{test}-mirror")),
    }
    .expect("mirror registry");
    let far = LatencyProxy::network(&mirror.host, Duration::from_millis(10)).expect("relay");
    plane.install_policy_crd();
    plane.apply_swapping_policy(
        "image-swapper",
        &json!({"mirrors": [{"source": "src.example", "target": format!("{}/hub", far.host)}]}),
    );
    let scratch = std::env::temp_dir().join(format!("fill-in-use-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("scratch");
    let auth_file = login.map(|(user, password)| {
        let login = rig::registry::basic_auth(user, password);
        let _ = LOGIN.set(login.clone());
        let auth = login.trim_start_matches("Basic ").to_string();
        let path = scratch.join("auth.json");
        rig::write_json(&path, &json!({"auths": {far.host.clone(): {"auth": auth}}}));
        path
    });
    Some(Rig {
        plane,
        mirror,
        far,
        scratch,
        auth_file,
    })
}

#[test]
fn pods_templates_scaled_to_zero_cron_jobs_and_rollbacks_are_in_the_set_and_anchored() {
    let Some(rig) = rig("in-use-named", true, None) else {
        return;
    };
    let push = |content: &str, repository: &str| {
        Image::new(content, "linux/amd64").push(&rig.mirror, repository, Some("1"))
    };
    let a = push("a", "hub/app/a");
    let b = push("b", "hub/app/b");
    let c = push("c", "hub/app/c");
    // D as a Docker v2 manifest: its anchor must be put with its own media type.
    let d = Image::new("d", "linux/amd64")
        .as_docker_v2()
        .push(&rig.mirror, "hub/app/d", Some("1"));
    let d2 = Image::new("d2", "linux/amd64").push(&rig.mirror, "hub/app/d", Some("2"));
    let unnamed = push("e", "hub/app/e");
    let signature = Artifact::new("signature of a").push(
        &rig.mirror,
        "hub/app/a",
        &format!("{}.sig", a.replacen(':', "-", 1)),
    );
    // A Pod of its own, swapped to the mirror's tag, that runs Q1 (its imageID) while the tag
    // has moved on to Q2 since; one pinned to P. No node runs them: their status is written as
    // a kubelet would.
    let q1 = push("q1", "hub/app/q");
    let q2 = push("q2", "hub/app/q");
    let p = push("p", "hub/app/p");
    let bare_pod = |name: &str, image: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "default"},
               "spec": {"containers": [{"name": "c", "image": image}]}})
    };
    apply(
        &rig.plane,
        &bare_pod("runs-q", &format!("{}/hub/app/q:1", rig.far.host)),
    );
    apply(
        &rig.plane,
        &bare_pod("pinned-p", &format!("{}/hub/app/p@{p}", rig.far.host)),
    );
    let status = json!({"status": {"phase": "Running", "containerStatuses": [{
        "name": "c", "image": format!("{}/hub/app/q:1", rig.far.host),
        "imageID": format!("{}/hub/app/q@{q1}", rig.far.host),
        "ready": true, "restartCount": 0, "started": true,
        "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}},
    }]}});
    let status = status.to_string();
    let patch = [
        "patch",
        "pod",
        "runs-q",
        "-n",
        "default",
        "--subresource=status",
    ];
    rig.plane.kubectl(
        &[&patch[..], &["--type=merge", "-p", &status]].concat(),
        None,
    );
    apply(&rig.plane, &deployment("a", "src.example/app/a:1", 1));
    apply(&rig.plane, &deployment("b", "src.example/app/b:1", 0));
    apply(&rig.plane, &cron_job("c", "src.example/app/c:1"));
    apply(&rig.plane, &deployment("d", "src.example/app/d:1", 0));
    // D's first ReplicaSet, then the update that makes it a rollback target only.
    let replica_sets = |app: &str| {
        let listed =
            rig.plane
                .get_json(&["replicasets", "-n", "default", "-l", &format!("app={app}")]);
        listed["items"].as_array().map_or(0, Vec::len)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while replica_sets("d") < 1 {
        assert!(Instant::now() < deadline, "no ReplicaSet of Deployment d");
        std::thread::sleep(Duration::from_millis(200));
    }
    apply(&rig.plane, &deployment("d", "src.example/app/d:2", 0));
    while replica_sets("d") < 2 {
        assert!(
            Instant::now() < deadline,
            "no second ReplicaSet of Deployment d"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let started = Timestamp::now();
    let watch = Watch::start(
        &rig.plane.kubeconfig,
        "east",
        rig.scratch.join("watch.log"),
        rig.auth_file.as_deref(),
    );
    let set = set_after(&rig.mirror.host, "east", started, &watch);
    let expected = [
        ("hub/app/a", a.as_str()),
        ("hub/app/a", signature.as_str()),
        ("hub/app/b", b.as_str()),
        ("hub/app/c", c.as_str()),
        ("hub/app/d", d.as_str()),
        ("hub/app/d", d2.as_str()),
        ("hub/app/q", q1.as_str()),
        ("hub/app/q", q2.as_str()),
        ("hub/app/p", p.as_str()),
    ];
    for (repository, digest) in expected {
        assert_eq!(
            named(&set, repository, &[digest]),
            [(digest, true)],
            "{repository}@{digest} not in the set: {set:#?}"
        );
        let tag = anchor_tag("east", digest).expect("an anchor tag");
        assert_eq!(
            rig.mirror.digest_of(repository, &tag).as_deref(),
            Some(digest),
            "the anchor {repository}:{tag}"
        );
    }
    assert_eq!(
        named(&set, "hub/app/e", &[&unnamed]),
        [(unnamed.as_str(), false)]
    );
    assert_eq!(
        rig.mirror
            .digest_of("hub/app/e", &anchor_tag("east", &unnamed).expect("tag")),
        None
    );
    let why = |digest: &str| {
        set.images
            .iter()
            .find(|i| i.digest == digest)
            .map(|i| i.used_by.join("; "))
            .unwrap_or_default()
    };
    assert!(why(&q1).contains("Pod default/runs-q"), "{}", why(&q1));
    assert!(why(&b).contains("Deployment default/b"), "{}", why(&b));
    assert!(why(&c).contains("CronJob default/c"), "{}", why(&c));
    assert!(why(&d).contains("(revision 1)"), "{}", why(&d));
    assert!(
        why(&signature).contains(&format!("attached to {a}")),
        "{}",
        why(&signature)
    );
    // The relay carried the watch's requests: the mirror was asked at a distance.
    assert!(rig.far.requests.load(std::sync::atomic::Ordering::Relaxed) > 0);
}

#[test]
fn a_restart_keeps_what_was_seen_before_and_two_clusters_publish_two_sets() {
    // A mirror that asks for a login: every read, blob upload and manifest PUT answers its
    // challenge with the auth file's.
    let Some(rig) = rig("in-use-restart", false, Some(("pusher", "push-token"))) else {
        return;
    };
    let kept = Image::new("kept", "linux/amd64").push(&rig.mirror, "hub/app/kept", Some("1"));
    let other = Image::new("other", "linux/amd64").push(&rig.mirror, "hub/app/other", Some("1"));
    apply(&rig.plane, &deployment("kept", "src.example/app/kept:1", 0));
    let started = Timestamp::now();
    let first = Watch::start(
        &rig.plane.kubeconfig,
        "west",
        rig.scratch.join("first.log"),
        rig.auth_file.as_deref(),
    );
    let set = set_after(&rig.mirror.host, "west", started, &first);
    assert_eq!(
        named(&set, "hub/app/kept", &[&kept]),
        [(kept.as_str(), true)]
    );
    let anchor = anchor_tag("west", &kept).expect("an anchor tag");
    assert_eq!(
        rig.mirror.digest_of("hub/app/kept", &anchor).as_deref(),
        Some(kept.as_str()),
        "the anchor hub/app/kept:{anchor}, put through the registry's login"
    );
    let seen = set.images[0].last_seen;
    drop(first);

    // Nothing names it any more; a new watch, with nothing of the first in memory.
    rig.plane
        .kubectl(&["delete", "deployment", "-n", "default", "kept"], None);
    apply(
        &rig.plane,
        &deployment("other", "src.example/app/other:1", 0),
    );
    let restarted = Timestamp::now();
    let second = Watch::start(
        &rig.plane.kubeconfig,
        "west",
        rig.scratch.join("second.log"),
        rig.auth_file.as_deref(),
    );
    let set = set_after(&rig.mirror.host, "west", restarted, &second);
    assert_eq!(
        named(&set, "hub/app/kept", &[&kept]),
        [(kept.as_str(), true)],
        "the entry seen before the restart was forgotten: {set:#?}"
    );
    let entry = set.images.iter().find(|i| i.digest == kept).expect("kept");
    assert_eq!(
        entry.last_seen, seen,
        "its lastSeen is the one it was seen at"
    );
    assert_eq!(
        named(&set, "hub/app/other", &[&other]),
        [(other.as_str(), true)]
    );

    // A second cluster's watch (another id) into the same registry: both sets readable.
    let third = Watch::start(
        &rig.plane.kubeconfig,
        "north",
        rig.scratch.join("third.log"),
        rig.auth_file.as_deref(),
    );
    let north = set_after(&rig.mirror.host, "north", restarted, &third);
    let west = read_set(&rig.mirror.host, "west").expect("west's set");
    assert_eq!(
        (north.cluster.as_str(), west.cluster.as_str()),
        ("north", "west")
    );
    assert_eq!(
        named(&north, "hub/app/other", &[&other]),
        [(other.as_str(), true)]
    );
    assert_eq!(
        named(&north, "hub/app/kept", &[&kept]),
        [(kept.as_str(), false)]
    );
    assert_eq!(
        named(&west, "hub/app/kept", &[&kept]),
        [(kept.as_str(), true)]
    );
}
