//! A loopback control plane (etcd and kube-apiserver) started by the tools' `start.sh` on free
//! ports, restartable on the same ports and data, stopped and removed on drop.
//!
//! The tools are where `scripts/real-tools.sh` unpacks them (`TOOLS_DIR`, else
//! `~/.cache/image-swapper-tools`). Absent: outside CI the test says it did not run and how to
//! get them; under `CI=true` it fails.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

pub struct ControlPlane {
    tools: PathBuf,
    data: PathBuf,
    pub kubeconfig: PathBuf,
    ports: [u16; 4],
    /// Added to kube-apiserver's flags.
    apiserver_args: String,
    /// kube-controller-manager runs too (Deployments make ReplicaSets).
    controller_manager: bool,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The tools folder when kube-apiserver and etcd are there.
pub fn find_tools(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/image-swapper-tools")
        });
    let missing: Vec<&str> = ["bin/kube-apiserver", "bin/etcd", "start.sh", "stop.sh"]
        .into_iter()
        .filter(|name| !dir.join(name).exists())
        .collect();
    if missing.is_empty() {
        return Some(dir);
    }
    let how = format!(
        "missing in {}: {}; `scripts/real-tools.sh` unpacks them (docs/development.md, The real tools)",
        dir.display(),
        missing.join(", ")
    );
    if std::env::var("CI").is_ok_and(|ci| ci == "true") {
        panic!("{test}: the real tools are required in CI: {how}");
    }
    // Straight to stderr, past the test harness's capture (it takes only the print macros'
    // output), so that a passing run still shows what did not run.
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: did not run: {how}");
    None
}

impl ControlPlane {
    pub fn start(tools: PathBuf) -> ControlPlane {
        ControlPlane::start_with(tools, "")
    }

    /// A control plane whose kube-apiserver also has `apiserver_args`.
    pub fn start_with(tools: PathBuf, apiserver_args: &str) -> ControlPlane {
        ControlPlane::start_as(tools, apiserver_args, false)
    }

    /// A control plane with kube-controller-manager: Deployments roll out ReplicaSets.
    pub fn start_with_controller_manager(tools: PathBuf) -> ControlPlane {
        ControlPlane::start_as(tools, "", true)
    }

