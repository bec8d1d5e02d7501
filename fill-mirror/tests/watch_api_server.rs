//! `fill-mirror watch` against a real kube-apiserver (etcd and kube-apiserver from the real
//! tools, on loopback), real registries on loopback and skopeo: a Pod created with the record
//! admission writes is filled and marked; `fill_mirror_missing_images` rises while the mirror
//! lacks the image and falls when the copy lands; the watch goes on across an API server
//! restart.

mod rig;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use rig::images::Image;
use rig::plane::{ControlPlane, find_tools};
use rig::registry::TestRegistry;
use rig::{fill_mirror, policy, recorded_pod, settings};
use serde_json::Value;

const LABEL: &str = "image-swapper.kubewarden.io/unmirrored";

/// The running watch, killed on drop.
struct Watch {
    child: Child,
    port: u16,
    agent: ureq::Agent,
}

impl Watch {
    fn start(plane: &ControlPlane) -> Watch {
        Watch::start_with(plane, &[])
    }

    fn start_with(plane: &ControlPlane, extra: &[&str]) -> Watch {
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
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .env("KUBECONFIG", &plane.kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start fill-mirror watch");
        Watch {
            child,
            port,
            agent: ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(5))
                .build(),
        }
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        let url = format!("http://127.0.0.1:{}{path}", self.port);
        match self.agent.get(&url).call() {
            Ok(response) => Some((response.status(), response.into_string().ok()?)),
            Err(ureq::Error::Status(code, response)) => {
                Some((code, response.into_string().unwrap_or_default()))
            }
            Err(ureq::Error::Transport(_)) => None,
        }
    }

