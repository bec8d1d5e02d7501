//! A real worker node beside the rig's control plane: the tools' kubelet and kube-scheduler with
//! Debian's containerd (its CRI plugin), runc and CNI bridge, started and stopped by the tools'
//! `node/start-node.sh` and `node/stop-node.sh`, so that a test's Pods are scheduled, their images
//! pulled by containerd from the rig's registries, and run. A test that starts one runs in a
//! network namespace of its own ([`super::netns`]): the node's address and its Pods' never leave
//! it. Shared by every test that needs Pods that run (the install's smoke test, retention,
//! signatures at pull time).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::tools::{ControlPlane, RealTools};

/// The node's address inside the test's network namespace ([`super::netns`] puts it on `lo`): a
/// non-loopback address, as the kubelet wants (RFC 2544's benchmarking range, never routed).
pub const NODE_IP: &str = "198.18.0.2";

/// The Debian programs a node needs (`make test` installs containerd, runc,
/// containernetworking-plugins and iproute2), beside the tools' `kubelet`, `kube-scheduler` and
/// `kit-cri`.
const PROGRAMS: [&str; 6] = [
    "containerd",
    "containerd-shim-runc-v2",
    "runc",
    "ctr",
    "ip",
    "unshare",
];
const CNI_PLUGINS: [&str; 3] = ["bridge", "host-local", "loopback"];

/// The real tools with the node's kit (`node/` in the tools folder) and what it runs on.
#[derive(Clone, Debug)]
pub struct NodeTools {
    pub tools: RealTools,
    /// `node/` in the tools folder: its scripts, `img/` (busybox, pause) and `bin/`.
    pub kit: PathBuf,
}

impl NodeTools {
    /// The tools when everything a node needs is here, as [`RealTools::find`] decides: under
    /// `CI=true` their absence fails the test; otherwise it prints why `test` did not run.
    pub fn find(test: &str) -> Option<NodeTools> {
        let tools = RealTools::find(test)?;
        let kit = tools.dir.join("node");
        let mut missing: Vec<String> = ["start-node.sh", "stop-node.sh", "img/bb-oci"]
            .iter()
            .filter(|name| !kit.join(name).exists())
            .map(|name| format!("{}", kit.join(name).display()))
            .collect();
        missing.extend(
            ["kubelet", "kube-scheduler", "kit-cri"]
                .iter()
                .filter(|name| !tools.bin(name).exists())
                .map(|name| format!("{}", tools.bin(name).display())),
        );
        missing.extend(
            PROGRAMS
                .iter()
                .filter(|name| !on_path(name))
                .map(|name| format!("{name} (on PATH)")),
        );
        missing.extend(
            CNI_PLUGINS
                .iter()
                .map(|name| Path::new("/usr/lib/cni").join(name))
                .filter(|path| !path.exists())
                .map(|path| format!("{}", path.display())),
        );
        // Root, and a kernel and sandbox that let it make namespaces.
        let isolated = Command::new("unshare")
            .args(["-n", "-m", "true"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !isolated {
            missing.push("root that may make network and mount namespaces (unshare -n -m)".into());
        }
        if missing.is_empty() {
            return Some(NodeTools { tools, kit });
        }
        let how = format!(
            "missing: {}; `scripts/real-tools.sh` unpacks the tools, `scripts/ensure-packages.sh containerd runc containernetworking-plugins iproute2` installs the rest (docs/development.md, The real tools)",
            missing.join(", ")
        );
        if std::env::var("CI").is_ok_and(|ci| ci == "true") {
            panic!("{test}: a real node is required in CI: {how}");
        }
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "SKIPPED {test}: did not run: {how}");
        None
    }
}

fn on_path(program: &str) -> bool {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .any(|dir| dir.join(program).is_file())
}

/// One node, `node1`, registered with a control plane; stopped (every sandbox, containerd,
/// mounts, cgroups, the bridge) on drop.
pub struct Node {
    kit: PathBuf,
    /// Everything the node writes (`start-node.sh`'s DATA_DIR).
    pub data: PathBuf,
    kubeconfig: PathBuf,
    kubectl_cache: PathBuf,
    /// What `start-node.sh` said, ending with "node node1 Ready after N s".
    pub started: String,
    /// From the start to the node's Ready.
    pub ready_after: Duration,
    stopped: bool,
}

impl Node {
    /// Starts the node in `data` (a short path: containerd's socket lives under it), pulling
    /// over plain HTTP from `insecure` (`127.0.0.1:PORT` each), its cgroups under a root of
    /// its own (`cgroup_root`, e.g. `/image-swapper-node-<pid>`).
    pub fn start(
        kit: &NodeTools,
        plane: &ControlPlane,
        data: &Path,
        insecure: &[&str],
        cgroup_root: &str,
    ) -> Node {
        let begun = Instant::now();
        let output = Command::new(kit.kit.join("start-node.sh"))
            .arg(&plane.kubeconfig)
            .arg(data)
            .env("NODE_IP", NODE_IP)
            .env("INSECURE_REGISTRIES", insecure.join(" "))
            .env("CGROUP_ROOT", cgroup_root)
            .env("BIN", kit.tools.dir.join("bin"))
            .stdin(Stdio::null())
            .output()
            .expect("start-node.sh");
        let started = text(&output);
        let mut node = Node {
            kit: kit.kit.clone(),
            data: data.to_path_buf(),
            kubeconfig: plane.kubeconfig.clone(),
            kubectl_cache: plane.data_dir().join("kubectl-cache"),
            started,
            ready_after: begun.elapsed(),
            stopped: false,
        };
        if !output.status.success() {
            node.stop();
            panic!("start-node.sh failed:\n{}", node.started);
        }
        node
    }

