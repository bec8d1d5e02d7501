//! `fill-mirror watch` against a real kube-apiserver (etcd and kube-apiserver from the real
//! tools, on loopback), real registries on loopback and skopeo: a Pod created with the record
//! admission writes is filled and marked; `fill_mirror_missing_images` rises while the mirror
//! lacks the image and falls when the copy lands; the watch goes on across an API server
//! restart.

mod rig;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use rig::api_proxy::ApiProxy;
use rig::images::Image;
use rig::plane::{ControlPlane, find_tools};
use rig::registry::TestRegistry;
use rig::{alerts, fill_mirror, pod_recorded_by_hand, settings};
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
        Watch::spawn(&plane.kubeconfig, extra, None)
    }

    /// The watch with `kubeconfig`, its log (stderr) to `log` when given.
    fn spawn(kubeconfig: &Path, extra: &[&str], log: Option<&Path>) -> Watch {
        let stderr = match log {
            Some(path) => Stdio::from(std::fs::File::create(path).expect("the watch's log")),
            None => Stdio::inherit(),
        };
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
            .env("KUBECONFIG", kubeconfig)
            .stdout(Stdio::null())
            .stderr(stderr)
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
}

fn cluster(test: &str) -> Option<Cluster> {
    cluster_with(test, "")
}

/// The same, with `apiserver_args` added to kube-apiserver's flags.
fn cluster_with(test: &str, apiserver_args: &str) -> Option<Cluster> {
    let tools = find_tools(test)?;
    let plane = ControlPlane::start_with(tools, apiserver_args);
    let source = TestRegistry::start(&format!("{test}-src")).expect("source registry");
    let mirror = TestRegistry::start(&format!("{test}-mirror")).expect("mirror registry");
    let settings = settings(&source.host, &mirror.host);
    plane.install_policy_crd();
    plane.apply_swapping_policy("image-swapper", &settings);
    Some(Cluster {
        plane,
        source,
        mirror,
    })
}

impl Cluster {
    /// Where the settings route `repository:1` of the source: the same path under `hub`.
    fn mirror_of(&self, repository: &str) -> String {
        format!("{}/hub/{repository}:1", self.mirror.host)
    }

    /// Creates Pod `name` running `repository:1` from the source, with the record admission
    /// writes when the mirror lacks it, written by hand.
    fn create_pod(&self, name: &str, repository: &str) {
        let image = format!("{}/{repository}:1", self.source.host);
        let pod = pod_recorded_by_hand(name, &image, &self.mirror_of(repository));
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
    // The alert on what this replica serves: after 35 minutes of such scrapes it fires for
    // the mirror's registry.
    let (_, lacking) = watch.get("/metrics").expect("/metrics");
    let registry = serde_json::json!({"registry": cluster.mirror.host});
    alerts::after_scrapes(
        &lacking,
        35,
        "ImageSwapperMirrorLacksImages",
        Some(registry),
    )
    .unwrap_or_else(|said| panic!("on\n{lacking}\npromtool: {said}"));

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
    let (_, filled) = watch.get("/metrics").expect("/metrics");
    alerts::after_scrapes(&filled, 35, "ImageSwapperMirrorLacksImages", None)
        .unwrap_or_else(|said| panic!("on\n{filled}\npromtool: {said}"));
    // Every series name an alert reads is one the binary serves (a histogram by its buckets).
    let served = alerts::sample_names(&filled);
    let unread: Vec<String> = alerts::names_the_alerts_read()
        .into_iter()
        // Served once a cluster's in-use set is in the mirror: tests/prune.rs checks it.
        .filter(|name| !served.contains(name) && name != "fill_mirror_in_use_set_age_seconds")
        .collect();
    assert_eq!(unread, Vec::<String>::new(), "not served:\n{filled}");
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

/// Templates are filled only in the namespaces the swapping policy's `namespaceSelector` covers:
/// a Deployment where the policy does not swap gets no copy, until its namespace is labelled into
/// the selector, and then gets it at once (the watch of the namespaces' labels).
#[test]
fn templates_are_filled_only_where_the_policy_s_namespace_selector_covers() {
    let Some(cluster) = cluster("fill-covered") else {
        return;
    };
    filled_only_where_covered(
        &cluster,
        "template",
        |namespace, image| {
            serde_json::json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": namespace},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                         "template": {"metadata": {"labels": {"app": "web"}},
                                      "spec": {"containers": [{"name": "c", "image": image}]}}},
            })
        },
        // Both templates were seen in the same list; give the other's copy the time it would take.
        |_| std::thread::sleep(std::time::Duration::from_secs(3)),
    );
}

