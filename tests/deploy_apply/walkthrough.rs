//! The install pages walked through as a new user types them: install.md, then each platform's
//! page, every fenced block in its page's order, on one API server (kube-apiserver from the real
//! tools with Kubewarden 1.38's CRDs, the monitoring CRDs and the stand-in for the controller's
//! PolicyServer check, as [`super::kubewarden_installed`] makes it). A console block runs unless
//! the line before it marks it, in a comment a reader sees in the page's source:
//!
//! - `<!-- walkthrough: not here (TOOL, ...) -->`: a command needs what this machine has not
//!   (helm, aws, gcloud, a kubelet); the walk prints what stands in for it. The mark must name
//!   every such tool, and a block whose every command runs here may not carry it. Such a block
//!   also holds a command that shows on a real cluster that the step worked (a `kubectl get`, an
//!   `aws … describe-…`, a `gcloud … describe`), which the walk prints.
//! - `<!-- walkthrough: example output (WHY) -->`: output a real cluster prints; neither run nor
//!   compared. Only a block that shows output (`$ command` lines) may carry it.
//! - before a YAML block, `<!-- walkthrough: saved as FILE -->`: the file a later command names.
//! - `<!-- walkthrough: alternative (WHAT) -->`: the block is another way to a step the page
//!   takes next (a pull-through cache in place of copies); it runs, then the walk deletes what it
//!   applied and made, so that the page's own way meets an API server without it.
//!
//! A block that runs and shows output (`$ command` then what it prints) is compared with what the
//! command printed. A console block with a command that cannot run here and no mark fails the walk,
//! so a new block is either run or marked. Between pages the walk deletes what the page applied,
//! so each page's first apply meets an API server without its Secrets.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use super::{KUBEWARDEN, RELEASES, kubewarden_installed, run_as_typed, text, words};
use crate::rig;
use crate::rig::tools::{ControlPlane, RealTools, scratch_dir};

/// The install pages, in the order a reader meets them: the shared steps, then each platform.
const PAGES: [&str; 3] = ["install.md", "install-eks.md", "install-gke.md"];

/// The mark's opening, on the line before a block.
const MARK: &str = "<!-- walkthrough:";

/// `kubectl` subcommands that need a kubelet or a running Pod.
const NEEDS_A_KUBELET: [&str; 7] = ["logs", "exec", "port-forward", "attach", "cp", "run", "top"];

/// The conditions `kubectl wait` meets here without a kubelet or Kubewarden's controller: a Job
/// the walk plays, and a policy whose PolicyServer exists ([`run_as_typed`]).
const WAITS_PLAYED: [&str; 2] = ["condition=complete", "condition=PolicyActive"];

/// CronJobs of Kubewarden's chart, which the walk has not (it installs Kubewarden's CRDs, not
/// the chart): a Job made from one needs helm.
const CHART_CRONJOBS: [&str; 1] = ["audit-scanner"];

/// The verbs of a command that only reads what a step made: on a real cluster, it shows that
/// the step worked.
const KUBECTL_READS: [&str; 5] = ["get", "describe", "wait", "logs", "rollout"];
const AWS_READS: [&str; 3] = ["get-", "describe-", "list-"];
const GCLOUD_READS: [&str; 3] = ["describe", "list", "get-iam-policy"];

/// A fenced block of a page: where it starts, its info string, its text, the mark before it.
#[derive(Debug)]
struct Block {
    place: String,
    info: String,
    body: String,
    mark: Option<String>,
}

fn blocks(page: &str) -> Vec<Block> {
    let text = std::fs::read_to_string(rig::root().join("docs").join(page))
        .unwrap_or_else(|e| panic!("docs/{page}: {e}"));
    let mut found = Vec::new();
    let mut before = "";
    let mut lines = text.lines().enumerate();
    while let Some((number, line)) = lines.next() {
        let Some(info) = line.trim_start().strip_prefix("```") else {
            if !line.trim().is_empty() {
                before = line.trim();
            }
            continue;
        };
        let mut body = String::new();
        for (_, inner) in lines.by_ref() {
            if inner.trim_start().starts_with("```") {
                break;
            }
            body.push_str(inner);
            body.push('\n');
        }
        let mark = before
            .strip_prefix(MARK)
            .and_then(|mark| mark.strip_suffix("-->"))
            .map(|mark| mark.trim().to_string());
        found.push(Block {
            place: format!("{page}:{}", number + 1),
            info: info.trim().to_string(),
            body,
            mark,
        });
        before = "";
    }
    found
}

/// One command of a console block and, where the block shows it (`$ command` lines), what it
/// prints.
#[derive(Debug)]
struct Step {
    command: String,
    shown: Option<String>,
}

