//! The install's smoke test on a real node: `deploy/registry` applied as docs/install.md types it
//! (`rig::install`: the controller and the fill controller's Deployment stood in for, the real
//! policy-server 1.35 serving the built module), a real node (`rig::node`: the tools' kubelet
//! and kube-scheduler, containerd, runc) beside kube-apiserver and kube-controller-manager, all
//! in network and mount namespaces of the test's own (`rig::netns`). Docker Hub is a registry
//! 20 ms away that the node (containerd's `hosts.toml`) and skopeo (`registries.conf`) reach as
//! `docker.io`; the mirror, 5 ms away, requires a login.
//!
//! A Pod of an image the mirror lacks is kept at its source and runs; the fill controller copies
//! the image; the next Pod is swapped, pulled by the node from the mirror with the login in the
//! pull Secret the policy adds, and runs, its `imageID` the mirror's digest; the image deleted
//! from the mirror, the check role's result for the running Pod, as the audit scanner asks it,
//! names the copy that refills it, and that copy refills it. Prints how long each phase took.

mod rig;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rig::chain::{self, Applied};
use rig::install::{self, Installed, Login, Stand};
use rig::netns::{self, Isolated};
use rig::node::{Node, NodeTools};
use rig::proxy::LatencyProxy;
use rig::registry::TestRegistry;
use rig::tools::ControlPlane;
use serde_json::{Value, json};

const SMOKE: &str = "deploy_registry_on_a_real_node_keeps_fills_swaps_and_reports";
const FILL_MIRROR_VAR: &str = "RIG_FILL_MIRROR";

/// The mirror's one login: what the page's Secrets hold (read and push alike here).
const LOGIN: Login<'static> = Login {
    user: "mirror-user",
    password: "mirror-token",
};
const SOURCE_AWAY: Duration = Duration::from_millis(20);
const MIRROR_AWAY: Duration = Duration::from_millis(5);

/// The image, as a Pod names it (Docker Hub's `team/web`), and its repository in the mirror
/// under deploy/registry's rule (`docker.io` -> `<mirror>/dockerhub`).
const IMAGE: &str = "team/web:1.0";
const MIRRORED: &str = "dockerhub/team/web";
const RECORD_LABEL: &str = "image-swapper.kubewarden.io/unmirrored";
/// Where the page's block creates the pull Secret, and where the Pods run.
const APPS: &str = "default";

/// How long the run may take in its namespaces, everything started and stopped.
const RUN_LIMIT: Duration = Duration::from_secs(900);

#[test]
fn deploy_registry_on_a_real_node_keeps_fills_swaps_and_reports() {
    let Some(kit) = NodeTools::find("real_node deploy_registry_on_a_real_node") else {
        return;
    };
    // Built before the namespaces, where cargo and kwctl have what they need.
    let module = kit.tools.annotated_policy();
    let fill_mirror = std::env::var_os(FILL_MIRROR_VAR)
        .map(PathBuf::from)
        .unwrap_or_else(|| rig::fill_mirror().to_path_buf());
    let Some(run) = netns::isolated(
        SMOKE,
        &kit.kit,
        RUN_LIMIT,
        &[(FILL_MIRROR_VAR, fill_mirror.as_os_str())],
    ) else {
        return;
    };
    smoke(&kit, &module, &fill_mirror, &run);
}