    /// The value of the sample `series` (name and labels, as the exposition writes them).
    fn metric(&self, series: &str) -> Option<f64> {
        let (_, text) = self.get("/metrics")?;
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for `condition` up to `seconds`; says whether it held.
fn eventually(seconds: u64, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    condition()
}

fn pod(plane: &ControlPlane, name: &str) -> Value {
    plane.get_json(&["pod", "-n", "default", name])
}

fn recorded(pod: &Value) -> bool {
    pod.pointer("/metadata/labels")
        .and_then(|labels| labels.get(LABEL))
        .is_some()
        || pod
            .pointer("/metadata/annotations")
            .and_then(|a| a.get("image-swapper.kubewarden.io/unmirrored-images"))
            .is_some()
}

struct Cluster {
    plane: ControlPlane,
    source: TestRegistry,
    mirror: TestRegistry,
    policy: image_swapper_policy::policy::Policy,
}

fn cluster(test: &str) -> Option<Cluster> {
    let tools = find_tools(test)?;
    let plane = ControlPlane::start(tools);
    let source = TestRegistry::start(&format!("{test}-src")).expect("source registry");
    let mirror = TestRegistry::start(&format!("{test}-mirror")).expect("mirror registry");
    let settings = settings(&source.host, &mirror.host);
    plane.install_policy_crd();
    plane.apply_swapping_policy("image-swapper", &settings);
    Some(Cluster {
        policy: policy(&settings),
        plane,
        source,
        mirror,
    })
}

impl Cluster {
    /// Creates Pod `name` running `repository:1` from the source, with the record admission
    /// writes when the mirror lacks it.
    fn create_pod(&self, name: &str, repository: &str) {
        let image = format!("{}/{repository}:1", self.source.host);
        let pod = recorded_pod(name, &[&image], &[&image], &self.policy);
        assert_eq!(
            pod.pointer("/metadata/labels").and_then(|l| l.get(LABEL)),
            Some(&Value::from("true")),
            "{pod}"
        );
        self.plane
            .kubectl(&["create", "-f", "-"], Some(&pod.to_string()));
    }
}

#[test]
fn a_recorded_pod_is_filled_and_marked_and_the_missing_gauge_rises_then_falls() {
    let Some(mut cluster) = cluster("fill-watch") else {
        return;
    };
    let digest = Image::new("web", "linux/amd64").push(&cluster.source, "app/web", Some("1"));
    // The mirror down: the copy cannot land, and the image stays missing.
    cluster.mirror.stop();
    let watch = Watch::start(&cluster.plane);
    assert!(
        eventually(30, || watch
            .get("/readyz")
            .is_some_and(|(code, _)| code == 200)),
        "not ready: {:?}",
        watch.get("/readyz")
    );
    cluster.create_pod("web", "app/web");
    let missing = format!(
        "fill_mirror_missing_images{{registry=\"{}\"}}",
        cluster.mirror.host
    );
    assert!(
        eventually(30, || watch.metric(&missing) == Some(1.0)),
        "{missing} is {:?}",
        watch.metric(&missing)
    );
    assert!(recorded(&pod(&cluster.plane, "web")));

    cluster.mirror.resume().expect("the mirror back");
    assert!(
        eventually(60, || !recorded(&pod(&cluster.plane, "web"))),
        "still recorded: {}",
        pod(&cluster.plane, "web")
    );
    assert_eq!(cluster.mirror.digest_of("hub/app/web", "1"), Some(digest));
    assert!(
        eventually(10, || watch.metric(&missing) == Some(0.0)),
        "{missing} is {:?}",
        watch.metric(&missing)
    );
    assert_eq!(
        watch.metric("fill_mirror_copies_total{result=\"copied\"}"),
        Some(1.0)
    );
}

#[test]
fn the_watch_goes_on_across_an_api_server_restart() {
    let Some(cluster) = cluster("fill-restart") else {
        return;
    };
    Image::new("one", "linux/amd64").push(&cluster.source, "app/one", Some("1"));
    let two = Image::new("two", "linux/amd64").push(&cluster.source, "app/two", Some("1"));
    let watch = Watch::start(&cluster.plane);
    cluster.create_pod("one", "app/one");
    assert!(
        eventually(60, || !recorded(&pod(&cluster.plane, "one"))),
        "one still recorded"
    );

    cluster.plane.restart();
    cluster.create_pod("two", "app/two");

    assert!(
        eventually(90, || !recorded(&pod(&cluster.plane, "two"))),
        "two still recorded after the restart: {}",
        pod(&cluster.plane, "two")
    );
    assert_eq!(cluster.mirror.digest_of("hub/app/two", "1"), Some(two));
    drop(watch);
}

/// A Deployment created with `replicas: 0` and a CronJob that has not run yet: no Pod exists,
/// and their images are in the mirror before the first one does.
#[test]
fn workload_templates_are_filled_before_any_pod_exists() {
    let Some(cluster) = cluster("fill-templates") else {
        return;
    };
    let warm = Image::new("warm", "linux/amd64").push(&cluster.source, "app/warm", Some("1"));
    let cron = Image::new("cron", "linux/amd64").push(&cluster.source, "app/cron", Some("1"));
    let _watch = Watch::start(&cluster.plane);
    let container = |repository: &str| serde_json::json!([{"name": "c", "image": format!("{}/{repository}:1", cluster.source.host)}]);
    let deployment = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "warm", "namespace": "default"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "warm"}},
                 "template": {"metadata": {"labels": {"app": "warm"}},
                              "spec": {"containers": container("app/warm")}}},
    });
    let cronjob = serde_json::json!({
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": "cron", "namespace": "default"},
        "spec": {"schedule": "0 0 1 1 *",
                 "jobTemplate": {"spec": {"template": {"spec": {
                     "restartPolicy": "Never", "containers": container("app/cron")}}}}},
    });
    for object in [deployment, cronjob] {
        cluster
            .plane
            .kubectl(&["create", "-f", "-"], Some(&object.to_string()));
    }
    assert!(
        eventually(60, || cluster.mirror.digest_of("hub/app/warm", "1")
            == Some(warm.clone())),
        "the Deployment's image is not in the mirror"
    );
    assert!(
        eventually(30, || cluster.mirror.digest_of("hub/app/cron", "1")
            == Some(cron.clone())),
        "the CronJob's image is not in the mirror"
    );
}

