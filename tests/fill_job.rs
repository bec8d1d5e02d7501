//! Keeping the mirror full, with real parts: the check role's findings for running Pods (the
//! built module, real registries), written into reports in the exact shape Kubewarden's audit
//! scanner writes them (kubewarden-controller `internal/audit-scanner/report/openreports.go`
//! and `policyreports.go`: one report per Pod, `.results[]` with `source`, `policy`
//! (`clusterwide-<name>`), `result`, `message`, ...), and the shipped `scripts/fill-mirror.sh`
//! run on them with Debian's `skopeo` and `jq`.

mod rig;

use std::path::{Path, PathBuf};
use std::process::Command;

use rig::hosts::LiveHost;
use rig::images::Image;
use rig::registry::TestRegistry;
use rig::{Response, audit_request, pod_request, shared, validate};
use serde_json::{Value, json};

const POLICY: &str = "clusterwide-image-swapper-check";

struct Cluster {
    source: TestRegistry,
    mirror: TestRegistry,
}

impl Cluster {
    fn start(name: &str) -> Cluster {
        Cluster {
            source: TestRegistry::start(&format!("{name}-source")).expect("registry"),
            mirror: TestRegistry::start(&format!("{name}-mirror")).expect("registry"),
        }
    }

    fn settings(&self, action: &str) -> Value {
        json!({"action": action, "mirrors": [{"source": self.source.host, "target": format!("{}/hub", self.mirror.host)}]})
    }

    fn source_image(&self, name: &str) -> String {
        format!("{}/{name}", self.source.host)
    }

    fn check(&self, n: usize, spec: &Value, annotations: &Value) -> Response {
        let request = audit_request(n, spec.clone(), annotations.clone());
        validate(
            &self.settings("check"),
            &request,
            shared(LiveHost::default()),
        )
    }
}

fn web(image: &str) -> Value {
    json!({"containers": [{"name": "web", "image": image}]})
}

/// One result as the scanner writes it for a policy's answer.
fn result(policy: &str, response: &Response) -> Value {
    let outcome = match (response.accepted, response.code) {
        (true, _) => "pass",
        (false, Some(500)) => "error",
        (false, _) => "fail",
    };
    let mut result = json!({
        "source": "kubewarden",
        "policy": policy,
        "category": "Image",
        "severity": "info",
        "timestamp": {"seconds": 1_780_300_800, "nanos": 0},
        "result": outcome,
        "scored": true,
        "resourceSelector": {},
        "properties": {
            "validating": "true",
            "policy-name": policy.trim_start_matches("clusterwide-"),
            "policy-resource-version": "81723",
            "policy-uid": "0a4f8d2c-5b1e-4e7a-9c3d-7f6e5d4c3b2a",
        },
    });
    if let Some(message) = &response.message {
        result["message"] = json!(message);
    }
    result
}

/// One report per Pod: an `openreports.io` Report (the Helm chart's default) or a
/// `wgpolicyk8s.io` PolicyReport, named after the Pod's uid, owned by it.
fn report(kind: &str, n: usize, results: Vec<Value>) -> Value {
    let request = audit_request(n, json!({}), json!({}));
    let (uid, name) = (request["uid"].clone(), request["name"].clone());
    let count = |r: &str| results.iter().filter(|x| x["result"] == r).count();
    let api_version = match kind {
        "Report" => "openreports.io/v1alpha1",
        _ => "wgpolicyk8s.io/v1alpha2",
    };
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": uid, "namespace": "default",
            "labels": {"app.kubernetes.io/managed-by": "kubewarden", "kubewarden.io/policyreport-version": "v2"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}],
        },
        "scope": {"apiVersion": "v1", "kind": "Pod", "namespace": "default", "name": name, "uid": uid, "resourceVersion": "48213"},
        "summary": {"pass": count("pass"), "fail": count("fail"), "warn": 0, "error": count("error"), "skip": 0},
        "results": results,
    })
}

/// `kubectl get <kind> -A -o json`: a List.
fn list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}})
}

fn write(dir: &Path, name: &str, value: &Value) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(value).expect("JSON")).expect("write");
    path
}