/// Kubewarden's controller registers the policy's webhook with its `objectSelector` and leaves
/// its own namespace out (policy-server accepts what comes from there unchanged): a template or
/// a recorded Pod the selector does not match, or in namespace `kubewarden`, is never swapped, so
/// it is not filled, beside a labelled one in `default` that is.
#[test]
fn nothing_outside_the_object_selector_or_in_kubewarden_s_namespace_is_filled() {
    let Some(cluster) = cluster("fill-object-selector") else {
        return;
    };
    let mut policy = cluster
        .plane
        .get_json(&["clusteradmissionpolicy", "image-swapper"]);
    policy["spec"]["objectSelector"] = serde_json::json!({"matchLabels": {"swap": "yes"}});
    cluster
        .plane
        .kubectl(&["apply", "-f", "-"], Some(&policy.to_string()));
    cluster
        .plane
        .kubectl(&["create", "namespace", "kubewarden"], None);
    let watch = Watch::start(&cluster.plane);
    // (repository, namespace, the Pods' labels, filled)
    let cases = [
        ("app/template-in", "default", "yes", true),
        ("app/template-unlabelled", "default", "no", false),
        ("app/template-kubewarden", "kubewarden", "yes", false),
        ("app/pod-in", "default", "yes", true),
        ("app/pod-unlabelled", "default", "no", false),
        ("app/pod-kubewarden", "kubewarden", "yes", false),
    ];
    let mut digests = Vec::new();
    for (i, (repository, namespace, swap, _)) in cases.iter().enumerate() {
        let digest =
            Image::new(repository, "linux/amd64").push(&cluster.source, repository, Some("1"));
        digests.push(digest);
        let image = format!("{}/{repository}:1", cluster.source.host);
        let object = if repository.starts_with("app/template") {
            serde_json::json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": format!("web-{i}"), "namespace": namespace},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                         "template": {"metadata": {"labels": {"app": "web", "swap": swap}},
                                      "spec": {"containers": [{"name": "c", "image": image}]}}},
            })
        } else {
            let mut pod =
                pod_recorded_by_hand(&format!("web-{i}"), &image, &cluster.mirror_of(repository));
            pod["metadata"]["namespace"] = Value::from(*namespace);
            pod["metadata"]["labels"]["swap"] = Value::from(*swap);
            pod
        };
        cluster
            .plane
            .kubectl(&["create", "-f", "-"], Some(&object.to_string()));
    }
    for ((repository, _, _, filled), digest) in cases.iter().zip(&digests) {
        if *filled {
            assert!(
                eventually(60, || cluster
                    .mirror
                    .digest_of(&format!("hub/{repository}"), "1")
                    == Some(digest.clone())),
                "{repository} is not filled"
            );
        }
    }
    // Everything was seen in the same lists; give the others' copies the time they would take.
    std::thread::sleep(Duration::from_secs(3));
    for (repository, namespace, swap, filled) in cases {
        if !filled {
            assert_eq!(
                cluster.mirror.digest_of(&format!("hub/{repository}"), "1"),
                None,
                "{repository} (namespace {namespace}, swap={swap}) was filled"
            );
        }
    }
    drop(watch);
}

