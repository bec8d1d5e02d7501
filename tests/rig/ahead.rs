//! Ahead of the first Pod, in a real chain: kube-apiserver and kube-controller-manager (the
//! real tools), policy-server 1.35 serving the built module as the namespace's mutating webhook,
//! and `fill-mirror watch` following the workload templates, the source 20 ms and the mirror
//! 5 ms away. A workload is created whose image the mirror lacks and which has no Pod yet (a
//! Deployment with `replicas: 0`, a CronJob before its first run); the fill controller fills the
//! mirror from the template; then the controllers make the Pods, and each is admitted by the
//! policy. Shared by `tests/ahead_of_pods.rs` (which asserts what was swapped) and `make bench`
//! (which prints how long each step took); nothing here asserts on time.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::chain::{self, Entry, Webhook};
use super::images::Image;
use super::proxy::LatencyProxy;
use super::registry::TestRegistry;
use super::tools::{ControlPlane, PolicyServer, PolicyServerOptions, RealTools, free_port};

/// The namespace the workloads run in, which the webhook covers.
pub const NAMESPACE: &str = "ahead";

/// What one workload's first Pods met.
#[derive(Debug)]
pub struct FirstPods {
    /// From the workload's create to its image in the mirror: the fill controller's work.
    pub template_to_mirror: Option<Duration>,
    /// The Pods' images as the API server stored them, after the policy admitted them.
    pub images: Vec<String>,
    /// From the scale (or the schedule's minute) to the last Pod stored.
    pub to_pods: Option<Duration>,
    /// What the mirror image must start with for a Pod to count as swapped.
    pub mirror_prefix: String,
    /// fill-mirror's log, for a failure's message.
    pub log: String,
}

impl FirstPods {
    pub fn swapped(&self) -> usize {
        self.images
            .iter()
            .filter(|image| image.starts_with(&self.mirror_prefix))
            .count()
    }
}

/// The chain: control plane with its controllers, registries, policy-server, webhook, and
/// fill-mirror watching as admin.
pub struct Ahead {
    pub plane: ControlPlane,
    source: TestRegistry,
    pub mirror: TestRegistry,
    source_far: LatencyProxy,
    mirror_far: LatencyProxy,
    _server: PolicyServer,
    watch: Child,
    log: std::path::PathBuf,
}

impl Drop for Ahead {
    fn drop(&mut self) {
        let _ = self.watch.kill();
        let _ = self.watch.wait();
    }
}

/// Limits that decide nothing by time on a loaded machine (the order the docs give them).
const LOOKUP_BUDGET_MS: u64 = 8_000;

impl Ahead {
    pub fn start(tools: &RealTools, module: &Path, fill_mirror: &Path) -> Ahead {
        let plane = ControlPlane::start(tools, true);
        chain::kubewarden_crds(&plane);
        chain::namespaces(&plane, &[NAMESPACE, chain::MARKERS]);
        let source = TestRegistry::start("ahead-source").expect("source registry");
        let mirror = TestRegistry::start("ahead-mirror").expect("mirror registry");
        let source_far =
            LatencyProxy::network(&source.host, Duration::from_millis(20)).expect("proxy");
        let mirror_far =
            LatencyProxy::network(&mirror.host, Duration::from_millis(5)).expect("proxy");
        let settings = json!({
            "mirrors": [{"source": source_far.host, "target": format!("{}/cache", mirror_far.host)}],
            "lookupBudgetMilliseconds": LOOKUP_BUDGET_MS,
        });
        let sources = chain::insecure_sources(&[&source_far.host, &mirror_far.host]);
        let server = PolicyServer::start(
            tools,
            &chain::policies_yml(
                tools,
                &[Entry::new("image-swapper", module, settings.clone())],
            ),
            PolicyServerOptions {
                sources: Some(&sources),
                policy_timeout: Some(10),
                ..PolicyServerOptions::default()
            },
        );
        Webhook {
            name: "clusterwide-image-swapper.ahead",
            server: &server,
            policy: "image-swapper",
            namespaces: &[NAMESPACE],
            failure_policy: "Fail",
            timeout_seconds: 15,
        }
        .install(&plane);
        // The policy object fill-mirror reads its settings from (policy-server reads its own
        // policies.yml: no Kubewarden controller runs here).
        let policy = chain::kubewarden_policy(
            "ClusterAdmissionPolicy",
            None,
            "image-swapper",
            "registry://ghcr.io/image-swapper-policy/image-swapper:v0",
            true,
            settings,
        );
        plane.kubectl_ok(&["apply", "-f", "-"], Some(&policy.to_string()));
        let log = plane.data_dir().join("fill-mirror.log");
        let watch = Command::new(fill_mirror)
            .args([
                "watch",
                "--insecure",
                "--no-election",
                "--log-format",
                "text",
            ])
            .args(["--listen", &format!("127.0.0.1:{}", free_port())])
            .env("KUBECONFIG", &plane.kubeconfig)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start fill-mirror watch");
        Ahead {
            plane,
            source,
            mirror,
            source_far,
            mirror_far,
            _server: server,
            watch,
            log,
        }
    }