    /// containerd's client socket.
    pub fn socket(&self) -> PathBuf {
        self.data.join("containerd/containerd.sock")
    }

    /// Pulls of images named `registry` (`docker.io`) go to `host` (`127.0.0.1:PORT`, plain
    /// HTTP) instead: containerd's `hosts.toml`, read at every pull, as a node's registry mirror
    /// configuration is. The node's own stand-in for a registry no machine here reaches.
    pub fn route(&self, registry: &str, host: &str) {
        let dir = self.data.join("containerd/certs.d").join(registry);
        std::fs::create_dir_all(&dir).expect("certs.d");
        let server = if registry == "docker.io" {
            "https://registry-1.docker.io".to_string()
        } else {
            format!("https://{registry}")
        };
        std::fs::write(
            dir.join("hosts.toml"),
            format!(
                "server = \"{server}\"\n[host.\"http://{host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  skip_verify = true\n"
            ),
        )
        .expect("hosts.toml");
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.kubectl_cache)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("kubectl")
    }

    /// The Pod as the API server has it now, if it exists.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        let output = self.kubectl(&["get", "pod", "-n", namespace, name, "-o", "json"]);
        output
            .status
            .success()
            .then(|| serde_json::from_slice(&output.stdout).ok())
            .flatten()
    }

    /// Waits until every container of the Pod runs, up to `within`: the Pod then, and how long
    /// the wait took. A Pod whose image the node cannot pull (`ImagePullBackOff`, which the
    /// kubelet reports once a pull failed) or that cannot start ends the wait at once, with
    /// the kubelet's words.
    pub fn wait_running(
        &self,
        namespace: &str,
        name: &str,
        within: Duration,
    ) -> Result<(Value, Duration), String> {
        let begun = Instant::now();
        let mut last = Value::Null;
        while begun.elapsed() < within {
            if let Some(pod) = self.pod(namespace, name) {
                let statuses = pod["status"]["containerStatuses"].as_array();
                let running = pod["status"]["phase"] == "Running"
                    && statuses.is_some_and(|all| {
                        !all.is_empty() && all.iter().all(|s| s["state"]["running"].is_object())
                    });
                if running {
                    return Ok((pod, begun.elapsed()));
                }
                let stuck = statuses.into_iter().flatten().find(|s| {
                    let reason = s["state"]["waiting"]["reason"].as_str().unwrap_or_default();
                    ["ImagePullBackOff", "CrashLoopBackOff", "InvalidImageName"].contains(&reason)
                        || s["state"]["terminated"].is_object()
                });
                if let Some(stuck) = stuck {
                    return Err(format!(
                        "{namespace}/{name} does not run after {:.1} s: {}",
                        begun.elapsed().as_secs_f64(),
                        stuck["state"]
                    ));
                }
                last = pod;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(format!(
            "{namespace}/{name} not running within {} s: {:#}",
            within.as_secs(),
            last["status"]
        ))
    }

    /// `status.containerStatuses[].imageID` of the Pod's container `container`: the image the
    /// node pulled, `<repository>@<digest>`.
    pub fn image_id(&self, namespace: &str, name: &str, container: &str) -> Option<String> {
        self.pod(namespace, name)?["status"]["containerStatuses"]
            .as_array()?
            .iter()
            .find(|status| status["name"] == container)?["imageID"]
            .as_str()
            .map(str::to_string)
    }

    /// Removes every name of the image `digest` from the node's containerd (and so its
    /// content, once nothing holds it): the next Pod of that image is pulled whole, as on a
    /// node that never had it. Running containers keep running.
    pub fn forget_image(&self, digest: &str) {
        let socket = self.socket();
        let ctr = |args: &[&str]| {
            Command::new("ctr")
                .arg("--address")
                .arg(&socket)
                .args(["-n", "k8s.io"])
                .args(args)
                .output()
                .expect("ctr")
        };
        let listed = ctr(&["images", "ls"]);
        let names: Vec<String> = String::from_utf8_lossy(&listed.stdout)
            .lines()
            .skip(1)
            .filter_map(|line| {
                let columns: Vec<&str> = line.split_whitespace().collect();
                (columns.get(2) == Some(&digest)).then(|| columns[0].to_string())
            })
            .collect();
        assert!(
            !names.is_empty(),
            "the node holds no image {digest}:\n{}",
            text(&listed)
        );
        let mut args = vec!["images", "rm", "--sync"];
        args.extend(names.iter().map(String::as_str));
        let removed = ctr(&args);
        assert!(
            removed.status.success(),
            "ctr images rm: {}",
            text(&removed)
        );
    }

    /// The kubelet's log (its last `lines`), for a failure's message.
    pub fn kubelet_log(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.data.join("logs/kubelet.log")).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Stops everything `start-node.sh` started (`stop-node.sh`): the kubelet, the scheduler,
    /// every Pod sandbox through the CRI, containerd, leftover shims, mounts under the node's
    /// folder, its cgroups, the bridge.
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        stop_node(&self.kit, &self.data);
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `stop-node.sh DATA`: what it said. Safe to run again, and on a node that never started.
pub fn stop_node(kit: &Path, data: &Path) -> String {
    Command::new(kit.join("stop-node.sh"))
        .arg(data)
        .stdin(Stdio::null())
        .output()
        .map(|output| text(&output))
        .unwrap_or_else(|e| format!("stop-node.sh: {e}"))
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