/// Creates in namespaces `covered` and `other` (`cover_only_covered`) the object `object` makes
/// for an image of each, under a running watch: the covered one's image is filled; once
/// `meanwhile` has run, the other's is not, until its namespace is labelled into the selector.
fn filled_only_where_covered(
    cluster: &Cluster,
    what: &str,
    object: impl Fn(&str, &str) -> Value,
    meanwhile: impl FnOnce(&Watch),
) {
    let inside = Image::new("inside", "linux/amd64").push(&cluster.source, "app/inside", Some("1"));
    let outside =
        Image::new("outside", "linux/amd64").push(&cluster.source, "app/outside", Some("1"));
    cover_only_covered(cluster);
    let watch = Watch::start(&cluster.plane);
    for (namespace, repository) in [("covered", "app/inside"), ("other", "app/outside")] {
        let image = format!("{}/{repository}:1", cluster.source.host);
        cluster.plane.kubectl(
            &["create", "-f", "-"],
            Some(&object(namespace, &image).to_string()),
        );
    }
    assert!(
        eventually(60, || cluster.mirror.digest_of("hub/app/inside", "1")
            == Some(inside.clone())),
        "the covered namespace's {what} is not filled"
    );
    meanwhile(&watch);
    assert_eq!(
        cluster.mirror.digest_of("hub/app/outside", "1"),
        None,
        "a {what} of a namespace the policy does not cover was filled"
    );
    cluster.plane.kubectl(
        &["label", "namespace", "other", "swap=yes", "--overwrite"],
        None,
    );
    assert!(
        eventually(30, || cluster.mirror.digest_of("hub/app/outside", "1")
            == Some(outside.clone())),
        "the namespace labelled into the selector: its {what} is not filled"
    );
}

/// The swapping policy's `namespaceSelector` set to `swap: yes`, and two namespaces: `covered`
/// (labelled in) and `other` (labelled out).
fn cover_only_covered(cluster: &Cluster) {
    let mut policy = cluster
        .plane
        .get_json(&["clusteradmissionpolicy", "image-swapper"]);
    policy["spec"]["namespaceSelector"] = serde_json::json!({"matchLabels": {"swap": "yes"}});
    cluster
        .plane
        .kubectl(&["apply", "-f", "-"], Some(&policy.to_string()));
    for (namespace, swap) in [("covered", "yes"), ("other", "no")] {
        let object = serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {"swap": swap}}});
        cluster
            .plane
            .kubectl(&["create", "-f", "-"], Some(&object.to_string()));
    }
}

