//! The plain-registry install as docs/install.md types it, on a cluster with a real node:
//! `deploy/` copied with the user's one value set (the mirror, in `deploy/registry`'s
//! `kustomization.yaml`), then the page's console block that applies `deploy/registry`, each
//! command run by a shell as typed, its placeholders (`mirror.example.com`, `READER`, ...) given
//! the rig's mirror and login. What no machine here runs is stood in for, as the other install
//! tests do: Helm's part (Kubewarden's CRDs of 1.38, the release the pages install, the
//! monitoring CRDs the overlay renders, the namespace), the controller ([`super::controller`]:
//! policy-server 1.35 as processes, the webhooks, `PolicyActive`), and the fill controller's
//! Deployment, whose image this machine cannot pull: its container is played here as the real
//! binary with the Deployment's arguments, environment and mounted Secret, as its
//! ServiceAccount, and the Deployment scaled to 0 so that the node does not try the image.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use base64::Engine as _;
use serde_json::Value;

use super::controller::{Controller, Reconcile};
use super::tools::{ControlPlane, RealTools, scratch_dir};

/// The controller's namespace, which the pages create with Kubewarden's chart.
pub const KUBEWARDEN: &str = "kubewarden";

/// A registry login: user and password.
pub struct Login<'a> {
    pub user: &'a str,
    pub password: &'a str,
}

/// What the install left running: the controller's policy-servers and the fill controller.
pub struct Installed {
    pub controller: Controller,
    pub fill: FillController,
    /// The page's commands as they ran, for a failure's message.
    pub ran: Vec<String>,
}

/// The rig's part of the install: the registries and programs it stands in with.
pub struct Stand<'a> {
    pub tools: &'a RealTools,
    /// The built, annotated module.
    pub module: &'a Path,
    /// The fill controller's binary.
    pub fill_mirror: &'a Path,
    /// The mirror's host as Pods name it (`127.0.0.1:PORT`).
    pub mirror: &'a str,
    pub login: Login<'a>,
    /// Plain-HTTP registries the programs reach (added as insecure sources).
    pub insecure: &'a [&'a str],
    /// A `registries.conf` that sends `docker.io` to the rig's stand-in, for skopeo.
    pub registries_conf: &'a Path,
}

/// The console block of `page` that applies `deploy/<overlay>`, its continued lines joined.
fn console_block(page: &str, overlay: &str) -> Vec<String> {
    let text = std::fs::read_to_string(super::root().join("docs").join(page))
        .unwrap_or_else(|e| panic!("docs/{page}: {e}"));
    let apply = format!("kubectl apply -k deploy/{overlay}");
    text.split("```console\n")
        .skip(1)
        .map(|block| block.split("```").next().unwrap_or_default())
        .find(|block| block.lines().any(|line| line.trim() == apply))
        .unwrap_or_else(|| panic!("docs/{page}: no console block runs `{apply}`"))
        .replace("\\\n", " ")
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// What an operator does beyond the page's one value: edits to the copied `deploy/` (a folder)
/// before the page's block runs (an overlay's patch), and changes to the cluster once the
/// page's Secrets exist: before the policy server reads its own (`before_policies`, the
/// `mirror-readonly` Secret re-created with a second mirror's login) and after the block, before
/// the fill controller starts (`before_fill`, `mirror-push` re-created with more logins).
pub struct Operator<'a> {
    pub overlay: &'a dyn Fn(&Path),
    pub before_policies: &'a dyn Fn(&ControlPlane),
    pub before_fill: &'a dyn Fn(&ControlPlane),
}

/// Installs `deploy/registry` on `plane` as docs/install.md types it, the rig standing in as
/// the module's documentation says; returns once the page's last command ran.
pub fn registry_as_typed(plane: &ControlPlane, stand: &Stand) -> Installed {
    registry_as_typed_by(
        plane,
        stand,
        &Operator {
            overlay: &|_| {},
            before_policies: &|_| {},
            before_fill: &|_| {},
        },
    )
}

