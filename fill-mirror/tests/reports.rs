//! `fill-mirror list` and `once` on the check role's reports (ported from the shell fill job's
//! tests, tests/fill_job.rs): reports in the shape Kubewarden's audit scanner writes them
//! (kubewarden-controller `internal/audit-scanner/report/openreports.go` and
//! `policyreports.go`: one report per Pod, `.results[]` with `policy` (`clusterwide-<name>`
//! before Kubewarden 1.37.2, `kw.cap.<name>` from it on), `result`, `message`), whose `fail`
//! messages carry the copies in the form the check role writes (`COPY_COMMAND`), against real
//! registries on loopback and skopeo. Only the check role's `fail` results are read, and each
//! copy passes the checks a Pod's record does before it runs.

mod rig;

use image_swapper_policy::plan::Copy;
use rig::check;
use rig::images::Image;
use rig::registry::TestRegistry;
use rig::{run, settings, text, write_json};
use serde_json::{Value, json};

const CHECK: &str = "clusterwide-image-swapper-check";

/// A copy in the form the check role writes it in a message.
fn command(source: &str, destination: &str) -> String {
    format!(
        "{} docker://{source} docker://{destination}",
        image_swapper_policy::plan::COPY_COMMAND
    )
}

fn web(image: &str) -> Value {
    json!({"containers": [{"name": "web", "image": image}]})
}

/// One result as the scanner writes it.
fn result(policy: &str, outcome: &str, message: &str) -> Value {
    json!({
        "source": "kubewarden", "policy": policy, "category": "Image", "severity": "info",
        "timestamp": {"seconds": 1_780_300_800, "nanos": 0}, "result": outcome,
        "scored": true, "resourceSelector": {}, "message": message,
        "properties": {"validating": "true", "policy-name": "image-swapper-check"},
    })
}

/// One report of a Pod: an `openreports.io` Report or a `wgpolicyk8s.io` PolicyReport.
fn report(kind: &str, pod: &str, results: Vec<Value>) -> Value {
    let api_version = match kind {
        "Report" => "openreports.io/v1alpha1",
        _ => "wgpolicyk8s.io/v1alpha2",
    };
    json!({
        "apiVersion": api_version, "kind": kind,
        "metadata": {"name": format!("uid-{pod}"), "namespace": "default",
                     "labels": {"app.kubernetes.io/managed-by": "kubewarden"}},
        "scope": {"apiVersion": "v1", "kind": "Pod", "namespace": "default", "name": pod},
        "results": results,
    })
}

fn list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

struct Setup {
    source: TestRegistry,
    mirror: TestRegistry,
    dir: tempfile::TempDir,
}

impl Setup {
    fn new(name: &str) -> Setup {
        Setup {
            source: TestRegistry::start(&format!("{name}-src")).expect("source registry"),
            mirror: TestRegistry::start(&format!("{name}-mirror")).expect("mirror registry"),
            dir: tempfile::tempdir().expect("a temporary folder"),
        }
    }

    fn write(&self, name: &str, value: &Value) -> String {
        let path = self.dir.path().join(name);
        write_json(&path, value);
        path.display().to_string()
    }

    fn settings(&self) -> String {
        self.write(
            "settings.json",
            &settings(&self.source.host, &self.mirror.host),
        )
    }

    fn src(&self, image: &str) -> String {
        format!("{}/{image}", self.source.host)
    }

    fn hub(&self, image: &str) -> String {
        format!("{}/hub/{image}", self.mirror.host)
    }

    /// `fill-mirror MODE --reports FILE... --settings S ARGS`.
    fn run(&self, mode: &str, reports: &[&str], args: &[&str]) -> std::process::Output {
        let settings = self.settings();
        let mut all = vec![mode, "--settings", &settings];
        if mode == "once" {
            all.push("--insecure");
        }
        for file in reports {
            all.extend(["--reports", file]);
        }
        all.extend(args);
        run(&all)
    }
}

