//! The fill job's watch mode (`scripts/fill-mirror.sh --watch` and `--copier`), with real
//! parts: the shipped script, Debian's `skopeo` and `jq`, real registries on loopback, the
//! swapping role's records written by the built module. Only the API server is a stand-in: a
//! fake `kubectl` on PATH that serves a recorded list and watch streams in the API server's
//! shape (`GET /api/v1/pods?labelSelector=...`: a PodList with `metadata.resourceVersion`;
//! `?watch=1&allowWatchBookmarks=true&...&resourceVersion=RV`: one `{"type", "object"}` event a
//! line, ADDED, MODIFIED, DELETED, BOOKMARK with only the resourceVersion, ERROR with a Status
//! 410 "too old resource version") and records every request and every patch it is sent.

mod rig;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rig::hosts::LiveHost;
use rig::images::Image;
use rig::registry::TestRegistry;
use rig::{pod_request, shared, validate};
use serde_json::{Value, json};

const LABEL: &str = "image-swapper.kubewarden.io/unmirrored";
const RECORD: &str = "image-swapper.kubewarden.io/unmirrored-images";
const LIST: &str = "/api/v1/pods?labelSelector=image-swapper.kubewarden.io%2Funmirrored";

/// `kubectl` where the API server would be: answers from the files in `$FAKE_KUBE` (list-N.json
/// for the N-th list, watch-N.jsonl for the N-th watch, where `#sleep S` waits, `#wait FILE`
/// waits for the test to write FILE, and `#fail TEXT` ends the stream with kubectl's error; a
/// watch with no file stays open; with `patch-fails` holding N, the first N patches fail with
/// the API server's 429, each stamped in `patch-failed`; `patch-sleep` holds how long each
/// patch takes), records each request
/// in `calls` and each patch in `patches` ("NAMESPACE/NAME PATCH"), and when it sent each event
/// (`emitted`) and received each patch (`patched`), in epoch seconds.
const FAKE_KUBECTL: &str = r#"#!/usr/bin/env bash
set -u
dir=${FAKE_KUBE:?}
next() {
  local n=0
  [[ -f $dir/$1.count ]] && n=$(<"$dir/$1.count")
  echo $((n + 1)) >"$dir/$1.count"
  echo "$n"
}
if [[ ${1:-} == get && ${2:-} == --raw ]]; then
  printf '%s\n' "$3" >>"$dir/calls"
  if [[ $3 == *watch=1* ]]; then
    n=$(next watch)
    [[ -f $dir/watch-$n.jsonl ]] || exec sleep 600
    while IFS= read -r line; do
      case $line in
        '#sleep '*) sleep "${line#'#sleep '}" ;;
        '#fail '*) echo "${line#'#fail '}" >&2; exit 1 ;;
        '#wait '*) until [[ -e $dir/${line#'#wait '} ]]; do sleep 0.05; done ;;
        *) echo "$EPOCHREALTIME" >>"$dir/emitted"; printf '%s\n' "$line" ;;
      esac
    done <"$dir/watch-$n.jsonl"
    exit 0
  fi
  n=$(next list)
  [[ -f $dir/list-$n.json ]] || n=0
  cat "$dir/list-$n.json"
  exit 0
fi
if [[ ${1:-} == get ]]; then
  printf '%s\n' "$*" >>"$dir/calls"
  case $2 in
    clusteradmissionpolicies*) cat "$dir/policy.json" ;;
    *) echo '{"apiVersion":"v1","kind":"List","items":[]}' ;;
  esac
  exit 0
fi
if [[ ${1:-} == patch && $2 == pod && $3 == -n && $6 == --type=json && $7 == -p ]]; then
  if [[ -f $dir/patch-fails ]] && (($(next patch) < $(<"$dir/patch-fails"))); then
    echo "$EPOCHREALTIME" >>"$dir/patch-failed"
    echo "Error from server (TooManyRequests): the server has received too many requests and has asked us to try again later" >&2
    exit 1
  fi
  [[ ! -f $dir/patch-sleep ]] || sleep "$(<"$dir/patch-sleep")"
  echo "$EPOCHREALTIME" >>"$dir/patched"
  printf '%s/%s %s\n' "$4" "$5" "$8" >>"$dir/patches"
  echo "pod/$5 patched"
  exit 0
fi
echo "fake kubectl: unexpected $*" >&2
exit 1
"#;

/// skopeo as it is, each call recorded in `$SKOPEO_LOG` first, and its start and end (epoch
/// seconds) in `$SKOPEO_LOG.times` ("start|end PID ARGS").
const SKOPEO_SHIM: &str = r#"#!/usr/bin/env bash
printf '%s\n' "$*" >>"${SKOPEO_LOG:?}"
printf 'start %s %s %s\n' "$(date +%s.%N)" "$$" "$1" >>"$SKOPEO_LOG.times"
/usr/bin/skopeo "$@"
status=$?
printf 'end %s %s %s\n' "$(date +%s.%N)" "$$" "$1" >>"$SKOPEO_LOG.times"
exit $status
"#;

struct Cluster {
    source: TestRegistry,
    mirror: TestRegistry,
    dir: PathBuf,
    rv: u64,
}