/// Runs the shipped script: its exit status and what it printed.
fn fill(reports: &[&Path], extra: &[&str]) -> (bool, String) {
    let mut command = Command::new(rig::root().join("scripts/fill-mirror.sh"));
    command.arg("--insecure").args(extra);
    for path in reports {
        command.arg("--reports").arg(path);
    }
    let output = command.output().expect("fill-mirror.sh runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// The whole loop. Pod A was swapped to `app:1.0@OLD`; then a sync moved the mirror's `app:1.0`
/// to NEW and a "delete untagged" rule pruned OLD. Pods B and C run `web:2`, which the mirror
/// never got; Pod D runs `db:3`, which it has; Pod E runs `gone:1`, which the source lacks too.
/// The reports also hold another policy's `fail` and this policy's `error`, both with a copy in
/// their message, which the script must not run.
#[test]
fn the_fill_job_copies_what_the_reports_name_and_moves_no_tag() {
    let cluster = Cluster::start("fill");
    let (source, mirror) = (&cluster.source, &cluster.mirror);
    let old_image = Image::new("app 1.0 old", "linux/amd64");
    let old = old_image.push(source, "app", Some("1.0"));
    old_image.push(mirror, "hub/app", Some("1.0"));
    let admitted = validate(
        &cluster.settings("swap"),
        &pod_request("CREATE", web(&cluster.source_image("app:1.0"))),
        shared(LiveHost::default()),
    );
    let pod_a = admitted.mutated.expect("swapped at admission");
    assert_eq!(
        pod_a["spec"]["containers"][0]["image"],
        json!(format!("{}/hub/app:1.0@{old}", mirror.host))
    );
    // Upstream moves app:1.0; a sync copies it; a lifecycle rule prunes the untagged OLD.
    let new_image = Image::new("app 1.0 new", "linux/amd64");
    let new = new_image.push(source, "app", Some("1.0"));
    new_image.push(mirror, "hub/app", Some("1.0"));
    mirror.delete_manifest("hub/app", &old).expect("prune");
    let web_digest = Image::new("web 2", "linux/amd64").push(source, "web", Some("2"));
    let db = Image::new("db 3", "linux/amd64");
    db.push(source, "db", Some("3"));
    db.push(mirror, "hub/db", Some("3"));

    let annotations_a = pod_a["metadata"]["annotations"].clone();
    let scan = |cluster: &Cluster| -> Vec<Response> {
        vec![
            cluster.check(1, &pod_a["spec"], &annotations_a),
            cluster.check(2, &web(&cluster.source_image("web:2")), &json!({})),
            cluster.check(3, &web(&cluster.source_image("web:2")), &json!({})),
            cluster.check(4, &web(&cluster.source_image("db:3")), &json!({})),
            cluster.check(5, &web(&cluster.source_image("gone:1")), &json!({})),
        ]
    };
    let first = scan(&cluster);
    let verdicts: Vec<(bool, Option<u64>)> = first.iter().map(|r| (r.accepted, r.code)).collect();
    assert_eq!(
        verdicts,
        [
            (false, None),
            (false, None),
            (false, None),
            (true, None),
            (false, None)
        ],
        "{first:#?}"
    );
    let own_tag = old.replacen(':', "-", 1);
    let a_message = first[0].message.as_deref().unwrap_or_default();
    assert!(
        a_message.contains(&format!(
            "it was swapped from \"{}\": refill the mirror (skopeo copy --all --preserve-digests docker://{}@{old} docker://{}/hub/app:{own_tag})",
            cluster.source_image("app:1.0"),
            cluster.source_image("app"),
            mirror.host
        )),
        "{a_message}"
    );
    assert!(
        first[1]
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with("a source image the Pod runs is not in the mirror: ")),
        "{first:?}"
    );

    let dir = tempdir("fill");
    let unrelated = json!({"source": "kubewarden", "policy": "clusterwide-other", "result": "fail",
        "message": format!("skopeo copy --all --preserve-digests docker://{} docker://{}/hub/db:3", cluster.source_image("app:1.0"), mirror.host)});
    let mut errored = result(POLICY, &first[1]);
    errored["result"] = json!("error");
    errored["message"] = json!(format!(
        "skopeo copy --all --preserve-digests docker://{} docker://{}/hub/app:1.0",
        cluster.source_image("app:1.0"),
        mirror.host
    ));
    let openreports = write(
        &dir,
        "reports.json",
        &list(vec![
            report("Report", 1, vec![result(POLICY, &first[0]), unrelated]),
            report("Report", 2, vec![result(POLICY, &first[1])]),
        ]),
    );
    let policyreports = write(
        &dir,
        "policyreports.json",
        &list(vec![
            report("PolicyReport", 3, vec![result(POLICY, &first[2]), errored]),
            report("PolicyReport", 4, vec![result(POLICY, &first[3])]),
        ]),
    );
    // One report alone, as `kubectl get report NAME -o json` prints it.
    let single = write(
        &dir,
        "single.json",
        &report("PolicyReport", 5, vec![result(POLICY, &first[4])]),
    );
    let reports = [
        openreports.as_path(),
        policyreports.as_path(),
        single.as_path(),
    ];

    let (ok, listed) = fill(&reports, &["--list"]);
    assert!(ok, "{listed}");
    assert_eq!(listed.lines().count(), 3, "A, web:2 once, gone:1: {listed}");

    let (ok, dry) = fill(&reports, &["--dry-run"]);
    assert!(ok, "{dry}");
    assert!(
        dry.ends_with("fill-mirror: dry run, 3 copies, none made\n"),
        "{dry}"
    );
    assert_eq!(
        mirror.digest_of("hub/web", "2"),
        None,
        "a dry run copies nothing"
    );
    assert_eq!(mirror.digest_of("hub/app", &own_tag), None);

    let (ok, text) = fill(&reports, &[]);
    assert!(!ok, "a failed copy fails the job: {text}");
    assert!(
        text.ends_with("fill-mirror: 2 copied, 1 failed, 0 skipped\n"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "failed docker://{}",
            cluster.source_image("gone:1")
        )),
        "{text}"
    );
    // Every image the reports named is in the mirror; no tag names other content than before.
    assert_eq!(
        mirror.digest_of("hub/app", "1.0"),
        Some(new.clone()),
        "app:1.0 stays on NEW"
    );
    assert_eq!(mirror.digest_of("hub/app", &own_tag), Some(old.clone()));
    assert_eq!(mirror.digest_of("hub/app", &old), Some(old.clone()));
    assert_eq!(mirror.digest_of("hub/web", "2"), Some(web_digest));
    assert_eq!(
        mirror.digest_of("hub/db", "3"),
        Some(db.digest()),
        "unrelated copy not run"
    );

    // The next scan passes every Pod the job filled; the source's missing image stays a finding.
    let second = scan(&cluster);
    let passed: Vec<bool> = second.iter().map(|r| r.accepted).collect();
    assert_eq!(passed, [true, true, true, true, false], "{second:#?}");

    // The same reports again: what exists now is skipped, never copied over.
    let (_, again) = fill(&reports, &[]);
    assert!(
        again.ends_with("fill-mirror: 0 copied, 1 failed, 2 skipped\n"),
        "{again}"
    );
}