/// A record written under settings the watch does not have yet is refused; once the swapping
/// policy's settings change to those, the record is read again at once, filled and marked.
#[test]
fn a_change_of_the_swapping_policy_s_settings_applies_at_once() {
    let Some(cluster) = cluster("fill-settings") else {
        return;
    };
    Image::new("web", "linux/amd64").push(&cluster.source, "app/web", Some("1"));
    let elsewhere = serde_json::json!({"mirrors": [{"source": cluster.source.host,
        "target": format!("{}/other", cluster.mirror.host)}]});
    cluster
        .plane
        .apply_swapping_policy("image-swapper", &elsewhere);
    let watch = Watch::start(&cluster.plane);
    cluster.create_pod("web", "app/web");
    let refused = "fill_mirror_copies_total{result=\"refused\"}";
    assert!(
        eventually(30, || watch.metric(refused) == Some(1.0)),
        "{refused} is {:?}",
        watch.metric(refused)
    );
    assert!(recorded(&pod(&cluster.plane, "web")));

    cluster.plane.apply_swapping_policy(
        "image-swapper",
        &settings(&cluster.source.host, &cluster.mirror.host),
    );

    assert!(
        eventually(60, || !recorded(&pod(&cluster.plane, "web"))),
        "still recorded after the settings changed"
    );
    assert!(cluster.mirror.digest_of("hub/app/web", "1").is_some());
    assert_eq!(cluster.mirror.digest_of("other/app/web", "1"), None);
}

/// Two replicas, one copier: one holds the Lease and copies; killed, the other takes the Lease
/// over and fills what comes next, and what the first made it finds there, never copied twice.
#[test]
fn of_two_replicas_one_copies_and_the_other_takes_over_when_it_dies() {
    let Some(cluster) = cluster("fill-leader") else {
        return;
    };
    Image::new("one", "linux/amd64").push(&cluster.source, "app/one", Some("1"));
    Image::new("two", "linux/amd64").push(&cluster.source, "app/two", Some("1"));
    let election = |identity| ["--identity", identity, "--lease-duration", "3"];
    let a = Watch::start_with(&cluster.plane, &election("a"));
    assert!(
        eventually(20, || a.metric("fill_mirror_leader") == Some(1.0)),
        "a does not lead"
    );
    let b = Watch::start_with(&cluster.plane, &election("b"));
    assert!(
        eventually(20, || b.get("/readyz").is_some_and(|(code, _)| code == 200)),
        "b is not ready"
    );
    assert_eq!(b.metric("fill_mirror_leader"), Some(0.0));
    cluster.create_pod("one", "app/one");
    assert!(
        eventually(60, || !recorded(&pod(&cluster.plane, "one"))),
        "one still recorded"
    );
    let copied = "fill_mirror_copies_total{result=\"copied\"}";
    assert_eq!(a.metric(copied), Some(1.0));
    assert_eq!(b.metric(copied), None, "b copied while a led");

    drop(a);
    assert!(
        eventually(20, || b.metric("fill_mirror_leader") == Some(1.0)),
        "b did not take the Lease over"
    );
    cluster.create_pod("two", "app/two");
    assert!(
        eventually(60, || !recorded(&pod(&cluster.plane, "two"))),
        "two still recorded after the failover"
    );
    assert_eq!(
        b.metric(copied),
        Some(1.0),
        "b copied one again, or not two"
    );
}

/// `fill-mirror once` against the cluster, as the CronJob runs it: it reads the settings from
/// the swapping policy and the recorded Pods from the API server, copies each image once, marks
/// every record, and exits 0.
#[test]
fn once_reads_the_cluster_copies_once_and_marks_every_record() {
    let Some(cluster) = cluster("fill-once-cluster") else {
        return;
    };
    let digest = Image::new("web", "linux/amd64").push(&cluster.source, "app/web", Some("1"));
    for name in ["a", "b", "c"] {
        cluster.create_pod(name, "app/web");
    }
    let output = fill_mirror()
        .args(["once", "--insecure", "--log-format", "text"])
        .env("KUBECONFIG", &cluster.plane.kubeconfig)
        .output()
        .expect("run fill-mirror once");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("fill-mirror: 1 copied, 0 failed, 0 skipped, 0 gone, 0 refused, 3 marked"),
        "{stdout}"
    );
    assert_eq!(cluster.mirror.digest_of("hub/app/web", "1"), Some(digest));
    for name in ["a", "b", "c"] {
        assert!(
            !recorded(&pod(&cluster.plane, name)),
            "{name} still recorded"
        );
    }
}