fn steps(body: &str) -> Vec<Step> {
    let joined = body.replace("\\\n", " ");
    let prompted = joined.lines().any(|line| line.starts_with("$ "));
    let mut steps: Vec<Step> = Vec::new();
    for line in joined.lines() {
        if !prompted {
            if !words(line).is_empty() {
                steps.push(Step {
                    command: line.to_string(),
                    shown: None,
                });
            }
        } else if let Some(command) = line.strip_prefix("$ ") {
            steps.push(Step {
                command: command.to_string(),
                shown: Some(String::new()),
            });
        } else if let Some(shown) = steps.last_mut().and_then(|step| step.shown.as_mut()) {
            shown.push_str(line);
            shown.push('\n');
        }
    }
    steps
}

/// The programs a command line runs: the first word of each part between `&&`, `||`, `;` and
/// `|`, with its words.
fn programs(command: &str) -> Vec<Vec<String>> {
    let words = words(command);
    words
        .split(|word| ["&&", "||", ";", "|"].contains(&word.as_str()))
        .filter(|part| !part.is_empty())
        .map(<[String]>::to_vec)
        .collect()
}

/// What a command needs that this machine has not (`helm`, `aws`, `gcloud`, `a kubelet`), if
/// anything: it runs kubectl against the walk's API server, `jq` and `promtool` only.
fn needs(command: &str) -> BTreeSet<String> {
    let mut needs = BTreeSet::new();
    for program in programs(command) {
        match program[0].as_str() {
            "jq" | "promtool" => {}
            "kubectl" => {
                let subcommand = program.get(1).map(String::as_str).unwrap_or_default();
                let waits_played = program.iter().any(|word| {
                    WAITS_PLAYED
                        .iter()
                        .any(|played| word.ends_with(&format!("--for={played}")) || word == played)
                });
                if NEEDS_A_KUBELET.contains(&subcommand) || (subcommand == "wait" && !waits_played)
                {
                    needs.insert("a kubelet".to_string());
                }
                let from_the_chart = program.iter().any(|word| {
                    CHART_CRONJOBS
                        .iter()
                        .any(|cronjob| word == &format!("--from=cronjob/{cronjob}"))
                });
                if subcommand == "create" && from_the_chart {
                    needs.insert("helm".to_string());
                }
            }
            other => {
                needs.insert(other.to_string());
            }
        }
    }
    needs
}

/// Whether `command` only reads what a step made, and so shows on a real cluster that the step
/// worked.
fn shows_it_worked(command: &str) -> bool {
    programs(command).iter().any(|program| {
        let word = |at: usize| program.get(at).map(String::as_str).unwrap_or_default();
        match word(0) {
            "kubectl" => KUBECTL_READS.contains(&word(1)),
            "aws" => AWS_READS.iter().any(|verb| word(2).starts_with(verb)),
            "gcloud" => program.iter().any(|w| GCLOUD_READS.contains(&w.as_str())),
            _ => false,
        }
    })
}

/// What stands in, here, for what a block marked `not here` needs.
fn stand_in(need: &str) -> &'static str {
    match need {
        "helm" => {
            "Kubewarden 1.38's CRDs and the stand-in for its controller's PolicyServer check, \
             installed before the walk (1.35's CRDs: deploy_apply's installs_as_typed)"
        }
        "aws" => {
            "nothing: IAM and ECR are outside the cluster (tests/docs.rs checks each aws command \
             against the AWS CLI's model)"
        }
        "gcloud" => "nothing: IAM and Artifact Registry are outside the cluster",
        // Here it would rewrite the checkout's IAM documents with the example's OIDC id.
        "deploy/eks-ecr/aws/render.sh" => {
            "nothing: tests/docs.rs the_iam_documents_are_rendered runs it on the overlays' \
             example values and holds the committed documents to its output"
        }
        "a kubelet" => "nothing: no Pod runs here",
        _ => "nothing",
    }
}

/// The walk's state: the API server, where saved files are, and what each page applied.
struct Walk {
    plane: ControlPlane,
    bin: PathBuf,
    saved: BTreeMap<String, PathBuf>,
    scratch: PathBuf,
    applied: BTreeSet<String>,
    ran: usize,
}