/// A record in a namespace the policy does not cover was not written by it (anyone who may
/// create a labelled Pod there can write one): nothing is copied for it, and the refusal is
/// counted; once the namespace is labelled into the selector, the record is read at once.
#[test]
fn a_record_in_a_namespace_the_policy_does_not_cover_is_ignored() {
    let Some(cluster) = cluster("fill-record-covered") else {
        return;
    };
    filled_only_where_covered(
        &cluster,
        "record",
        |namespace, image| {
            let repository = image
                .strip_prefix(&format!("{}/", cluster.source.host))
                .and_then(|path| path.strip_suffix(":1"))
                .expect("a repository of the source");
            let mut pod = pod_recorded_by_hand("web", image, &cluster.mirror_of(repository));
            pod["metadata"]["namespace"] = Value::from(namespace);
            pod
        },
        |watch| {
            let refused = "fill_mirror_copies_total{result=\"refused\"}";
            assert!(
                eventually(10, || watch.metric(refused) == Some(1.0)),
                "{refused} is {:?}",
                watch.metric(refused)
            );
        },
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
    assert_eq!(b.metric(copied), Some(0.0), "b copied while a led");

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

/// A report of the check role about Pod `pod` (in `default`), with one `fail` result whose
/// message carries `copy`: as the audit scanner writes it, one report per Pod, `scope` the Pod.
fn check_report(kind: &str, pod: &str, copy: &str) -> Value {
    let api_version = match kind {
        "Report" => "openreports.io/v1alpha1",
        _ => "wgpolicyk8s.io/v1alpha2",
    };
    serde_json::json!({
        "apiVersion": api_version, "kind": kind,
        "metadata": {"name": format!("uid-{pod}"), "namespace": "default"},
        "scope": {"apiVersion": "v1", "kind": "Pod", "namespace": "default", "name": pod},
        "results": [{"source": "kubewarden", "policy": "kw.cap.image-swapper-check", "result": "fail",
            "message": format!("a source image the Pod runs is not in the mirror: containers \"web\": fill it ({copy})")}],
    })
}

/// The check role's findings from the cluster: `list` prints the copy a PolicyReport's `fail`
/// names about a Pod that runs it; the watch fills it, and a Report's made later, within its
/// period.
#[test]
fn the_check_role_s_reports_in_the_cluster_are_listed_and_filled() {
    let Some(cluster) = cluster("fill-reports") else {
        return;
    };
    cluster.plane.install_report_crds();
    cluster.plane.apply_swapping_policy(
        "image-swapper-check",
        &settings(&cluster.source.host, &cluster.mirror.host),
    );
    let (source, mirror) = (&cluster.source.host, &cluster.mirror.host);
    let web = Image::new("web", "linux/amd64").push(&cluster.source, "app/web", Some("2"));
    let db = Image::new("db", "linux/amd64").push(&cluster.source, "app/db", Some("3"));
    let copy = |image: &str| {
        format!(
            "skopeo copy --all --preserve-digests docker://{source}/{image} docker://{mirror}/hub/{image}"
        )
    };
    for (pod, image) in [("web", "app/web:2"), ("db", "app/db:3")] {
        let running = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": "default"},
            "spec": {"containers": [{"name": "web", "image": format!("{source}/{image}")}]}});
        cluster
            .plane
            .kubectl(&["create", "-f", "-"], Some(&running.to_string()));
    }
    let namespaced = check_report("PolicyReport", "web", &copy("app/web:2"));
    cluster
        .plane
        .kubectl(&["create", "-f", "-"], Some(&namespaced.to_string()));

    let listed = fill_mirror()
        .args(["list", "--log-format", "text"])
        .env("KUBECONFIG", &cluster.plane.kubeconfig)
        .output()
        .expect("run fill-mirror list");
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout),
        format!("{source}/app/web:2 {mirror}/hub/app/web:2\n"),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );

    let _watch = Watch::start_with(&cluster.plane, &["--period", "2"]);
    assert!(
        eventually(60, || cluster.mirror.digest_of("hub/app/web", "2")
            == Some(web.clone())),
        "the PolicyReport's copy is not in the mirror"
    );
    let later = check_report("Report", "db", &copy("app/db:3"));
    cluster
        .plane
        .kubectl(&["create", "-f", "-"], Some(&later.to_string()));
    assert!(
        eventually(60, || cluster.mirror.digest_of("hub/app/db", "3")
            == Some(db.clone())),
        "the Report's copy is not in the mirror"
    );
}

/// The watch's log so far.
fn log_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// A watch expired: the connection to the API server cut, a Pod recorded meanwhile, and etcd's
/// history compacted past the revision the watch would resume from (the API server's watch
/// cache off, so the resume reaches etcd, as it does once a gap outlives the cache). The watch's
/// resume gets 410 Gone, and its list again finds the Pod it never saw an event of, which is
/// filled and marked.
#[test]
fn a_watch_expired_by_a_compaction_lists_again_and_misses_nothing() {
    let Some(cluster) = cluster_with("fill-expired", "--watch-cache=false") else {
        return;
    };
    Image::new("before", "linux/amd64").push(&cluster.source, "app/before", Some("1"));
    let during = Image::new("during", "linux/amd64").push(&cluster.source, "app/during", Some("1"));
    let dir = tempfile::tempdir().expect("a temporary folder");
    let proxy = ApiProxy::start(cluster.plane.api_port());
    let kubeconfig = dir.path().join("proxied.kubeconfig");
    proxy.kubeconfig(&cluster.plane.kubeconfig, &kubeconfig);
    let log = dir.path().join("watch.log");
    let _watch = Watch::spawn(
        &kubeconfig,
        &["--no-election", "--no-templates", "--no-reports"],
        Some(&log),
    );
    cluster.create_pod("before", "app/before");
    assert!(
        eventually(60, || !recorded(&pod(&cluster.plane, "before"))),
        "before still recorded: {}",
        log_of(&log)
    );

    proxy.cut();
    cluster.create_pod("during", "app/during");
    // A later write, so that the compaction passes the Pod's own revision too: the watch can
    // then learn of the Pod only from a list.
    cluster.plane.kubectl(
        &["create", "configmap", "-n", "default", "after-during"],
        None,
    );
    cluster.plane.compact_etcd();
    std::thread::sleep(Duration::from_secs(2));
    proxy.restore();

    assert!(
        eventually(90, || !recorded(&pod(&cluster.plane, "during"))),
        "during still recorded after the watch came back: {}",
        log_of(&log)
    );
    assert_eq!(
        cluster.mirror.digest_of("hub/app/during", "1"),
        Some(during)
    );
    let log = log_of(&log);
    assert!(
        log.lines().any(
            |line| line.contains("the watch of the recorded Pods failed")
                && line.contains("too old")
        ),
        "the Pods' watch's resume was not refused as expired (410): {log}"
    );
}

