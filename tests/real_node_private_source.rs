//! A private source on a real node: the fill controller copies a private image only for the
//! namespaces listed for its login (`--source-namespaces`), and the copies live in a mirror of
//! their own whose pull login only those namespaces hold, so a tenant with no pull Secret for the
//! source never gets to run it from the mirror. `deploy/registry` applied as docs/install.md
//! types it (`rig::install`), with what an operator adds for a private source
//! (docs/fill-mirror.md's recipe): a rule routing it to the copies' mirror with that mirror's
//! `pullSecret` (an overlay's patch of both policies), that mirror's read login in the policy
//! server's `mirror-readonly`, its push login and the source's in the fill controller's
//! `mirror-push`, `FILL_MIRROR_SOURCE_NAMESPACES` listing `payroll` alone (the Deployment's
//! commented variable, set), and the copies' pull Secret created in `payroll` alone. A real node
//! (`rig::node`) pulls, in namespaces of the test's own (`rig::netns`); the private registry is
//! 20 ms away and requires a login, the two mirrors 5 ms away, each with its own login.
//!
//! `tenant` (no Secret for the source) creates a Pod of `<private>/team/payroll:1`: the node
//! cannot pull it (ErrImagePull), the fill controller does not copy it (it reads the source
//! anonymously and fails), and the tenant's next Pod is not swapped and still cannot pull it.
//! `payroll` (its Pods carry the source's pull Secret) runs it from the source, the fill
//! controller copies it, and its next Pod is swapped and runs from the copies' mirror, its
//! `imageID` the digest. The tenant's Pod after that copy is swapped too, given the copies'
//! `pullSecret` that its namespace lacks: the kubelet warns (`FailedToRetrieveImagePullSecret`),
//! pulls without it and gets 401 (ErrImagePull), and does the same when payroll's Pod has put
//! the image on the node.

#[path = "real_node_private_source/operator.rs"]
mod operator;
mod rig;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use operator::{
    Hosts, LISTED, MIRROR_LOGIN, PRIVATE_LOGIN, PRIVATE_MIRROR_LOGIN, PRIVATE_MIRROR_PULL,
    SOURCE_PULL, TENANT, namespace_with_secrets, private_rule, push_secret_with_private_logins,
    read_secret_with_copies_login,
};
use rig::chain::{self, Applied};
use rig::install::{self, Installed, Operator, Stand};
use rig::netns::{self, Isolated};
use rig::node::{Node, NodeTools};
use rig::proxy::LatencyProxy;
use rig::registry::TestRegistry;
use rig::tools::ControlPlane;
use serde_json::{Value, json};

const TEST: &str = "a_tenant_without_the_private_source_s_login_never_runs_its_image";
const FILL_MIRROR_VAR: &str = "RIG_FILL_MIRROR";
const SOURCE_AWAY: Duration = Duration::from_millis(20);
const MIRROR_AWAY: Duration = Duration::from_millis(5);
/// The private image's repository at the source, and under the rule's target in the private
/// copies' mirror.
const REPOSITORY: &str = "team/payroll";
const MIRRORED: &str = "private/team/payroll";
const RECORD_LABEL: &str = "image-swapper.kubewarden.io/unmirrored";
const RUN_LIMIT: Duration = Duration::from_secs(900);

#[test]
fn a_tenant_without_the_private_source_s_login_never_runs_its_image() {
    let Some(kit) = NodeTools::find(TEST) else {
        return;
    };
    // Built before the namespaces, where cargo and kwctl have what they need.
    let module = kit.tools.annotated_policy();
    let fill_mirror = std::env::var_os(FILL_MIRROR_VAR)
        .map(PathBuf::from)
        .unwrap_or_else(|| rig::fill_mirror().to_path_buf());
    let Some(run) = netns::isolated(
        TEST,
        &kit.kit,
        RUN_LIMIT,
        &[(FILL_MIRROR_VAR, fill_mirror.as_os_str())],
    ) else {
        return;
    };
    prove(&kit, &module, &fill_mirror, &run);
}

