//! Keeping the mirror full, with real parts: the check role's findings for running Pods (the
//! built module, real registries), written into reports in the exact shape Kubewarden's audit
//! scanner writes them (kubewarden-controller `internal/audit-scanner/report/openreports.go`
//! and `policyreports.go`: one report per Pod, `.results[]` with `source`, `policy`
//! (`clusterwide-<name>` before Kubewarden 1.37.2, `kw.cap.<name>` from it on), `result`,
//! `message`, ...), and the shipped `scripts/fill-mirror.sh` run on them with Debian's `skopeo`
//! and `jq`.

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
            "policy-name": policy.trim_start_matches("clusterwide-").trim_start_matches("kw.cap."),
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
    let (code, text) = fill_code(reports, extra);
    (code == Some(0), text)
}

/// The same, with the exit code itself.
fn fill_code(reports: &[&Path], extra: &[&str]) -> (Option<i32>, String) {
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
    (output.status.code(), text)
}

/// `--settings FILE` with `settings` written in `dir`: the routing every copy is checked against.
fn with_settings(dir: &Path, settings: &Value) -> [String; 2] {
    let path = write(dir, "settings.json", settings);
    [
        "--settings".to_string(),
        path.to_string_lossy().into_owned(),
    ]
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
    let [flag, settings] = with_settings(&dir, &cluster.settings("swap"));
    let routed = [flag.as_str(), settings.as_str()];
    let fill = |reports: &[&Path], extra: &[&str]| fill(reports, &[&routed[..], extra].concat());

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
    assert!(ok, "a source gone for good does not fail the job: {text}");
    assert!(
        text.ends_with("fill-mirror: 2 copied, 0 failed, 0 skipped, 1 gone, 0 refused\n"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "gone docker://{}: its registry has no such image",
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
    let (ok, again) = fill(&reports, &[]);
    assert!(
        ok && again.ends_with("fill-mirror: 0 copied, 0 failed, 2 skipped, 1 gone, 0 refused\n"),
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
    let [flag, settings] = with_settings(&dir, &cluster.settings("swap"));
    let (ok, listed) = fill(&[&reports], &["--list", &flag, &settings]);
    assert!(ok, "{listed}");
    let copies = dir.join("copies.txt");
    std::fs::write(&copies, &listed).expect("copies");
    let (ok, text) = fill(&[], &["--copies", copies.to_str().expect("path")]);
    assert!(
        ok && text.ends_with("fill-mirror: 1 copied, 0 failed, 0 skipped, 0 gone, 0 refused\n"),
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
    let [flag, settings] = with_settings(&dir, &settings);
    let (ok, printed) = fill(&[&reports], &["--list", &flag, &settings]);
    assert!(ok, "{printed}");
    assert_eq!(
        printed.trim(),
        format!("{}/web:4 {}/hub/web:4", source.host, mirror.host),
        "one copy, the finding's"
    );
}

/// A Pod as `kubectl get pods -o json` lists it, from the policy's answer to its admission.
fn listed_pod(n: usize, admitted: &Response, request: &Value) -> Value {
    let mut pod = admitted
        .mutated
        .clone()
        .unwrap_or_else(|| request["object"].clone());
    pod["metadata"]["name"] = json!(format!("web-{n}"));
    pod["metadata"]["namespace"] = json!("default");
    pod
}

/// Time to mirror from the Pods' records: three Pods admitted while the mirror lacks `web:5` and
/// `api:1` carry the swapping role's record; a scan reported `api:1` too. One fill-job run over
/// the Pods and the reports together copies each image once; a record the policy did not write
/// (a Pod in a namespace the policy does not cover, naming a tag the mirror lacks) is refused,
/// and an existing tag is never copied over. The next admission of `web:5` is swapped.
#[test]
fn the_fill_job_copies_what_the_pods_records_name_once_and_refuses_a_record_not_the_policys() {
    let cluster = Cluster::start("fill-pods");
    let (source, mirror) = (&cluster.source, &cluster.mirror);
    let web_digest = Image::new("web 5", "linux/amd64").push(source, "web", Some("5"));
    let api = Image::new("api 1", "linux/amd64").push(source, "api", Some("1"));
    let db_mirror = Image::new("db 2 as mirrored", "linux/amd64").push(mirror, "hub/db", Some("2"));
    Image::new("db 2 moved on", "linux/amd64").push(source, "db", Some("2"));

    let started = std::time::Instant::now();
    let mut pods = Vec::new();
    for (n, image) in ["web:5", "web:5", "api:1"].into_iter().enumerate() {
        let request = pod_request("CREATE", web(&cluster.source_image(image)));
        let admitted = validate(
            &cluster.settings("swap"),
            &request,
            shared(LiveHost::default()),
        );
        assert!(admitted.images_unchanged(&request), "{admitted:?}");
        assert!(admitted.unmirrored().is_some(), "{admitted:?}");
        pods.push(listed_pod(n, &admitted, &request));
    }
    let forged_copy = format!(
        "skopeo copy --all --preserve-digests docker://{}/web:5 docker://{}/hub/nginx:9",
        source.host, mirror.host
    );
    pods.push(json!({
        "metadata": {"name": "forged", "namespace": "unwatched",
            "labels": {"image-swapper.kubewarden.io/unmirrored": "true"},
            "annotations": {"image-swapper.kubewarden.io/unmirrored-images":
                json!({"web": {"source": cluster.source_image("web:5"), "copy": forged_copy}}).to_string()}},
        "spec": {"containers": [{"name": "web", "image": cluster.source_image("web:5")}]},
    }));
    let scanned = cluster.check(9, &web(&cluster.source_image("api:1")), &json!({}));
    assert_eq!(
        (scanned.accepted, scanned.code),
        (false, None),
        "{scanned:?}"
    );

    let dir = tempdir("fill-pods");
    let pods_file = write(&dir, "pods.json", &list(pods));
    let reports = write(
        &dir,
        "reports.json",
        &list(vec![report("Report", 9, vec![result(POLICY, &scanned)])]),
    );
    let settings = write(&dir, "settings.json", &cluster.settings("swap"));
    let settings_arg = settings.to_str().unwrap_or_default().to_string();
    let pods_arg = pods_file.to_str().unwrap_or_default().to_string();
    let job = std::time::Instant::now();
    let (ok, printed) = fill(
        &[&reports],
        &["--pods", &pods_arg, "--settings", &settings_arg],
    );
    let job = job.elapsed();
    assert!(ok, "{printed}");
    assert!(
        printed.contains("fill-mirror: 2 copied, 0 failed, 0 skipped, 0 gone, 1 refused\n"),
        "{printed}"
    );
    assert!(
        printed.contains(&format!(
            "fill-mirror: refused unwatched/forged container web: its record is not the policy's own ({forged_copy}), not run"
        )),
        "{printed}"
    );
    assert_eq!(
        mirror.digest_of("hub/web", "5").as_deref(),
        Some(web_digest.as_str())
    );
    assert_eq!(
        mirror.digest_of("hub/api", "1").as_deref(),
        Some(api.as_str())
    );
    assert_eq!(
        mirror.digest_of("hub/nginx", "9"),
        None,
        "the forged copy was not made"
    );
    assert_eq!(
        mirror.digest_of("hub/db", "2").as_deref(),
        Some(db_mirror.as_str()),
        "no tag moved"
    );

    let request = pod_request("CREATE", web(&cluster.source_image("web:5")));
    let next = validate(
        &cluster.settings("swap"),
        &request,
        shared(LiveHost::default()),
    );
    assert_eq!(
        next.image("containers", 0),
        Some(format!("{}/hub/web:5@{web_digest}", mirror.host).as_str()),
        "{next:?}"
    );
    eprintln!(
        "time to mirror, on loopback: first admission to swapped admission {:?}, of it the fill job's run {job:?}",
        started.elapsed()
    );
}

/// ECR: the mirror refuses a push to a repository that does not exist, and the job has no push
/// Secret. With `--ecr` the job logs in with `aws ecr get-login-password` (moto's token, which
/// the registry front requires) and creates the repository with the operator's arguments, then
/// copies; without it, the copy fails with ECR's own words.
#[test]
fn on_ecr_the_fill_job_creates_the_repository_and_logs_in_by_itself() {
    use rig::ecr::{EcrRegistry, Moto};
    let source = TestRegistry::start("ecr-source").expect("registry");
    let storage = TestRegistry::start("ecr-storage").expect("registry");
    let moto = Moto::start().expect("moto");
    let ecr = EcrRegistry::start(&storage, &moto).expect("ECR front");
    let digest = Image::new("app 1 for ecr", "linux/amd64").push(&source, "team/app", Some("1"));
    let settings =
        json!({"mirrors": [{"source": source.host, "target": format!("{}/cache", ecr.host)}]});
    let dir = tempdir("fill-ecr");
    // policy-server's imagePullSecret for the ECR registry, as the credentials CronJob renews it.
    let docker = dir.join("policy-server");
    std::fs::create_dir_all(&docker).expect("dir");
    let auth = rig::registry::basic_auth("AWS", &EcrRegistry::password());
    let auth = auth.trim_start_matches("Basic ");
    std::fs::write(
        docker.join("config.json"),
        json!({"auths": {ecr.host.clone(): {"auth": auth}}}).to_string(),
    )
    .expect("config");
    let admit = || {
        let request = pod_request("CREATE", web(&format!("{}/team/app:1", source.host)));
        let host = shared(LiveHost {
            docker_config: Some(docker.clone()),
            ..LiveHost::default()
        });
        (validate(&settings, &request, host), request)
    };
    let (kept, request) = admit();
    assert!(kept.unmirrored().is_some(), "{kept:?}");
    let pods = write(
        &dir,
        "pods.json",
        &list(vec![listed_pod(1, &kept, &request)]),
    );
    let settings_file = write(&dir, "settings.json", &settings);
    let run = |extra: &[&str]| {
        let mut command = Command::new(rig::root().join("scripts/fill-mirror.sh"));
        command
            .args(["--insecure", "--pods"])
            .arg(&pods)
            .arg("--settings")
            .arg(&settings_file)
            .args(extra)
            .env("REGISTRY_AUTH_FILE", dir.join("push-auth.json"))
            .env(
                "ECR_CREATE_REPOSITORY_ARGS",
                "--image-tag-mutability IMMUTABLE",
            );
        for (name, value) in moto.environment() {
            command.env(name, value);
        }
        let output = command.output().expect("fill-mirror.sh runs");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.success(), text)
    };

    // With push credentials from a Secret and no --ecr: ECR refuses the push, in its words.
    let auth_file = dir.join("push-auth.json");
    let login = Command::new("skopeo")
        .args([
            "login",
            "--tls-verify=false",
            "--username",
            "AWS",
            "--password",
        ])
        .arg(EcrRegistry::password())
        .arg(&ecr.host)
        .env("REGISTRY_AUTH_FILE", &auth_file)
        .output()
        .expect("skopeo login");
    assert!(login.status.success(), "{login:?}");
    let (ok, printed) = run(&[]);
    assert!(!ok, "{printed}");
    assert!(
        printed.contains("fill-mirror: 0 copied, 1 failed")
            && printed.contains("The repository with name 'cache/team/app' does not exist in the registry with id '123456789012'"),
        "{printed}"
    );
    assert_eq!(moto.repository("cache/team/app"), None);

    // With --ecr and no credentials at all: the job logs in and creates the repository.
    std::fs::remove_file(&auth_file).expect("no push credentials");

    let (ok, printed) = run(&["--ecr"]);
    assert!(ok, "{printed}");
    assert!(
        printed.contains("created ECR repository cache/team/app")
            && printed.contains("fill-mirror: 1 copied, 0 failed, 0 skipped"),
        "{printed}"
    );
    let repository = moto.repository("cache/team/app").expect("created");
    assert_eq!(
        repository["imageTagMutability"],
        json!("IMMUTABLE"),
        "{repository}"
    );
    assert_eq!(
        storage.digest_of("cache/team/app", "1").as_deref(),
        Some(digest.as_str())
    );

    let (swapped, _) = admit();
    assert_eq!(
        swapped.image("containers", 0),
        Some(format!("{}/cache/team/app:1@{digest}", ecr.host).as_str()),
        "{swapped:?}"
    );
}

/// The documented ECR CronJob, container by container, each with only what its public image
/// has: `--list` (kubectl and jq), `--ecr-prepare` (the AWS CLI and bash, no skopeo: it creates
/// the repository and writes the push login), `--copies` (skopeo, with that login and no AWS).
#[test]
fn the_ecr_cronjobs_three_steps_fill_a_new_repository() {
    use rig::ecr::{EcrRegistry, Moto};
    let source = TestRegistry::start("ecr3-source").expect("registry");
    let storage = TestRegistry::start("ecr3-storage").expect("registry");
    let moto = Moto::start().expect("moto");
    let ecr = EcrRegistry::start(&storage, &moto).expect("ECR front");
    let digest = Image::new("api 3 for ecr", "linux/amd64").push(&source, "team/api", Some("3"));
    let dir = tempdir("fill-ecr3");
    let settings =
        json!({"mirrors": [{"source": source.host, "target": format!("{}/cache", ecr.host)}]});
    let record = json!({"api": {"source": format!("{}/team/api:3", source.host),
        "copy": format!("skopeo copy --all --preserve-digests docker://{0}/team/api:3 docker://{1}/cache/team/api:3", source.host, ecr.host)}});
    let pods = write(
        &dir,
        "pods.json",
        &list(vec![json!({
            "metadata": {"name": "api-0", "namespace": "default",
                "labels": {"image-swapper.kubewarden.io/unmirrored": "true"},
                "annotations": {"image-swapper.kubewarden.io/unmirrored-images": record.to_string()}},
            "spec": {"containers": [{"name": "api", "image": format!("{}/team/api:3", source.host)}]},
        })]),
    );
    let settings_file = write(&dir, "settings.json", &settings);
    let script = rig::root().join("scripts/fill-mirror.sh");
    let copies = dir.join("copies");
    let listed = Command::new(&script)
        .args(["--list", "--pods"])
        .arg(&pods)
        .arg("--settings")
        .arg(&settings_file)
        .output()
        .expect("--list");
    assert!(listed.status.success(), "{listed:?}");
    std::fs::write(&copies, &listed.stdout).expect("copies");

    let tools = aws_cli_image(&dir);
    let auth_file = dir.join("auth.json");
    let mut prepare = Command::new(tools.join("bash"));
    prepare
        .arg(&script)
        .args(["--ecr-prepare", "--copies"])
        .arg(&copies)
        .env("PATH", &tools)
        .env("REGISTRY_AUTH_FILE", &auth_file);
    for (name, value) in moto.environment() {
        prepare.env(name, value);
    }
    let prepared = prepare.output().expect("--ecr-prepare");
    let printed = String::from_utf8_lossy(&prepared.stdout).to_string()
        + &String::from_utf8_lossy(&prepared.stderr);
    assert!(prepared.status.success(), "{printed}");
    assert!(
        printed.contains("created ECR repository cache/team/api")
            && printed.contains("fill-mirror: ECR prepared for 1 copies, 0 failed"),
        "{printed}"
    );

    // skopeo's container: the login from the shared file, no AWS credentials.
    let copied = Command::new(&script)
        .args(["--insecure", "--copies"])
        .arg(&copies)
        .env("REGISTRY_AUTH_FILE", &auth_file)
        .output()
        .expect("--copies");
    let printed = String::from_utf8_lossy(&copied.stdout).to_string()
        + &String::from_utf8_lossy(&copied.stderr);
    assert!(copied.status.success(), "{printed}");
    assert!(
        printed.contains("fill-mirror: 1 copied, 0 failed, 0 skipped"),
        "{printed}"
    );
    assert_eq!(
        storage.digest_of("cache/team/api", "3").as_deref(),
        Some(digest.as_str())
    );
}

/// The AWS CLI's container, as a PATH: bash, coreutils and aws; no skopeo, no jq.
fn aws_cli_image(dir: &Path) -> PathBuf {
    let tools = dir.join("aws-cli-image");
    std::fs::create_dir_all(&tools).expect("dir");
    for tool in [
        "bash", "aws", "sort", "base64", "grep", "tail", "env", "mktemp", "mv",
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

/// A Pod kept at its signed source image because the mirror's copy lacks the signature: the
/// check role (with the same `signatures`) reports it with the copy that brings the signature,
/// one fill-job run from that report copies it, and the next admission is swapped at the
/// verified digest, through a verification the rig makes for real.
#[test]
fn the_check_role_reports_a_missing_signature_and_one_fill_run_brings_it() {
    use rig::cosign::{Signer, signature_tag};
    let cluster = Cluster::start("fill-sig");
    let (source, mirror) = (&cluster.source, &cluster.mirror);
    let signer = Signer::generate();
    let image = Image::new("app 1", "linux/amd64");
    let digest = image.push(source, "org/app", Some("1"));
    signer.sign(source, "org/app", &digest, &[]);
    image.push(mirror, "hub/org/app", Some("1"));
    let signatures =
        json!([{"image": format!("{}/org/*", source.host), "pubKeys": [signer.public_pem]}]);
    // Verified at the mirror (`verifySource: false`), where the copy needs its signature.
    let mut check = cluster.settings("check");
    check["signatures"] = signatures.clone();
    check["verifySource"] = json!(false);
    let mut swap = cluster.settings("swap");
    swap["signatures"] = signatures;
    swap["verifySource"] = json!(false);
    let running = cluster.source_image("org/app:1");

    let request = pod_request("CREATE", web(&running));
    let kept = validate(&swap, &request, shared(LiveHost::default()));
    assert_eq!(
        kept.image("containers", 0),
        Some(running.as_str()),
        "kept at its source: {kept:?}"
    );
    let tag = signature_tag(&digest);
    let signature_line = format!(
        "{}/org/app:{tag} {}/hub/org/app:{tag}",
        source.host, mirror.host
    );
    // The Pod's record names the signature copy too, which the fill job reads from Pods.
    let dir = tempdir("fill-sig");
    let pods = write(
        &dir,
        "pods.json",
        &list(vec![listed_pod(1, &kept, &request)]),
    );
    let settings_file = write(&dir, "settings.json", &swap);
    let (ok, printed) = fill(
        &[],
        &[
            "--list",
            "--pods",
            &pods.to_string_lossy(),
            "--settings",
            &settings_file.to_string_lossy(),
        ],
    );
    assert!(
        ok && printed.lines().any(|l| l == signature_line),
        "{printed}"
    );

    let response = validate(
        &check,
        &audit_request(3, web(&running), json!({})),
        shared(LiveHost::default()),
    );
    let message = response.message.clone().unwrap_or_default();
    let copy = format!(
        "skopeo copy --all --preserve-digests docker://{}/org/app:{tag} docker://{}/hub/org/app:{tag}",
        source.host, mirror.host
    );
    assert!(!response.accepted, "a finding: {response:?}");
    assert!(
        message.contains("is in the mirror without a signature that verifies")
            && message.contains(&copy),
        "{message}"
    );

    let reports = write(
        &dir,
        "reports.json",
        &list(vec![report("Report", 3, vec![result(POLICY, &response)])]),
    );
    let (ok, printed) = fill(
        &[&reports],
        &["--settings", &settings_file.to_string_lossy()],
    );
    assert!(ok, "{printed}");
    assert!(
        mirror.digest_of("hub/org/app", &tag).is_some(),
        "the signature is in the mirror: {printed}"
    );

    let swapped = validate(
        &swap,
        &pod_request("CREATE", web(&running)),
        shared(LiveHost::default()),
    );
    assert_eq!(
        swapped.image("containers", 0),
        Some(format!("{}/hub/org/app:1@{digest}", mirror.host).as_str()),
        "{swapped:?}"
    );
    let after = validate(
        &check,
        &audit_request(3, web(&running), json!({})),
        shared(LiveHost::default()),
    );
    assert!(after.accepted, "{after:?}");
}

/// A signed image the mirror lacks entirely, by tag: its Pod's record names the image copy only
/// (the digest is not known at admission). One `fill-mirror.sh --signatures` run from the Pod
/// copies the image and then its signature (the tag of the digest the mirror now serves), and
/// the next admission is swapped at the verified digest. Without `--signatures` the image
/// arrives alone, and the Pod stays unswapped.
#[test]
fn with_signatures_one_fill_run_brings_a_new_image_and_its_signature() {
    use rig::cosign::{Signer, signature_tag};
    let cluster = Cluster::start("fill-sig-new");
    let (source, mirror) = (&cluster.source, &cluster.mirror);
    let signer = Signer::generate();
    let digest = Image::new("app 2", "linux/amd64").push(source, "org/app", Some("2"));
    signer.sign(source, "org/app", &digest, &[]);
    let mut swap = cluster.settings("swap");
    swap["signatures"] =
        json!([{"image": format!("{}/org/*", source.host), "pubKeys": [signer.public_pem]}]);
    // Verified at the mirror (`verifySource: false`), where the copy needs its signature.
    swap["verifySource"] = json!(false);
    let running = cluster.source_image("org/app:2");
    let request = pod_request("CREATE", web(&running));
    let kept = validate(&swap, &request, shared(LiveHost::default()));
    let record = kept.unmirrored().expect("recorded");
    assert!(record["web"].get("signatureCopy").is_none(), "{record}");

    let dir = tempdir("fill-sig-new");
    let pods = write(
        &dir,
        "pods.json",
        &list(vec![listed_pod(1, &kept, &request)]),
    );
    let settings_file = write(&dir, "settings.json", &swap);
    let (pods, settings_file) = (pods.to_string_lossy(), settings_file.to_string_lossy());
    let from_pods = ["--pods", &*pods, "--settings", &*settings_file];
    let (ok, printed) = fill(&[], &from_pods);
    assert!(ok, "{printed}");
    let tag = signature_tag(&digest);
    assert!(mirror.digest_of("hub/org/app", "2").is_some(), "{printed}");
    assert!(
        mirror.digest_of("hub/org/app", &tag).is_none(),
        "no signature without --signatures"
    );
    let still = validate(&swap, &request, shared(LiveHost::default()));
    assert_eq!(still.image("containers", 0), Some(running.as_str()));

    let mut with_signatures = from_pods.to_vec();
    with_signatures.push("--signatures");
    let (ok, printed) = fill(&[], &with_signatures);
    assert!(ok, "{printed}");
    assert!(
        printed.contains(&format!(
            "skipped docker://{}/hub/org/app:2: it exists already",
            mirror.host
        )) && printed.contains(&format!(
            "copied docker://{}/org/app:{tag} to docker://{}/hub/org/app:{tag}",
            source.host, mirror.host
        )),
        "{printed}"
    );
    let swapped = validate(&swap, &request, shared(LiveHost::default()));
    assert_eq!(
        swapped.image("containers", 0),
        Some(format!("{}/hub/org/app:2@{digest}", mirror.host).as_str()),
        "{swapped:?}"
    );
}

/// A Pod as `kubectl get pods -o json` lists it, with the record's label and `annotations`.
fn recorded_pod(namespace: &str, name: &str, image: &str, annotations: Value) -> Value {
    json!({
        "metadata": {"name": name, "namespace": namespace,
            "labels": {"image-swapper.kubewarden.io/unmirrored": "true"},
            "annotations": annotations},
        "spec": {"containers": [{"name": "web", "image": image}]},
    })
}

const RECORD: &str = "image-swapper.kubewarden.io/unmirrored-images";

/// No record can stop the run. A static Pod's mirror (`kubernetes.io/config.mirror`, which the
/// swapper leaves alone) carries the label and the record `{"web":1}`; another Pod a record
/// whose copy is a list, naming a destination of its own; a third one that is not JSON. Each
/// is skipped with one line naming its Pod and why; a fourth, whose copy hides a line of the
/// work list after a new line, is refused on one line. None of their copies is made, and the
/// policy's own record beside them is copied in the same run, which exits 0 and counts them.
#[test]
fn a_record_that_is_not_well_formed_is_skipped_and_stops_nothing() {
    let cluster = Cluster::start("fill-forged-record");
    let (source, mirror) = (&cluster.source, &cluster.mirror);
    let digest = Image::new("web 7", "linux/amd64").push(source, "web", Some("7"));
    Image::new("api 7", "linux/amd64").push(source, "api", Some("7"));
    let request = pod_request("CREATE", web(&cluster.source_image("web:7")));
    let kept = validate(
        &cluster.settings("swap"),
        &request,
        shared(LiveHost::default()),
    );
    assert!(kept.unmirrored().is_some(), "{kept:?}");
    let api = cluster.source_image("api:7");
    let listed_copy = json!({"web": {"source": api, "copy": [format!(
        "skopeo copy --all --preserve-digests docker://{api} docker://{}/hub/nginx:7",
        mirror.host
    )]}});
    let injected = format!("x\n{api} {}/hub/nginx:7\n", mirror.host);
    let pods = vec![
        recorded_pod(
            "kube-system",
            "etcd-node-1",
            &api,
            json!({"kubernetes.io/config.mirror": "3f1c9a", RECORD: r#"{"web":1}"#}),
        ),
        recorded_pod(
            "team",
            "listed-copy",
            &api,
            json!({RECORD: listed_copy.to_string()}),
        ),
        recorded_pod("team", "not-json", &api, json!({RECORD: "{\"web\": {"})),
        // A copy that is a string, with a line of the work list inside it.
        recorded_pod(
            "team",
            "new-line",
            &api,
            json!({RECORD: json!({"web": {"source": api, "copy": injected}}).to_string()}),
        ),
        listed_pod(1, &kept, &request),
    ];
    let dir = tempdir("fill-forged-record");
    let pods = write(&dir, "pods.json", &list(pods));
    let [flag, settings] = with_settings(&dir, &cluster.settings("swap"));
    let (code, printed) = fill_code(&[], &["--pods", &pods.to_string_lossy(), &flag, &settings]);

    assert_eq!(
        mirror.digest_of("hub/web", "7").as_deref(),
        Some(digest.as_str()),
        "the policy's own record is copied in the same run: {printed}"
    );
    assert_eq!(mirror.digest_of("hub/nginx", "7"), None, "{printed}");
    assert_eq!(mirror.digest_of("hub/api", "7"), None, "{printed}");
    assert_eq!(code, Some(0), "{printed}");
    let listed_copy = shown(&listed_copy["web"]["copy"]);
    for (pod, why) in [
        (
            "kube-system/etcd-node-1",
            "its record is not well formed (container \"web\" is a number (1), not an object with source and copy)".to_string(),
        ),
        (
            "team/listed-copy",
            format!("its record is not well formed (container \"web\": copy is an array ({listed_copy}), not a string)"),
        ),
        (
            "team/not-json",
            "its record is not a JSON object (\"{\\\"web\\\": {\")".to_string(),
        ),
    ] {
        let lines: Vec<&str> = printed.lines().filter(|l| l.contains(pod)).collect();
        assert_eq!(
            lines,
            [format!("fill-mirror: skipped {pod}: {why}, none of it run")],
            "one line for {pod}: {printed}"
        );
    }
    assert!(
        printed.contains(&format!(
            "fill-mirror: refused team/new-line container web: its record is not the policy's own ({}), not run\n",
            injected.replace('\n', "?")
        )),
        "{printed}"
    );
    assert!(
        printed.contains("fill-mirror: 1 copied, 0 failed, 0 skipped, 0 gone, 4 refused"),
        "{printed}"
    );

    // The CronJob's list step, which the copying step cannot see into: its log counts them.
    let pods = pods.to_string_lossy();
    let (code, listed) = fill_code(&[], &["--list", "--pods", &pods, &flag, &settings]);
    assert_eq!(code, Some(0), "{listed}");
    assert!(
        listed.starts_with(&format!(
            "{} {}/hub/web:7\n",
            cluster.source_image("web:7"),
            mirror.host
        )) && listed.ends_with("fill-mirror: listed 1 copies, 4 refused\n"),
        "{listed}"
    );
}

/// No report can steer a copy. Anyone who can write a Report could write a `fail` result of the
/// check whose message holds `skopeo copy` lines: to a repository the settings do not route the
/// source to, by digest to a tag that is not the digest's own, from a source no rule routes, and
/// from an image `exclude` keeps out. Each is refused with one line naming the report and why,
/// and none is made; a report whose results are not a list and a result whose message is not a
/// string are skipped so; the check's real finding beside them is copied in the same run.
#[test]
fn a_report_copy_passes_the_checks_a_pod_record_does() {
    let cluster = Cluster::start("fill-forged-report");
    let (source, mirror) = (&cluster.source, &cluster.mirror);
    let web_digest = Image::new("web 8", "linux/amd64").push(source, "web", Some("8"));
    let api = Image::new("api 8", "linux/amd64").push(source, "api", Some("8"));
    Image::new("private 1", "linux/amd64").push(source, "private/app", Some("1"));
    let mut settings = cluster.settings("swap");
    settings["exclude"] = json!([format!("{}/private/*", source.host)]);
    let finding = cluster.check(1, &web(&cluster.source_image("web:8")), &json!({}));
    assert_eq!(
        (finding.accepted, finding.code),
        (false, None),
        "{finding:?}"
    );

    let (s, m) = (&source.host, &mirror.host);
    let copy = |from: &str, to: &str| {
        format!("skopeo copy --all --preserve-digests docker://{s}/{from} docker://{m}/{to}")
    };
    let forged_copies = [
        (
            copy("api:8", "hub/nginx:8"),
            format!("the settings route {s}/api to {m}/hub/api, not {m}/hub/nginx"),
        ),
        (
            copy(&format!("api@{api}"), "hub/api:8"),
            format!(
                "a copy by digest goes to the digest's own tag {}, not 8",
                api.replacen(':', "-", 1)
            ),
        ),
        (
            copy("private/app:1", "hub/private/app:1"),
            format!("{s}/private/app:1 is excluded by {s}/private/*"),
        ),
    ];
    let unrouted = format!(
        "skopeo copy --all --preserve-digests docker://quay.io/team/app:1 docker://{m}/hub/app:1"
    );
    let message = format!(
        "a source image the Pod runs is not in the mirror: {}; {}",
        forged_copies
            .iter()
            .map(|(c, _)| format!("fill the mirror ({c})"))
            .collect::<Vec<_>>()
            .join("; "),
        unrouted
    );
    let message_object = json!({"copy": copy("api:8", "hub/api:8")});
    let mut forged = report(
        "Report",
        2,
        vec![
            json!({"source": "kubewarden", "policy": POLICY, "result": "fail", "message": message}),
            json!({"policy": POLICY, "result": "fail", "message": message_object}),
        ],
    );
    forged["metadata"]["name"] = json!("forged");
    forged["metadata"]["namespace"] = json!("team");
    let mut not_a_list = report("PolicyReport", 3, vec![]);
    not_a_list["metadata"]["name"] = json!("not-a-list");
    not_a_list["results"] = json!(copy("api:8", "hub/api:8"));

    let dir = tempdir("fill-forged-report");
    let reports = write(
        &dir,
        "reports.json",
        &list(vec![
            forged,
            not_a_list.clone(),
            report("Report", 1, vec![result(POLICY, &finding)]),
        ]),
    );
    let [flag, settings] = with_settings(&dir, &settings);
    let (code, printed) = fill_code(&[&reports], &[&flag, &settings]);

    for (repository, tag) in [
        ("hub/nginx", "8"),
        ("hub/api", "8"),
        ("hub/private/app", "1"),
    ] {
        assert_eq!(
            mirror.digest_of(repository, tag),
            None,
            "a forged copy was made, to {repository}:{tag}: {printed}"
        );
    }
    assert_eq!(
        mirror.digest_of("hub/web", "8").as_deref(),
        Some(web_digest.as_str()),
        "the real finding is copied in the same run: {printed}"
    );
    assert_eq!(code, Some(0), "{printed}");
    let head = format!("fill-mirror: refused Report team/forged results[0] of {POLICY}: its copy");
    for (line, why) in forged_copies.iter().chain([&(
        unrouted.clone(),
        "no rule of the settings routes quay.io/team/app".to_string(),
    )]) {
        let docker = line.trim_start_matches("skopeo copy --all --preserve-digests ");
        assert!(
            printed.contains(&format!(
                "{head} {docker} is not the policy's own: {why}, not run\n"
            )),
            "{why}: {printed}"
        );
    }
    assert!(
        printed.contains(&format!("fill-mirror: skipped Report team/forged: results[1] of {POLICY}: message is an object ({}), not a string, not read\n", shown(&message_object)))
            && printed.contains(&format!("fill-mirror: skipped PolicyReport default/not-a-list: its results are a string ({}), not a list, not read\n", shown(&not_a_list["results"]))),
        "{printed}"
    );
    assert!(
        printed.contains("fill-mirror: 1 copied, 0 failed, 0 skipped, 0 gone, 6 refused"),
        "{printed}"
    );
}

/// Kubewarden 1.37.2 renamed every policy's unique id, the `policy` of its audit results:
/// `clusterwide-image-swapper-check` before, `kw.cap.image-swapper-check` from it on (and during
/// the upgrade both, for a while). By default the fill job reads the check's results under
/// either; `--policy` names the one to read.
#[test]
fn the_fill_job_reads_the_checks_results_under_either_id() {
    let cluster = Cluster::start("fill-ids");
    let (source, mirror) = (&cluster.source, &cluster.mirror);
    let web_digest = Image::new("web 9", "linux/amd64").push(source, "web", Some("9"));
    let api_digest = Image::new("api 9", "linux/amd64").push(source, "api", Some("9"));
    let web_finding = cluster.check(1, &web(&cluster.source_image("web:9")), &json!({}));
    let api_finding = cluster.check(2, &web(&cluster.source_image("api:9")), &json!({}));
    let (new_id, old_id) = (
        "kw.cap.image-swapper-check",
        "clusterwide-image-swapper-check",
    );
    let dir = tempdir("fill-ids");
    let reports = write(
        &dir,
        "reports.json",
        &list(vec![
            report("Report", 1, vec![result(new_id, &web_finding)]),
            report("Report", 2, vec![result(old_id, &api_finding)]),
        ]),
    );
    let [flag, settings] = with_settings(&dir, &cluster.settings("swap"));
    let web_line = format!("{}/web:9 {}/hub/web:9", source.host, mirror.host);
    let api_line = format!("{}/api:9 {}/hub/api:9", source.host, mirror.host);
    for (ids, expected) in [
        (vec![], vec![&web_line, &api_line]),
        (vec!["--policy", new_id], vec![&web_line]),
        (vec!["--policy", old_id], vec![&api_line]),
    ] {
        let args = [&["--list", flag.as_str(), settings.as_str()][..], &ids[..]].concat();
        let (ok, listed) = fill(&[&reports], &args);
        assert!(ok, "{listed}");
        assert_eq!(listed.lines().collect::<Vec<_>>(), expected, "{ids:?}");
    }

    let (ok, printed) = fill(&[&reports], &[&flag, &settings]);
    assert!(ok, "{printed}");
    assert_eq!(
        mirror.digest_of("hub/web", "9").as_deref(),
        Some(web_digest.as_str())
    );
    assert_eq!(
        mirror.digest_of("hub/api", "9").as_deref(),
        Some(api_digest.as_str())
    );
}

/// The exit status lets an alert on failed Jobs clear. 0 when every copy was made or is there
/// already; 0 too when a source is gone for good (its registry answers that it has no such
/// manifest, or no such repository): one line names each, at every run, and the summary counts
/// them. 1 when a copy failed in a way a later run may not meet (here the source registry
/// refuses connections). 2 when the job cannot run (reports without the settings to check them).
#[test]
fn the_exit_status_is_0_when_copied_or_gone_for_good_and_1_when_a_copy_failed() {
    let cluster = Cluster::start("fill-status");
    let (source, mirror) = (&cluster.source, &cluster.mirror);
    let digest = Image::new("ok 1", "linux/amd64").push(source, "ok", Some("1"));
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let down = closed.local_addr().expect("address").to_string();
    drop(closed);
    let (s, m) = (&source.host, &mirror.host);
    let dir = tempdir("fill-status");
    let run = |lines: &[String]| {
        let copies = write_text(&dir, "copies.txt", &lines.join("\n"));
        fill_code(&[], &["--copies", &copies.to_string_lossy()])
    };
    let good = format!("{s}/ok:1 {m}/hub/ok:1");
    let no_tag = format!("{s}/ok:404 {m}/hub/ok:404");
    let no_repository = format!("{s}/never/pushed:1 {m}/hub/never/pushed:1");

    let (code, printed) = run(std::slice::from_ref(&good));
    assert_eq!(code, Some(0), "{printed}");
    assert!(
        printed.ends_with("fill-mirror: 1 copied, 0 failed, 0 skipped, 0 gone, 0 refused\n"),
        "{printed}"
    );
    assert_eq!(
        mirror.digest_of("hub/ok", "1").as_deref(),
        Some(digest.as_str())
    );

    for _ in 0..2 {
        let (code, printed) = run(&[good.clone(), no_tag.clone(), no_repository.clone()]);
        assert_eq!(
            code,
            Some(0),
            "gone for good does not fail the Job: {printed}"
        );
        for gone in [format!("{s}/ok:404"), format!("{s}/never/pushed:1")] {
            let lines = printed
                .lines()
                .filter(|l| {
                    l.starts_with(&format!(
                        "gone docker://{gone}: its registry has no such image"
                    ))
                })
                .count();
            assert_eq!(lines, 1, "one line names {gone}: {printed}");
        }
        assert!(
            printed.ends_with("fill-mirror: 0 copied, 0 failed, 1 skipped, 2 gone, 0 refused\n"),
            "{printed}"
        );
    }

    let (code, printed) = run(&[no_tag, format!("{down}/app:1 {m}/hub/app:1")]);
    assert_eq!(code, Some(1), "{printed}");
    assert!(
        printed.contains(&format!(
            "failed docker://{down}/app:1 to docker://{m}/hub/app:1: "
        )) && printed.ends_with("fill-mirror: 0 copied, 1 failed, 0 skipped, 1 gone, 0 refused\n"),
        "{printed}"
    );

    let reports = write(&dir, "reports.json", &list(vec![]));
    let (code, printed) = fill_code(&[&reports], &[]);
    assert_eq!(code, Some(2), "{printed}");
    assert!(
        printed.contains("--reports and --pods need --settings"),
        "{printed}"
    );
}

/// A value as the fill job's notes quote it: its JSON, cut at 80 characters.
fn shown(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 80 {
        format!("{}...", text.chars().take(80).collect::<String>())
    } else {
        text
    }
}

fn write_text(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

/// Two ECR registries and a private source, as the ECR CronJob's AWS CLI container prepares
/// them (bash, coreutils and aws: no skopeo, no jq). `--ecr-prepare` merges one login per ECR
/// host and the sources' credentials (`--source-auth`, a docker config as a Secret mounts it)
/// into the auth file, keeping the entries it held, and the copying step fills both registries
/// from the private source with that file alone. A repository it cannot create does not stop
/// it (exit 0): the copy into it fails, in ECR's words, and fails the run.
#[test]
fn ecr_prepare_merges_one_login_per_host_and_the_sources_credentials() {
    use rig::ecr::{EcrRegistry, Moto};
    let source = TestRegistry::start_with_basic_auth("ecr-merge-source", "puller", "pull-token")
        .expect("registry");
    let storage = TestRegistry::start("ecr-merge-storage").expect("registry");
    let moto = Moto::start().expect("moto");
    let (first, second) = (
        EcrRegistry::start(&storage, &moto).expect("ECR front"),
        EcrRegistry::start(&storage, &moto).expect("ECR front"),
    );
    let a = Image::new("a 1 for ecr", "linux/amd64").push(&source, "team/a", Some("1"));
    let b = Image::new("b 1 for ecr", "linux/amd64").push(&source, "other/b", Some("1"));
    let dir = tempdir("fill-ecr-merge");
    let copies = write_text(
        &dir,
        "copies.txt",
        &format!(
            "{0}/team/a:1 {1}/cache/team/a:1\n{0}/other/b:1 {2}/cache2/other/b:1\n",
            source.host, first.host, second.host
        ),
    );
    let basic = |user: &str, password: &str| {
        rig::registry::basic_auth(user, password)
            .trim_start_matches("Basic ")
            .to_string()
    };
    // The sources' credentials as `kubectl create secret docker-registry` writes them, and an
    // entry the auth file already holds.
    let source_config = write(
        &dir,
        "source-config.json",
        &json!({"auths": {source.host.clone(): {"username": "puller", "password": "pull-token",
            "auth": basic("puller", "pull-token")}}}),
    );
    let auth_file = write(
        &dir,
        "auth.json",
        &json!({"auths": {"quay.io": {"auth": basic("robot", "quay")}}}),
    );
    let tools = aws_cli_image(&dir);
    let script = rig::root().join("scripts/fill-mirror.sh");
    let prepare = |create_arguments: &str| {
        let mut command = Command::new(tools.join("bash"));
        command
            .arg(&script)
            .args(["--ecr-prepare", "--copies"])
            .arg(&copies)
            .arg("--source-auth")
            .arg(&source_config)
            .env("PATH", &tools)
            .env("REGISTRY_AUTH_FILE", &auth_file)
            .env("ECR_CREATE_REPOSITORY_ARGS", create_arguments);
        for (name, value) in moto.environment() {
            command.env(name, value);
        }
        let output = command.output().expect("--ecr-prepare");
        let text = String::from_utf8_lossy(&output.stdout).to_string()
            + &String::from_utf8_lossy(&output.stderr);
        (output.status.code(), text)
    };
    let copy = || {
        let output = Command::new(&script)
            .args(["--insecure", "--copies"])
            .arg(&copies)
            .env("REGISTRY_AUTH_FILE", &auth_file)
            .output()
            .expect("--copies");
        let text = String::from_utf8_lossy(&output.stdout).to_string()
            + &String::from_utf8_lossy(&output.stderr);
        (output.status.code(), text)
    };

    // Repositories that cannot be created: the step goes on, and the copies say what failed.
    let (code, printed) = prepare("--no-such-option");
    assert_eq!(code, Some(0), "{printed}");
    assert!(
        printed.contains("fill-mirror: aws ecr create-repository cache/team/a: ")
            && printed.contains("fill-mirror: aws ecr create-repository cache2/other/b: ")
            && printed.contains("fill-mirror: ECR prepared for 2 copies, 2 failed"),
        "{printed}"
    );
    let (code, printed) = copy();
    assert_eq!(code, Some(1), "{printed}");
    assert!(
        printed.contains(&format!(
            "failed docker://{}/team/a:1 to docker://{}/cache/team/a:1: ",
            source.host, first.host
        )) && printed.contains("The repository with name 'cache/team/a' does not exist")
            && printed.contains("fill-mirror: 0 copied, 2 failed, 0 skipped, 0 gone, 0 refused"),
        "{printed}"
    );

    let (code, printed) = prepare("--image-tag-mutability IMMUTABLE");
    assert_eq!(code, Some(0), "{printed}");
    assert!(
        printed.contains("created ECR repository cache/team/a")
            && printed.contains("created ECR repository cache2/other/b"),
        "{printed}"
    );
    let auths: Value =
        serde_json::from_str(&std::fs::read_to_string(&auth_file).expect("auth file"))
            .expect("the merged auth file is JSON");
    let mut hosts: Vec<&String> = auths["auths"].as_object().expect("auths").keys().collect();
    hosts.sort();
    let mut expected = vec![&first.host, &second.host, &source.host];
    let quay = "quay.io".to_string();
    expected.push(&quay);
    expected.sort();
    assert_eq!(hosts, expected, "one entry per host: {auths}");
    let ecr_login = basic("AWS", &EcrRegistry::password());
    assert_eq!(auths["auths"][&first.host]["auth"], json!(ecr_login));
    assert_eq!(auths["auths"][&second.host]["auth"], json!(ecr_login));
    assert_eq!(
        auths["auths"][&source.host]["auth"],
        json!(basic("puller", "pull-token"))
    );

    let (code, printed) = copy();
    assert_eq!(code, Some(0), "{printed}");
    assert!(
        printed.contains("fill-mirror: 2 copied, 0 failed, 0 skipped, 0 gone, 0 refused"),
        "{printed}"
    );
    assert_eq!(
        storage.digest_of("cache/team/a", "1").as_deref(),
        Some(a.as_str())
    );
    assert_eq!(
        storage.digest_of("cache2/other/b", "1").as_deref(),
        Some(b.as_str())
    );
}

/// A mirror that cannot be asked whether the destination exists (it answers 429, then 500, to
/// the manifest's check) is not read as lacking it: the tag exists there with other content,
/// and a copy would move it. The copy fails, in the registry's words, and is tried again by
/// the next run; the tag keeps its digest.
#[test]
fn a_destination_the_mirror_could_not_be_asked_about_is_not_copied_over() {
    let cluster = Cluster::start("fill-unasked");
    let (source, mirror) = (&cluster.source, &cluster.mirror);
    Image::new("app 1 moved", "linux/amd64").push(source, "app", Some("1"));
    let kept = Image::new("app 1 as mirrored", "linux/amd64").push(mirror, "hub/app", Some("1"));
    let dir = tempdir("fill-unasked");
    for (code, body) in [
        (
            429,
            r#"{"errors":[{"code":"TOOMANYREQUESTS","message":"slow down"}]}"#,
        ),
        (
            500,
            r#"{"errors":[{"code":"UNKNOWN","message":"internal error"}]}"#,
        ),
    ] {
        let (front, stop) =
            rig::front::relay("unasked mirror", &mirror.host, move |method, url| {
                (["GET", "HEAD"].contains(&method) && url.starts_with("/v2/hub/app/manifests/"))
                    .then(|| (code, body.to_string()))
            })
            .expect("relay");
        let destination = format!("{front}/hub/app:1");
        let copies = write_text(
            &dir,
            "copies.txt",
            &format!("{}/app:1 {destination}", source.host),
        );
        let (status, printed) = fill_code(&[], &["--copies", &copies.to_string_lossy()]);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(status, Some(1), "answered {code}: {printed}");
        assert!(
            printed.contains(&format!(
                "failed docker://{}/app:1 to docker://{destination}: could not tell whether docker://{destination} exists: ",
                source.host
            )) && printed.ends_with("fill-mirror: 0 copied, 1 failed, 0 skipped, 0 gone, 0 refused\n"),
            "answered {code}: {printed}"
        );
        assert_eq!(
            mirror.digest_of("hub/app", "1").as_deref(),
            Some(kept.as_str()),
            "answered {code}, the mirror's tag moved: {printed}"
        );
    }
}