/// [`registry_as_typed`] with the operator's own edits and changes.
pub fn registry_as_typed_by(plane: &ControlPlane, stand: &Stand, operator: &Operator) -> Installed {
    let root = super::root();
    let dir = scratch_dir("install");
    for path in [
        "scripts/kubewarden-crds-1.38",
        "tests/deploy_apply/monitoring_crds.yaml",
    ] {
        plane.kubectl_ok(&["apply", "-f", &root.join(path).to_string_lossy()], None);
    }
    plane.kubectl_ok(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "--all",
        ],
        None,
    );
    plane.kubectl_ok(&["create", "namespace", KUBEWARDEN], None);
    let copied = Command::new("cp")
        .arg("-a")
        .arg(root.join("deploy"))
        .arg(&dir)
        .status()
        .expect("cp");
    assert!(copied.success(), "cp -a deploy/");
    // The user's value, written once in the overlay.
    let values = dir.join("deploy/registry/kustomization.yaml");
    let text = std::fs::read_to_string(&values).expect("kustomization.yaml");
    let example = "mirror=mirror.example.com/dockerhub";
    assert!(text.contains(example), "deploy/registry: no `{example}`");
    std::fs::write(
        &values,
        text.replace(example, &format!("mirror={}/dockerhub", stand.mirror)),
    )
    .expect("kustomization.yaml");
    (operator.overlay)(&dir.join("deploy"));
    let bin = kubectl_for(plane, &dir);

    let placeholders = [
        ("mirror.example.com", stand.mirror),
        ("READ_TOKEN", stand.login.password),
        ("PUSH_TOKEN", stand.login.password),
        ("READER", stand.login.user),
        ("PUSHER", stand.login.user),
    ];
    let block = console_block("install.md", "registry");
    for (placeholder, _) in placeholders {
        assert!(
            block.iter().any(|line| line.contains(placeholder)),
            "docs/install.md's block no longer names {placeholder}: {block:#?}"
        );
    }
    let mut ran = Vec::new();
    let mut controller = None;
    for line in block {
        let mut command = line.clone();
        for (placeholder, value) in placeholders {
            command = command.replace(placeholder, value);
        }
        if command.starts_with("kubectl wait") && command.contains("PolicyActive") {
            (operator.before_policies)(plane);
            controller = Some(Controller::reconcile(
                plane,
                &Reconcile {
                    tools: stand.tools,
                    module: stand.module,
                    insecure: stand.insecure,
                    namespace: KUBEWARDEN,
                    probe_namespace: "default",
                },
            ));
        }
        let output = Command::new("bash")
            .args(["-c", &command])
            .current_dir(&dir)
            .env("PATH", path_with(&bin))
            .stdin(Stdio::null())
            .output()
            .expect("bash");
        ran.push(command.clone());
        assert!(
            output.status.success(),
            "docs/install.md: `{line}` failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let controller = controller
        .expect("docs/install.md's block never waits for PolicyActive: nothing reconciled");
    (operator.before_fill)(plane);
    let fill = FillController::play(plane, stand, &dir);
    Installed {
        controller,
        fill,
        ran,
    }
}

/// A `kubectl` on PATH that talks to `plane` (its admin kubeconfig and discovery cache).
fn kubectl_for(plane: &ControlPlane, dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    let real = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
        .expect("kubectl on PATH");
    let wrapper = bin.join("kubectl");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec '{}' --kubeconfig '{}' --cache-dir '{}' \"$@\"\n",
            real.display(),
            plane.kubeconfig.display(),
            plane.data_dir().join("kubectl-cache").display()
        ),
    )
    .expect("kubectl wrapper");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    bin
}