/// Phases and how long each took, printed at the end.
#[derive(Default)]
struct Phases(Vec<(&'static str, Duration)>);

impl Phases {
    fn took(&mut self, phase: &'static str, took: Duration) {
        println!("phase: {phase}: {:.2} s", took.as_secs_f64());
        self.0.push((phase, took));
    }
}

fn smoke(kit: &NodeTools, module: &Path, fill_mirror: &Path, run: &Isolated) {
    let mut phases = Phases::default();
    let source = TestRegistry::start("node-hub").expect("source registry");
    let source_far = LatencyProxy::network(&source.host, SOURCE_AWAY).expect("proxy");
    let mirror = TestRegistry::start_with_basic_auth("node-mirror", LOGIN.user, LOGIN.password)
        .expect("mirror registry");
    let mirror_far = LatencyProxy::network(&mirror.host, MIRROR_AWAY).expect("proxy");
    let digest = push_busybox(kit, &source);
    let registries_conf = run.data.join("registries.conf");
    std::fs::write(
        &registries_conf,
        format!(
            "[[registry]]\nprefix = \"docker.io\"\nlocation = \"{}\"\ninsecure = true\n",
            source_far.host
        ),
    )
    .expect("registries.conf");

    let begun = Instant::now();
    let plane = ControlPlane::start(&kit.tools, true);
    phases.took("control plane up", begun.elapsed());
    let node = Node::start(
        kit,
        &plane,
        &run.node_dir("node"),
        &[&mirror_far.host, &source_far.host],
        &run.cgroup_root("node"),
    );
    node.route("docker.io", &source_far.host);
    phases.took("node Ready", node.ready_after);
    let begun = Instant::now();
    let installed = install::registry_as_typed(
        &plane,
        &Stand {
            tools: &kit.tools,
            module,
            fill_mirror,
            mirror: &mirror_far.host,
            login: LOGIN,
            insecure: &[&mirror_far.host, &source_far.host],
            registries_conf: &registries_conf,
        },
    );
    phases.took("install.md's block, to PolicyActive", begun.elapsed());
    wait_for_default_account(&plane);
    let explain = |what: &str| explain(what, &plane, &node, &installed);

    // 1. Kept at its source, and runs: the node pulls it from Docker Hub.
    let created = Instant::now();
    let kept = apply(&plane, "web-1");
    assert_eq!(kept.image(0), IMAGE, "{}", explain("web-1 kept"));
    assert_eq!(kept.label(RECORD_LABEL), Some("true"), "{kept:?}");
    let (_, took) = node
        .wait_running(APPS, "web-1", Duration::from_secs(180))
        .unwrap_or_else(|e| panic!("{e}\n{}", explain("web-1 runs")));
    phases.took("a Pod kept at its source: created to Running", took);
    assert_eq!(
        node.image_id(APPS, "web-1", "web").as_deref(),
        Some(format!("docker.io/team/web@{digest}").as_str())
    );

    // 2. The fill controller copies it; the record is dropped.
    let copied = until(Duration::from_secs(120), || {
        mirror.digest_of(MIRRORED, "1.0").as_deref() == Some(digest.as_str())
    })
    .unwrap_or_else(|| panic!("{}", explain("the mirror never got the image")));
    phases.took(
        "the copy: the kept Pod created to the image in the mirror",
        copied - created,
    );
    until(Duration::from_secs(60), || {
        node.pod(APPS, "web-1")
            .is_some_and(|pod| pod["metadata"]["labels"].get(RECORD_LABEL).is_none())
    })
    .unwrap_or_else(|| panic!("{}", explain("web-1's record never dropped")));

    // 3. Swapped, pulled whole by the node from the mirror with the pull Secret's login.
    node.forget_image(&digest);
    let asked_before = mirror_far.seen().len();
    let swapped = apply(&plane, "web-2");
    let pinned = format!("{}/{MIRRORED}:1.0@{digest}", mirror_far.host);
    assert_eq!(swapped.image(0), pinned, "{}", explain("web-2 swapped"));
    let (_, took) = node
        .wait_running(APPS, "web-2", Duration::from_secs(180))
        .unwrap_or_else(|e| panic!("{e}\n{}", explain("web-2 runs")));
    phases.took("the next Pod, swapped: created to Running", took);
    let secrets = &swapped.pod()["spec"]["imagePullSecrets"];
    assert!(
        secrets
            .as_array()
            .is_some_and(|all| all.iter().any(|s| s["name"] == "mirror-pull")),
        "the swapped Pod carries no mirror-pull: {secrets}"
    );
    assert_eq!(
        node.image_id(APPS, "web-2", "web"),
        Some(format!("{}/{MIRRORED}@{digest}", mirror_far.host)),
        "the image the node ran"
    );
    let asked: Vec<String> = mirror_far.seen()[asked_before..].to_vec();
    assert!(
        asked.contains(&format!("GET /v2/{MIRRORED}/manifests/{digest}"))
            && asked
                .iter()
                .any(|r| r.starts_with(&format!("GET /v2/{MIRRORED}/blobs/"))),
        "the node did not pull the manifest and its blobs from the mirror: {asked:?}"
    );

    // 4. Pruned from the mirror: the check role's result for the running Pod names the copy.
    mirror
        .delete_manifest(MIRRORED, &digest)
        .expect("the prune");
    let running = node.pod(APPS, "web-2").expect("web-2");
    assert_eq!(
        running["status"]["phase"], "Running",
        "web-2 after the prune"
    );
    let begun = Instant::now();
    let (result, message) = installed.controller.audit("image-swapper-check", &running);
    phases.took(
        "the check of the running Pod, the image pruned",
        begun.elapsed(),
    );
    println!(
        "report: pod {APPS}/web-2: {result}: {}",
        message.as_deref().unwrap_or("")
    );
    let message = message.unwrap_or_default();
    let refill = format!(
        "skopeo copy --all --preserve-digests docker://docker.io/team/web@{digest} docker://{}/{MIRRORED}:",
        mirror_far.host
    );
    assert!(
        result == "fail"
            && message.contains(&format!(
                "containers \"web\": image \"{pinned}\" is gone from the mirror"
            ))
            && message.contains(&refill),
        "the check's result for web-2: {result}: {message}"
    );
    let begun = Instant::now();
    run_copy(&message, &registries_conf);
    phases.took("the copy the report names", begun.elapsed());
    assert_eq!(
        mirror.digest_of(MIRRORED, &digest).as_deref(),
        Some(digest.as_str()),
        "the report's copy did not refill the mirror"
    );
    let (again, said) = installed.controller.audit("image-swapper-check", &running);
    assert_eq!(again, "pass", "after the refill: {said:?}");

    println!(
        "phases (source {} ms away, mirror {} ms away):",
        SOURCE_AWAY.as_millis(),
        MIRROR_AWAY.as_millis()
    );
    for (phase, took) in &phases.0 {
        println!("  {phase:<60} {:>7.2} s", took.as_secs_f64());
    }
}

/// The tools' busybox (`node/img/bb-oci`) pushed to Docker Hub's stand-in as `team/web:1.0`:
/// its digest as the registry serves it.
fn push_busybox(kit: &NodeTools, hub: &TestRegistry) -> String {
    let status = Command::new("skopeo")
        .args(["copy", "-q", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:1.0", kit.kit.join("img/bb-oci").display()))
        .arg(format!("docker://{}/team/web:1.0", hub.host))
        .status()
        .expect("skopeo");
    assert!(status.success(), "skopeo copy of the busybox image");
    hub.digest_of("team/web", "1.0").expect("the pushed image")
}

/// A Pod `name` of [`IMAGE`] in [`APPS`], applied with kubectl as a user does.
fn apply(plane: &ControlPlane, name: &str) -> Applied {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": APPS, "labels": {"app": "web"}},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "web", "image": IMAGE,
            "command": ["/bin/busybox", "sh", "-c", "echo started; exec /bin/busybox sleep 3600"]}]}});
    let applied = chain::apply(plane, &pod);
    assert!(applied.refused.is_none(), "{name}: {applied:?}");
    applied
}