/// The job in two containers, as the CronJob runs it: the reports' copies listed where kubectl
/// and jq are, the copies made where skopeo is.
#[test]
fn a_list_of_copies_is_copied_by_itself() {
    let cluster = Cluster::start("fill-list");
    Image::new("web 2", "linux/amd64").push(&cluster.source, "web", Some("2"));
    let finding = cluster.check(1, &web(&cluster.source_image("web:2")), &json!({}));
    let dir = tempdir("fill-list");
    let reports = write(
        &dir,
        "r.json",
        &list(vec![report("Report", 1, vec![result(POLICY, &finding)])]),
    );
    let (ok, listed) = fill(&[&reports], &["--list"]);
    assert!(ok, "{listed}");
    let copies = dir.join("copies.txt");
    std::fs::write(&copies, &listed).expect("copies");
    let (ok, text) = fill(&[], &["--copies", copies.to_str().expect("path")]);
    assert!(
        ok && text.ends_with("fill-mirror: 1 copied, 0 failed, 0 skipped\n"),
        "{text}"
    );
    assert!(cluster.mirror.digest_of("hub/web", "2").is_some());
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("image-swapper-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A finding and an image that could not be checked, in one Pod: the report's `fail` (not
/// `error`, which the fill job skips), whose message names both, the finding first; the fill
/// job copies the finding's image and nothing for the other.
#[test]
fn a_finding_beside_an_unchecked_image_is_a_fail_whose_copy_the_fill_job_makes() {
    let cluster = Cluster::start("fill-mixed");
    let (source, mirror) = (&cluster.source, &cluster.mirror);
    Image::new("web 4", "linux/amd64").push(source, "web", Some("4"));
    // A second rule to a mirror that refuses connections: its image cannot be checked.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let down = closed.local_addr().expect("address").to_string();
    drop(closed);
    let mut settings = cluster.settings("check");
    settings["mirrors"]
        .as_array_mut()
        .expect("mirrors")
        .push(json!({"source": "quay.io", "target": format!("{down}/quay")}));
    let spec = json!({"containers": [
        {"name": "web", "image": cluster.source_image("web:4")},
        {"name": "sidecar", "image": "quay.io/team/sidecar:1"},
    ]});
    let response = validate(
        &settings,
        &audit_request(7, spec, json!({})),
        shared(LiveHost::default()),
    );
    assert_eq!(
        (response.accepted, response.code),
        (false, None),
        "{response:?}"
    );
    let message = response.message.clone().unwrap_or_default();
    let head = format!(
        "a source image the Pod runs is not in the mirror: containers \"web\": image \"{}\" is not in the mirror",
        cluster.source_image("web:4")
    );
    let also = format!(
        "; also containers \"sidecar\": image \"quay.io/team/sidecar:1\" not checked: could not ask the mirror for \"{down}/quay/team/sidecar:1\" (error sending request for url (http://{down}/v2/quay/team/sidecar/manifests/1): Connection refused (os error 111))"
    );
    assert!(
        message.starts_with(&head) && message.ends_with(&also),
        "{message}"
    );

    let dir = tempdir("fill-mixed");
    let reports = write(
        &dir,
        "reports.json",
        &list(vec![report("Report", 7, vec![result(POLICY, &response)])]),
    );
    let (ok, printed) = fill(&[&reports], &["--list"]);
    assert!(ok, "{printed}");
    assert_eq!(
        printed.trim(),
        format!("{}/web:4 {}/hub/web:4", source.host, mirror.host),
        "one copy, the finding's"
    );
}
