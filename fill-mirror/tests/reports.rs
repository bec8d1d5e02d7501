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
use rig::images::{Artifact, Image};
use rig::plane::{ControlPlane, find_tools};
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

/// Pod `name` of `default` running the source's `image`.
fn running(s: &Setup, name: &str, image: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"}, "spec": web(&s.src(image))})
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

    /// `fill-mirror MODE --reports FILE... --pods P --settings S ARGS`: `pods` are the Pods the
    /// reports are about (`kubectl get pods -A -o json`).
    fn run(
        &self,
        mode: &str,
        pods: &[Value],
        reports: &[&str],
        args: &[&str],
    ) -> std::process::Output {
        let settings = self.settings();
        let pods = self.write("pods.json", &list(pods.to_vec()));
        let mut all = vec![mode, "--settings", &settings, "--pods", &pods];
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

    let running = |name: &str, image: &str| running(&s, name, image);
    let pods = [
        pod_a.clone(),
        running("b", "web:2"),
        running("c", "web:2"),
        running("d", "db:3"),
        running("e", "gone:1"),
    ];
    let scan = || pods.clone().map(|pod| check::scanned(&check, CHECK, &pod));
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

    let listed = s.run("list", &pods, &reports, &[]);
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

    let once = s.run("once", &pods, &reports, &[]);
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
    let again = s.run("once", &pods, &reports, &[]);
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

    let once = s.run("once", &[running(&s, "p", "web:2")], &[&reports], &[]);

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

    let pods = [running(&s, "a", "one:1"), running(&s, "b", "two:1")];
    let listed = s.run("list", &pods, &[&reports], &[]);
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
    let other = s.run(
        "list",
        &pods,
        &[&reports],
        &["--check-policy", "another-check"],
    );
    assert_eq!(other.status.code(), Some(0), "{}", text(&other.stderr));
    assert_eq!(
        text(&other.stdout),
        "",
        "another policy's results are not read"
    );
}

/// The check role's reports in a real kube-apiserver (etcd and kube-apiserver on loopback),
/// read by `fill-mirror once` as the watch reads them: the swapping policy, the check policy
/// covering the namespaces labelled `checked: yes` (`team`, not `outside`), and the report
/// kinds' CRDs.
struct InCluster {
    plane: ControlPlane,
    s: Setup,
}

impl InCluster {
    fn start(test: &str) -> Option<InCluster> {
        let plane = ControlPlane::start(find_tools(test)?);
        plane.install_policy_crd();
        plane.install_report_crds();
        let s = Setup::new(test);
        let swap = settings(&s.source.host, &s.mirror.host);
        plane.apply_swapping_policy("image-swapper", &swap);
        plane.apply_swapping_policy("image-swapper-check", &swap);
        let mut check = plane.get_json(&["clusteradmissionpolicy", "image-swapper-check"]);
        check["spec"]["namespaceSelector"] = json!({"matchLabels": {"checked": "yes"}});
        plane.kubectl(&["apply", "-f", "-"], Some(&check.to_string()));
        for (namespace, checked) in [("team", "yes"), ("outside", "no")] {
            let object = json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": namespace, "labels": {"checked": checked}}});
            plane.kubectl(&["create", "-f", "-"], Some(&object.to_string()));
        }
        Some(InCluster { plane, s })
    }

    fn create(&self, object: &Value) {
        self.plane
            .kubectl(&["create", "-f", "-"], Some(&object.to_string()));
    }

    /// Pod `name` of `namespace` running the source's `image`.
    fn pod(&self, namespace: &str, name: &str, image: &str) {
        self.create(&json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": web(&self.s.src(image))}));
    }

    /// A PolicyReport about Pod `pod` of `namespace`, as the scanner writes it, with one
    /// `fail` result of `policy` whose message carries `copies`.
    fn report(&self, namespace: &str, pod: &str, policy: &str, copies: &[String]) {
        let mut report = report(
            "PolicyReport",
            pod,
            vec![result(policy, "fail", &copies.join("; "))],
        );
        report["metadata"]["namespace"] = json!(namespace);
        report["scope"]["namespace"] = json!(namespace);
        self.create(&report);
    }

    /// `fill-mirror once` against the cluster: its standard output and error.
    fn once(&self) -> String {
        let output = rig::fill_mirror()
            .args([
                "once",
                "--insecure",
                "--no-election",
                "--log-format",
                "text",
            ])
            .env("KUBECONFIG", &self.plane.kubeconfig)
            .output()
            .expect("run fill-mirror once");
        let words = format!("{}{}", text(&output.stdout), text(&output.stderr));
        assert_eq!(output.status.code(), Some(0), "{words}");
        words
    }

    /// The copy of the source's `image` to the mirror's, as the check role writes it.
    fn copy(&self, image: &str) -> String {
        command(&self.s.src(image), &self.s.hub(image))
    }
}

/// Only the check policy's own results are read: another policy's `fail` in the same
/// namespace, about a Pod that runs the image, copies nothing; the check's beside it does.
#[test]
fn a_report_from_another_policy_copies_nothing_in_the_cluster() {
    let Some(c) = InCluster::start("reports-other-policy") else {
        return;
    };
    let one = Image::new("one 1", "linux/amd64").push(&c.s.source, "one", Some("1"));
    Image::new("two 1", "linux/amd64").push(&c.s.source, "two", Some("1"));
    c.pod("team", "a", "one:1");
    c.pod("team", "b", "two:1");
    c.report(
        "team",
        "a",
        "kw.cap.image-swapper-check",
        &[c.copy("one:1")],
    );
    c.report("team", "b", "kw.cap.another-policy", &[c.copy("two:1")]);

    let words = c.once();

    assert!(words.contains("fill-mirror: 1 copied"), "{words}");
    assert_eq!(c.s.mirror.digest_of("hub/one", "1"), Some(one));
    assert_eq!(c.s.mirror.digest_of("hub/two", "1"), None, "{words}");
}

/// Reports anyone who may write one could forge: about a Pod that runs another image, about a
/// Pod that does not exist, and in a namespace the check policy does not cover (whose Pod runs
/// the image): none copies anything, and each is named; the check's own report about a Pod
/// that runs its image, beside them, is filled.
#[test]
fn a_forged_report_copies_nothing_in_the_cluster() {
    let Some(c) = InCluster::start("reports-forged") else {
        return;
    };
    let good = Image::new("good 1", "linux/amd64").push(&c.s.source, "good", Some("1"));
    for name in ["secret", "ghost", "outside"] {
        Image::new(name, "linux/amd64").push(&c.s.source, name, Some("1"));
    }
    c.pod("team", "good", "good:1");
    c.pod("team", "benign", "benign:1");
    c.pod("outside", "runs-it", "outside:1");
    let check = "kw.cap.image-swapper-check";
    c.report("team", "good", check, &[c.copy("good:1")]);
    c.report("team", "benign", check, &[c.copy("secret:1")]);
    c.report("team", "nobody", check, &[c.copy("ghost:1")]);
    c.report("outside", "runs-it", check, &[c.copy("outside:1")]);

    let words = c.once();

    assert!(words.contains("fill-mirror: 1 copied"), "{words}");
    assert_eq!(c.s.mirror.digest_of("hub/good", "1"), Some(good));
    for name in ["secret", "ghost", "outside"] {
        assert_eq!(
            c.s.mirror.digest_of(&format!("hub/{name}"), "1"),
            None,
            "{name}: {words}"
        );
    }
    for why in [
        format!("fills no image its Pod runs ({})", c.s.src("benign:1")),
        "the Pod team/nobody it is about does not exist".to_string(),
        "the check policy does not cover its namespace outside".to_string(),
    ] {
        assert!(words.contains(&why), "{why}: {words}");
    }
}

/// The check role wrote "copy its signature" for the digest the mirror's tag named (D_old);
/// the publisher has moved the source's tag to D_new since. The report's signature copy is
/// refused as a record's is, naming both digests; the signature of an image whose tag has not
/// moved, beside it, is copied.
#[test]
fn a_drifted_report_signature_is_refused_as_a_record_s_is() {
    let Some(c) = InCluster::start("reports-drifted") else {
        return;
    };
    let sig = |digest: &str| format!("{}.sig", digest.replacen(':', "-", 1));
    let old = Image::new("web build 1", "linux/amd64").push(&c.s.source, "web", Some("1"));
    Artifact::new("signature of build 1").push(&c.s.source, "web", &sig(&old));
    let new = Image::new("web build 2", "linux/amd64").push(&c.s.source, "web", Some("1"));
    let db = Image::new("db 1", "linux/amd64").push(&c.s.source, "db", Some("1"));
    Artifact::new("signature of db 1").push(&c.s.source, "db", &sig(&db));
    c.pod("team", "web", "web:1");
    c.pod("team", "db", "db:1");
    let check = "kw.cap.image-swapper-check";
    let signature = |repository: &str, digest: &str| {
        let tag = sig(digest);
        command(
            &c.s.src(&format!("{repository}:{tag}")),
            &c.s.hub(&format!("{repository}:{tag}")),
        )
    };
    c.report("team", "web", check, &[signature("web", &old)]);
    c.report("team", "db", check, &[signature("db", &db)]);

    let words = c.once();

    assert_eq!(c.s.mirror.digest_of("hub/web", &sig(&old)), None, "{words}");
    assert!(words.contains("1 refused"), "{words}");
    assert!(
        words.contains(&old) && words.contains(&new),
        "the refusal names both digests: {words}"
    );
    assert_eq!(
        c.s.mirror.digest_of("hub/db", &sig(&db)),
        c.s.source.digest_of("db", &sig(&db)),
        "{words}"
    );
}
