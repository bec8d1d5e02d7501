//! A private source on a real node: the fill controller copies a private image only for the
//! namespaces listed for its login (`--source-namespaces`), so a tenant with no pull Secret for
//! it never gets to run it from the mirror. `deploy/registry` applied as docs/install.md types it
//! (`rig::install`), with what an operator adds for a private source: a rule routing it to the
//! mirror (an overlay's patch of both policies), its login in the fill controller's `mirror-push`
//! auth file, and `FILL_MIRROR_SOURCE_NAMESPACES` listing `payroll` alone (the Deployment's
//! commented variable, set). A real node (`rig::node`) pulls, in namespaces of the test's own
//! (`rig::netns`); the private registry is 20 ms away and requires a login, the mirror 5 ms away.
//!
//! `tenant` (no Secret for the source) creates a Pod of `<private>/team/payroll:1`: the node
//! cannot pull it (ErrImagePull), the fill controller does not copy it (it reads the source
//! anonymously and fails), and the tenant's next Pod is not swapped and still cannot pull it.
//! `payroll` (its Pods carry the source's pull Secret) runs it from the source, the fill
//! controller copies it, and its next Pod is swapped and runs from the mirror, its `imageID` the
//! digest.

mod rig;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;
use rig::chain::{self, Applied};
use rig::install::{self, Installed, KUBEWARDEN, Login, Operator, Stand};
use rig::netns::{self, Isolated};
use rig::node::{Node, NodeTools};
use rig::proxy::LatencyProxy;
use rig::registry::TestRegistry;
use rig::tools::ControlPlane;
use serde_json::{Value, json};