/// The whole loop, with the check role's own findings (the policy crate's `admit` under
/// `action: check`, asking the loopback registries). Pod A was swapped to `app:1.0@OLD`; a sync
/// then moved the mirror's `app:1.0` to NEW and a "delete untagged" rule pruned OLD: its finding
/// asks for OLD under its own tag. Pods B and C run `web:2`, which the mirror never got; Pod D
/// runs `db:3`, which it has; Pod E runs `gone:1`, which the source lacks too. The reports also
/// hold another policy's `fail` and the check's `error`, both with a copy in their message,
/// which are not run.
#[test]
fn once_copies_what_the_reports_name_and_moves_no_tag() {
    let s = Setup::new("reports");
    let swap = settings(&s.source.host, &s.mirror.host);
    let mut check = swap.clone();
    check["action"] = json!("check");
    let old_image = Image::new("app 1.0 old", "linux/amd64");
    let old = old_image.push(&s.source, "app", Some("1.0"));
    old_image.push(&s.mirror, "hub/app", Some("1.0"));
    let pod_a = check::swapped(&swap, "a", web(&s.src("app:1.0")));
    assert_eq!(
        pod_a["spec"]["containers"][0]["image"],
        json!(format!("{}@{old}", s.hub("app:1.0"))),
        "swapped at admission"
    );
    let new_image = Image::new("app 1.0 new", "linux/amd64");
    let new = new_image.push(&s.source, "app", Some("1.0"));
    new_image.push(&s.mirror, "hub/app", Some("1.0"));
    s.mirror.delete_manifest("hub/app", &old).expect("prune");
    let web_digest = Image::new("web 2", "linux/amd64").push(&s.source, "web", Some("2"));
    let db = Image::new("db 3", "linux/amd64");
    db.push(&s.source, "db", Some("3"));
    let db = db.push(&s.mirror, "hub/db", Some("3"));
    let own_tag = old.replacen(':', "-", 1);

    let running = |name: &str, image: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"}, "spec": web(&s.src(image))})
    };
    let scan = || {
        [
            pod_a.clone(),
            running("b", "web:2"),
            running("c", "web:2"),
            running("d", "db:3"),
            running("e", "gone:1"),
        ]
        .map(|pod| check::scanned(&check, CHECK, &pod))
    };
    let first = scan();
    let outcomes: Vec<&Value> = first.iter().map(|r| &r["result"]).collect();
    assert_eq!(
        outcomes,
        ["fail", "fail", "fail", "pass", "fail"],
        "{first:#?}"
    );

    let other = result(
        "clusterwide-other",
        "fail",
        &command(&s.src("app:1.0"), &s.hub("db:3")),
    );
    let mut errored = first[1].clone();
    errored["result"] = json!("error");
    errored["message"] = json!(command(&s.src("app:1.0"), &s.hub("app:1.0")));
    let [a, b, c, d, e] = first;
    let openreports = s.write(
        "reports.json",
        &list(vec![
            report("Report", "a", vec![a, other]),
            report("Report", "b", vec![b]),
        ]),
    );
    let policyreports = s.write(
        "policyreports.json",
        &list(vec![
            report("PolicyReport", "c", vec![c, errored]),
            report("PolicyReport", "d", vec![d]),
        ]),
    );
    // One report alone, as `kubectl get policyreport NAME -o json` prints it.
    let single = s.write("single.json", &report("PolicyReport", "e", vec![e]));
    let reports = [
        openreports.as_str(),
        policyreports.as_str(),
        single.as_str(),
    ];

    let listed = s.run("list", &reports, &[]);
    assert_eq!(listed.status.code(), Some(0), "{}", text(&listed.stderr));
    let expected = [
        Copy {
            source: format!("{}@{old}", s.src("app")),
            destination: s.hub(&format!("app:{own_tag}")),
            warm: None,
        },
        Copy {
            source: s.src("web:2"),
            destination: s.hub("web:2"),
            warm: None,
        },
        Copy {
            source: s.src("gone:1"),
            destination: s.hub("gone:1"),
            warm: None,
        },
    ]
    .map(|copy| format!("{copy}\n"))
    .concat();
    assert_eq!(text(&listed.stdout), expected, "A, web:2 once, gone:1");

    let once = s.run("once", &reports, &[]);
    let stdout = text(&once.stdout);
    assert_eq!(
        once.status.code(),
        Some(0),
        "a gone source does not fail the run: {stdout}{}",
        text(&once.stderr)
    );
    assert!(
        stdout.contains("fill-mirror: 2 copied, 0 failed, 0 skipped, 1 gone, 0 refused"),
        "{stdout}"
    );
    assert_eq!(
        s.mirror.digest_of("hub/app", "1.0"),
        Some(new),
        "app:1.0 stays on NEW"
    );
    assert_eq!(s.mirror.digest_of("hub/app", &own_tag), Some(old.clone()));
    assert_eq!(s.mirror.digest_of("hub/app", &old), Some(old));
    assert_eq!(s.mirror.digest_of("hub/web", "2"), Some(web_digest));
    assert_eq!(
        s.mirror.digest_of("hub/db", "3"),
        Some(db),
        "another policy's copy is not run"
    );

    // The next scan passes every Pod the run filled; the source's missing image stays a finding.
    let second: Vec<Value> = scan().into_iter().map(|r| r["result"].clone()).collect();
    assert_eq!(second, ["pass", "pass", "pass", "pass", "fail"]);

    // The same reports again: what exists now is checked and left, never copied over.
    let again = s.run("once", &reports, &[]);
    let stdout = text(&again.stdout);
    assert!(
        stdout.contains("fill-mirror: 0 copied, 0 failed, 2 skipped, 1 gone, 0 refused"),
        "{stdout}"
    );
}