fn prove(kit: &NodeTools, module: &Path, fill_mirror: &Path, run: &Isolated) {
    let begun = Instant::now();
    let hub = TestRegistry::start("private-node-hub").expect("Docker Hub's stand-in");
    let private = TestRegistry::start_with_basic_auth(
        "private-node-src",
        PRIVATE_LOGIN.user,
        PRIVATE_LOGIN.password,
    )
    .expect("private registry");
    let private_far = LatencyProxy::network(&private.host, SOURCE_AWAY).expect("proxy");
    let mirror = TestRegistry::start_with_basic_auth(
        "private-node-mirror",
        MIRROR_LOGIN.user,
        MIRROR_LOGIN.password,
    )
    .expect("mirror registry");
    let mirror_far = LatencyProxy::network(&mirror.host, MIRROR_AWAY).expect("proxy");
    let copies = TestRegistry::start_with_basic_auth(
        "private-node-copies",
        PRIVATE_MIRROR_LOGIN.user,
        PRIVATE_MIRROR_LOGIN.password,
    )
    .expect("the private copies' mirror");
    let copies_far = LatencyProxy::network(&copies.host, MIRROR_AWAY).expect("proxy");
    let hosts = Hosts {
        mirror: &mirror_far.host,
        copies: &copies_far.host,
        source: &private_far.host,
    };
    let digest = push_busybox(kit, &private);
    let registries_conf = run.data.join("registries.conf");
    std::fs::write(
        &registries_conf,
        format!(
            "[[registry]]\nprefix = \"docker.io\"\nlocation = \"{}\"\ninsecure = true\n",
            hub.host
        ),
    )
    .expect("registries.conf");

    let plane = ControlPlane::start(&kit.tools, true);
    let node = Node::start(
        kit,
        &plane,
        &run.node_dir("node"),
        &[&mirror_far.host, &copies_far.host, &private_far.host],
        &run.cgroup_root("node"),
    );
    let overlay = |deploy: &Path| private_rule(deploy, &hosts);
    let before_policies = |plane: &ControlPlane| read_secret_with_copies_login(plane, &hosts);
    let before_fill = |plane: &ControlPlane| push_secret_with_private_logins(plane, &hosts);
    let installed = install::registry_as_typed_by(
        &plane,
        &Stand {
            tools: &kit.tools,
            module,
            fill_mirror,
            mirror: &mirror_far.host,
            login: MIRROR_LOGIN,
            insecure: &[&mirror_far.host, &copies_far.host, &private_far.host],
            registries_conf: &registries_conf,
        },
        &Operator {
            overlay: &overlay,
            before_policies: &before_policies,
            before_fill: &before_fill,
        },
    );
    for namespace in [TENANT, LISTED] {
        namespace_with_secrets(&plane, namespace, &hosts);
    }
    let explain = |what: &str| explain(what, &plane, &node, &installed);
    let source_image = format!("{}/{REPOSITORY}:1", private_far.host);
    println!("up after {:.1} s", begun.elapsed().as_secs_f64());

    // 1. The tenant: kept at the source, recorded, and the node cannot pull it.
    let first = apply(&plane, TENANT, "t-1", &source_image, false);
    assert_eq!(first.image(0), source_image, "{}", explain("t-1 kept"));
    assert_eq!(first.label(RECORD_LABEL), Some("true"), "{first:?}");
    let reason = pull_failure(&node, TENANT, "t-1")
        .unwrap_or_else(|| panic!("{}", explain("t-1 pulled a private image without a login")));
    println!("t-1: {reason}");

    // 2. The fill controller tries it, reading the source anonymously (the tenant is not listed
    // for its login), and copies nothing; the record stays.
    let tried = until(Duration::from_secs(90), || {
        installed
            .fill
            .log()
            .contains("read anonymously: no namespace that asks for it")
            || copies.digest_of(MIRRORED, "1").is_some()
    });
    assert!(
        tried.is_some(),
        "{}",
        explain("the fill controller never tried t-1's copy")
    );
    assert_eq!(
        copies.digest_of(MIRRORED, "1"),
        None,
        "{}",
        explain("the fill controller copied a private image for a tenant not listed for its login")
    );
    let recorded = node.pod(TENANT, "t-1").expect("t-1");
    assert_eq!(
        recorded["metadata"]["labels"][RECORD_LABEL], "true",
        "t-1's record was dropped: {recorded:#}"
    );

    // 3. The tenant's next Pod: not swapped to the mirror, and still cannot pull the image.
    let second = apply(&plane, TENANT, "t-2", &source_image, false);
    assert_eq!(
        second.image(0),
        source_image,
        "{}",
        explain("the tenant's next Pod was swapped to the mirror")
    );
    let reason = pull_failure(&node, TENANT, "t-2")
        .unwrap_or_else(|| panic!("{}", explain("t-2 runs the private image")));
    println!("t-2: {reason}");

    // 4. payroll, listed, with the source's pull Secret: runs from the source, the copy is made
    // with the login, the record dropped.
    let kept = apply(&plane, LISTED, "p-1", &source_image, true);
    assert_eq!(kept.image(0), source_image, "{}", explain("p-1 kept"));
    node.wait_running(LISTED, "p-1", Duration::from_secs(180))
        .unwrap_or_else(|e| panic!("{e}\n{}", explain("p-1 runs")));
    assert_eq!(
        node.image_id(LISTED, "p-1", "app"),
        Some(format!("{}/{REPOSITORY}@{digest}", private_far.host))
    );
    until(Duration::from_secs(120), || {
        copies.digest_of(MIRRORED, "1").as_deref() == Some(digest.as_str())
    })
    .unwrap_or_else(|| panic!("{}", explain("payroll's copy never made")));
    until(Duration::from_secs(60), || {
        node.pod(LISTED, "p-1")
            .is_some_and(|pod| pod["metadata"]["labels"].get(RECORD_LABEL).is_none())
    })
    .unwrap_or_else(|| panic!("{}", explain("p-1's record never dropped")));

    // 5. payroll's next Pod: swapped, pulled whole from the mirror, and runs.
    node.forget_image(&digest);
    let swapped = apply(&plane, LISTED, "p-2", &source_image, true);
    let pinned = format!("{}/{MIRRORED}:1@{digest}", copies_far.host);
    assert_eq!(swapped.image(0), pinned, "{}", explain("p-2 swapped"));
    assert!(
        pull_secrets(&swapped).contains(&PRIVATE_MIRROR_PULL.to_string()),
        "p-2 was not given {PRIVATE_MIRROR_PULL}: {:#}",
        swapped.pod()
    );
    node.wait_running(LISTED, "p-2", Duration::from_secs(180))
        .unwrap_or_else(|e| panic!("{e}\n{}", explain("p-2 runs")));
    assert_eq!(
        node.image_id(LISTED, "p-2", "app"),
        Some(format!("{}/{MIRRORED}@{digest}", copies_far.host)),
        "the image p-2 runs"
    );

    // 6. The tenant's Pod once the mirror holds the copy (and the node does not): swapped to
    // it, as any Pod naming an image the mirror holds, and given the rule's pullSecret, which the
    // tenant's namespace lacks: the kubelet says so, pulls without it, and the private copies'
    // mirror refuses.
    node.forget_image(&digest);
    let after = apply(&plane, TENANT, "t-3", &source_image, false);
    assert_eq!(after.image(0), pinned, "{}", explain("t-3 swapped"));
    assert!(
        pull_secrets(&after).contains(&PRIVATE_MIRROR_PULL.to_string()),
        "t-3 was not given {PRIVATE_MIRROR_PULL}: {:#}",
        after.pod()
    );
    let reason = pull_failure(&node, TENANT, "t-3")
        .unwrap_or_else(|| panic!("{}", explain("t-3 runs the private image from the mirror")));
    println!("t-3: {reason}");
    let missing = until(Duration::from_secs(30), || {
        events(&plane, TENANT, "t-3").contains("FailedToRetrieveImagePullSecret")
    });
    assert!(
        missing.is_some(),
        "the kubelet did not say t-3's Secret is missing: {}",
        events(&plane, TENANT, "t-3")
    );

    // 7. The image on the node again, pulled by payroll's Pod with its Secret; the tenant's Pod
    // of it (`IfNotPresent`, pinned) is not run from the node's store: the kubelet checks the
    // tenant's credentials against the registry first (ensure-secret-pulled-images, beta and on
    // by default since Kubernetes 1.35), and the registry refuses.
    apply(&plane, LISTED, "p-3", &source_image, true);
    node.wait_running(LISTED, "p-3", Duration::from_secs(180))
        .unwrap_or_else(|e| panic!("{e}\n{}", explain("p-3 runs")));
    let cached = apply(&plane, TENANT, "t-4", &source_image, false);
    assert_eq!(cached.image(0), pinned, "{}", explain("t-4 swapped"));
    let reason = pull_failure(&node, TENANT, "t-4").unwrap_or_else(|| {
        panic!(
            "{}",
            explain("t-4 runs the private image from the node's store")
        )
    });
    println!("t-4 (the image on the node): {reason}");
    println!(
        "the tenant's Pods never ran {source_image}; payroll's next Pod runs {pinned}; {:.1} s in all",
        begun.elapsed().as_secs_f64()
    );
}