impl Walk {
    fn new(plane: ControlPlane) -> Walk {
        let scratch = scratch_dir("walkthrough");
        let bin = scratch.join("bin");
        std::fs::create_dir_all(&bin).expect("bin");
        let wrapper = bin.join("kubectl");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nexec '{}' --kubeconfig '{}' --cache-dir '{}' \"$@\"\n",
                super::real_kubectl().display(),
                plane.kubeconfig.display(),
                plane.data_dir().join("kubectl-cache").display(),
            ),
        )
        .expect("kubectl wrapper");
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        Walk {
            plane,
            bin,
            saved: BTreeMap::new(),
            scratch,
            applied: BTreeSet::new(),
            ran: 0,
        }
    }

    /// `command`'s words, a saved file's name replaced by its path.
    fn words(&self, command: &str) -> Vec<String> {
        words(command)
            .into_iter()
            .map(|word| {
                self.saved
                    .get(&word)
                    .map_or(word, |path| path.display().to_string())
            })
            .collect()
    }

    /// Runs one step: a plain kubectl command as [`run_as_typed`] plays it, anything else with
    /// `sh -c` from the repository's root (kubectl there is the walk's); compares what it printed
    /// with what the page shows.
    fn run(&mut self, place: &str, step: &Step) {
        let words = self.words(&step.command);
        let plain_kubectl = programs(&step.command).len() == 1 && words[0] == "kubectl";
        if plain_kubectl
            && words.get(1).is_some_and(|w| w == "apply")
            && let Some(at) = words.iter().position(|w| w == "-k")
            && let Some(folder) = words.get(at + 1)
        {
            self.applied.insert(folder.clone());
        }
        self.ran += 1;
        if plain_kubectl && step.shown.is_none() {
            run_as_typed(&self.plane, place, std::slice::from_ref(&words));
            return;
        }
        let mut line = step.command.clone();
        for (name, path) in &self.saved {
            line = line.replace(&format!(" {name}"), &format!(" {}", path.display()));
        }
        let output = Command::new("sh")
            .arg("-c")
            .arg(&line)
            .current_dir(rig::root())
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    self.bin.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .output()
            .expect("sh");
        assert!(
            output.status.success(),
            "{place}: `{}` failed:\n{}",
            step.command,
            text(&output)
        );
        if let Some(shown) = &step.shown {
            let printed = String::from_utf8_lossy(&output.stdout);
            assert_eq!(
                printed.trim_end(),
                shown.trim_end(),
                "{place}: `{}` prints otherwise than the page shows",
                step.command
            );
        }
    }

    /// After a page: deletes what it applied and the Secrets and Jobs its commands made, so the
    /// next page's first apply meets an API server without them.
    fn clear(&mut self, page: &str) {
        for folder in std::mem::take(&mut self.applied) {
            println!("walkthrough: after {page}: kubectl delete -k {folder}");
            self.plane.kubectl_ok(
                &[
                    "delete",
                    "-k",
                    &folder,
                    "--ignore-not-found",
                    "--wait=false",
                ],
                None,
            );
        }
        println!(
            "walkthrough: after {page}: the Secrets and Jobs of namespace {KUBEWARDEN} deleted"
        );
        self.plane.kubectl_ok(
            &[
                "delete",
                "secret,job",
                "-n",
                KUBEWARDEN,
                "--all",
                "--wait=false",
            ],
            None,
        );
    }
}

/// Walks `page`: runs its blocks, or says what stands in for those marked.
fn walk_page(walk: &mut Walk, page: &str) {
    for block in blocks(page) {
        let mark = block.mark.as_deref().unwrap_or_default();
        if let Some(file) = mark.strip_prefix("saved as ") {
            let path = walk.scratch.join(file);
            std::fs::write(&path, &block.body).expect("saved file");
            println!("walkthrough: {}: saved as {file}", block.place);
            walk.saved.insert(file.to_string(), path);
            continue;
        }
        if block.info != "console" {
            assert!(
                ["yaml", "json", "text", "toml"].contains(&block.info.as_str()),
                "{}: a ```{} block: commands go in ```console blocks, which the walk runs",
                block.place,
                block.info
            );
            continue;
        }
        let steps = steps(&block.body);
        let needed: BTreeSet<String> = steps.iter().flat_map(|s| needs(&s.command)).collect();
        if let Some(why) = mark.strip_prefix("example output") {
            assert!(
                steps.iter().any(|step| step.shown.is_some()),
                "{}: marked example output, but shows no output (`$ command` lines)",
                block.place
            );
            println!(
                "walkthrough: {}: example output{why}: not run, not compared",
                block.place
            );
            continue;
        }
        if let Some(tools) = mark.strip_prefix("not here") {
            assert!(
                !needed.is_empty(),
                "{}: marked `not here`, but every command runs here: drop the mark",
                block.place
            );
            for need in &needed {
                assert!(
                    tools.contains(need.as_str()),
                    "{}: marked `{mark}`, but it needs {need} too: name it in the mark",
                    block.place
                );
                println!(
                    "walkthrough: {}: not here ({need}); in its place: {}",
                    block.place,
                    stand_in(need)
                );
            }
            let checks: Vec<&Step> = steps
                .iter()
                .filter(|step| shows_it_worked(&step.command))
                .collect();
            assert!(
                !checks.is_empty(),
                "{}: marked `not here`, but no command of it shows on a real cluster that the \
                 step worked: add one (a kubectl get, an aws ... describe-/get-/list-, a gcloud \
                 ... describe or list)",
                block.place
            );
            for check in checks {
                println!(
                    "walkthrough: {}: on a real cluster, `{}` shows it worked",
                    block.place, check.command
                );
            }
            continue;
        }
        let alternative = mark.starts_with("alternative");
        assert!(
            mark.is_empty() || alternative,
            "{}: `{MARK} {mark} -->`: the marks are `not here (...)`, `example output (...)`, \
             `saved as FILE`, `alternative (...)`",
            block.place
        );
        assert!(
            needed.is_empty(),
            "{}: needs {needed:?}, which this walk has not: run it here, or mark the block \
             `{MARK} not here ({}) -->` and say in the walk what stands in",
            block.place,
            needed.iter().cloned().collect::<Vec<_>>().join(", ")
        );
        for step in &steps {
            walk.run(&block.place, step);
        }
        println!("walkthrough: {}: ran {} commands", block.place, steps.len());
        if alternative {
            walk.clear(&block.place);
        }
    }
    walk.clear(page);
}