const TEST: &str = "a_tenant_without_the_private_source_s_login_never_runs_its_image";
const FILL_MIRROR_VAR: &str = "RIG_FILL_MIRROR";
const MIRROR_LOGIN: Login<'static> = Login {
    user: "mirror-user",
    password: "mirror-token",
};
const PRIVATE_LOGIN: Login<'static> = Login {
    user: "payroll-reader",
    password: "payroll-token",
};
const SOURCE_AWAY: Duration = Duration::from_millis(20);
const MIRROR_AWAY: Duration = Duration::from_millis(5);
/// The private image's repository at the source, and under the rule's target in the mirror.
const REPOSITORY: &str = "team/payroll";
const MIRRORED: &str = "private/team/payroll";
const RECORD_LABEL: &str = "image-swapper.kubewarden.io/unmirrored";
/// Listed for the private source's login; not listed.
const LISTED: &str = "payroll";
const TENANT: &str = "tenant";
/// The private source's pull Secret, in `payroll` only.
const SOURCE_PULL: &str = "payroll-source-pull";
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
        &[&mirror_far.host, &private_far.host],
        &run.cgroup_root("node"),
    );
    let overlay = |deploy: &Path| private_rule(deploy, &private_far.host, &mirror_far.host);
    let before_fill = |plane: &ControlPlane| {
        push_secret_with_private_login(plane, &mirror_far.host, &private_far.host)
    };
    let installed = install::registry_as_typed_by(
        &plane,
        &Stand {
            tools: &kit.tools,
            module,
            fill_mirror,
            mirror: &mirror_far.host,
            login: MIRROR_LOGIN,
            insecure: &[&mirror_far.host, &private_far.host],
            registries_conf: &registries_conf,
        },
        &Operator {
            overlay: &overlay,
            before_fill: &before_fill,
        },
    );
    for namespace in [TENANT, LISTED] {
        namespace_with_secrets(&plane, namespace, &mirror_far.host, &private_far.host);
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
            || mirror.digest_of(MIRRORED, "1").is_some()
    });
    assert!(
        tried.is_some(),
        "{}",
        explain("the fill controller never tried t-1's copy")
    );
    assert_eq!(
        mirror.digest_of(MIRRORED, "1"),
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
        mirror.digest_of(MIRRORED, "1").as_deref() == Some(digest.as_str())
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
    let pinned = format!("{}/{MIRRORED}:1@{digest}", mirror_far.host);
    assert_eq!(swapped.image(0), pinned, "{}", explain("p-2 swapped"));
    node.wait_running(LISTED, "p-2", Duration::from_secs(180))
        .unwrap_or_else(|e| panic!("{e}\n{}", explain("p-2 runs")));
    assert_eq!(
        node.image_id(LISTED, "p-2", "app"),
        Some(format!("{}/{MIRRORED}@{digest}", mirror_far.host)),
        "the image p-2 runs"
    );
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

/// The operator's overlay: a rule routing the private source to `<mirror>/private` in both
/// policies (the swapping one adding the mirror's pull Secret, as for Docker Hub), and the fill
/// controller's `FILL_MIRROR_SOURCE_NAMESPACES` listing [`LISTED`] for the source's login.
fn private_rule(deploy: &Path, source: &str, mirror: &str) {
    let values = deploy.join("registry/kustomization.yaml");
    let text = std::fs::read_to_string(&values).expect("kustomization.yaml");
    assert!(
        !text.contains("\npatches:"),
        "deploy/registry has patches now"
    );
    let rule = |pull: bool| {
        let mut rule = json!({"source": source, "target": format!("{mirror}/private")});
        if pull {
            rule["pullSecret"] = json!("mirror-pull");
        }
        json!([{"op": "add", "path": "/spec/settings/mirrors/-", "value": rule}]).to_string()
    };
    let env = json!([{"op": "add", "path": "/spec/template/spec/containers/0/env/-",
        "value": {"name": "FILL_MIRROR_SOURCE_NAMESPACES", "value": format!("{source}={LISTED}")}}]);
    let patches = format!(
        "patches:\n  - target: {{kind: ClusterAdmissionPolicy, name: image-swapper}}\n    patch: '{}'\n  - target: {{kind: ClusterAdmissionPolicy, name: image-swapper-check}}\n    patch: '{}'\n  - target: {{kind: Deployment, name: fill-mirror}}\n    patch: '{}'\n",
        rule(true),
        rule(false),
        env
    );
    std::fs::write(&values, format!("{text}\n{patches}")).expect("kustomization.yaml");
}

/// `mirror-push` re-created holding the private source's login beside the mirror's, as
/// docs/fill-mirror.md's private sources have it.
fn push_secret_with_private_login(plane: &ControlPlane, mirror: &str, source: &str) {
    let config = json!({"auths": {mirror: auth(&MIRROR_LOGIN), source: auth(&PRIVATE_LOGIN)}});
    apply_docker_secret(plane, KUBEWARDEN, "mirror-push", &config);
}

fn auth(login: &Login) -> Value {
    let both = format!("{}:{}", login.user, login.password);
    json!({"auth": base64::engine::general_purpose::STANDARD.encode(both)})
}

fn apply_docker_secret(plane: &ControlPlane, namespace: &str, name: &str, config: &Value) {
    let encoded = base64::engine::general_purpose::STANDARD.encode(config.to_string());
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "kubernetes.io/dockerconfigjson", "data": {".dockerconfigjson": encoded}});
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&secret.to_string()));
}

/// A namespace with the mirror's pull Secret (the swapping policy adds it to swapped Pods) and,
/// in [`LISTED`] only, the private source's; waits for its `default` ServiceAccount.
fn namespace_with_secrets(plane: &ControlPlane, namespace: &str, mirror: &str, source: &str) {
    plane.kubectl_ok(&["create", "namespace", namespace], None);
    let config = json!({"auths": {mirror: auth(&MIRROR_LOGIN)}});
    apply_docker_secret(plane, namespace, "mirror-pull", &config);
    if namespace == LISTED {
        let config = json!({"auths": {source: auth(&PRIVATE_LOGIN)}});
        apply_docker_secret(plane, namespace, SOURCE_PULL, &config);
    }
    until(Duration::from_secs(60), || {
        plane
            .kubectl(&["get", "serviceaccount", "-n", namespace, "default"], None)
            .status
            .success()
    })
    .unwrap_or_else(|| panic!("no default ServiceAccount in {namespace}"));
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