/// Figures, not asserts (`cargo test -p fill-mirror --test watch_api_server -- --ignored
/// --nocapture`): the time from a recorded Pod's creation to its image in the mirror, median of
/// 20 distinct images; then 100 Pods recorded for one image: copied once, and the time from
/// their creation to the last one marked.
#[test]
#[ignore = "a measurement: run it with --ignored --nocapture"]
fn time_to_mirror() {
    let Some(cluster) = cluster("fill-bench") else {
        return;
    };
    let watch = Watch::start(&cluster.plane);
    assert!(
        eventually(30, || watch
            .get("/readyz")
            .is_some_and(|(code, _)| code == 200)),
        "not ready"
    );
    let mut times = Vec::new();
    for i in 0..20 {
        let repository = format!("app/bench{i}");
        Image::new(&repository, "linux/amd64").push(&cluster.source, &repository, Some("1"));
        let started = Instant::now();
        cluster.create_pod(&format!("bench{i}"), &repository);
        assert!(
            eventually(60, || cluster
                .mirror
                .digest_of(&format!("hub/{repository}"), "1")
                .is_some()),
            "{repository} not in the mirror"
        );
        times.push(started.elapsed());
    }
    times.sort();
    println!(
        "time to mirror, one Pod, 20 images: median {:?}, min {:?}, max {:?}",
        times[times.len() / 2],
        times[0],
        times[times.len() - 1]
    );

    Image::new("crowd", "linux/amd64").push(&cluster.source, "app/crowd", Some("1"));
    let image = format!("{}/app/crowd:1", cluster.source.host);
    let items: Vec<Value> = (0..100)
        .map(|i| recorded_pod(&format!("crowd{i}"), &[&image], &[&image], &cluster.policy))
        .collect();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    let started = Instant::now();
    cluster
        .plane
        .kubectl(&["create", "-f", "-"], Some(&list.to_string()));
    let created = started.elapsed();
    let selector = format!("{LABEL}=true");
    assert!(
        eventually(120, || {
            cluster
                .plane
                .get_json(&["pods", "-n", "default", "-l", &selector])["items"]
                .as_array()
                .is_some_and(Vec::is_empty)
        }),
        "the 100 Pods are not all marked"
    );
    println!(
        "100 Pods for one image: created in {created:?}, all marked {:?} after the first was created; copies made: {:?}",
        started.elapsed(),
        watch.metric("fill_mirror_copies_total{result=\"copied\"}")
    );
    assert_eq!(
        watch.metric("fill_mirror_copies_total{result=\"copied\"}"),
        Some(21.0),
        "one copy per image"
    );
}

/// `once` beside a running watch: the watch holds the Lease, so the run copies nothing (the
/// watch does) and exits 0, naming the holder.
#[test]
fn once_does_nothing_while_a_watch_replica_holds_the_lease() {
    let Some(cluster) = cluster("fill-once-lease") else {
        return;
    };
    let watch = Watch::start_with(&cluster.plane, &["--identity", "watcher"]);
    assert!(
        eventually(20, || watch.metric("fill_mirror_leader") == Some(1.0)),
        "the watch does not lead"
    );
    let output = fill_mirror()
        .args(["once", "--insecure", "--log-format", "text"])
        .env("KUBECONFIG", &cluster.plane.kubeconfig)
        .output()
        .expect("run fill-mirror once");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains(
            "the Lease fill-mirror is held by watcher: the watch copies and marks, nothing done"
        ),
        "{stdout}"
    );
    assert_eq!(watch.metric("fill_mirror_leader"), Some(1.0));
}