/// A mark patch racing a change of the same Pod's record: the watch sees the change late (the
/// API server's answers held back), so the mark goes with the record as it was, and the patch's
/// `test` op refuses it; the watch then reads the changed record and marks that, once.
#[test]
fn a_mark_racing_a_change_of_the_record_is_refused_then_sent_for_the_new_record() {
    let Some(mut cluster) = cluster("fill-race") else {
        return;
    };
    let digest = Image::new("web", "linux/amd64").push(&cluster.source, "app/web", Some("1"));
    let dir = tempfile::tempdir().expect("a temporary folder");
    let proxy = ApiProxy::start(cluster.plane.api_port());
    let kubeconfig = dir.path().join("proxied.kubeconfig");
    proxy.kubeconfig(&cluster.plane.kubeconfig, &kubeconfig);
    let log = dir.path().join("watch.log");
    // The mirror down: the copy fails and waits for its retry.
    cluster.mirror.stop();
    let watch = Watch::spawn(
        &kubeconfig,
        &["--no-election", "--no-templates", "--no-reports"],
        Some(&log),
    );
    cluster.create_pod("web", "app/web");
    let missing = format!(
        "fill_mirror_missing_images{{registry=\"{}\"}}",
        cluster.mirror.host
    );
    assert!(
        eventually(30, || watch.metric(&missing) == Some(1.0)),
        "the watch has not read the record: {}",
        log_of(&log)
    );

    // From now on the watch hears of changes 10 s late; the change: the same record written
    // again in another layout (still the policy's own, another text).
    proxy.hold_back(Duration::from_secs(10));
    let annotation = "image-swapper.kubewarden.io/unmirrored-images";
    let before = pod(&cluster.plane, "web")["metadata"]["annotations"][annotation]
        .as_str()
        .expect("the record")
        .to_string();
    let record: Value = serde_json::from_str(&before).expect("the record's JSON");
    let changed = serde_json::to_string_pretty(&record).expect("JSON");
    assert_ne!(changed, before);
    cluster.plane.kubectl(
        &[
            "annotate",
            "--overwrite",
            "-n",
            "default",
            "pod/web",
            &format!("{annotation}={changed}"),
        ],
        None,
    );
    cluster.mirror.resume().expect("the mirror back");

    assert!(
        eventually(90, || !recorded(&pod(&cluster.plane, "web"))),
        "still recorded: {}",
        log_of(&log)
    );
    let log = log_of(&log);
    assert!(
        log.contains("not marked: the record changed or the Pod is gone"),
        "no mark raced the change (the test op did not refuse one): {log}"
    );
    assert_eq!(cluster.mirror.digest_of("hub/app/web", "1"), Some(digest));
    assert_eq!(
        watch.metric("fill_mirror_copies_total{result=\"copied\"}"),
        Some(1.0),
        "copied once"
    );
}