/// A process group of the script's, ended with it.
struct Running {
    child: Child,
    log: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

impl Running {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("image-swapper-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("bin")).expect("temp dir");
    dir
}

fn executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

fn wait_until(what: &str, seconds: u64, mut done: impl FnMut() -> bool, log: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while !done() {
        if Instant::now() > deadline {
            panic!("{what}: not within {seconds} s\n{}", log());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Cluster {
    fn start(name: &str) -> Cluster {
        let cluster = Cluster {
            source: TestRegistry::start(&format!("{name}-source")).expect("registry"),
            mirror: TestRegistry::start(&format!("{name}-mirror")).expect("registry"),
            dir: tempdir(name),
            rv: 100,
        };
        executable(&cluster.dir.join("bin/kubectl"), FAKE_KUBECTL);
        executable(&cluster.dir.join("bin/skopeo"), SKOPEO_SHIM);
        cluster.write(
            "policy.json",
            &json!({"apiVersion": "policies.kubewarden.io/v1", "kind": "ClusterAdmissionPolicy",
                "metadata": {"name": "image-swapper"}, "spec": {"settings": cluster.settings()}}),
        );
        cluster
    }

    fn settings(&self) -> Value {
        json!({"mirrors": [{"source": self.source.host, "target": format!("{}/hub", self.mirror.host)}]})
    }

    fn write(&self, name: &str, value: &Value) {
        std::fs::write(self.dir.join(name), value.to_string()).expect("write");
    }

    /// A watch stream: the events, one a line, and the fake's own `#` lines.
    fn stream(&self, n: usize, lines: &[String]) {
        std::fs::write(
            self.dir.join(format!("watch-{n}.jsonl")),
            lines.join("\n") + "\n",
        )
        .expect("write");
    }

    fn list(&self, n: usize, rv: u64, pods: &[Value]) {
        self.write(
            &format!("list-{n}.json"),
            &json!({"kind": "PodList", "apiVersion": "v1",
                "metadata": {"resourceVersion": rv.to_string()}, "items": pods}),
        );
    }

    /// A Pod as the API server stores it after the swapping role admitted it: `containers`
    /// (name, source image), the record the built module wrote for those the mirror lacks.
    fn pod(&mut self, name: &str, containers: &[(&str, &str)]) -> Value {
        let spec = json!({"containers": containers.iter()
            .map(|(n, image)| json!({"name": n, "image": format!("{}/{image}", self.source.host)}))
            .collect::<Vec<_>>()});
        let admitted = validate(
            &json!({"mirrors": self.settings()["mirrors"]}),
            &pod_request("CREATE", spec.clone()),
            shared(LiveHost::default()),
        );
        let mut pod = admitted
            .mutated
            .expect("the policy records what the mirror lacks");
        assert_eq!(pod["metadata"]["labels"][LABEL], "true", "{pod}");
        self.rv += 1;
        pod["metadata"]["name"] = json!(name);
        pod["metadata"]["namespace"] = json!("default");
        pod["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        pod
    }

    fn path(&self) -> String {
        format!(
            "{}:{}",
            self.dir.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        )
    }

    fn run(&self, name: &str, args: &[&str]) -> Running {
        self.run_with(name, args, &self.path(), &[])
    }

    fn run_with(&self, name: &str, args: &[&str], path: &str, env: &[(&str, String)]) -> Running {
        use std::os::unix::process::CommandExt;
        let log = self.dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).expect("log");
        let child = Command::new("bash")
            .arg(rig::root().join("scripts/fill-mirror.sh"))
            .args(args)
            .arg("--spool")
            .arg(self.dir.join("spool"))
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("PATH", path)
            .env("FAKE_KUBE", &self.dir)
            .env("SKOPEO_LOG", self.dir.join("skopeo.log"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .process_group(0)
            .spawn()
            .expect("fill-mirror.sh");
        Running { child, log }
    }

    fn watcher(&self) -> Running {
        self.run("watcher", &["--watch"])
    }

    fn copier(&self, extra: &[&str]) -> Running {
        let mut args = vec!["--copier", "--insecure"];
        args.extend_from_slice(extra);
        self.run("copier", &args)
    }

    fn text(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }

    /// The requests for Pods the fake was asked, in order.
    fn pod_calls(&self) -> Vec<String> {
        self.text("calls")
            .lines()
            .filter(|l| l.starts_with("/api/v1/pods"))
            .map(str::to_string)
            .collect()
    }

    /// The patches sent, as (namespace/name, patch).
    fn patches(&self) -> Vec<(String, Value)> {
        self.text("patches")
            .lines()
            .map(|l| {
                let (pod, patch) = l.split_once(' ').expect("POD PATCH");
                (
                    pod.to_string(),
                    serde_json::from_str(patch).expect("JSON patch"),
                )
            })
            .collect()
    }

    fn in_mirror(&self, repository: &str, tag: &str) -> Option<String> {
        self.mirror.digest_of(&format!("hub/{repository}"), tag)
    }
}

fn event(kind: &str, object: &Value) -> String {
    json!({"type": kind, "object": object}).to_string()
}

fn bookmark(rv: u64) -> String {
    json!({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
        "metadata": {"resourceVersion": rv.to_string(),
            "annotations": {"k8s.io/initial-events-end": "true"}}}})
    .to_string()
}

fn watch(rv: u64) -> String {
    format!(
        "/api/v1/pods?watch=1&allowWatchBookmarks=true&labelSelector=image-swapper.kubewarden.io%2Funmirrored&resourceVersion={rv}"
    )
}

/// The text of one entry of a record, as its bytes stand in the record.
fn entry_text<'a>(record: &'a str, container: &str) -> &'a str {
    let key = format!("\"{container}\":{{");
    let start = record.find(&key).expect("entry") + key.len() - 1;
    let end = record[start..].find('}').expect("entry end") + start + 1;
    &record[start..end]
}

/// A JSON patch applied as the API server would (the ops the watcher sends).
fn apply(pod: &mut Value, patch: &Value) -> bool {
    let field = |path: &str| -> (String, String) {
        let mut parts = path.trim_start_matches('/').split('/');
        let (_, map, key) = (parts.next(), parts.next().unwrap_or(""), parts.next());
        (
            map.to_string(),
            key.unwrap_or("").replace("~1", "/").replace("~0", "~"),
        )
    };
    for op in patch.as_array().expect("a list of ops") {
        let (map, key) = field(op["path"].as_str().expect("path"));
        let target = &mut pod["metadata"][map.as_str()];
        match op["op"].as_str() {
            Some("test") if target[key.as_str()] != op["value"] => return false,
            Some("test") => {}
            Some("replace") => target[key.as_str()] = op["value"].clone(),
            Some("remove") => {
                target.as_object_mut().and_then(|m| m.remove(&key));
            }
            other => panic!("unexpected op {other:?}"),
        }
    }
    true
}

const FILL_JOB: &str = "system:serviceaccount:kubewarden:fill-mirror";

/// The Pod as it leaves the swapping policy's admission of the fill job's update (from
/// `old` to `new`, the watcher's patch applied), with `fillJobUsernames` naming the fill job:
/// the policy's patch applied, or the update as sent.
fn admitted_update(cluster: &Cluster, old: &Value, new: &Value) -> Value {
    let mut request = pod_request("UPDATE", json!({}));
    request["userInfo"]["username"] = json!(FILL_JOB);
    request["oldObject"] = old.clone();
    request["object"] = new.clone();
    let settings =
        json!({"mirrors": cluster.settings()["mirrors"], "fillJobUsernames": [FILL_JOB]});
    let response = validate(&settings, &request, shared(LiveHost::default()));
    assert!(response.accepted, "{response:?}");
    response.mutated.unwrap_or_else(|| new.clone())
}

/// The container names of a Pod's record.
fn entries(pod: &Value) -> Vec<String> {
    pod["metadata"]["annotations"][RECORD]
        .as_str()
        .and_then(|text| serde_json::from_str::<serde_json::Map<String, Value>>(text).ok())
        .map(|record| record.keys().cloned().collect())
        .unwrap_or_default()
}

/// The events of one stream in the API server's shape: a Pod ADDED, another MODIFIED (its
/// record now names a second image), a third ADDED then DELETED, a bookmark, and the end of the
/// stream (the API server's timeout), resumed from the bookmark's resourceVersion. Every image
/// of the Pods still there is copied; each is marked once, the deleted one never.
#[test]
fn the_watch_follows_added_modified_deleted_and_a_bookmark_and_resumes_where_it_was() {
    let mut cluster = Cluster::start("watch-events");
    for (repository, tag) in [("app", "1"), ("web", "2"), ("db", "3"), ("gone", "4")] {
        Image::new(&format!("{repository} {tag}"), "linux/amd64").push(
            &cluster.source,
            repository,
            Some(tag),
        );
    }
    let a = cluster.pod("a", &[("app", "app:1")]);
    cluster.list(0, 100, std::slice::from_ref(&a));
    let b = cluster.pod("b", &[("web", "web:2")]);
    let a2 = cluster.pod("a", &[("app", "app:1"), ("db", "db:3")]);
    let mut c = cluster.pod("c", &[("gone", "gone:4")]);
    let c_added = c.clone();
    c["metadata"]["resourceVersion"] = json!("140");
    cluster.stream(
        0,
        &[
            event("ADDED", &b),
            event("MODIFIED", &a2),
            event("ADDED", &c_added),
            event("DELETED", &c),
            bookmark(150),
        ],
    );
    let watcher = cluster.watcher();
    wait_until(
        "the stream resumed",
        10,
        || cluster.pod_calls().len() >= 3,
        || watcher.log(),
    );
    let copier = cluster.copier(&[]);
    let log = || format!("{}\n{}", watcher.log(), copier.log());
    wait_until(
        "a's and b's images in the mirror, both Pods marked",
        20,
        || cluster.patches().len() >= 2,
        log,
    );
    assert_eq!(
        cluster.pod_calls(),
        [LIST.to_string(), watch(100), watch(150)]
    );
    for (repository, tag) in [("app", "1"), ("web", "2"), ("db", "3")] {
        assert!(
            cluster.in_mirror(repository, tag).is_some(),
            "{repository}:{tag}\n{}",
            log()
        );
    }
    std::thread::sleep(Duration::from_millis(500));
    let patches = cluster.patches();
    let mut marked: Vec<&str> = patches.iter().map(|(pod, _)| pod.as_str()).collect();
    marked.sort_unstable();
    assert_eq!(marked, ["default/a", "default/b"], "{}", log());
    let (_, patch_a) = patches
        .iter()
        .find(|(pod, _)| pod == "default/a")
        .expect("a");
    // The record a MODIFIED event brought, not the listed one.
    assert_eq!(
        patch_a[0]["value"], a2["metadata"]["annotations"][RECORD],
        "{patch_a}"
    );
}

/// A stream that ends, then one that answers 410 Gone (an ERROR event, "too old resource
/// version"), then a watch the API server refuses with 410 itself (kubectl's error): each
/// resume asks for the last resourceVersion seen, and each expiry lists again and watches from
/// the new list's resourceVersion. A Pod of each list is copied.
#[test]
fn an_expired_watch_lists_again_and_each_resume_asks_for_the_last_resource_version() {
    let mut cluster = Cluster::start("watch-expired");
    for repository in ["one", "two", "three"] {
        Image::new(repository, "linux/amd64").push(&cluster.source, repository, Some("1"));
    }
    let one = cluster.pod("one", &[("one", "one:1")]);
    let two = cluster.pod("two", &[("two", "two:1")]);
    let three = cluster.pod("three", &[("three", "three:1")]);
    cluster.list(0, 100, &[one]);
    cluster.stream(0, &[bookmark(150), bookmark(170)]);
    cluster.stream(
        1,
        &[json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": "too old resource version: 170 (300)",
            "reason": "Expired", "code": 410}})
        .to_string()],
    );
    cluster.list(1, 300, &[two]);
    cluster.stream(
        2,
        &["#fail Error from server (Expired): too old resource version: 300 (400)".to_string()],
    );
    cluster.list(2, 400, &[three]);
    let watcher = cluster.watcher();
    let copier = cluster.copier(&[]);
    let log = || format!("{}\n{}", watcher.log(), copier.log());
    wait_until("three lists", 15, || cluster.pod_calls().len() >= 7, log);
    assert_eq!(
        cluster.pod_calls(),
        [
            LIST.to_string(),
            watch(100),
            watch(170),
            LIST.to_string(),
            watch(300),
            LIST.to_string(),
            watch(400)
        ],
        "{}",
        log()
    );
    wait_until(
        "each list's Pod copied",
        20,
        || {
            ["one", "two", "three"]
                .iter()
                .all(|r| cluster.in_mirror(r, "1").is_some())
        },
        log,
    );
}

/// A watch that fails (kubectl's words for an API server it cannot reach) is resumed from the
/// same resourceVersion twice, a second and two seconds later; a third failure lists again,
/// and the watch goes on from the new list's resourceVersion. The list's Pod is copied.
#[test]
fn a_watch_that_cannot_resume_lists_again() {
    let mut cluster = Cluster::start("watch-down");
    Image::new("late", "linux/amd64").push(&cluster.source, "late", Some("1"));
    let late = cluster.pod("late", &[("web", "late:1")]);
    cluster.list(0, 100, &[]);
    let refused = "#fail The connection to the server 10.96.0.1:443 was refused - did you specify the right host or port?";
    for n in 0..3 {
        cluster.stream(n, &[refused.to_string()]);
    }
    cluster.list(1, 300, &[late]);
    let watcher = cluster.watcher();
    let copier = cluster.copier(&[]);
    let log = || format!("{}\n{}", watcher.log(), copier.log());
    wait_until(
        "the list's Pod copied",
        20,
        || cluster.in_mirror("late", "1").is_some(),
        log,
    );
    assert_eq!(
        cluster.pod_calls(),
        [
            LIST.to_string(),
            watch(100),
            watch(100),
            watch(100),
            LIST.to_string(),
            watch(300)
        ],
        "{}",
        log()
    );
}

/// Ten Pods ask for one image, one event each, five arriving while the copy runs (the source is
/// 50 ms away) and five after it is done: skopeo is run for it once (one look at the mirror, one copy).
/// Each Pod is then marked with one patch that tests its record and removes it and the label;
/// once the patches are applied and the swapping policy (`fillJobUsernames` naming the fill job)
/// has admitted each update, no Pod carries the label: the kept-Pods alert's count is 0.
#[test]
fn ten_pods_asking_for_one_image_copy_it_once_and_every_pod_is_marked() {
    use rig::proxy::{HostModel, LatencyProxy, Transport};
    let mut cluster = Cluster::start("watch-dedup");
    Image::new("shared 1", "linux/amd64").push(&cluster.source, "shared", Some("1"));
    let far = LatencyProxy::start_as(
        &cluster.source.host,
        Duration::from_millis(50),
        HostModel::V1_31,
        Transport::PlainHttp,
    )
    .expect("proxy");
    let near = cluster.source.host.clone();
    // The Pods name the source through the proxy; the policy's record is written for it.
    cluster.source.host = far.host.clone();
    let mut pods: Vec<Value> = (0..10)
        .map(|n| cluster.pod(&format!("web-{n}"), &[("web", "shared:1")]))
        .collect();
    cluster.source.host = near;
    cluster.write(
        "policy.json",
        &json!({"spec": {"settings": {"mirrors": [{"source": far.host, "target": format!("{}/hub", cluster.mirror.host)}]}}}),
    );
    cluster.list(0, 100, &[]);
    let mut lines = Vec::new();
    for (n, pod) in pods.iter().enumerate() {
        if n == 5 {
            lines.push("#wait copied".to_string());
        }
        lines.push(event("ADDED", pod));
        lines.push("#sleep 0.15".to_string());
    }
    cluster.stream(0, &lines);
    let copier = cluster.copier(&[]);
    let watcher = cluster.watcher();
    let log = || format!("{}\n{}", watcher.log(), copier.log());
    wait_until(
        "the image in the mirror",
        20,
        || cluster.in_mirror("shared", "1").is_some(),
        log,
    );
    assert!(cluster.patches().len() < 10, "five Pods are still to come");
    std::fs::write(cluster.dir.join("copied"), "").expect("write");
    wait_until("ten Pods marked", 30, || cluster.patches().len() >= 10, log);
    let destination = format!("docker://{}/hub/shared:1", cluster.mirror.host);
    let skopeo = cluster.text("skopeo.log");
    let runs: Vec<&str> = skopeo
        .lines()
        .filter(|l| l.contains(&destination))
        .collect();
    assert_eq!(
        runs.len(),
        2,
        "one inspect and one copy:\n{skopeo}\n{}",
        log()
    );
    assert!(runs[1].starts_with("copy "), "{skopeo}");
    let patches = cluster.patches();
    for pod in &mut pods {
        let key = format!(
            "default/{}",
            pod["metadata"]["name"].as_str().expect("name")
        );
        let patch = &patches.iter().find(|(p, _)| *p == key).expect("a patch").1;
        assert_eq!(
            patch,
            &json!([
                {"op": "test", "path": "/metadata/annotations/image-swapper.kubewarden.io~1unmirrored-images",
                 "value": pod["metadata"]["annotations"][RECORD]},
                {"op": "remove", "path": "/metadata/annotations/image-swapper.kubewarden.io~1unmirrored-images"},
                {"op": "remove", "path": "/metadata/labels/image-swapper.kubewarden.io~1unmirrored"},
            ]),
            "{key}"
        );
        let old = pod.clone();
        assert!(apply(pod, patch), "the test op holds");
        // The swapping policy admits the update from the fill job as it is.
        *pod = admitted_update(&cluster, &old, pod);
    }
    assert_eq!(patches.len(), 10, "{}", log());
    let labelled = pods
        .iter()
        .filter(|p| p["metadata"]["labels"][LABEL] == "true")
        .count();
    assert_eq!(
        labelled, 0,
        "count(kube_pod_labels{{...unmirrored=\"true\"}})"
    );
}

/// A Pod with two recorded images, one whose source is gone: the patch removes the copied
/// one's entry only, and keeps the other byte for byte, with the label; a record that is not
/// the policy's own (another Pod's, naming a destination of its own) is refused on one line,
/// never copied, never marked.
#[test]
fn the_patch_removes_only_the_entries_the_mirror_now_holds() {
    let mut cluster = Cluster::start("watch-patch");
    Image::new("web 7", "linux/amd64").push(&cluster.source, "web", Some("7"));
    Image::new("side 1", "linux/amd64").push(&cluster.source, "side", Some("1"));
    let pod = cluster.pod("two", &[("web", "web:7"), ("side", "side:1")]);
    let mut forged = cluster.pod("forged", &[("web", "web:7")]);
    let record = forged["metadata"]["annotations"][RECORD]
        .as_str()
        .expect("record")
        .replace("hub/web:7", "hub/elsewhere:7");
    forged["metadata"]["annotations"][RECORD] = json!(record);
    // side:1 goes before the copier looks: its source is gone.
    let side = cluster.source.digest_of("side", "1").expect("side");
    cluster
        .source
        .delete_manifest("side", &side)
        .expect("delete");
    cluster.list(0, 100, &[pod.clone(), forged]);
    let watcher = cluster.watcher();
    let copier = cluster.copier(&[]);
    let log = || format!("{}\n{}", watcher.log(), copier.log());
    wait_until("one patch", 20, || !cluster.patches().is_empty(), log);
    std::thread::sleep(Duration::from_millis(500));
    let old = pod["metadata"]["annotations"][RECORD]
        .as_str()
        .expect("record");
    let kept = format!("{{\"side\":{}}}", entry_text(old, "side"));
    assert_eq!(
        cluster.patches(),
        [(
            "default/two".to_string(),
            json!([
                {"op": "test", "path": "/metadata/annotations/image-swapper.kubewarden.io~1unmirrored-images", "value": old},
                {"op": "replace", "path": "/metadata/annotations/image-swapper.kubewarden.io~1unmirrored-images", "value": kept},
            ])
        )],
        "{}",
        log()
    );
    // Applied and admitted by the swapping policy: side's entry and the label stay.
    let mut marked = pod.clone();
    assert!(
        apply(&mut marked, &cluster.patches()[0].1),
        "the test op holds"
    );
    let admitted = admitted_update(&cluster, &pod, &marked);
    assert_eq!(
        (entries(&admitted), &admitted["metadata"]["labels"][LABEL]),
        (vec!["side".to_string()], &json!("true")),
        "{admitted}"
    );
    assert!(cluster.in_mirror("elsewhere", "7").is_none());
    let refused = watcher.log();
    assert_eq!(
        refused
            .lines()
            .filter(|l| l.starts_with("fill-mirror: refused default/forged container web"))
            .count(),
        1,
        "{refused}"
    );
    assert!(copier.log().contains("gone docker://"), "{}", copier.log());
}

/// A source registry that answers 429 Too Many Requests (`Retry-After: 0`, so that skopeo's own
/// retries give up at once) to its first `busy` HTTP requests, then relays to the registry. A
/// TLS handshake is closed at once (skopeo `--tls-verify=false` then speaks plain HTTP). It
/// records when each plain-HTTP connection arrived.
struct Busy {
    host: String,
    arrivals: std::sync::Arc<std::sync::Mutex<Vec<Instant>>>,
}

impl Busy {
    fn start(upstream: &str, busy: usize) -> Busy {
        use std::io::{Read, Write};
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::{Arc, Mutex};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let host = listener.local_addr().expect("address").to_string();
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let (seen, upstream) = (arrivals.clone(), upstream.to_string());
        let answered = Arc::new(AtomicUsize::new(0));
        std::thread::spawn(move || {
            for mut client in listener.incoming().flatten() {
                let mut first = [0u8; 1];
                if client.peek(&mut first).unwrap_or(0) == 0 || first[0] == 0x16 {
                    continue;
                }
                seen.lock().expect("lock").push(Instant::now());
                if answered.fetch_add(1, Ordering::SeqCst) < busy {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") && client.read(&mut byte).unwrap_or(0) == 1 {
                        head.push(byte[0]);
                    }
                    let body = r#"{"errors":[{"code":"TOOMANYREQUESTS","message":"slow down"}]}"#;
                    let _ = write!(
                        client,
                        "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 0\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    continue;
                }
                let Ok(server) = std::net::TcpStream::connect(&upstream) else {
                    continue;
                };
                let (mut to_server, mut from_server) = (server.try_clone().expect("clone"), server);
                let mut from_client = client.try_clone().expect("clone");
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from_client, &mut to_server);
                    let _ = to_server.shutdown(std::net::Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from_server, &mut client);
                    let _ = client.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        Busy { host, arrivals }
    }
}

/// A source that answers 429 to a copy: the copier names it, and no copy from it starts for
/// `--retry` seconds (1 here), the other image's included; then both are copied.
#[test]
fn a_source_answering_429_is_left_alone_for_the_retry_time_then_copied() {
    let mut cluster = Cluster::start("watch-429");
    for repository in ["first", "second"] {
        Image::new(repository, "linux/amd64").push(&cluster.source, repository, Some("1"));
    }
    // skopeo asks /v2/ five times, then /v1/_ping five times, before it gives up.
    let busy = Busy::start(&cluster.source.host, 10);
    let near = cluster.source.host.clone();
    cluster.source.host = busy.host.clone();
    let pods = [
        cluster.pod("first", &[("web", "first:1")]),
        cluster.pod("second", &[("web", "second:1")]),
    ];
    cluster.write(
        "policy.json",
        &json!({"spec": {"settings": cluster.settings()}}),
    );
    cluster.source.host = near;
    cluster.list(0, 100, &pods);
    let watcher = cluster.watcher();
    let copier = cluster.copier(&["--jobs", "1", "--retry", "1"]);
    let log = || format!("{}\n{}", watcher.log(), copier.log());
    wait_until(
        "both copied",
        20,
        || cluster.in_mirror("first", "1").is_some() && cluster.in_mirror("second", "1").is_some(),
        log,
    );
    assert!(
        copier.log().contains(&format!(
            "fill-mirror: {} answered too many requests, its copies wait 1s",
            busy.host
        )),
        "{}",
        log()
    );
    let arrivals = busy.arrivals.lock().expect("lock").clone();
    let longest = arrivals
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    assert!(
        longest >= Duration::from_millis(900),
        "no pause of the retry time between the 429s and the next request: {longest:?}\n{}",
        log()
    );
}

/// Six images at once with `--jobs 2`: never more than two skopeo copies run at the same time,
/// and two do.
#[test]
fn at_most_jobs_copies_run_at_once() {
    let mut cluster = Cluster::start("watch-jobs");
    let mut pods = Vec::new();
    for n in 0..6 {
        let repository = format!("app{n}");
        Image::new(&repository, "linux/amd64").push(&cluster.source, &repository, Some("1"));
        pods.push(cluster.pod(&repository, &[("web", &format!("{repository}:1"))]));
    }
    cluster.list(0, 100, &pods);
    let watcher = cluster.watcher();
    let copier = cluster.copier(&["--jobs", "2"]);
    let log = || format!("{}\n{}", watcher.log(), copier.log());
    wait_until("six Pods marked", 30, || cluster.patches().len() >= 6, log);
    let times = cluster.text("skopeo.log.times");
    let mut events: Vec<(f64, i32)> = times
        .lines()
        .filter(|l| l.ends_with(" copy"))
        .map(|l| {
            let mut parts = l.split(' ');
            let kind = parts.next().expect("kind");
            let at: f64 = parts.next().expect("time").parse().expect("seconds");
            (at, if kind == "start" { 1 } else { -1 })
        })
        .collect();
    events.sort_by(|a, b| a.partial_cmp(b).expect("ordered"));
    let (mut now, mut most) = (0, 0);
    for (_, change) in &events {
        now += change;
        most = most.max(now);
    }
    assert_eq!(events.len(), 12, "{times}");
    assert_eq!(most, 2, "{times}\n{}", log());
}

/// The AWS CLI's container, as a PATH: bash, coreutils and aws; no skopeo, no jq, no kubectl.
fn aws_cli_image(dir: &Path) -> PathBuf {
    let tools = dir.join("aws-cli-image");
    std::fs::create_dir_all(&tools).expect("dir");
    for tool in [
        "bash", "aws", "sort", "base64", "grep", "tail", "env", "mktemp", "mv", "mkdir", "sleep",
    ] {
        // pyenv's shims are scripts that need pyenv: link the program itself.
        let found = Command::new("bash")
            .args([
                "-c",
                &format!("pyenv which {tool} 2>/dev/null || command -v {tool}"),
            ])
            .output()
            .expect("command -v");
        let path = String::from_utf8_lossy(&found.stdout).trim().to_string();
        let _ = std::os::unix::fs::symlink(&path, tools.join(tool));
    }
    tools
}

/// The Deployment on ECR, container by container with only what its public image has: the
/// watcher (kubectl, jq) queues a recorded Pod's copy, the AWS CLI's step creates the missing
/// repository and writes the push login, the copier (`--prepared`, skopeo) copies with that
/// login alone, and the watcher marks the Pod.
#[test]
fn on_ecr_the_watch_creates_the_repository_logs_in_and_copies() {
    use rig::ecr::{EcrRegistry, Moto};
    let cluster = Cluster::start("watch-ecr");
    let storage = TestRegistry::start("watch-ecr-storage").expect("registry");
    let moto = Moto::start().expect("moto");
    let ecr = EcrRegistry::start(&storage, &moto).expect("ECR front");
    let digest =
        Image::new("api 3 for ecr", "linux/amd64").push(&cluster.source, "team/api", Some("3"));
    cluster.write(
        "policy.json",
        &json!({"spec": {"settings": {"mirrors": [{"source": cluster.source.host, "target": format!("{}/cache", ecr.host)}]}}}),
    );
    let record = json!({"api": {"source": format!("{}/team/api:3", cluster.source.host),
        "copy": format!("skopeo copy --all --preserve-digests docker://{0}/team/api:3 docker://{1}/cache/team/api:3", cluster.source.host, ecr.host)}});
    cluster.list(
        0,
        100,
        &[json!({
            "metadata": {"name": "api-0", "namespace": "default", "resourceVersion": "90",
                "labels": {LABEL: "true"}, "annotations": {RECORD: record.to_string()}},
            "spec": {"containers": [{"name": "api", "image": format!("{}/team/api:3", cluster.source.host)}]},
        })],
    );
    let auth = cluster.dir.join("spool/auth.json").display().to_string();
    let watcher = cluster.watcher();
    let tools = aws_cli_image(&cluster.dir);
    let mut env = moto.environment();
    env.push(("REGISTRY_AUTH_FILE", auth.clone()));
    let prepare = cluster.run_with(
        "ecr",
        &["--ecr-prepare"],
        &tools.display().to_string(),
        &env,
    );
    let copier = cluster.run_with(
        "copier",
        &["--copier", "--prepared", "--insecure"],
        &cluster.path(),
        &[("REGISTRY_AUTH_FILE", auth)],
    );
    let log = || format!("{}\n{}\n{}", watcher.log(), prepare.log(), copier.log());
    wait_until("the Pod marked", 30, || !cluster.patches().is_empty(), log);
    assert_eq!(
        storage.digest_of("cache/team/api", "3").as_deref(),
        Some(digest.as_str()),
        "{}",
        log()
    );
    assert!(moto.repository("cache/team/api").is_some());
    assert!(
        prepare
            .log()
            .contains("created ECR repository cache/team/api")
            && prepare
                .log()
                .contains(&format!("logged in to {}", ecr.host)),
        "{}",
        log()
    );
}

/// The epoch seconds of each line of a file the fake kubectl stamps.
fn stamps(cluster: &Cluster, name: &str) -> Vec<f64> {
    cluster
        .text(name)
        .lines()
        .filter_map(|l| l.replace(',', ".").parse().ok())
        .collect()
}

fn epoch() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64()
}

/// One round: `pods` Pods asking for `images` images (Pod p for image p mod images), their
/// events sent at once when the test writes `go-N`.
struct Round {
    n: usize,
    pods: usize,
    repositories: Vec<String>,
}

/// What a round measured, in seconds from its first event sent: to the first and the last
/// image in the mirror (polled every 10 ms), to the last Pod marked; and the skopeo copies run.
struct Measured {
    mirrored: f64,
    last_mirrored: f64,
    marked: f64,
    copies: usize,
}

/// Pushes the round's images to the source and gives its stream's lines; the Pods name
/// `source_host`.
fn prepare(
    cluster: &mut Cluster,
    n: usize,
    pods: usize,
    images: usize,
    source_host: &str,
) -> (Round, Vec<String>) {
    let repositories: Vec<String> = (0..images).map(|i| format!("r{n}-app{i}")).collect();
    for repository in &repositories {
        Image::new(repository, "linux/amd64").push(&cluster.source, repository, Some("1"));
    }
    let near = std::mem::replace(&mut cluster.source.host, source_host.to_string());
    let mut lines = vec![format!("#wait go-{n}")];
    for p in 0..pods {
        let image = format!("{}:1", repositories[p % images]);
        let pod = cluster.pod(&format!("r{n}-web-{p}"), &[("web", &image)]);
        lines.push(event("ADDED", &pod));
    }
    cluster.source.host = near;
    (
        Round {
            n,
            pods,
            repositories,
        },
        lines,
    )
}

fn copies_run(cluster: &Cluster) -> usize {
    cluster
        .text("skopeo.log")
        .lines()
        .filter(|l| l.starts_with("copy "))
        .count()
}

fn measure(cluster: &Cluster, round: &Round) -> Measured {
    let emitted_before = stamps(cluster, "emitted").len();
    let patched_before = stamps(cluster, "patched").len();
    let copies_before = copies_run(cluster);
    std::fs::write(cluster.dir.join(format!("go-{}", round.n)), "").expect("go");
    let mut seen = vec![None; round.repositories.len()];
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.iter().any(Option::is_none) {
        assert!(
            Instant::now() < deadline,
            "round {}: not mirrored in 120 s",
            round.n
        );
        for (i, repository) in round.repositories.iter().enumerate() {
            if seen[i].is_none() && cluster.in_mirror(repository, "1").is_some() {
                seen[i] = Some(epoch());
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    while stamps(cluster, "patched").len() < patched_before + round.pods {
        assert!(
            Instant::now() < deadline,
            "round {}: not marked in 120 s",
            round.n
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let sent = stamps(cluster, "emitted")[emitted_before];
    let seen: Vec<f64> = seen.into_iter().flatten().collect();
    Measured {
        mirrored: seen.iter().cloned().fold(f64::MAX, f64::min) - sent,
        last_mirrored: seen.iter().cloned().fold(0.0, f64::max) - sent,
        marked: stamps(cluster, "patched")
            .iter()
            .cloned()
            .fold(0.0, f64::max)
            - sent,
        copies: copies_run(cluster) - copies_before,
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).expect("ordered"));
    values[values.len() / 2]
}

/// Runs the rounds of `plan` ((Pods, images, runs) each) through one watcher and one copier
/// (`--jobs 4`), and prints a line per entry.
fn bench(cluster: &mut Cluster, source_host: &str, label: &str, plan: &[(usize, usize, usize)]) {
    cluster.list(0, 100, &[]);
    let mut rounds = Vec::new();
    let mut stream = Vec::new();
    for &(pods, images, runs) in plan {
        let mut these = Vec::new();
        for _ in 0..runs {
            let n = rounds.iter().map(Vec::len).sum::<usize>() + these.len();
            let (round, lines) = prepare(cluster, n, pods, images, source_host);
            stream.extend(lines);
            these.push(round);
        }
        rounds.push(these);
    }
    cluster.stream(0, &stream);
    let watcher = cluster.watcher();
    let copier = cluster.copier(&["--jobs", "4"]);
    wait_until(
        "the watch",
        20,
        || cluster.pod_calls().len() >= 2,
        || watcher.log(),
    );
    for (these, &(pods, images, runs)) in rounds.iter().zip(plan) {
        let measured: Vec<Measured> = these.iter().map(|r| measure(cluster, r)).collect();
        println!(
            "| {pods}{label} | {images} | {runs} | {:.2} | {:.2} | {:.2} | {} |",
            median(measured.iter().map(|m| m.mirrored).collect()),
            median(measured.iter().map(|m| m.last_mirrored).collect()),
            median(measured.iter().map(|m| m.marked).collect()),
            measured.iter().map(|m| m.copies).max().unwrap_or(0),
        );
    }
    drop(copier);
    drop(watcher);
}

/// `BENCH_ONLY=fill-watch make bench`: time to mirror in the watch mode (the watcher and the
/// copier as the Deployment runs them, `--jobs 4`), from the watch event that brings a Pod's
/// record to its image in the mirror and to the Pods marked: medians over the runs, and the
/// most skopeo copies a run made. It prints figures and asserts none of them.
#[test]
#[ignore = "a benchmark: BENCH_ONLY=fill-watch make bench"]
fn time_to_mirror() {
    use rig::proxy::{HostModel, LatencyProxy, Transport};
    println!("\nfill-watch: from the watch event to the image in the mirror, median seconds");
    println!(
        "| Pods at once | images | runs | to the first image in the mirror | to the last | to the last Pod marked | skopeo copies (most in a run) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut cluster = Cluster::start("watch-bench");
    let host = cluster.source.host.clone();
    bench(
        &mut cluster,
        &host,
        "",
        &[(1, 1, 20), (10, 1, 5), (100, 1, 3), (20, 20, 3)],
    );
    // The source 50 ms away: the Pods name it through the rig's latency proxy.
    let mut far_cluster = Cluster::start("watch-bench-far");
    let far = LatencyProxy::start_as(
        &far_cluster.source.host,
        Duration::from_millis(50),
        HostModel::V1_31,
        Transport::PlainHttp,
    )
    .expect("proxy");
    far_cluster.write(
        "policy.json",
        &json!({"spec": {"settings": {"mirrors": [{"source": far.host, "target": format!("{}/hub", far_cluster.mirror.host)}]}}}),
    );
    bench(
        &mut far_cluster,
        &far.host.clone(),
        ", source 50 ms away",
        &[(1, 1, 5), (100, 1, 1), (20, 20, 1)],
    );
}

/// On ECR, a repository the AWS CLI's step could not create at first (here its first
/// `aws ecr create-repository` fails) is tried again: the copy into it fails, the `--prepared`
/// copier sends it back to `queue/`, the ECR step creates the repository, and the copy is made.
#[test]
fn on_ecr_a_repository_that_could_not_be_created_is_tried_again() {
    use rig::ecr::{EcrRegistry, Moto};
    let cluster = Cluster::start("watch-ecr-again");
    let storage = TestRegistry::start("watch-ecr-again-storage").expect("registry");
    let moto = Moto::start().expect("moto");
    let ecr = EcrRegistry::start(&storage, &moto).expect("ECR front");
    let digest =
        Image::new("api 4 for ecr", "linux/amd64").push(&cluster.source, "team/api", Some("4"));
    cluster.write(
        "policy.json",
        &json!({"spec": {"settings": {"mirrors": [{"source": cluster.source.host, "target": format!("{}/cache", ecr.host)}]}}}),
    );
    let record = json!({"api": {"source": format!("{}/team/api:4", cluster.source.host),
        "copy": format!("skopeo copy --all --preserve-digests docker://{0}/team/api:4 docker://{1}/cache/team/api:4", cluster.source.host, ecr.host)}});
    cluster.list(
        0,
        100,
        &[json!({
            "metadata": {"name": "api-0", "namespace": "default", "resourceVersion": "90",
                "labels": {LABEL: "true"}, "annotations": {RECORD: record.to_string()}},
            "spec": {"containers": [{"name": "api", "image": format!("{}/team/api:4", cluster.source.host)}]},
        })],
    );
    let auth = cluster.dir.join("spool/auth.json").display().to_string();
    let watcher = cluster.watcher();
    let tools = aws_cli_image(&cluster.dir);
    // The first repository creation fails, as a throttled or refused API call would.
    let aws = std::fs::read_link(tools.join("aws")).expect("aws");
    std::fs::remove_file(tools.join("aws")).expect("aws");
    executable(
        &tools.join("aws"),
        &format!(
            "#!/usr/bin/env bash\nif [[ $* == *create-repository* && ! -e {0}/created-once ]]; then\n  : >{0}/created-once\n  echo 'An error occurred (ThrottlingException) when calling the CreateRepository operation: Rate exceeded' >&2\n  exit 254\nfi\nexec {1} \"$@\"\n",
            cluster.dir.display(),
            aws.display()
        ),
    );
    let mut env = moto.environment();
    env.push(("REGISTRY_AUTH_FILE", auth.clone()));
    let prepare = cluster.run_with(
        "ecr",
        &["--ecr-prepare"],
        &tools.display().to_string(),
        &env,
    );
    let copier = cluster.run_with(
        "copier",
        &["--copier", "--prepared", "--insecure", "--retry", "1"],
        &cluster.path(),
        &[("REGISTRY_AUTH_FILE", auth)],
    );
    let log = || format!("{}\n{}\n{}", watcher.log(), prepare.log(), copier.log());
    wait_until("the Pod marked", 40, || !cluster.patches().is_empty(), log);
    assert_eq!(
        storage.digest_of("cache/team/api", "4").as_deref(),
        Some(digest.as_str()),
        "{}",
        log()
    );
    assert!(
        prepare.log().contains("Rate exceeded")
            && prepare
                .log()
                .contains("created ECR repository cache/team/api")
            && copier.log().contains("again in 1s"),
        "{}",
        log()
    );
}

/// A marking patch that the API server refuses with 429 is sent again after 5 s, without a new
/// event for the Pod: the Pod stays pending until its patch goes through.
#[test]
fn a_marking_patch_that_fails_is_sent_again_after_a_delay() {
    let mut cluster = Cluster::start("watch-patch-again");
    Image::new("retried 1", "linux/amd64").push(&cluster.source, "retried", Some("1"));
    let pod = cluster.pod("retried", &[("web", "retried:1")]);
    cluster.list(0, 100, &[pod]);
    std::fs::write(cluster.dir.join("patch-fails"), "1").expect("write");
    let watcher = cluster.watcher();
    let copier = cluster.copier(&[]);
    let log = || format!("{}\n{}", watcher.log(), copier.log());
    wait_until("the Pod marked", 30, || !cluster.patches().is_empty(), log);
    let failed = stamps(&cluster, "patch-failed");
    let patched = stamps(&cluster, "patched");
    assert_eq!((failed.len(), patched.len()), (1, 1), "{}", log());
    assert!(
        // 5 s on the watcher's whole-second clock: 4 s at least.
        patched[0] - failed[0] >= 3.9,
        "sent again {:.1} s after the 429\n{}",
        patched[0] - failed[0],
        log()
    );
    assert!(
        watcher
            .log()
            .contains("fill-mirror: could not mark default/retried, again in 5s: Error from server (TooManyRequests)"),
        "{}",
        log()
    );
}

/// How old the file `name` of the spool is, in seconds (0 when it is missing).
fn age(cluster: &Cluster, name: &str) -> f64 {
    std::fs::metadata(cluster.dir.join("spool").join(name))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Four Pods marked in one batch whose patches take 1.2 s each: the watcher's alive file (its
/// liveness probe's) is touched at every patch, so it is never older than about one patch,
/// however long the batch.
#[test]
fn a_long_marking_batch_keeps_the_watcher_alive() {
    let mut cluster = Cluster::start("watch-alive");
    Image::new("alive 1", "linux/amd64").push(&cluster.source, "alive", Some("1"));
    let pods: Vec<Value> = (0..4)
        .map(|n| cluster.pod(&format!("alive-{n}"), &[("web", "alive:1")]))
        .collect();
    cluster.list(0, 100, &pods);
    std::fs::write(cluster.dir.join("patch-sleep"), "1.2").expect("write");
    let watcher = cluster.watcher();
    let copier = cluster.copier(&[]);
    let log = || format!("{}\n{}", watcher.log(), copier.log());
    wait_until(
        "the image in the mirror",
        30,
        || cluster.in_mirror("alive", "1").is_some(),
        log,
    );
    let mut oldest: f64 = 0.0;
    wait_until(
        "four Pods marked",
        30,
        || {
            oldest = oldest.max(age(&cluster, "watch/alive"));
            cluster.patches().len() == 4
        },
        log,
    );
    assert!(
        oldest < 2.5,
        "the alive file was {oldest:.1} s old during the marks\n{}",
        log()
    );
}

/// A Pod recorded after its copy was made: the spool's `done/` says the mirror held the image
/// two minutes ago, but the Pod, created now, was recorded because the mirror lacked it (a
/// lifecycle rule pruned it since). The copy is made again, and the Pod marked only once the
/// mirror holds the image anew.
#[test]
fn a_pod_recorded_after_its_copy_was_made_has_it_made_again() {
    let mut cluster = Cluster::start("watch-lost");
    Image::new("lost 1", "linux/amd64").push(&cluster.source, "lost", Some("1"));
    let mut pod = cluster.pod("lost", &[("web", "lost:1")]);
    let now = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .expect("date");
    pod["metadata"]["creationTimestamp"] = json!(String::from_utf8_lossy(&now.stdout).trim());
    let line = format!(
        "{}/lost:1 {}/hub/lost:1",
        cluster.source.host, cluster.mirror.host
    );
    let key = rig::registry::sha256(line.as_bytes());
    let done = cluster.dir.join("spool/done");
    std::fs::create_dir_all(&done).expect("spool");
    let made = done.join(key.trim_start_matches("sha256:"));
    std::fs::write(&made, format!("{line}\n")).expect("write");
    let touched = Command::new("touch")
        .args(["-d", "2 minutes ago"])
        .arg(&made)
        .status()
        .expect("touch");
    assert!(touched.success());
    cluster.list(0, 100, &[pod]);
    let watcher = cluster.watcher();
    let copier = cluster.copier(&[]);
    let log = || format!("{}\n{}", watcher.log(), copier.log());
    wait_until("the Pod marked", 30, || !cluster.patches().is_empty(), log);
    assert!(
        cluster.in_mirror("lost", "1").is_some(),
        "marked while the mirror lacks the image\n{}",
        log()
    );
    assert!(
        watcher.log().contains(&format!(
            "fill-mirror: default/lost was recorded after docker://{}/hub/lost:1 was made: the mirror lost it since, copying it again",
            cluster.mirror.host
        )),
        "{}",
        log()
    );
}