fn path_with(bin: &Path) -> String {
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// The fill controller's Deployment played as one replica: the real binary with the
/// container's arguments (and `--insecure`: the rig's registries are plain HTTP), its
/// environment with the mounted paths moved under a folder of its own, the `mirror-push`
/// Secret's docker config where the Deployment mounts it, and a token of its ServiceAccount.
/// Killed on drop.
pub struct FillController {
    child: Child,
    log: PathBuf,
}

impl FillController {
    fn play(plane: &ControlPlane, stand: &Stand, dir: &Path) -> FillController {
        let deployment = plane.get_json(&["deployment", "-n", KUBEWARDEN, "fill-mirror"]);
        plane.kubectl_ok(
            &[
                "scale",
                "-n",
                KUBEWARDEN,
                "deployment/fill-mirror",
                "--replicas=0",
            ],
            None,
        );
        let pod = &deployment["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        let root = dir.join("fill-mirror");
        // Each volume's mount path, moved under `root`, and a Secret's items written there.
        let mut moved: Vec<(String, PathBuf)> = Vec::new();
        for mount in container["volumeMounts"].as_array().into_iter().flatten() {
            let (Some(volume), Some(path)) = (mount["name"].as_str(), mount["mountPath"].as_str())
            else {
                continue;
            };
            let folder = root.join(volume);
            std::fs::create_dir_all(&folder).expect("volume folder");
            let source = pod["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|v| v["name"] == volume)
                .cloned()
                .unwrap_or(Value::Null);
            if let Some(secret) = source["secret"]["secretName"].as_str() {
                let data = plane.get_json(&["secret", "-n", KUBEWARDEN, secret])["data"].clone();
                for item in source["secret"]["items"].as_array().into_iter().flatten() {
                    let key = item["key"].as_str().unwrap_or_default();
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(data[key].as_str().unwrap_or_default())
                        .expect("a Secret's base64");
                    let file = folder.join(item["path"].as_str().unwrap_or(key));
                    std::fs::write(file, bytes).expect("a Secret's item");
                }
            }
            moved.push((path.to_string(), folder));
        }
        let place = |value: &str| {
            moved
                .iter()
                .find(|(path, _)| value == path || value.starts_with(&format!("{path}/")))
                .map(|(path, folder)| value.replacen(path.as_str(), &folder.to_string_lossy(), 1))
                .unwrap_or_else(|| value.to_string())
        };
        let args: Vec<String> = container["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect();
        let account = pod["serviceAccountName"].as_str().unwrap_or("default");
        let kubeconfig = service_account_kubeconfig(plane, account, &root);
        // skopeo reaches Docker Hub's stand-in through the rig's `registries.conf` (skopeo 1.9
        // reads no CONTAINERS_REGISTRIES_CONF), by the binary's own `FILL_MIRROR_SKOPEO`.
        let skopeo = root.join("skopeo");
        std::fs::write(
            &skopeo,
            format!(
                "#!/bin/sh\nexec skopeo --registries-conf '{}' \"$@\"\n",
                stand.registries_conf.display()
            ),
        )
        .expect("skopeo wrapper");
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&skopeo, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let log = root.join("fill-mirror.log");
        let mut command = Command::new(stand.fill_mirror);
        command
            .args(&args)
            .arg("--insecure")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("KUBECONFIG", &kubeconfig)
            .env("HOSTNAME", "fill-mirror-played-0")
            .env("FILL_MIRROR_SKOPEO", &skopeo);
        for variable in container["env"].as_array().into_iter().flatten() {
            if let (Some(name), Some(value)) =
                (variable["name"].as_str(), variable["value"].as_str())
            {
                command.env(name, place(value));
            }
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("fill-mirror");
        FillController { child, log }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for FillController {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A kubeconfig that acts as ServiceAccount `account` of the controller's namespace (a
/// TokenRequest token, as the Pod's mounted token), its namespace the context's.
fn service_account_kubeconfig(plane: &ControlPlane, account: &str, dir: &Path) -> PathBuf {
    let token = plane.kubectl_ok(&["create", "token", account, "-n", KUBEWARDEN], None);
    let config = serde_json::json!({"apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "plane", "cluster": {
            "server": format!("https://127.0.0.1:{}", plane.port),
            "certificate-authority": plane.ca_file()}}],
        "users": [{"name": account, "user": {"token": token.trim()}}],
        "contexts": [{"name": account, "context": {
            "cluster": "plane", "user": account, "namespace": KUBEWARDEN}}],
        "current-context": account});
    let path = dir.join(format!("{account}.kubeconfig"));
    std::fs::write(&path, config.to_string()).expect("kubeconfig");
    path
}