/// A private source (distribution with htpasswd, 20 ms away) whose login the controller's auth
/// file holds, listed for the namespace `payroll` only (`--source-namespaces`): a tenant's Pod
/// recorded in `tenant`, naming a private image it has no Secret for, is not copied (the source
/// is read anonymously for it, and refuses), while `payroll`'s Pod naming another is copied
/// and marked. Once `tenant` is listed too, its copy is made.
#[test]
fn a_private_source_s_login_is_used_only_for_the_namespaces_listed_for_it() {
    let Some(tools) = find_tools("fill-private-source") else {
        return;
    };
    let plane = ControlPlane::start(tools);
    let private = TestRegistry::start_with_basic_auth("fill-private-src", "puller", "pull-token")
        .expect("private source registry");
    let mirror = TestRegistry::start("fill-private-mirror").expect("mirror registry");
    let far = rig::proxy::LatencyProxy::network(&private.host, Duration::from_millis(20))
        .expect("latency proxy");
    let swap = settings(&far.host, &mirror.host);
    plane.install_policy_crd();
    plane.apply_swapping_policy("image-swapper", &swap);
    let ledger = Image::new("ledger", "linux/amd64").push(&private, "private/ledger", Some("1"));
    let payroll = Image::new("payroll", "linux/amd64").push(&private, "private/payroll", Some("1"));
    for (namespace, repository) in [("payroll", "private/ledger"), ("tenant", "private/payroll")] {
        let object = serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace}});
        plane.kubectl(&["create", "-f", "-"], Some(&object.to_string()));
        let image = format!("{}/{repository}:1", far.host);
        let mut pod = pod_recorded_by_hand(
            "web",
            &image,
            &rig::mirror_by_hand(&swap["mirrors"], &image),
        );
        pod["metadata"]["namespace"] = Value::from(namespace);
        plane.kubectl(&["create", "-f", "-"], Some(&pod.to_string()));
    }
    let dir = tempfile::tempdir().expect("a temporary folder");
    let auth_file = dir.path().join("auth.json");
    let login = rig::registry::basic_auth("puller", "pull-token");
    rig::write_json(
        &auth_file,
        // The mirror's push login beside the source's, listed for no namespace: warned of.
        &serde_json::json!({"auths": {
            far.host.clone(): {"auth": login.trim_start_matches("Basic ")},
            mirror.host.clone(): {"auth": login.trim_start_matches("Basic ")},
        }}),
    );
    let auth = auth_file.display().to_string();
    let listed = format!("{}=payroll", far.host);
    let log = dir.path().join("watch.log");
    let recorded_in = |namespace: &str| recorded(&plane.get_json(&["pod", "-n", namespace, "web"]));
    let watch = Watch::spawn(
        &plane.kubeconfig,
        &[
            "--auth-file",
            &auth,
            "--source-namespaces",
            &listed,
            "--no-reports",
        ],
        Some(&log),
    );
    assert!(
        eventually(60, || !recorded_in("payroll")),
        "payroll's Pod still recorded: {}",
        log_of(&log)
    );
    assert_eq!(mirror.digest_of("hub/private/ledger", "1"), Some(ledger));
    assert!(
        eventually(30, || log_of(&log).contains("read anonymously")),
        "the tenant's copy was not refused by the source: {}",
        log_of(&log)
    );
    assert_eq!(
        mirror.digest_of("hub/private/payroll", "1"),
        None,
        "{}",
        log_of(&log)
    );
    assert!(recorded_in("tenant"), "{}", log_of(&log));
    let start = log_of(&log);
    assert!(
        start.contains("used for no copy's source") && start.contains(&mirror.host),
        "no warning at start: {start}"
    );
    drop(watch);

    // The tenant listed too: its copy is made with the login.
    let both = format!("{}=payroll,tenant", far.host);
    let _watch = Watch::spawn(
        &plane.kubeconfig,
        &[
            "--auth-file",
            &auth,
            "--source-namespaces",
            &both,
            "--no-reports",
        ],
        None,
    );
    assert!(
        eventually(60, || !recorded_in("tenant")),
        "the tenant's Pod still recorded once listed"
    );
    assert_eq!(mirror.digest_of("hub/private/payroll", "1"), Some(payroll));
}