    fn start_as(tools: PathBuf, apiserver_args: &str, controller_manager: bool) -> ControlPlane {
        let data = std::env::temp_dir().join(format!(
            "fill-mirror-k8s-{}-{}",
            std::process::id(),
            free_port()
        ));
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data).expect("data folder");
        let mut plane = ControlPlane {
            kubeconfig: data.join("admin.kubeconfig"),
            tools,
            data,
            ports: [free_port(), free_port(), free_port(), free_port()],
            apiserver_args: apiserver_args.to_string(),
            controller_manager,
        };
        // A port found free can be taken before etcd or the API server binds it (a client's
        // ephemeral port, another test's plane, more likely with test binaries run at once):
        // start.sh then stops what it started, and the plane starts again on other ports,
        // three times at most.
        for _ in 1..3 {
            match plane.start_sh() {
                Ok(()) => return plane,
                Err(said) if said.contains("already in use") => {
                    plane.down();
                    let _ = std::fs::remove_dir_all(&plane.data);
                    std::fs::create_dir_all(&plane.data).expect("data folder");
                    plane.ports = [free_port(), free_port(), free_port(), free_port()];
                }
                Err(said) => panic!("start.sh: {said}"),
            }
        }
        plane.up();
        plane
    }

    fn up(&self) {
        if let Err(said) = self.start_sh() {
            panic!("start.sh: {said}");
        }
    }

    fn start_sh(&self) -> Result<(), String> {
        let [kube, etcd, peer, kcm] = self.ports;
        let output = Command::new(self.tools.join("start.sh"))
            .arg(&self.data)
            .env("K8S_DIR", &self.tools)
            .env("KUBE_PORT", kube.to_string())
            .env("ETCD_PORT", etcd.to_string())
            .env("ETCD_PEER_PORT", peer.to_string())
            .env("KCM_PORT", kcm.to_string())
            .env("START_KCM", if self.controller_manager { "1" } else { "0" })
            .env("KUBE_APISERVER_EXTRA_ARGS", &self.apiserver_args)
            .env("KUBECONFIG_OUT", &self.kubeconfig)
            .output()
            .expect("start.sh");
        match output.status.success() {
            true => Ok(()),
            false => Err(format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )),
        }
    }

    fn down(&self) {
        let _ = Command::new(self.tools.join("stop.sh"))
            .arg(&self.data)
            .env("K8S_DIR", &self.tools)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// Stops etcd and the API server and starts them again on the same ports and data, as an
    /// API server upgrade or crash does under a running watch.
    pub fn restart(&self) {
        self.down();
        self.up();
    }

    /// The API server's port on loopback.
    pub fn api_port(&self) -> u16 {
        self.ports[0]
    }

    /// Compacts etcd's history up to its current revision (`etcdctl compact`, Debian's
    /// etcd-client), as the API server does every 5 minutes: a watch that resumes from an older
    /// revision then gets 410 Gone. The revision compacted to.
    pub fn compact_etcd(&self) -> u64 {
        let endpoint = format!("http://127.0.0.1:{}", self.ports[1]);
        let status = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &endpoint, "endpoint", "status", "-w", "json"])
            .output()
            .expect("etcdctl (apt-get install etcd-client)");
        let statuses: Value = serde_json::from_slice(&status.stdout).expect("etcdctl's JSON");
        let revision = statuses[0]["Status"]["header"]["revision"]
            .as_u64()
            .expect("etcd's revision");
        let compact = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &endpoint, "compact", &revision.to_string()])
            .output()
            .expect("etcdctl compact");
        assert!(
            compact.status.success(),
            "etcdctl compact {revision}: {}",
            String::from_utf8_lossy(&compact.stderr)
        );
        revision
    }

    /// `kubectl ARGS` (with `stdin`), which must succeed; its standard output.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> String {
        use std::io::Write;
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl (apt-get install kubectl)");
        if let Some(mut input) = child.stdin.take() {
            input
                .write_all(stdin.unwrap_or_default().as_bytes())
                .expect("kubectl's stdin");
        }
        let output = child.wait_with_output().expect("kubectl");
        assert!(
            output.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    pub fn get_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.kubectl(&all, None)).expect("kubectl's JSON")
    }

    /// Kubewarden's ClusterAdmissionPolicy CRD (the copy the policy's tests use), established.
    pub fn install_policy_crd(&self) {
        let crd = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../scripts/kubewarden-crds/policies.kubewarden.io_clusteradmissionpolicies.yaml"
        );
        self.kubectl(&["apply", "-f", crd], None);
        // `kubectl wait` fails at once on a CRD whose status has no conditions yet ("accessor
        // error: <nil>"): asked again until it waits.
        let started = std::time::Instant::now();
        loop {
            let waited = Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(["wait", "--for", "condition=established", "--timeout=60s"])
                .arg("crd/clusteradmissionpolicies.policies.kubewarden.io")
                .output()
                .expect("kubectl wait");
            if waited.status.success() {
                return;
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(60),
                "kubectl wait for the CRD: {}",
                String::from_utf8_lossy(&waited.stderr)
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// The report kinds Kubewarden's audit scanner writes about a Pod (wgpolicyk8s.io
    /// PolicyReport, openreports.io Report) and the cluster-wide PolicyReport, as the API server
    /// serves them to the fill job: stand-in CRDs of the real groups, versions, kinds and plurals
    /// (the upstream schemas are not vendored here; their fields are what the fill job reads and
    /// the audit scanner writes).
    pub fn install_report_crds(&self) {
        for (group, version, kind, plural, scope) in [
            (
                "wgpolicyk8s.io",
                "v1alpha2",
                "PolicyReport",
                "policyreports",
                "Namespaced",
            ),
            (
                "wgpolicyk8s.io",
                "v1alpha2",
                "ClusterPolicyReport",
                "clusterpolicyreports",
                "Cluster",
            ),
            (
                "openreports.io",
                "v1alpha1",
                "Report",
                "reports",
                "Namespaced",
            ),
        ] {
            let crd = serde_json::json!({
                "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": format!("{plural}.{group}")},
                "spec": {
                    "group": group, "scope": scope,
                    "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                    "versions": [{"name": version, "served": true, "storage": true,
                        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
                },
            });
            self.kubectl(&["apply", "-f", "-"], Some(&crd.to_string()));
            self.kubectl(
                &[
                    "wait",
                    "--for",
                    "condition=established",
                    "--timeout=60s",
                    &format!("crd/{plural}.{group}"),
                ],
                None,
            );
        }
    }

    /// The swapping policy `name` with `settings`.
    pub fn apply_swapping_policy(&self, name: &str, settings: &Value) {
        let policy = serde_json::json!({
            "apiVersion": "policies.kubewarden.io/v1",
            "kind": "ClusterAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "module": "registry://example.com/image-swapper:v0",
                "mutating": true,
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE", "UPDATE"]}],
                "settings": settings,
            },
        });
        self.kubectl(&["apply", "-f", "-"], Some(&policy.to_string()));
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.down();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}