/// A report's copy passes the checks a Pod's record does: one the settings do not route there,
/// one that moves a tag, and one by digest onto a tag are refused, each named once, and none
/// runs; the good copy beside them does.
#[test]
fn a_report_copy_passes_the_checks_a_pod_record_does() {
    let s = Setup::new("reports-checked");
    let digest = Image::new("web 2", "linux/amd64").push(&s.source, "web", Some("2"));
    Image::new("web 3", "linux/amd64").push(&s.source, "web", Some("3"));
    let message = [
        command(
            &s.src("web:2"),
            &format!("{}/elsewhere/web:2", s.mirror.host),
        ),
        command(&s.src("web:3"), &s.hub("web:2")),
        command(&format!("{}@{digest}", s.src("web")), &s.hub("web:latest")),
        command(&s.src("web:2"), &s.hub("web:2")),
    ]
    .join("; ");
    let reports = s.write(
        "reports.json",
        &list(vec![report(
            "PolicyReport",
            "p",
            vec![result(CHECK, "fail", &message)],
        )]),
    );

    let once = s.run("once", &[&reports], &[]);

    let (stdout, stderr) = (text(&once.stdout), text(&once.stderr));
    assert_eq!(once.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("fill-mirror: 1 copied, 0 failed, 0 skipped, 0 gone, 3 refused"),
        "{stdout}"
    );
    for problem in [
        format!(
            "the settings route {} to {}, not {}/elsewhere/web",
            s.src("web"),
            s.hub("web"),
            s.mirror.host
        ),
        "a copy by tag goes to the same tag 3, not 2".to_string(),
        format!(
            "a copy by digest goes to the digest's own tag {}, not latest",
            digest.replacen(':', "-", 1)
        ),
    ] {
        assert!(
            stderr.contains(&format!(
                "refused PolicyReport default/uid-p results[0] of {CHECK}: its copy"
            )) && stderr.contains(&problem),
            "{problem}: {stderr}"
        );
    }
    assert_eq!(
        s.mirror.digest_of("hub/web", "2"),
        Some(digest),
        "web:2 is web:2"
    );
    assert_eq!(s.mirror.digest_of("elsewhere/web", "2"), None);
}

/// The check's results are read under either id of its ClusterAdmissionPolicy (before and from
/// Kubewarden 1.37.2), and under no other: `--check-policy` names another policy.
#[test]
fn the_reports_are_read_under_either_id_of_the_check_policy() {
    let s = Setup::new("reports-ids");
    let copy = |image: &str| command(&s.src(image), &s.hub(image));
    let reports = s.write(
        "reports.json",
        &list(vec![
            report("Report", "a", vec![result(CHECK, "fail", &copy("one:1"))]),
            report(
                "Report",
                "b",
                vec![result("kw.cap.image-swapper-check", "fail", &copy("two:1"))],
            ),
        ]),
    );

    let listed = s.run("list", &[&reports], &[]);
    assert_eq!(
        text(&listed.stdout),
        format!(
            "{} {}\n{} {}\n",
            s.src("one:1"),
            s.hub("one:1"),
            s.src("two:1"),
            s.hub("two:1")
        )
    );
    let other = s.run("list", &[&reports], &["--check-policy", "another-check"]);
    assert_eq!(other.status.code(), Some(0), "{}", text(&other.stderr));
    assert_eq!(
        text(&other.stdout),
        "",
        "another policy's results are not read"
    );
}
