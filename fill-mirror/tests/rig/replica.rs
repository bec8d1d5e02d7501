//! A `fill-mirror watch` replica for the election's tests, as a Deployment runs one: its own
//! identity and kubeconfig, its log in a file, its `/metrics` read as Prometheus would scrape
//! them, stopped by SIGTERM as the kubelet stops a Pod, killed on drop. And the Lease as the API
//! server holds it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::fill_mirror;
use super::plane::ControlPlane;

pub struct Replica {
    pub identity: String,
    child: Child,
    port: u16,
    agent: ureq::Agent,
    log: PathBuf,
}

impl Replica {
    /// `fill-mirror watch --identity IDENTITY EXTRA` against the API server of `kubeconfig`,
    /// its log in `dir`.
    pub fn start(kubeconfig: &Path, identity: &str, extra: &[&str], dir: &Path) -> Replica {
        let log = dir.join(format!("{identity}.log"));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let child = fill_mirror()
            .args([
                "watch",
                "--insecure",
                "--retry",
                "1",
                "--log-format",
                "text",
            ])
            .args(["--identity", identity])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(&log).expect("the replica's log"),
            ))
            .spawn()
            .expect("start fill-mirror watch");
        Replica {
            identity: identity.to_string(),
            child,
            port,
            agent: ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(2))
                .build(),
            log,
        }
    }

    /// Whether `/readyz` answers 200: the settings and the first list of Pods are in.
    pub fn ready(&self) -> bool {
        let url = format!("http://127.0.0.1:{}/readyz", self.port);
        self.agent.get(&url).call().is_ok()
    }

    /// `/metrics` as served now; none while the port does not answer.
    pub fn metrics(&self) -> Option<String> {
        let url = format!("http://127.0.0.1:{}/metrics", self.port);
        self.agent.get(&url).call().ok()?.into_string().ok()
    }

    /// The value of the sample `series` (name and labels, as the exposition writes them).
    pub fn metric(&self, series: &str) -> Option<f64> {
        sample(&self.metrics()?, series)
    }

    /// Whether `fill_mirror_leader` is 1; none while it cannot be read.
    pub fn leads(&self) -> Option<bool> {
        self.metric("fill_mirror_leader").map(|value| value == 1.0)
    }

    /// Every sample of `fill_mirror_copies_total`, one per result.
    pub fn copy_series(&self) -> Vec<(String, f64)> {
        let text = self.metrics().unwrap_or_default();
        text.lines()
            .filter(|line| line.starts_with("fill_mirror_copies_total{"))
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                Some((series.to_string(), value.parse().ok()?))
            })
            .collect()
    }

    /// SIGTERM, as the kubelet sends it to a Pod it stops.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(status.success(), "kill -TERM {}", self.child.id());
    }

    /// Its exit status, once it exits within `within`.
    pub fn exited_within(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of `series` in the exposition `text`.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The Lease `name` in `default` (the admin kubeconfig's namespace), if it exists.
pub fn lease(plane: &ControlPlane, name: &str) -> Option<Value> {
    let listed = plane.get_json(&["leases", "-n", "default"]);
    listed["items"]
        .as_array()?
        .iter()
        .find(|lease| lease["metadata"]["name"] == name)
        .cloned()
}

/// The Lease's holder, "" when it names none.
pub fn holder(plane: &ControlPlane, name: &str) -> String {
    lease(plane, name)
        .and_then(|lease| lease["spec"]["holderIdentity"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A time as the Lease's `renewTime` holds it (a MicroTime), `offset` from now.
pub fn micro_time(offset: std::time::Duration, behind: bool) -> Value {
    let now = k8s_openapi::jiff::Timestamp::now();
    let signed = k8s_openapi::jiff::SignedDuration::try_from(offset).expect("a duration");
    let at = if behind { now - signed } else { now + signed };
    serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        at,
    ))
    .expect("a MicroTime")
}

/// Waits for `condition` up to `seconds`; says whether it held.
pub fn eventually(seconds: u64, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    condition()
}