/// The ServiceAccount admission plugin wants the namespace's `default` account, which
/// kube-controller-manager makes.
fn wait_for_default_account(plane: &ControlPlane) {
    until(Duration::from_secs(60), || {
        plane
            .kubectl(&["get", "serviceaccount", "-n", APPS, "default"], None)
            .status
            .success()
    })
    .expect("no default ServiceAccount");
}

/// Runs the `skopeo copy` a report's message names, as an operator would: Docker Hub through
/// `registries_conf`, the mirror with the login.
fn run_copy(message: &str, registries_conf: &Path) {
    let from = message
        .find("skopeo copy ")
        .unwrap_or_else(|| panic!("no copy in {message}"));
    let words: Vec<&str> = message[from..]
        .split(|c: char| c.is_whitespace() || c == ')')
        .filter(|w| !w.is_empty())
        .take(6)
        .collect();
    assert_eq!(
        &words[..4],
        ["skopeo", "copy", "--all", "--preserve-digests"],
        "{message}"
    );
    let output = Command::new("skopeo")
        .arg("--registries-conf")
        .arg(registries_conf)
        .args([
            "copy",
            "--all",
            "--preserve-digests",
            "--src-tls-verify=false",
        ])
        .args(["--dest-tls-verify=false", "--dest-creds"])
        .arg(format!("{}:{}", LOGIN.user, LOGIN.password))
        .args(&words[4..6])
        .output()
        .expect("skopeo");
    assert!(
        output.status.success(),
        "skopeo copy {:?}: {}",
        &words[4..6],
        String::from_utf8_lossy(&output.stderr)
    );
}

fn until(within: Duration, mut done: impl FnMut() -> bool) -> Option<Instant> {
    let deadline = Instant::now() + within;
    loop {
        if done() {
            return Some(Instant::now());
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// For a failure's message: the Pods, the fill controller's log, the policy-servers' and the
/// kubelet's last lines.
fn explain(what: &str, plane: &ControlPlane, node: &Node, installed: &Installed) -> String {
    let pods = plane.get_json(&["pods", "-A"]);
    let pods: Vec<Value> = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            json!({"name": p["metadata"]["name"], "image": p["spec"]["containers"][0]["image"],
            "labels": p["metadata"]["labels"], "status": p["status"]["containerStatuses"]})
        })
        .collect();
    let servers: String = installed
        .controller
        .servers
        .iter()
        .map(|(name, server)| format!("policy-server {name}:\n{}\n", server.log()))
        .collect();
    format!(
        "{what}\npods: {:#}\nthe page ran: {:#?}\nfill-mirror:\n{}\n{servers}kubelet:\n{}",
        Value::Array(pods),
        installed.ran,
        installed.fill.log(),
        node.kubelet_log(40)
    )
}
