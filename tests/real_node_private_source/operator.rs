//! What an operator adds to `deploy/registry` for a private source whose copies live behind a
//! login of their own (docs/fill-mirror.md's recipe): the rule, the Secrets holding each login,
//! and the namespaces, listed or not, with theirs.

use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::rig::install::{KUBEWARDEN, Login};
use crate::rig::tools::ControlPlane;

pub const MIRROR_LOGIN: Login<'static> = Login {
    user: "mirror-user",
    password: "mirror-token",
};
pub const PRIVATE_LOGIN: Login<'static> = Login {
    user: "payroll-reader",
    password: "payroll-token",
};
/// The private copies' own mirror (a Harbor project or ECR repository of its own, in a cluster):
/// a login the shared mirror's pull Secret does not hold.
pub const PRIVATE_MIRROR_LOGIN: Login<'static> = Login {
    user: "payroll-mirror-reader",
    password: "payroll-mirror-token",
};
/// Listed for the private source's login; not listed.
pub const LISTED: &str = "payroll";
pub const TENANT: &str = "tenant";
/// The private source's pull Secret, in `payroll` only.
pub const SOURCE_PULL: &str = "payroll-source-pull";
/// The private copies' mirror's pull Secret: the rule's `pullSecret`, created in `payroll` only.
pub const PRIVATE_MIRROR_PULL: &str = "payroll-mirror-pull";
/// The registries as the node and the programs reach them (each through its relay).
pub struct Hosts<'a> {
    /// The shared mirror (`deploy/registry`'s `mirror`).
    pub mirror: &'a str,
    /// The private copies' own mirror.
    pub copies: &'a str,
    /// The private source.
    pub source: &'a str,
}

/// The operator's overlay: a rule routing the private source to `<copies>/private` in both
/// policies, the swapping one adding [`PRIVATE_MIRROR_PULL`] (a Secret only the listed
/// namespaces hold), and the fill controller's `FILL_MIRROR_SOURCE_NAMESPACES` listing
/// [`LISTED`] for the source's login.
pub fn private_rule(deploy: &Path, hosts: &Hosts) {
    let values = deploy.join("registry/kustomization.yaml");
    let text = std::fs::read_to_string(&values).expect("kustomization.yaml");
    assert!(
        !text.contains("\npatches:"),
        "deploy/registry has patches now"
    );
    let rule = |pull: bool| {
        let mut rule =
            json!({"source": hosts.source, "target": format!("{}/private", hosts.copies)});
        if pull {
            rule["pullSecret"] = json!(PRIVATE_MIRROR_PULL);
        }
        json!([{"op": "add", "path": "/spec/settings/mirrors/-", "value": rule}]).to_string()
    };
    let env = json!([{"op": "add", "path": "/spec/template/spec/containers/0/env/-",
        "value": {"name": "FILL_MIRROR_SOURCE_NAMESPACES",
            "value": format!("{}={LISTED}", hosts.source)}}]);
    let patches = format!(
        "patches:\n  - target: {{kind: ClusterAdmissionPolicy, name: image-swapper}}\n    patch: '{}'\n  - target: {{kind: ClusterAdmissionPolicy, name: image-swapper-check}}\n    patch: '{}'\n  - target: {{kind: Deployment, name: fill-mirror}}\n    patch: '{}'\n",
        rule(true),
        rule(false),
        env
    );
    std::fs::write(&values, format!("{text}\n{patches}")).expect("kustomization.yaml");
}

/// `mirror-readonly` (the policy server's) re-created holding the private copies' mirror's
/// login beside the shared mirror's: the policy looks the copies up there.
pub fn read_secret_with_copies_login(plane: &ControlPlane, hosts: &Hosts) {
    let config = json!({"auths": {hosts.mirror: auth(&MIRROR_LOGIN),
        hosts.copies: auth(&PRIVATE_MIRROR_LOGIN)}});
    apply_docker_secret(plane, KUBEWARDEN, "mirror-readonly", &config);
}

/// `mirror-push` re-created holding the private source's login and the private copies'
/// mirror's beside the shared mirror's, as docs/fill-mirror.md's private sources have it.
pub fn push_secret_with_private_logins(plane: &ControlPlane, hosts: &Hosts) {
    let config = json!({"auths": {hosts.mirror: auth(&MIRROR_LOGIN),
        hosts.copies: auth(&PRIVATE_MIRROR_LOGIN), hosts.source: auth(&PRIVATE_LOGIN)}});
    apply_docker_secret(plane, KUBEWARDEN, "mirror-push", &config);
}

pub fn auth(login: &Login) -> Value {
    let both = format!("{}:{}", login.user, login.password);
    json!({"auth": base64::engine::general_purpose::STANDARD.encode(both)})
}

pub fn apply_docker_secret(plane: &ControlPlane, namespace: &str, name: &str, config: &Value) {
    let encoded = base64::engine::general_purpose::STANDARD.encode(config.to_string());
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "kubernetes.io/dockerconfigjson", "data": {".dockerconfigjson": encoded}});
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&secret.to_string()));
}

/// A namespace with the shared mirror's pull Secret (the swapping policy adds it to Pods
/// swapped there) and, in [`LISTED`] only, the private source's and the private copies'
/// mirror's; waits for its `default` ServiceAccount.
pub fn namespace_with_secrets(plane: &ControlPlane, namespace: &str, hosts: &Hosts) {
    plane.kubectl_ok(&["create", "namespace", namespace], None);
    let config = json!({"auths": {hosts.mirror: auth(&MIRROR_LOGIN)}});
    apply_docker_secret(plane, namespace, "mirror-pull", &config);
    if namespace == LISTED {
        let config = json!({"auths": {hosts.source: auth(&PRIVATE_LOGIN)}});
        apply_docker_secret(plane, namespace, SOURCE_PULL, &config);
        let config = json!({"auths": {hosts.copies: auth(&PRIVATE_MIRROR_LOGIN)}});
        apply_docker_secret(plane, namespace, PRIVATE_MIRROR_PULL, &config);
    }
    let ready = until_true(Duration::from_secs(60), || {
        plane
            .kubectl(&["get", "serviceaccount", "-n", namespace, "default"], None)
            .status
            .success()
    });
    assert!(ready, "no default ServiceAccount in {namespace}");
}

fn until_true(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while !done() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    true
}