    /// Pushes a new image to the source: `<source>/team/<name>:1`, and the mirror's repository.
    fn image(&self, name: &str) -> (String, String) {
        Image::new(name, "linux/amd64").push(&self.source, &format!("team/{name}"), Some("1"));
        (
            format!("{}/team/{name}:1", self.source_far.host),
            format!("cache/team/{name}"),
        )
    }

    fn first_pods(
        &self,
        images: Vec<String>,
        template_to_mirror: Option<Duration>,
        to_pods: Option<Duration>,
    ) -> FirstPods {
        FirstPods {
            template_to_mirror,
            images,
            to_pods,
            mirror_prefix: format!("{}/cache/", self.mirror_far.host),
            log: std::fs::read_to_string(&self.log).unwrap_or_default(),
        }
    }

    /// The mirror's tag `1` of `repository`, waited for up to `seconds`: when it landed.
    fn in_mirror(&self, repository: &str, since: Instant, seconds: u64) -> Option<Duration> {
        until(seconds, || self.mirror.digest_of(repository, "1").is_some())
            .map(|at| at.duration_since(since))
    }

    /// The images of the Pods whose name starts with `prefix`, once there are `count` of them.
    fn pods(&self, prefix: &str, count: usize, seconds: u64) -> (Vec<String>, Option<Instant>) {
        let mut images = Vec::new();
        let at = until(seconds, || {
            let list = self.plane.get_json(&["pods", "-n", NAMESPACE]);
            images = list["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|pod| {
                    pod["metadata"]["name"]
                        .as_str()
                        .is_some_and(|name| name.starts_with(prefix))
                })
                .map(|pod| chain::image_of(pod, 0).to_string())
                .collect();
            images.len() >= count
        });
        (images, at)
    }

    /// A Deployment created with `replicas: 0`, left until its image is in the mirror (or
    /// `wait` has passed), then scaled to `replicas`.
    pub fn deployment_scaled_from_zero(&self, name: &str, replicas: usize, wait: u64) -> FirstPods {
        let (image, repository) = self.image(name);
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "web", "image": image}]}}}});
        let created = Instant::now();
        self.plane
            .kubectl_ok(&["create", "-f", "-"], Some(&deployment.to_string()));
        let landed = self.in_mirror(&repository, created, wait);
        let scaled = Instant::now();
        self.plane.kubectl_ok(
            &[
                "scale",
                "-n",
                NAMESPACE,
                &format!("deployment/{name}"),
                &format!("--replicas={replicas}"),
            ],
            None,
        );
        let (images, at) = self.pods(name, replicas, 60);
        self.first_pods(images, landed, at.map(|at| at.duration_since(scaled)))
    }

    /// A CronJob that runs every minute, created with its image absent from the mirror; its
    /// first Job's Pod, made by the CronJob and Job controllers at the next minute.
    pub fn cronjob_first_run(&self, name: &str) -> FirstPods {
        let (image, repository) = self.image(name);
        let cronjob = json!({"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "job", "image": image}]}}}}}});
        let created = Instant::now();
        self.plane
            .kubectl_ok(&["create", "-f", "-"], Some(&cronjob.to_string()));
        let landed = self.in_mirror(&repository, created, 60);
        let (images, at) = self.pods(name, 1, 90);
        self.first_pods(images, landed, at.map(|at| at.duration_since(created)))
    }
}

fn until(seconds: u64, mut condition: impl FnMut() -> bool) -> Option<Instant> {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        if condition() {
            return Some(Instant::now());
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// For a failure's message: the workloads and Pods of the namespace.
pub fn described(plane: &ControlPlane) -> Value {
    plane.get_json(&[
        "deployments,replicasets,cronjobs,jobs,pods",
        "-n",
        NAMESPACE,
    ])
}
