//! The user pages: the README stays a first page, every relative link of the README and docs/
//! resolves, the README's sample output is what the command it names prints, and no page speaks
//! of how the policy was developed (issue numbers).

mod rig;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The README is the policy's Artifact Hub page (`kwctl annotate -u README.md`).
const README_MAX_BYTES: usize = 12 * 1024;

fn pages() -> Vec<PathBuf> {
    let mut pages = vec![
        rig::root().join("README.md"),
        rig::root().join("CHANGELOG.md"),
    ];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(rig::root().join("docs"))
        .expect("docs/")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text outside fenced code blocks.
fn prose(text: &str) -> String {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The targets of `[text](target)` links.
fn links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            links.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    links
}

/// GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as '-'.
fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .lines()
        .filter_map(|line| line.strip_prefix('#'))
        .map(|heading| {
            heading
                .trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

#[test]
fn the_readme_stays_a_first_page() {
    let size = read(&rig::root().join("README.md")).len();
    assert!(
        size <= README_MAX_BYTES,
        "README.md is {size} bytes; keep it under {README_MAX_BYTES} and move the rest to docs/"
    );
}

#[test]
fn every_relative_link_resolves() {
    let mut checked = 0;
    for page in pages() {
        let text = read(&page);
        let dir = page.parent().expect("a page has a folder");
        for link in links(&prose(&text)) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                page.clone()
            } else {
                dir.join(file)
            };
            assert!(
                target.exists(),
                "{}: link {link:?}: no {}",
                page.display(),
                target.display()
            );
            if !anchor.is_empty() {
                let headings = anchors(&read(&target));
                assert!(
                    headings.contains(anchor),
                    "{}: link {link:?}: no heading #{anchor} in {} ({headings:?})",
                    page.display(),
                    target.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 20, "only {checked} links checked");
}

#[test]
fn no_page_names_an_issue_of_this_repository() {
    for page in pages() {
        let text = read(&page).to_lowercase();
        assert!(
            !text.contains("issue #") && !text.contains("/issues/"),
            "{}: user pages speak of the policy, not of how it was developed",
            page.display()
        );
    }
}

/// Millisecond figures vary from run to run; everything else must be what `make run` prints.
fn without_timings(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("Milliseconds\":") {
        let (head, tail) = rest.split_at(at + "Milliseconds\":".len());
        out.push_str(head);
        out.push('N');
        rest = tail.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

/// The README shows what `make run` prints: `cargo run --example run`, whose binary `cargo
/// test` builds with the tests.
#[test]
fn the_readmes_sample_output_is_what_make_run_prints() {
    let readme = read(&rig::root().join("README.md"));
    let after = readme
        .split_once("`make run` answers as")
        .map(|(_, after)| after)
        .expect("the README introduces make run's output");
    let sample = after
        .split_once("```text\n")
        .and_then(|(_, block)| block.split_once("```"))
        .map(|(block, _)| block)
        .expect("a text block after the introduction");
    rig::policy(); // the module is fresh: the example runs it
    let example = rig::root().join("target/debug/examples/run");
    let output = Command::new(&example)
        .current_dir(rig::root())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (cargo test builds it)", example.display()));
    assert!(output.status.success(), "{output:?}");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert_eq!(without_timings(sample), without_timings(&printed));
}

/// The settings of every example in the README and docs/: a bare settings block (a mapping with
/// `mirrors` or `defaultMirror`), or the `spec.settings` of a ClusterAdmissionPolicy or
/// AdmissionPolicy. Each with where it is, for the failure message.
fn settings_examples() -> Vec<(String, serde_json::Value)> {
    let mut examples = Vec::new();
    for page in pages() {
        let text = read(&page);
        let name = page.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        let mut rest = text.as_str();
        while let Some(start) = rest.find("```yaml\n") {
            let line = text.len() - rest.len() + start;
            let line = text[..line].lines().count() + 1;
            let body = &rest[start + "```yaml\n".len()..];
            let end = body.find("```").unwrap_or(body.len());
            for document in serde_yaml::Deserializer::from_str(&body[..end]) {
                let value: serde_json::Value = match serde::Deserialize::deserialize(document) {
                    Ok(value) => value,
                    Err(e) => panic!("{name}:{line}: the YAML does not parse: {e}"),
                };
                let kind = value["kind"].as_str().unwrap_or_default();
                // RKE2's registries.yaml, shown beside the policy's own: `mirrors` by host.
                let rke2 = value["mirrors"]
                    .as_object()
                    .is_some_and(|hosts| hosts.values().all(|h| h.get("endpoint").is_some()));
                let settings = if kind == "ClusterAdmissionPolicy" || kind == "AdmissionPolicy" {
                    value["spec"]["settings"].clone()
                } else if !rke2
                    && (value.get("mirrors").is_some() || value.get("defaultMirror").is_some())
                {
                    value
                } else {
                    continue;
                };
                examples.push((format!("{name}:{line}"), settings));
            }
            rest = &body[end..];
            rest = rest.get(3..).unwrap_or_default();
        }
    }
    examples
}

/// Every settings example an operator may copy is valid settings for the built module, so that
/// a page never teaches a typo that would disable swapping.
#[test]
fn every_settings_example_is_valid() {
    let examples = settings_examples();
    assert!(examples.len() >= 10, "{} examples found", examples.len());
    for (place, settings) in examples {
        let (valid, message) = rig::validate_settings(&settings);
        assert!(valid, "{place}: {message:?}\n{settings:#}");
    }
}

/// One figure per fact: every measured range of seconds the README and operations.md quote
/// ("0.63-0.68 s") is one that performance.md, where the measurements are, states.
#[test]
fn quoted_measurements_are_the_ones_performance_md_states() {
    let performance = read(&rig::root().join("docs/performance.md"));
    let mut quoted = 0;
    for page in ["README.md", "docs/operations.md"] {
        let text = read(&rig::root().join(page));
        let mut rest = text.as_str();
        while let Some(at) = rest.find(" s") {
            let before = &rest[..at];
            let figure: String = before
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == '-')
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            if figure.contains('-') && figure.contains('.') && !figure.starts_with('-') {
                quoted += 1;
                assert!(
                    performance.contains(&format!("{figure} s")),
                    "{page} quotes {figure} s, which docs/performance.md does not state"
                );
            }
            rest = &rest[at + 2..];
        }
    }
    assert!(quoted >= 4, "{quoted} ranges quoted");
}

/// The user pages and the installation files: README.md, docs/ and deploy/ (when present).
fn pinned_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            if path.is_dir() {
                walk(&path, files);
            } else if path
                .extension()
                .is_some_and(|e| e == "md" || e == "yaml" || e == "yml")
            {
                files.push(path);
            }
        }
    }
    let mut files = vec![rig::root().join("README.md")];
    walk(&rig::root().join("docs"), &mut files);
    walk(&rig::root().join("deploy"), &mut files);
    files
}

/// Every reference to this policy's module in `text`, with the version it pins: a name whose
/// last path segment is `image-swapper` (or `image-swapper-...`), or the `registry://HOST/PATH`
/// of one's own build, followed by `:vX.Y.Z`.
fn module_references(text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut rest = text;
    let mut offset = 0;
    while let Some(at) = rest.find(":v") {
        let start = offset + at;
        let version: String = text[start + 2..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let version = version.trim_end_matches('.').to_string();
        let name: String = text[..start]
            .chars()
            .rev()
            .take_while(|c| !c.is_whitespace() && !"`'\"(=[".contains(*c))
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let last = name.rsplit('/').next().unwrap_or_default();
        let is_module = last.starts_with("image-swapper") || name.ends_with("HOST/PATH");
        if is_module && version.split('.').count() == 3 && version.split('.').all(|p| !p.is_empty())
        {
            found.push((format!("{name}:v{version}"), version));
        }
        offset = start + 2;
        rest = &text[offset..];
    }
    found
}

#[test]
fn module_references_are_recognised() {
    let text = "module: registry://ghcr.io/image-swapper-policy/policies/image-swapper:v0.5.0\n\
        `make push REGISTRY=registry://HOST/PATH:v1.2.3` and cosign verify \
        ghcr.io/o/image-swapper-check:v0.1.0. Not: ghcr.io/kubewarden/policy-server:v1.38.2, \
        quay.io/argoproj/argocd:v2.13.0, image-swapper:vX.Y.Z";
    let versions: Vec<String> = module_references(text)
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(versions, ["0.5.0", "1.2.3", "0.1.0"]);
}

/// The docs pin the release that has what they describe: every module reference in README.md,
/// docs/ and deploy/ names the crate's version, and the changelog has that version's section.
#[test]
fn every_module_reference_names_the_crates_version() {
    let version = env!("CARGO_PKG_VERSION");
    let mut references = 0;
    let mut wrong = Vec::new();
    for file in pinned_files() {
        for (reference, pinned) in module_references(&read(&file)) {
            references += 1;
            if pinned != version {
                wrong.push(format!("{}: {reference}", file.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "these pin another version than the crate's {version}:\n{}",
        wrong.join("\n")
    );
    assert!(references >= 8, "only {references} module references found");
    let changelog = read(&rig::root().join("CHANGELOG.md"));
    assert!(
        changelog.lines().any(|line| {
            let heading = line.trim_start_matches("## ").replace(['[', ']'], "");
            line.starts_with("## ") && heading.starts_with(&format!("{version} - "))
        }),
        "CHANGELOG.md has no section for {version} (## [{version}] - DATE)"
    );
}

/// Every fenced YAML block of the README and docs/: where it is, its text, its documents.
fn yaml_blocks() -> Vec<(String, String, Vec<serde_json::Value>)> {
    let mut blocks = Vec::new();
    for page in pages() {
        let text = read(&page);
        let name = page
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("?")
            .to_string();
        let mut rest = text.as_str();
        while let Some(start) = rest.find("```yaml\n") {
            let at = text.len() - rest.len() + start;
            let line = text[..at].lines().count() + 1;
            let body = &rest[start + "```yaml\n".len()..];
            let end = body.find("```").unwrap_or(body.len());
            let documents = serde_yaml::Deserializer::from_str(&body[..end])
                .map(|document| {
                    serde::Deserialize::deserialize(document)
                        .unwrap_or_else(|e| panic!("{name}:{line}: the YAML does not parse: {e}"))
                })
                .collect();
            blocks.push((format!("{name}:{line}"), body[..end].to_string(), documents));
            rest = &body[end..];
            rest = rest.get(3..).unwrap_or_default();
        }
    }
    blocks
}

/// One lookup as the docs size the swapping policy (and the check in `protect`) for: 0.68 s, the
/// slowest measured on policy-server 1.35 with the mirror 100 ms away.
const ONE_LOOKUP_MS: u64 = 680;
/// The check under the audit scanner is sized for a mirror up to 50 ms away: 0.40 s on 1.35.
const CHECK_LOOKUP_MS: u64 = 400;
/// The audit scanner's HTTP timeout, which bounds the check's scans instead of `timeoutSeconds`.
const SCANNER_TIMEOUT_S: u64 = 10;

/// The time rule of operations.md ("Three time limits"), for one deployment: budget + workers x
/// one lookup + 1 s <= timeoutEvalSeconds < the outer limit. None when it holds, else why not.
fn time_rule(
    budget_ms: u64,
    workers: u64,
    lookup_ms: u64,
    eval_s: u64,
    outer_s: u64,
) -> Option<String> {
    let needed = budget_ms + workers * lookup_ms + 1000;
    if needed > eval_s * 1000 {
        Some(format!(
            "{budget_ms} ms budget + {workers} workers x {lookup_ms} ms + 1 s = {needed} ms > \
             timeoutEvalSeconds {eval_s} s"
        ))
    } else if eval_s >= outer_s {
        Some(format!(
            "timeoutEvalSeconds {eval_s} s is not under {outer_s} s"
        ))
    } else {
        None
    }
}

#[test]
fn the_time_rule_refuses_what_it_should() {
    assert_eq!(time_rule(800, 2, ONE_LOOKUP_MS, 4, 5), None);
    assert_eq!(
        time_rule(4000, 2, CHECK_LOOKUP_MS, 6, SCANNER_TIMEOUT_S),
        None
    );
    // The settings.md example as it was: a 2,500 ms budget under timeoutEvalSeconds: 4.
    assert!(time_rule(2500, 2, ONE_LOOKUP_MS, 4, 5).is_some());
    assert!(time_rule(800, 2, ONE_LOOKUP_MS, 5, 5).is_some());
}

/// Every deployment the pages give keeps the time rule: each ClusterAdmissionPolicy or
/// AdmissionPolicy with its PolicyServer's `KUBEWARDEN_WORKERS` (which must be set: unset, it is
/// the node's CPU count, which no sizing can know), and each bare settings block whose budget is
/// not the default, with the limits its comment names (and the docs' 2 workers).
#[test]
fn every_example_keeps_the_time_rule() {
    let blocks = yaml_blocks();
    let mut workers = std::collections::BTreeMap::new();
    for (place, _, documents) in &blocks {
        for document in documents.iter().filter(|d| d["kind"] == "PolicyServer") {
            let name = document["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let set = document["spec"]["env"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| e["name"] == "KUBEWARDEN_WORKERS")
                .and_then(|e| e["value"].as_str())
                .map(|v| {
                    v.parse::<u64>()
                        .unwrap_or_else(|e| panic!("{place}: {v:?}: {e}"))
                });
            let Some(set) = set else {
                panic!(
                    "{place}: PolicyServer {name} sets no KUBEWARDEN_WORKERS: policy-server then \
                     runs one worker per CPU, and the time rule cannot be checked"
                );
            };
            let most = workers.entry(name).or_insert(set);
            *most = (*most).max(set);
        }
    }
    let mut checked = 0;
    let mut broken = Vec::new();
    for (place, text, documents) in &blocks {
        for document in documents {
            let kind = document["kind"].as_str().unwrap_or_default();
            let (settings, eval_s, outer_s, workers) = if kind == "ClusterAdmissionPolicy"
                || kind == "AdmissionPolicy"
            {
                let spec = &document["spec"];
                let server = spec["policyServer"].as_str().unwrap_or("default");
                let Some(&n) = workers.get(server) else {
                    panic!("{place}: {kind} names PolicyServer {server:?}, which no page gives");
                };
                (
                    spec["settings"].clone(),
                    spec["timeoutEvalSeconds"].as_u64().unwrap_or(2),
                    spec["timeoutSeconds"].as_u64().unwrap_or(10),
                    n,
                )
            } else if document.get("mirrors").is_some_and(|m| m.is_array())
                || document.get("defaultMirror").is_some()
            {
                if document["lookupBudgetMilliseconds"].as_u64().unwrap_or(800) == 800 {
                    continue; // the default budget, under the documented deployment
                }
                let named = |key: &str| {
                    text.split_once(&format!("{key}: "))
                        .and_then(|(_, after)| {
                            after
                                .split(|c: char| !c.is_ascii_digit())
                                .next()?
                                .parse()
                                .ok()
                        })
                        .unwrap_or_else(|| {
                            panic!("{place}: a budget of its own needs its `{key}: N` beside it")
                        })
                };
                (
                    document.clone(),
                    named("timeoutEvalSeconds"),
                    named("timeoutSeconds"),
                    2,
                )
            } else {
                continue;
            };
            let budget = settings["lookupBudgetMilliseconds"].as_u64().unwrap_or(800);
            let scanned = settings["action"] == "check" && settings["checkAdmissions"] != true;
            let (lookup, outer) = if scanned {
                (CHECK_LOOKUP_MS, SCANNER_TIMEOUT_S)
            } else {
                (ONE_LOOKUP_MS, outer_s)
            };
            checked += 1;
            if let Some(why) = time_rule(budget, workers, lookup, eval_s, outer) {
                broken.push(format!("{place}: {why}"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "the time rule is broken:\n{}",
        broken.join("\n")
    );
    assert!(checked >= 6, "only {checked} deployments checked");
}

/// What `kubectl kustomize deploy/<platform>` renders, for every platform folder beside base/.
fn rendered_overlays() -> Vec<(String, Vec<serde_json::Value>)> {
    let deploy = rig::root().join("deploy");
    let mut overlays: Vec<PathBuf> = std::fs::read_dir(&deploy)
        .expect("deploy/")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.join("kustomization.yaml").exists() && !path.ends_with("base"))
        .collect();
    overlays.sort();
    overlays
        .into_iter()
        .map(|overlay| {
            let output = Command::new("kubectl")
                .arg("kustomize")
                .arg(&overlay)
                .output()
                .unwrap_or_else(|e| {
                    panic!("kubectl: {e} (install it: apt-get install kubectl, as .ci/run does)")
                });
            assert!(output.status.success(), "{}: {output:?}", overlay.display());
            let documents = serde_yaml::Deserializer::from_slice(&output.stdout)
                .map(|document| serde::Deserialize::deserialize(document).expect("rendered YAML"))
                .collect();
            (
                format!("deploy/{}", overlay.file_name().unwrap().to_string_lossy()),
                documents,
            )
        })
        .collect()
}

/// Every overlay renders policies whose settings the built module accepts, on PolicyServers
/// that set their workers, within the time rule, pinned to the crate's version.
#[test]
fn every_deploy_overlay_renders_a_valid_deployment() {
    let overlays = rendered_overlays();
    assert!(overlays.len() >= 3, "{} overlays", overlays.len());
    for (place, documents) in overlays {
        let workers = |server: &str| -> u64 {
            documents
                .iter()
                .find(|d| d["kind"] == "PolicyServer" && d["metadata"]["name"] == server)
                .and_then(|d| d["spec"]["env"].as_array())
                .into_iter()
                .flatten()
                .find(|e| e["name"] == "KUBEWARDEN_WORKERS")
                .and_then(|e| e["value"].as_str()?.parse().ok())
                .unwrap_or_else(|| {
                    panic!("{place}: PolicyServer {server} sets no KUBEWARDEN_WORKERS")
                })
        };
        let policies: Vec<&serde_json::Value> = documents
            .iter()
            .filter(|d| d["kind"] == "ClusterAdmissionPolicy")
            .collect();
        assert_eq!(
            policies.len(),
            2,
            "{place}: the swapping and the check policy"
        );
        for policy in policies {
            let name = policy["metadata"]["name"].as_str().unwrap_or_default();
            let spec = &policy["spec"];
            let settings = &spec["settings"];
            let (valid, message) = rig::validate_settings(settings);
            assert!(valid, "{place}: {name}: {message:?}\n{settings:#}");
            let module = spec["module"].as_str().unwrap_or_default();
            assert!(
                module.ends_with(&format!(":v{}", env!("CARGO_PKG_VERSION"))),
                "{place}: {name}: {module}"
            );
            let scanned = settings["action"] == "check" && settings["checkAdmissions"] != true;
            let (lookup, outer) = if scanned {
                (CHECK_LOOKUP_MS, SCANNER_TIMEOUT_S)
            } else {
                (ONE_LOOKUP_MS, spec["timeoutSeconds"].as_u64().unwrap_or(10))
            };
            let why = time_rule(
                settings["lookupBudgetMilliseconds"].as_u64().unwrap_or(800),
                workers(spec["policyServer"].as_str().unwrap_or("default")),
                lookup,
                spec["timeoutEvalSeconds"].as_u64().unwrap_or(2),
                outer,
            );
            assert_eq!(why, None, "{place}: {name}: the time rule");
        }
    }
}

/// Every alert of the PrometheusRule the docs and `deploy/` install fires on the series of its
/// cause and clears once the cause is gone: `promtool test rules` (Debian's prometheus
/// package; `make test-deps` installs it) over `tests/alerts/image-swapper.test.yaml`, with the
/// rule's `spec` as the rule file and each alert's own annotations expected.
#[test]
fn every_alert_fires_on_its_cause_and_clears_under_promtool() {
    let rule = rig::read_yaml(&rig::root().join("deploy/base/prometheus-rule.yaml"));
    let alerts: Vec<serde_json::Value> = rule["spec"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|group| group["rules"].as_array().cloned().unwrap_or_default())
        .filter(|r| r.get("alert").is_some())
        .collect();
    assert!(!alerts.is_empty(), "no alert in the PrometheusRule");
    let mut tests = rig::read_yaml(&rig::root().join("tests/alerts/image-swapper.test.yaml"));
    let mut fires = BTreeSet::new();
    let mut clears = BTreeSet::new();
    for test in tests["tests"].as_array_mut().expect("tests").iter_mut() {
        let mut fired = BTreeSet::new();
        for case in test["alert_rule_test"]
            .as_array_mut()
            .expect("alert_rule_test")
        {
            let name = case["alertname"].as_str().unwrap_or_default().to_string();
            let alert = alerts
                .iter()
                .find(|a| a["alert"] == name.as_str())
                .unwrap_or_else(|| panic!("no alert {name} in the PrometheusRule"));
            let expected = case["exp_alerts"].as_array_mut().expect("exp_alerts");
            if expected.is_empty() {
                if fired.contains(&name) {
                    clears.insert(name.clone());
                }
            } else {
                fired.insert(name.clone());
                fires.insert(name.clone());
            }
            for entry in expected.iter_mut() {
                entry["exp_annotations"] = alert["annotations"].clone();
            }
        }
    }
    let names: BTreeSet<String> = alerts
        .iter()
        .filter_map(|a| a["alert"].as_str().map(str::to_string))
        .collect();
    assert_eq!(fires, names, "every alert has a case where it fires");
    assert_eq!(
        clears, names,
        "every alert has a later case where it has cleared"
    );
    let dir = std::env::temp_dir().join(format!("image-swapper-alerts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let write = |file: &str, value: &serde_json::Value| {
        let text = serde_yaml::to_string(value).expect("YAML");
        std::fs::write(dir.join(file), text).expect("write");
    };
    write("rules.yaml", &rule["spec"]);
    write("tests.yaml", &tests);
    let output = Command::new("promtool")
        .args(["test", "rules", "tests.yaml"])
        .current_dir(&dir)
        .output()
        .expect("promtool (Debian's prometheus package: make test-deps)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(output.status.success(), "promtool test rules:\n{said}");
}