/// The tools' busybox pushed to the private registry as `REPOSITORY:1`: its digest.
fn push_busybox(kit: &NodeTools, private: &TestRegistry) -> String {
    let status = Command::new("skopeo")
        .args(["copy", "-q", "--dest-tls-verify=false", "--dest-creds"])
        .arg(format!("{}:{}", PRIVATE_LOGIN.user, PRIVATE_LOGIN.password))
        .arg(format!("oci:{}:1.0", kit.kit.join("img/bb-oci").display()))
        .arg(format!("docker://{}/{REPOSITORY}:1", private.host))
        .status()
        .expect("skopeo");
    assert!(status.success(), "skopeo copy of the busybox image");
    private
        .digest_of(REPOSITORY, "1")
        .expect("the pushed image")
}

/// The names in a stored Pod's `imagePullSecrets`.
fn pull_secrets(applied: &Applied) -> Vec<String> {
    applied.pod()["spec"]["imagePullSecrets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["name"].as_str().map(str::to_string))
        .collect()
}

/// The reasons and messages of a Pod's events, one a line.
fn events(plane: &ControlPlane, namespace: &str, name: &str) -> String {
    let selector = format!("involvedObject.name={name}");
    let events = plane.get_json(&["events", "-n", namespace, "--field-selector", &selector]);
    events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| format!("{}: {}", e["reason"], e["message"]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A Pod `name` of `image` in `namespace`, with the private source's pull Secret when
/// `with_secret`, applied with kubectl as a user does.
fn apply(
    plane: &ControlPlane,
    namespace: &str,
    name: &str,
    image: &str,
    with_secret: bool,
) -> Applied {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "app", "image": image,
            "command": ["/bin/busybox", "sh", "-c", "exec /bin/busybox sleep 3600"]}]}});
    if with_secret {
        pod["spec"]["imagePullSecrets"] = json!([{"name": SOURCE_PULL}]);
    }
    let applied = chain::apply(plane, &pod);
    assert!(applied.refused.is_none(), "{namespace}/{name}: {applied:?}");
    applied
}

/// Waits up to 2 minutes for the Pod's image pull to fail (ErrImagePull or ImagePullBackOff):
/// the kubelet's reason and message; None when it runs or nothing failed.
fn pull_failure(node: &Node, namespace: &str, name: &str) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let pod = node.pod(namespace, name)?;
        for status in pod["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if status["state"]["running"].is_object() {
                return None;
            }
            let waiting = &status["state"]["waiting"];
            let reason = waiting["reason"].as_str().unwrap_or_default();
            if ["ErrImagePull", "ImagePullBackOff"].contains(&reason) {
                return Some(format!("{reason}: {}", waiting["message"]));
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
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

/// For a failure's message: the Pods, the fill controller's log, the kubelet's last lines.
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
    format!(
        "{what}\npods: {:#}\nfill-mirror:\n{}\nkubelet:\n{}",
        Value::Array(pods),
        installed.fill.log(),
        node.kubelet_log(30)
    )
}