/// The commands of every console block of the pages that is not marked `not here`, `example
/// output` or `saved as`: what the walk must run, counted from the pages, not by the walk.
fn commands_to_run() -> usize {
    PAGES
        .iter()
        .flat_map(|page| blocks(page))
        .filter(|block| block.info == "console")
        .filter(|block| {
            let mark = block.mark.as_deref().unwrap_or_default();
            mark.is_empty() || mark.starts_with("alternative")
        })
        .map(|block| steps(&block.body).len())
        .sum()
}

/// install.md, install-eks.md and install-gke.md, every block run or marked, on one API server.
#[test]
fn the_install_pages_run_as_typed() {
    let Some(tools) = RealTools::find("deploy_apply the_install_pages_run_as_typed") else {
        return;
    };
    let started = Instant::now();
    let (plane, _controller) = kubewarden_installed(&tools, RELEASES[1].1);
    let mut walk = Walk::new(plane);
    for page in PAGES {
        walk_page(&mut walk, page);
    }
    let _ = std::fs::remove_dir_all(&walk.scratch);
    let to_run = commands_to_run();
    assert_eq!(
        walk.ran, to_run,
        "the walk ran {} commands; the pages' console blocks it must run (unmarked, or marked \
         `alternative`) hold {to_run}",
        walk.ran
    );
    println!(
        "walkthrough: {} commands of {} pages ran in {:.1} s (one API server)",
        walk.ran,
        PAGES.len(),
        started.elapsed().as_secs_f64()
    );
}

/// The marks and the block parser, without an API server.
#[test]
fn a_command_this_walk_cannot_run_is_found() {
    assert_eq!(
        needs("helm repo add k https://x && helm repo update"),
        ["helm".to_string()].into()
    );
    assert!(needs("kubectl apply -k deploy/registry").is_empty());
    assert!(needs("kubectl wait --for=condition=PolicyActive --timeout=5m x").is_empty());
    assert_eq!(
        needs("kubectl wait --for=condition=Ready pod/x"),
        ["a kubelet".to_string()].into()
    );
    assert_eq!(
        needs("kubectl logs -l a=b | jq -c ."),
        ["a kubelet".to_string()].into()
    );
    assert_eq!(
        needs("kubectl create job -n kubewarden --from=cronjob/audit-scanner now"),
        ["helm".to_string()].into()
    );
    assert!(
        needs("kubectl create job -n kubewarden --from=cronjob/mirror-credentials first")
            .is_empty()
    );
    assert!(shows_it_worked(
        "aws ecr describe-repository-creation-templates --prefixes cache"
    ));
    assert!(shows_it_worked(
        "gcloud compute firewall-rules list --filter=x"
    ));
    assert!(shows_it_worked("helm install x y && kubectl get crd z"));
    assert!(!shows_it_worked(
        "aws ecr create-repository-creation-template --prefix cache"
    ));
    assert!(!shows_it_worked("gcloud iam service-accounts create x"));
    assert!(!shows_it_worked("helm install x y"));
    let shown = steps("$ kubectl get x \\\n  -o name\nx/y\n$ kubectl get z\n");
    assert_eq!(shown.len(), 2);
    assert_eq!(shown[0].shown.as_deref(), Some("x/y\n"));
}
