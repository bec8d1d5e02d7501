//! The user pages: the README stays a first page, every relative link of the README and docs/
//! resolves, the README's sample output is what the command it names prints, and no page speaks
//! of how the policy was developed (issue numbers).

mod rig;

#[path = "docs/install_pages.rs"]
mod install_pages;

use std::collections::{BTreeMap, BTreeSet};
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

/// Every file of `deploy/` a page names (`-f deploy/helm/...`, `file://deploy/...`, a path in a
/// command or a sentence) is in the repository, so a command typed as the page writes it finds
/// its file; and the chart's values files turn on what the pages say they do.
#[test]
fn every_deploy_file_a_page_names_exists() {
    let mut checked = 0;
    // The history names the files of earlier releases.
    let history = ["CHANGELOG.md", "upgrading.md"];
    for page in pages() {
        if page
            .file_name()
            .is_some_and(|name| history.iter().any(|h| name == *h))
        {
            continue;
        }
        let text = read(&page);
        for (at, _) in text.match_indices("deploy/") {
            let before = text[..at].chars().last().unwrap_or(' ');
            if before.is_ascii_alphanumeric() || before == '-' || before == '.' {
                continue;
            }
            let path: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || "/._-".contains(*c))
                .collect();
            let path = path.trim_end_matches(['.', '/']);
            let line = text[..at].rsplit('\n').next().unwrap_or_default();
            // `kubectl ... deploy/NAME` names a Deployment, not a folder.
            let a_deployment = line.contains("kubectl ") && path.matches('/').count() == 1;
            if path == "deploy" || path.contains('<') || a_deployment {
                continue;
            }
            assert!(
                rig::root().join(path).exists(),
                "{}: names {path}, which is not in the repository",
                page.display()
            );
            checked += 1;
        }
    }
    assert!(checked > 20, "only {checked} deploy/ paths checked");
    let values = rig::read_yaml(&rig::root().join("deploy/helm/kubewarden-values.yaml"));
    assert!(
        values["auditScanner"]["parallelResources"]
            .as_u64()
            .is_some(),
        "{values}"
    );
    let telemetry = rig::read_yaml(&rig::root().join("deploy/helm/kubewarden-telemetry.yaml"));
    assert_eq!(telemetry["telemetry"]["metrics"], true, "{telemetry}");
    assert_eq!(telemetry["telemetry"]["mode"], "sidecar", "{telemetry}");
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

/// One figure per fact: every measured range of seconds the README and the pages of running it
/// (sizing, signatures, filling the mirror, monitoring) quote ("0.63-0.68 s") is one that
/// performance.md, where the measurements are, states.
#[test]
fn quoted_measurements_are_the_ones_performance_md_states() {
    let performance = read(&rig::root().join("docs/performance.md"));
    let mut quoted = 0;
    for page in [
        "README.md",
        "docs/sizing.md",
        "docs/signatures.md",
        "docs/fill-mirror.md",
        "docs/monitoring.md",
        "docs/missing-images.md",
        "docs/credentials.md",
    ] {
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

/// The user pages and the installation files: README.md, docs/, deploy/ (when present) and
/// Artifact Hub's package page.
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
    let mut files = vec![
        rig::root().join("README.md"),
        rig::root().join("artifacthub-pkg.yml"),
    ];
    walk(&rig::root().join("docs"), &mut files);
    walk(&rig::root().join("deploy"), &mut files);
    files
}

/// Every reference to this release's artifacts in `text`, with the version it pins: a name whose
/// last path segment is `image-swapper` (or `image-swapper-...`, the module) or `fill-mirror`
/// (the fill controller's image), or the `registry://HOST/PATH` of one's own build, followed by
/// `:vX.Y.Z`.
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
        let is_module = last.starts_with("image-swapper")
            || last == "fill-mirror"
            || name.ends_with("HOST/PATH");
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
        ghcr.io/o/image-swapper-check:v0.1.0, image: ghcr.io/o/fill-mirror:v0.2.0. Not: \
        ghcr.io/kubewarden/policy-server:v1.38.2, quay.io/argoproj/argocd:v2.13.0, \
        ghcr.io/o/fill-mirror-old:v9.9.9, image-swapper:vX.Y.Z";
    let versions: Vec<String> = module_references(text)
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(versions, ["0.5.0", "1.2.3", "0.1.0", "0.2.0"]);
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

/// The changelog's sections: each `## ` heading's text (brackets removed) and its `- ` entries.
fn changelog_sections(changelog: &str) -> Vec<(String, usize)> {
    let mut sections: Vec<(String, usize)> = Vec::new();
    for line in changelog.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            sections.push((heading.replace(['[', ']'], ""), 0));
        } else if line.starts_with("- ")
            && let Some((_, entries)) = sections.last_mut()
        {
            *entries += 1;
        }
    }
    sections
}

/// Main is always a release: nothing waits under `[Unreleased]` (a change users see bumps the
/// version and dates its section in the same landing), and the newest released section is the
/// crates' version, dated, with entries. With the pins above (every page and deploy/ file names
/// that version), a fresh clone installs exactly what its pages describe.
#[test]
fn main_is_a_release_nothing_waits_unreleased() {
    let version = env!("CARGO_PKG_VERSION");
    let sections = changelog_sections(&read(&rig::root().join("CHANGELOG.md")));
    let unreleased: usize = sections
        .iter()
        .filter(|(heading, _)| heading.starts_with("Unreleased"))
        .map(|(_, entries)| entries)
        .sum();
    assert_eq!(
        unreleased, 0,
        "CHANGELOG.md has {unreleased} entries under [Unreleased]: bump both crates' version, date \
         its section and move every pin in deploy/ and the pages to it in the same change"
    );
    let (newest, entries) = sections
        .iter()
        .find(|(heading, _)| !heading.starts_with("Unreleased"))
        .expect("CHANGELOG.md has no released section");
    let (released, date) = newest.split_once(" - ").unwrap_or((newest, ""));
    assert_eq!(
        released, version,
        "CHANGELOG.md's newest section is {newest}, the crates say {version}"
    );
    let dated = date.len() == 10
        && date.char_indices().all(|(i, c)| {
            if i == 4 || i == 7 {
                c == '-'
            } else {
                c.is_ascii_digit()
            }
        });
    assert!(
        dated,
        "CHANGELOG.md's section {version} has no date (YYYY-MM-DD): {newest}"
    );
    assert!(
        *entries > 0,
        "CHANGELOG.md's section {version} lists no change"
    );
}

/// The guard above reads what it should: entries under [Unreleased] are counted, an undated or
/// older newest section is told apart.
#[test]
fn changelog_sections_are_read_as_written() {
    let text = "# Changelog\n\n## [Unreleased]\n\n### Added\n\n- one\n- two\n  more\n\n\
                ## [0.7.0] - 2026-12-04\n\n- three\n\n## [0.6.0] - 2026-12-02\n- four\n";
    assert_eq!(
        changelog_sections(text),
        [
            ("Unreleased".to_string(), 2),
            ("0.7.0 - 2026-12-04".to_string(), 1),
            ("0.6.0 - 2026-12-02".to_string(), 1)
        ]
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
    // The install pages' and the reference pages' deployments (the README links them).
    assert!(checked >= 5, "only {checked} deployments checked");
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

/// The alerting rules of a rule `spec` (`groups[].rules[]` with an `alert`).
fn alerts_of(spec: &serde_json::Value) -> Vec<serde_json::Value> {
    spec["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|group| group["rules"].as_array().cloned().unwrap_or_default())
        .filter(|r| r.get("alert").is_some())
        .collect()
}

/// Runs `promtool test rules` over `tests/alerts/image-swapper.test.yaml` with the rule `spec`
/// (a PrometheusRule's or a Managed Prometheus ClusterRules') as the rule file: only the cases
/// of the alerts the spec has, each expected with the spec's own annotations. Every alert must
/// have a case where it fires and a later one where it has cleared. `what` names the rule in
/// failures.
fn promtool_fires_and_clears(what: &str, spec: &serde_json::Value) {
    let alerts = alerts_of(spec);
    assert!(!alerts.is_empty(), "{what}: no alert");
    let mut tests = rig::read_yaml(&rig::root().join("tests/alerts/image-swapper.test.yaml"));
    let mut fires = BTreeSet::new();
    let mut clears = BTreeSet::new();
    let all = tests["tests"].as_array_mut().expect("tests");
    for test in all.iter_mut() {
        let mut fired = BTreeSet::new();
        let cases = test["alert_rule_test"]
            .as_array_mut()
            .expect("alert_rule_test");
        cases.retain(|case| alerts.iter().any(|a| a["alert"] == case["alertname"]));
        for case in cases.iter_mut() {
            let name = case["alertname"].as_str().unwrap_or_default().to_string();
            let alert = alerts
                .iter()
                .find(|a| a["alert"] == name.as_str())
                .expect("kept above");
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
    all.retain(|test| {
        test["alert_rule_test"]
            .as_array()
            .is_some_and(|cases| !cases.is_empty())
    });
    let names: BTreeSet<String> = alerts
        .iter()
        .filter_map(|a| a["alert"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        fires, names,
        "{what}: every alert has a case where it fires"
    );
    assert_eq!(
        clears, names,
        "{what}: every alert has a later case where it has cleared"
    );
    let dir = std::env::temp_dir().join(format!(
        "image-swapper-alerts-{}-{}",
        std::process::id(),
        what.replace(|c: char| !c.is_ascii_alphanumeric(), "-")
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let write = |file: &str, value: &serde_json::Value| {
        let text = serde_yaml::to_string(value).expect("YAML");
        std::fs::write(dir.join(file), text).expect("write");
    };
    write("rules.yaml", spec);
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
    assert!(
        output.status.success(),
        "{what}: promtool test rules:\n{said}"
    );
}

/// Every alert of the PrometheusRule the docs and `deploy/` install fires on the series of its
/// cause and clears once the cause is gone: `promtool test rules` (Debian's prometheus
/// package; `make test-deps` installs it) over `tests/alerts/image-swapper.test.yaml`, with the
/// rule's `spec` as the rule file and each alert's own annotations expected.
#[test]
fn every_alert_fires_on_its_cause_and_clears_under_promtool() {
    let rule = rig::read_yaml(&rig::root().join("deploy/base/prometheus-rule.yaml"));
    promtool_fires_and_clears("deploy/base PrometheusRule", &rule["spec"]);
}

/// install-eks.md's smoke-test rule (a PrometheusRule shown in a YAML block, `for:` of a minute or
/// less) fires within minutes once no fill-mirror replica answers a scrape and clears when one
/// does, under promtool; its expression is `ImageSwapperFillDown`'s, so what it shows firing is
/// that alert's path (fill-mirror's ServiceMonitor, the scrape's `job`, the rule's labels for the
/// stack).
#[test]
fn the_smoke_alert_fires_and_clears_within_minutes() {
    let base = rig::read_yaml(&rig::root().join("deploy/base/prometheus-rule.yaml"));
    let kept = alerts_of(&base["spec"])
        .into_iter()
        .find(|a| a["alert"] == "ImageSwapperFillDown")
        .expect("the base's ImageSwapperFillDown");
    let smoke: Vec<serde_json::Value> = yaml_blocks()
        .into_iter()
        .filter(|(place, _, _)| place.starts_with("install-eks.md:"))
        .flat_map(|(_, _, documents)| documents)
        .filter(|d| d["kind"] == "PrometheusRule" && d["metadata"]["name"] == "image-swapper-smoke")
        .collect();
    assert_eq!(
        smoke.len(),
        1,
        "install-eks.md shows the smoke-test rule once"
    );
    let rule = &smoke[0];
    assert_eq!(
        rule["metadata"]["labels"], base["metadata"]["labels"],
        "the smoke-test rule is labelled as the base's, for the stack to load it"
    );
    let alerts = alerts_of(&rule["spec"]);
    assert_eq!(alerts.len(), 1, "one smoke-test alert");
    assert_eq!(
        alerts[0]["expr"], kept["expr"],
        "the smoke-test alert's expression"
    );
    let minutes = alerts[0]["for"]
        .as_str()
        .and_then(|f| f.strip_suffix('m'))
        .and_then(|m| m.parse::<u64>().ok());
    assert!(
        minutes.is_some_and(|m| m <= 1),
        "the smoke-test alert's for: {} (a minute at most)",
        alerts[0]["for"]
    );
    promtool_fires_and_clears("install-eks.md smoke-test PrometheusRule", &rule["spec"]);
}

/// Where an overlay gives Google Cloud Managed Service for Prometheus its alerts (`Rules`,
/// `ClusterRules` or `GlobalRules` of monitoring.googleapis.com), they are the PrometheusRule's:
/// the same alerts (less fill-mirror's where the overlay runs no fill-mirror, plus the overlay's
/// own for what it lacks), each with the same `expr`, `for` and labels, so that the promtool tests
/// of the one are tests of the other (and they run on these rules too). Such an overlay renders no PrometheusRule (its CRD is the
/// Prometheus Operator's, which `kubectl apply` would miss), and a PodMonitoring that scrapes
/// every PolicyServer it renders.
#[test]
fn managed_prometheus_rules_are_the_prometheus_rules_alerts() {
    let base = rig::read_yaml(&rig::root().join("deploy/base/prometheus-rule.yaml"));
    let base_alerts = alerts_of(&base["spec"]);
    let mut checked = 0;
    for (place, documents) in rendered_overlays() {
        let kind = |d: &&serde_json::Value, kinds: &[&str]| {
            d["apiVersion"] == "monitoring.googleapis.com/v1"
                && kinds.iter().any(|k| d["kind"] == *k)
        };
        let rules: Vec<&serde_json::Value> = documents
            .iter()
            .filter(|d| kind(d, &["Rules", "ClusterRules", "GlobalRules"]))
            .collect();
        if rules.is_empty() {
            continue;
        }
        assert!(
            !documents.iter().any(|d| d["kind"] == "PrometheusRule"),
            "{place}: renders both Managed Prometheus rules and a PrometheusRule"
        );
        // An alert on fill-mirror's metrics belongs where the overlay renders fill-mirror.
        let renders_fill_mirror = documents
            .iter()
            .any(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "fill-mirror");
        let reads_fill_mirror = |a: &serde_json::Value| {
            let expr = a["expr"].as_str().unwrap_or_default();
            expr.contains("fill_mirror_") || expr.contains("job=\"fill-mirror\"")
        };
        let expected: Vec<&serde_json::Value> = base_alerts
            .iter()
            .filter(|a| renders_fill_mirror || !reads_fill_mirror(a))
            .collect();
        let spec = serde_json::json!({"groups": rules.iter().flat_map(|r| {
            r["spec"]["groups"].as_array().cloned().unwrap_or_default()
        }).collect::<Vec<_>>()});
        let given = alerts_of(&spec);
        let names = |alerts: &[&serde_json::Value]| -> Vec<String> {
            alerts
                .iter()
                .map(|a| a["alert"].as_str().unwrap_or_default().to_string())
                .collect()
        };
        // The overlay's own alerts (where it lacks a part the base's alerts read) are the ones
        // the base does not name; they run under promtool below like the rest.
        let in_base = |a: &serde_json::Value| base_alerts.iter().any(|b| b["alert"] == a["alert"]);
        let shared: Vec<&serde_json::Value> = given.iter().filter(|a| in_base(a)).collect();
        assert_eq!(
            names(&shared),
            names(&expected),
            "{place}: the Managed Prometheus alerts are the PrometheusRule's"
        );
        for own in given.iter().filter(|a| !in_base(a)) {
            assert!(
                !renders_fill_mirror
                    || !own["expr"]
                        .as_str()
                        .unwrap_or_default()
                        .contains("kube_pod_labels"),
                "{place}: {}: fill-mirror runs here; its own alerts replace kube-state-metrics' kept Pods",
                own["alert"]
            );
        }
        for (alert, prometheus) in shared.iter().zip(&expected) {
            let name = &alert["alert"];
            for field in ["expr", "for", "labels"] {
                assert_eq!(
                    alert.get(field),
                    prometheus.get(field),
                    "{place}: {name}: `{field}` differs from deploy/base's PrometheusRule"
                );
            }
        }
        for alert in &given {
            let name = &alert["alert"];
            for annotation in ["summary", "description"] {
                assert!(
                    alert["annotations"][annotation]
                        .as_str()
                        .is_some_and(|s| !s.trim().is_empty()),
                    "{place}: {name}: no {annotation}"
                );
            }
        }
        promtool_fires_and_clears(&format!("{place} Managed Prometheus rules"), &spec);
        let servers: BTreeSet<String> = documents
            .iter()
            .filter(|d| d["kind"] == "PolicyServer")
            .filter_map(|d| d["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        let scraped: BTreeSet<String> = documents
            .iter()
            .filter(|d| kind(d, &["PodMonitoring"]) && d["metadata"]["namespace"] == "kubewarden")
            .flat_map(|d| {
                d["spec"]["selector"]["matchExpressions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter(|e| e["key"] == "kubewarden/policy-server" && e["operator"] == "In")
            .flat_map(|e| e["values"].as_array().cloned().unwrap_or_default())
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        assert!(
            servers.is_subset(&scraped),
            "{place}: no PodMonitoring in kubewarden scrapes PolicyServers {:?}",
            servers.difference(&scraped).collect::<Vec<_>>()
        );
        checked += 1;
    }
    assert!(checked >= 1, "no overlay gives Managed Prometheus rules");
}

/// Minutes between two runs of a CronJob schedule of the forms the overlays use: `*/N * * * *`
/// (every N minutes) or `M */N * * *` (every N hours).
fn schedule_period_minutes(schedule: &str) -> u64 {
    let fields: Vec<&str> = schedule.split_whitespace().collect();
    let every = |field: &str| field.strip_prefix("*/").and_then(|n| n.parse::<u64>().ok());
    match fields.as_slice() {
        [minutes, "*", "*", "*", "*"] => every(minutes),
        [minute, hours, "*", "*", "*"] if minute.parse::<u64>().is_ok() => {
            every(hours).map(|h| h * 60)
        }
        _ => None,
    }
    .unwrap_or_else(|| panic!("schedule {schedule:?}: not `*/N * * * *` or `M */N * * *`"))
}

/// The kubelet's update of a mounted Secret: its sync period plus its cache (about a minute;
/// operations.md, "Credentials that expire"), rounded up.
const SECRET_SYNC_MINUTES: u64 = 2;

/// Every credentials CronJob of `deploy/` renews its token so that one run can fail and the next
/// still replaces the token before it expires: 2 periods + the kubelet's sync <= the lifetime of
/// the token it writes. ECR's (`aws ecr get-login-password`) last 12 hours. An Artifact Registry
/// token minted for the Google service account (`--impersonate-service-account`: IAM's
/// generateAccessToken) lasts 60 minutes from the run; one read from the metadata server may be a
/// cached one with as little as 4 minutes left (golang.org/x/oauth2 v0.21.0), which no schedule
/// keeps ahead of.
#[test]
fn every_token_refresh_keeps_ahead_of_the_tokens_life() {
    assert_eq!(schedule_period_minutes("*/20 * * * *"), 20);
    assert_eq!(schedule_period_minutes("0 */4 * * *"), 240);
    let mut checked = 0;
    for (place, documents) in rendered_overlays() {
        for job in documents
            .iter()
            .filter(|d| d["kind"] == "CronJob" && d["metadata"]["name"] == "mirror-credentials")
        {
            let period = schedule_period_minutes(job["spec"]["schedule"].as_str().unwrap_or(""));
            let text = serde_json::to_string(&job["spec"]["jobTemplate"]).expect("JSON");
            let (registry, lifetime) = if text.contains("aws ecr get-login-password") {
                ("ECR", 12 * 60)
            } else if text.contains("gcloud auth print-access-token") {
                if text.contains("--impersonate-service-account") {
                    ("Artifact Registry, a minted token", 60)
                } else {
                    ("Artifact Registry, the metadata server's token", 4)
                }
            } else {
                panic!("{place}: mirror-credentials writes a token of an unknown lifetime")
            };
            assert!(
                2 * period + SECRET_SYNC_MINUTES <= lifetime,
                "{place}: mirror-credentials every {period} min: its token ({registry}) lasts \
                 {lifetime} min, so after one failed run the next comes too late \
                 (2 x {period} + {SECRET_SYNC_MINUTES} min > {lifetime} min)"
            );
            checked += 1;
        }
    }
    assert!(checked >= 2, "only {checked} credentials CronJobs found");
}

/// The IAM policy documents of `deploy/eks-ecr/aws/`, by file name.
fn iam_policy(name: &str) -> serde_json::Value {
    rig::read_json(&rig::root().join("deploy/eks-ecr/aws").join(name))
}

/// The resources a policy document allows `action` on (its Allow statements; no Deny is used).
fn allowed_on(policy: &serde_json::Value, action: &str) -> Vec<String> {
    let list = |value: &serde_json::Value| -> Vec<String> {
        match value {
            serde_json::Value::String(s) => vec![s.clone()],
            serde_json::Value::Array(items) => items
                .iter()
                .filter_map(|i| i.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        }
    };
    policy["Statement"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["Effect"] == "Allow" && list(&s["Action"]).iter().any(|a| a == action))
        .flat_map(|s| list(&s["Resource"]))
        .collect()
}

/// The mirror of deploy/eks-ecr: (account, region, repository prefix), from its one value.
fn eks_mirror() -> (String, String, String) {
    overlay_mirror("eks-ecr")
}

/// The mirror of `deploy/<overlay>`: (account, region, repository prefix), from its one value.
fn overlay_mirror(overlay: &str) -> (String, String, String) {
    let kustomization = read(
        &rig::root()
            .join("deploy")
            .join(overlay)
            .join("kustomization.yaml"),
    );
    let mirror = kustomization
        .lines()
        .find_map(|l| l.trim().strip_prefix("- mirror="))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("deploy/{overlay}: the mirror= value"))
        .to_string();
    let (host, prefix) = mirror.split_once('/').expect("host/prefix");
    let parts: Vec<&str> = host.split('.').collect();
    (
        parts[0].to_string(),
        parts[3].to_string(),
        prefix.split('/').next().unwrap_or_default().to_string(),
    )
}

/// What each role of the EKS overlays does, as IAM actions: the fill controller's, read from the
/// flags the overlay runs it with (fill-mirror's `--ecr-registry` asks for the push token,
/// `--ecr-create-repositories` describes and creates a repository) and the `aws ecr` calls of the
/// lifecycle CronJob, plus what skopeo's copy needs from ECR's registry API (a pull of the
/// source's layers it checks, a push); the lookups' (the token and a pull); the pull-through
/// cache's (a pull that fills it); the lifecycle CronJob's, a role of its own (its `aws ecr`
/// calls). (fill job, reader, cache, lifecycle.)
fn what_the_roles_do() -> [BTreeSet<&'static str>; 4] {
    let (account, region, _) = eks_mirror();
    // The `aws ecr` subcommands a role's code calls, and the IAM action each needs.
    let action_of = |subcommand: &str| -> &'static str {
        match subcommand {
            "get-login-password" | "get-authorization-token" => "ecr:GetAuthorizationToken",
            "create-repository" => "ecr:CreateRepository",
            "describe-repositories" => "ecr:DescribeRepositories",
            "get-lifecycle-policy" => "ecr:GetLifecyclePolicy",
            "put-lifecycle-policy" => "ecr:PutLifecyclePolicy",
            other => panic!(
                "`aws ecr {other}`: add the IAM action it needs to this test and to \
                 deploy/eks-ecr/aws/fill-job.json"
            ),
        }
    };
    let calls = |text: &str| -> BTreeSet<&'static str> {
        text.split("aws ecr ")
            .skip(1)
            .filter_map(|rest| rest.split_whitespace().next())
            .map(|s| s.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '-'))
            .map(action_of)
            .collect()
    };
    let (_, eks) = rendered_overlays()
        .into_iter()
        .find(|(place, _)| place == "deploy/eks-ecr")
        .expect("deploy/eks-ecr");
    // The fallback where no repository creation template applies (the component
    // without-creation-template): the fill controller's flags there, and its lifecycle CronJob,
    // which runs with a role of its own.
    let fallback = rendered_with_component("eks-ecr", "without-creation-template");
    let args_of = |documents: &[serde_json::Value]| -> Vec<String> {
        documents
            .iter()
            .filter(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "fill-mirror")
            .flat_map(|d| {
                d["spec"]["template"]["spec"]["containers"]
                    .as_array()
                    .cloned()
            })
            .flatten()
            .filter(|c| c["name"] == "fill-mirror")
            .flat_map(|c| c["args"].as_array().cloned().unwrap_or_default())
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect()
    };
    let args = args_of(&eks);
    let host = format!("{account}.dkr.ecr.{region}.amazonaws.com");
    assert!(
        args.contains(&format!("--ecr-registry={host}")),
        "the fill controller's token is not the mirror's ({host}): {args:?}"
    );
    let mut fill_job: BTreeSet<&'static str> = args
        .iter()
        .chain(&args_of(&fallback))
        .flat_map(|arg| match arg.split('=').next().unwrap_or_default() {
            "--ecr-registry" => vec!["ecr:GetAuthorizationToken"],
            "--ecr-create-repositories" => {
                vec!["ecr:DescribeRepositories", "ecr:CreateRepository"]
            }
            flag if flag.starts_with("--ecr") || flag.starts_with("--aws") => panic!(
                "fill-mirror {flag}: add the ECR calls it makes to this test and to \
                 deploy/eks-ecr/aws/fill-job.json"
            ),
            _ => vec![],
        })
        .collect();
    let lifecycle = fallback
        .iter()
        .find(|d| d["kind"] == "CronJob" && d["metadata"]["name"] == "mirror-lifecycle")
        .expect("without-creation-template: the mirror-lifecycle CronJob");
    // Not the fill controller's identity: its role may not set a lifecycle policy.
    assert_eq!(
        lifecycle["spec"]["jobTemplate"]["spec"]["template"]["spec"]["serviceAccountName"],
        "mirror-lifecycle",
        "the lifecycle CronJob's ServiceAccount"
    );
    let lifecycle = lifecycle.to_string();
    let lifecycle = calls(&lifecycle);
    // Kept for create-on-push too: which permission a push that creates a repository by the
    // template checks is not stated in the AWS pages read (docs/development.md).
    fill_job.insert("ecr:CreateRepository");
    assert!(
        fill_job.contains("ecr:DescribeRepositories")
            && !fill_job.contains("ecr:PutLifecyclePolicy")
            && lifecycle.contains("ecr:PutLifecyclePolicy"),
        "{fill_job:?} {lifecycle:?}"
    );
    let pull = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"];
    let push = [
        "ecr:BatchCheckLayerAvailability",
        "ecr:InitiateLayerUpload",
        "ecr:UploadLayerPart",
        "ecr:CompleteLayerUpload",
        "ecr:PutImage",
    ];
    fill_job.extend(pull);
    fill_job.extend(push);
    let reader: BTreeSet<&str> = ["ecr:GetAuthorizationToken"]
        .into_iter()
        .chain(pull)
        .collect();
    let mut cache = reader.clone();
    cache.extend(["ecr:BatchImportUpstreamImage", "ecr:CreateRepository"]);
    [fill_job, reader, cache, lifecycle]
}

/// Whether an IAM resource pattern matches `arn`: `*` any run of characters (`/` included), `?`
/// one, as IAM matches an ARN.
fn arn_matches(pattern: &str, arn: &str) -> bool {
    match pattern.chars().next() {
        None => arn.is_empty(),
        Some('*') => {
            let rest = &pattern[1..];
            (0..=arn.len())
                .filter(|at| arn.is_char_boundary(*at))
                .any(|at| arn_matches(rest, &arn[at..]))
        }
        Some(wanted) => arn.chars().next().is_some_and(|c| {
            (wanted == '?' || c == wanted)
                && arn_matches(&pattern[wanted.len_utf8()..], &arn[c.len_utf8()..])
        }),
    }
}

/// `policy` (the document `file`) allows each action of `needs` on exactly what it needs, and
/// no more: `ecr:GetAuthorizationToken` on `*` (it has no resource), `ecr:DescribeRepositories`
/// on every repository of the registry (listing names them all), everything else on the
/// repositories `mirror` (ARN patterns) names, and a pull or a push also on `in_use` (the in-use
/// set's repository, where the watch publishes); no action it does not need, no wildcard action.
fn holds_to_least_privilege(
    file: &str,
    policy: &serde_json::Value,
    needs: &BTreeSet<&str>,
    mirror: &[String],
    in_use: &[String],
) {
    let (account, region, _) = eks_mirror();
    assert_eq!(policy["Version"], "2012-10-17", "{file}");
    for action in needs.iter() {
        let mut on = allowed_on(policy, action);
        on.sort();
        let mut wanted = match *action {
            "ecr:GetAuthorizationToken" => vec!["*".to_string()],
            "ecr:DescribeRepositories" => {
                vec![format!("arn:aws:ecr:{region}:{account}:repository/*")]
            }
            "ecr:CreateRepository" | "ecr:GetLifecyclePolicy" | "ecr:PutLifecyclePolicy" => {
                mirror.to_vec()
            }
            _ => [mirror, in_use].concat(),
        };
        wanted.sort();
        assert_eq!(on, wanted, "{file}: {action} is allowed on {on:?}");
    }
    // Least privilege: nothing the role does not need, on nothing but what it needs.
    for statement in policy["Statement"].as_array().expect("Statement") {
        let actions: Vec<String> = match &statement["Action"] {
            serde_json::Value::String(s) => vec![s.clone()],
            other => serde_json::from_value(other.clone()).expect("Action list"),
        };
        for action in &actions {
            assert!(
                needs.contains(action.as_str()),
                "{file}: {action} is allowed but not needed"
            );
            assert!(!action.contains('*'), "{file}: wildcard action {action}");
        }
        let resources: Vec<String> = match &statement["Resource"] {
            serde_json::Value::String(s) => vec![s.clone()],
            other => serde_json::from_value(other.clone()).expect("Resource list"),
        };
        if resources.iter().any(|r| r == "*") {
            assert_eq!(
                actions,
                ["ecr:GetAuthorizationToken"],
                "{file}: only the token has no resource"
            );
        }
    }
}

/// The IAM policies the docs give for ECR (`deploy/eks-ecr/aws/*.json`) allow what each role
/// does (`what_the_roles_do`), and no more than the mirror's repositories: everything but the
/// token and the listing on the repositories under the mirror's prefix (the pull-through
/// cache's: its rule's prefix).
#[test]
fn the_iam_policies_allow_what_the_lookups_and_the_fill_job_do() {
    let (account, region, prefix) = eks_mirror();
    let cache_prefix = overlay_mirror("eks-ecr-pull-through").2;
    let repositories = |prefix: &str| {
        vec![format!(
            "arn:aws:ecr:{region}:{account}:repository/{prefix}/*"
        )]
    };
    let [fill_job, reader, cache, lifecycle] = what_the_roles_do();
    let in_use = publishing_in_use(&account, &region);
    for (file, needs, under) in [
        ("fill-job.json", &fill_job, prefix.as_str()),
        ("lifecycle-job.json", &lifecycle, prefix.as_str()),
        ("policy-server-reader.json", &reader, prefix.as_str()),
        ("pull-through-cache.json", &cache, cache_prefix.as_str()),
    ] {
        let in_use: &[String] = if file == "fill-job.json" {
            &in_use
        } else {
            &[]
        };
        holds_to_least_privilege(file, &iam_policy(file), needs, &repositories(under), in_use);
    }
}

/// The in-use set's repository, when the fill controller as deploy/eks-ecr runs it publishes its
/// set (`FILL_MIRROR_CLUSTER_ID` set on its container): its pulls and pushes reach it too.
fn publishing_in_use(account: &str, region: &str) -> Vec<String> {
    let (_, eks) = rendered_overlays()
        .into_iter()
        .find(|(place, _)| place == "deploy/eks-ecr")
        .expect("deploy/eks-ecr");
    let publishes = eks
        .iter()
        .filter(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "fill-mirror")
        .flat_map(|d| {
            d["spec"]["template"]["spec"]["containers"]
                .as_array()
                .cloned()
        })
        .flatten()
        .flat_map(|c| c["env"].as_array().cloned().unwrap_or_default())
        .any(|e| e["name"] == "FILL_MIRROR_CLUSTER_ID");
    match publishes {
        true => vec![format!(
            "arn:aws:ecr:{region}:{account}:repository/image-swapper/in-use"
        )],
        false => Vec::new(),
    }
}

/// The prune's IAM policy (`prune-job.json`) is the only one that may delete: `ecr:BatchDeleteImage`
/// on the mirror's repositories (a stale anchor tag), besides listing them, reading their
/// manifests and, on the in-use repository only, reading the clusters' sets and pushing its
/// ledger; no other role of the EKS overlays holds a delete or a lifecycle action it would not
/// need, so the watch that anchors cannot remove an anchor or an image.
#[test]
fn only_the_prune_may_delete_and_only_under_the_mirror() {
    let (account, region, prefix) = eks_mirror();
    let policy = iam_policy("prune-job.json");
    let mirror = vec![format!(
        "arn:aws:ecr:{region}:{account}:repository/{prefix}/*"
    )];
    let in_use = vec![format!(
        "arn:aws:ecr:{region}:{account}:repository/image-swapper/in-use"
    )];
    let pull = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"];
    let push = [
        "ecr:BatchCheckLayerAvailability",
        "ecr:InitiateLayerUpload",
        "ecr:UploadLayerPart",
        "ecr:CompleteLayerUpload",
        "ecr:PutImage",
    ];
    let mut wanted: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    wanted.insert("ecr:GetAuthorizationToken", vec!["*".to_string()]);
    wanted.insert(
        "ecr:DescribeRepositories",
        vec![format!("arn:aws:ecr:{region}:{account}:repository/*")],
    );
    for action in ["ecr:DescribeImages", "ecr:BatchDeleteImage"] {
        wanted.insert(action, mirror.clone());
    }
    for action in push.into_iter().chain(["ecr:ListImages", pull[1]]) {
        wanted.insert(action, in_use.clone());
    }
    let mut both = [mirror.clone(), in_use.clone()].concat();
    both.sort();
    wanted.insert(pull[0], both);
    let statements = policy["Statement"].as_array().expect("Statement");
    let granted: BTreeSet<String> = statements
        .iter()
        .flat_map(|st| match &st["Action"] {
            serde_json::Value::String(a) => vec![a.clone()],
            other => serde_json::from_value(other.clone()).expect("Action list"),
        })
        .collect();
    assert_eq!(
        granted,
        wanted
            .keys()
            .map(|a| a.to_string())
            .collect::<BTreeSet<_>>(),
        "prune-job.json grants other actions than the prune's"
    );
    for (action, on) in &wanted {
        let mut allowed = allowed_on(&policy, action);
        allowed.sort();
        assert_eq!(
            &allowed, on,
            "prune-job.json: {action} is allowed on {allowed:?}"
        );
    }
    let deleting = [
        "ecr:BatchDeleteImage",
        "ecr:DeleteRepository",
        "ecr:DeleteLifecyclePolicy",
        "ecr:PutLifecyclePolicy",
    ];
    for file in [
        "fill-job.json",
        "policy-server-reader.json",
        "pull-through-cache.json",
    ] {
        let other = iam_policy(file);
        for action in deleting {
            // The lifecycle rules are set by the lifecycle CronJob's own role
            // (lifecycle-job.json), so the copying identity cannot expire the mirror.
            let on = allowed_on(&other, action);
            assert!(on.is_empty(), "{file} allows {action} on {on:?}");
        }
    }
}

/// A mirror at the registry's root (k8s-image-swapper's default layout: the source host is the
/// first path component, `docker.io/library/nginx`): `render.sh` takes it with the overlay's
/// `sourceHosts` and renders, for each role, what it does on the repositories of those hosts
/// (IAM's own matching: every repository `defaultMirror` makes of their images, none of another
/// host, none of the account's other repositories, none of a prefixed layout), and no more. It
/// refuses a root mirror without `sourceHosts`, a host with a port (no repository can be named
/// by it), and a pull-through overlay at the root (its cache rule has a prefix).
#[test]
fn a_mirror_at_the_registry_root_renders_the_repositories_of_its_source_hosts() {
    let (account, region, _) = eks_mirror();
    let host = format!("{account}.dkr.ecr.{region}.amazonaws.com");
    let scratch = std::env::temp_dir().join(format!("image-swapper-root-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let render = |overlay: &str, sources: Option<&str>| -> std::process::Output {
        let dir = scratch.join("overlay");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let original = read(
            &rig::root()
                .join("deploy")
                .join(overlay)
                .join("kustomization.yaml"),
        );
        let mut kustomization = String::new();
        for line in original.lines() {
            if line.trim_start().starts_with("- sourceHosts=") {
                continue;
            }
            let indent = &line[..line.len() - line.trim_start().len()];
            if line.trim_start().starts_with("- mirror=") {
                kustomization.push_str(&format!("{indent}- mirror={host}   # at the root\n"));
                if let Some(sources) = sources {
                    kustomization.push_str(&format!("{indent}- sourceHosts={sources}\n"));
                }
            } else {
                kustomization.push_str(line);
                kustomization.push('\n');
            }
        }
        std::fs::write(dir.join("kustomization.yaml"), kustomization).expect("kustomization");
        std::fs::copy(
            rig::root()
                .join("deploy")
                .join(overlay)
                .join("settings.yaml"),
            dir.join("settings.yaml"),
        )
        .expect("settings");
        Command::new("bash")
            .arg(rig::root().join("deploy/eks-ecr/aws/render.sh"))
            .arg(&dir)
            .arg("0123ABCD")
            .arg(scratch.join("out"))
            .output()
            .expect("bash with jq")
    };
    let rendered = render("eks-ecr", Some("docker.io,quay.io"));
    assert!(rendered.status.success(), "{rendered:?}");
    let [fill_job, reader, _, lifecycle] = what_the_roles_do();
    let arn = |repository: &str| format!("arn:aws:ecr:{region}:{account}:repository/{repository}");
    for (file, needs) in [
        ("fill-job.json", &fill_job),
        ("lifecycle-job.json", &lifecycle),
        ("policy-server-reader.json", &reader),
    ] {
        let policy = rig::read_json(&scratch.join("out").join(file));
        let in_use = match file {
            "fill-job.json" => publishing_in_use(&account, &region),
            _ => Vec::new(),
        };
        holds_to_least_privilege(
            file,
            &policy,
            needs,
            &[arn("docker.io/*"), arn("quay.io/*")],
            &in_use,
        );
        // What each role does on a repository of the mirror: the lifecycle job sets its policy.
        let action = match file {
            "lifecycle-job.json" => "ecr:PutLifecyclePolicy",
            _ => "ecr:BatchGetImage",
        };
        let allowed = |repository: &str| {
            allowed_on(&policy, action)
                .iter()
                .any(|pattern| arn_matches(pattern, &arn(repository)))
        };
        for mirrored in [
            "docker.io/library/nginx",
            "quay.io/org/app",
            "docker.io/a/b/c",
        ] {
            assert!(allowed(mirrored), "{file}: {mirrored} is not allowed");
        }
        for other in [
            "ghcr.io/org/app",
            "team/app",
            "docker.io",
            "docker.io-lookalike/app",
            "cache/docker.io/library/nginx",
        ] {
            assert!(!allowed(other), "{file}: {other} is allowed");
        }
    }
    for (overlay, sources, says) in [
        ("eks-ecr", None, "needs sourceHosts="),
        ("eks-ecr", Some("docker.io,localhost:5000"), "no port"),
        (
            "eks-ecr-pull-through",
            Some("docker.io"),
            "its rule's prefix",
        ),
    ] {
        let refused = render(overlay, sources);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            refused.status.code() == Some(2) && stderr.contains(says),
            "{overlay} {sources:?}: {refused:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
}

/// The IAM documents of `deploy/eks-ecr/aws/` are what `render.sh` makes of the overlays' one
/// value each (the mirror), byte for byte: the copying overlay's trust policies, fill-job.json
/// and policy-server-reader.json, the pull-through overlay's pull-through-cache.json; and a
/// mirror of another account, region and prefix is rendered into every ARN and the OIDC
/// provider, with nothing of the example's left.
#[test]
fn the_iam_documents_are_rendered_from_the_overlays_mirror() {
    const OIDC: &str = "EXAMPLED539D4633E53DE1B71EXAMPLE";
    let script = rig::root().join("deploy/eks-ecr/aws/render.sh");
    let scratch = std::env::temp_dir().join(format!("image-swapper-render-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let render = |overlay: &Path, oidc: &str| -> BTreeMap<String, String> {
        let out = scratch.join("out");
        let _ = std::fs::remove_dir_all(&out);
        let output = Command::new("bash")
            .arg(&script)
            .arg(overlay)
            .arg(oidc)
            .arg(&out)
            .output()
            .expect("bash with jq");
        assert!(output.status.success(), "{output:?}");
        std::fs::read_dir(&out)
            .expect("rendered")
            .filter_map(Result::ok)
            .map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                (name, read(&e.path()))
            })
            .collect()
    };
    let mut rendered = 0;
    for (overlay, files) in [
        (
            "eks-ecr",
            &[
                "irsa-trust-mirror-credentials.json",
                "irsa-trust-fill-mirror.json",
                "fill-job.json",
                "policy-server-reader.json",
                "prune-job.json",
                "irsa-trust-mirror-unanchor.json",
                "irsa-trust-mirror-lifecycle.json",
                "lifecycle-job.json",
            ][..],
        ),
        (
            "eks-ecr-pull-through",
            &[
                "irsa-trust-mirror-credentials.json",
                "irsa-trust-fill-mirror.json",
                "pull-through-cache.json",
            ][..],
        ),
    ] {
        let made = render(&rig::root().join("deploy").join(overlay), OIDC);
        assert_eq!(
            made.keys().map(String::as_str).collect::<BTreeSet<_>>(),
            files.iter().copied().collect::<BTreeSet<_>>(),
            "deploy/{overlay}"
        );
        for (name, text) in &made {
            assert_eq!(
                &read(&rig::root().join("deploy/eks-ecr/aws").join(name)),
                text,
                "deploy/eks-ecr/aws/{name} is not what render.sh makes of deploy/{overlay}'s mirror"
            );
            rendered += 1;
        }
    }
    assert_eq!(rendered, 11);
    // Another mirror: the one value reaches every ARN.
    let dir = scratch.join("overlay");
    std::fs::create_dir_all(&dir).expect("dir");
    let kustomization = read(&rig::root().join("deploy/eks-ecr/kustomization.yaml")).replace(
        "123456789012.dkr.ecr.eu-west-1.amazonaws.com/cache",
        "210987654321.dkr.ecr.ap-south-2.amazonaws.com/mirror",
    );
    std::fs::write(dir.join("kustomization.yaml"), kustomization).expect("kustomization");
    std::fs::copy(
        rig::root().join("deploy/eks-ecr/settings.yaml"),
        dir.join("settings.yaml"),
    )
    .expect("settings");
    for (name, text) in render(&dir, "0123ABCD") {
        for old in ["123456789012", "eu-west-1", "/cache/", OIDC] {
            assert!(!text.contains(old), "{name} keeps {old}: {text}");
        }
        assert!(text.contains("210987654321"), "{name}: {text}");
        let arns_prefixed = !text.contains("repository/")
            || text.contains("repository/mirror/*")
            || name == "fill-job.json"
            || name == "lifecycle-job.json";
        assert!(arns_prefixed, "{name}: {text}");
    }
    let _ = std::fs::remove_dir_all(&scratch);
}

/// Every `aws` command of install-eks.md and migrating.md, as the AWS CLI parses it (its own
/// argument parser; `file://` parameters read from the repository's root, so the files in
/// `deploy/eks-ecr/aws/` they name must exist and parse as the parameter), is a valid request
/// under botocore's model of the service: required members, types, lengths and the enums the
/// service checks (`appliedFor`, `imageTagMutability`, `upstreamRegistry`). Nothing is sent:
/// `tests/rig/aws_cli_check.py` stops each call where the request would be built. (moto 5.1.22,
/// the tests' ECR, implements neither CreateRepositoryCreationTemplate nor
/// CreatePullThroughCacheRule, so these two are checked against the model only.)
#[test]
fn every_aws_command_of_the_docs_is_a_valid_request() {
    let mut commands = Vec::new();
    for page in ["docs/install-eks.md", "docs/migrating.md"] {
        let text = read(&rig::root().join(page));
        let mut in_console = false;
        let mut current = String::new();
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                in_console = line.trim() == "```console";
                continue;
            }
            if !in_console {
                continue;
            }
            // A block in a list item is indented.
            let line = line.trim_start().trim_start_matches("$ ");
            if current.is_empty() && !line.starts_with("aws ") {
                continue;
            }
            let (part, more) = match line.strip_suffix('\\') {
                Some(part) => (part, true),
                None => (line, false),
            };
            current.push_str(part);
            current.push(' ');
            if !more {
                // The command alone: not what a shell does with its output.
                let command = current.split(" | ").next().unwrap_or_default();
                let command = command.split(" # ").next().unwrap_or_default().trim();
                commands.push((page, command.to_string()));
                current.clear();
            }
        }
    }
    let operations = |wanted: &str| commands.iter().filter(|(_, c)| c.contains(wanted)).count();
    assert!(
        operations("aws ecr create-repository-creation-template") >= 2
            && operations("aws ecr create-pull-through-cache-rule") >= 1
            && operations("aws secretsmanager create-secret") >= 1,
        "the ECR set-up's commands: {commands:#?}"
    );
    let mut child = Command::new("python3")
        .arg(rig::root().join("tests/rig/aws_cli_check.py"))
        .current_dir(rig::root())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with the AWS CLI (scripts/ensure-python-tools.sh)");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        for (_, command) in &commands {
            writeln!(stdin, "{command}").expect("write");
        }
    }
    let output = child.wait_with_output().expect("aws_cli_check.py");
    assert!(output.status.success(), "{output:?}");
    let results: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(results.len(), commands.len(), "{output:?}");
    let broken: Vec<String> = results
        .iter()
        .zip(&commands)
        .filter(|(r, _)| r.get("error").is_some() || r.get("operation").is_none())
        .map(|(r, (page, c))| format!("{page}: {c}\n  {}", r["error"]))
        .collect();
    assert!(
        broken.is_empty(),
        "the AWS CLI refuses:\n{}\n{}",
        broken.join("\n"),
        String::from_utf8_lossy(&output.stderr)
    );
    // The lifecycle rule the templates carry is the file's.
    let lifecycle = read(&rig::root().join("deploy/eks-ecr/aws/lifecycle-policy.json"));
    let templates: Vec<&serde_json::Value> = results
        .iter()
        .filter(|r| r["operation"] == "CreateRepositoryCreationTemplate")
        .collect();
    for template in &templates {
        assert_eq!(
            template["params"]["lifecyclePolicy"].as_str(),
            Some(lifecycle.as_str()),
            "{template}"
        );
    }
    let applied: BTreeSet<String> = templates
        .iter()
        .flat_map(|t| {
            t["params"]["appliedFor"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    assert!(
        applied.contains("CREATE_ON_PUSH") && applied.contains("PULL_THROUGH_CACHE"),
        "{applied:?}"
    );
    // The fill controller copies a re-signed source's cosign tags over the mirror's: the
    // repositories it pushes to (the template's, and k8s-image-swapper's made immutable by
    // migrating.md) exempt exactly those from immutability.
    let digest = "sha256-".to_string() + &"0a1b2c3d".repeat(8);
    let exempt = [".sig", ".att", ".sbom"].map(|suffix| format!("{digest}{suffix}"));
    let immutable = ["1.27.3", "latest", digest.as_str(), "sha256-sig"];
    let mut immutables = 0;
    for result in results.iter().filter(|r| {
        (r["operation"] == "CreateRepositoryCreationTemplate"
            && r["params"]["appliedFor"]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x == "CREATE_ON_PUSH")))
            || r["operation"] == "PutImageTagMutability"
    }) {
        let params = &result["params"];
        assert_eq!(
            params["imageTagMutability"], "IMMUTABLE_WITH_EXCLUSION",
            "{result}"
        );
        let filters: Vec<&str> = params["imageTagMutabilityExclusionFilters"]
            .as_array()
            .into_iter()
            .flatten()
            .inspect(|f| assert_eq!(f["filterType"], "WILDCARD", "{result}"))
            .filter_map(|f| f["filter"].as_str())
            .collect();
        let exempted = |tag: &str| filters.iter().any(|f| wildcard_matches(f, tag));
        for tag in &exempt {
            assert!(exempted(tag), "{tag} stays immutable: {result}");
        }
        for tag in immutable {
            assert!(
                !exempted(tag),
                "{tag} is exempt from immutability: {result}"
            );
        }
        immutables += 1;
    }
    assert!(
        immutables >= 2,
        "the template and migrating.md's repositories"
    );
    // Scan on push reaches the template's repositories: a rule of the registry's scanning
    // configuration whose filter matches a repository under the template's prefix.
    let scanned = results
        .iter()
        .filter(|r| r["operation"] == "PutRegistryScanningConfiguration")
        .flat_map(|r| r["params"]["rules"].as_array().cloned().unwrap_or_default())
        .filter(|rule| rule["scanFrequency"] == "SCAN_ON_PUSH")
        .flat_map(|rule| {
            rule["repositoryFilters"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|f| f["filter"].as_str().map(str::to_string))
        .collect::<Vec<_>>();
    for template in templates.iter().filter(|t| {
        t["params"]["appliedFor"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "CREATE_ON_PUSH"))
    }) {
        let repository = format!(
            "{}/docker.io/library/nginx",
            template["params"]["prefix"].as_str().unwrap_or_default()
        );
        assert!(
            scanned.iter().any(|f| wildcard_matches(f, &repository)),
            "no SCAN_ON_PUSH filter of {scanned:?} reaches {repository}"
        );
    }
}

/// ECR's `WILDCARD` filters: `*` stands for any run of characters, everything else for itself.
fn wildcard_matches(filter: &str, text: &str) -> bool {
    let parts: Vec<&str> = filter.split('*').collect();
    let (first, rest) = parts.split_first().expect("split yields one part at least");
    let Some(mut left) = text.strip_prefix(first) else {
        return false;
    };
    let Some((last, middle)) = rest.split_last() else {
        return left.is_empty();
    };
    for part in middle {
        match left.find(part) {
            Some(at) => left = &left[at + part.len()..],
            None => return false,
        }
    }
    left.len() >= last.len() && left.ends_with(last)
}

#[test]
fn ecr_wildcards_are_matched_as_ecr_reads_them() {
    assert!(wildcard_matches("sha256-*.sig", "sha256-ab.sig"));
    assert!(!wildcard_matches("sha256-*.sig", "sha256-ab.sig.att"));
    assert!(!wildcard_matches("sha256-*.sig", "sha256-ab"));
    assert!(wildcard_matches("cache/*", "cache/docker.io/library/nginx"));
    assert!(!wildcard_matches("cache/*", "other/cache/x"));
    assert!(wildcard_matches("latest", "latest"));
    assert!(!wildcard_matches("latest", "latest2"));
    assert!(wildcard_matches("a*b*c", "abc"));
    assert!(!wildcard_matches("a*bc*c", "abc"));
}

/// `deploy/<overlay>` with its component `deploy/<overlay>/<component>` added, as a user adds
/// it (a line of `components:`), rendered: a kustomization in a scratch folder naming both by
/// relative paths (kustomize refuses absolute ones).
fn rendered_with_component(overlay: &str, component: &str) -> Vec<serde_json::Value> {
    // One folder per call: tests calling this at once must not remove each other's.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "image-swapper-component-{}-{component}-{call}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let up = "../".repeat(dir.components().count() - 1);
    let root = rig::root();
    let root = root.to_string_lossy();
    let root = root.trim_start_matches('/');
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {up}{root}/deploy/{overlay}\ncomponents:\n  - {up}{root}/deploy/{overlay}/{component}\n"
        ),
    )
    .expect("kustomization");
    let output = Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .expect("kubectl");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        output.status.success(),
        "deploy/{overlay} with {component}: {output:?}"
    );
    serde_yaml::Deserializer::from_slice(&output.stdout)
        .map(|document| serde::Deserialize::deserialize(document).expect("rendered YAML"))
        .collect()
}

/// deploy/eks-ecr/aws/lifecycle-policy.json as 0.7.0 shipped it: an age-only rule, which expired
/// running images too.
const AGE_ONLY_0_7: &str = r#"{"rules":[{"rulePriority":1,"description":"Expire images pushed more than 30 days ago: the check reports their Pods and the fill job copies them again","selection":{"tagStatus":"any","countType":"sinceImagePushed","countUnit":"days","countNumber":30},"action":{"type":"expire"}}]}"#;

/// The lifecycle CronJob of the overlay's fallback component (without-creation-template), its
/// script run against moto's ECR (whose PutLifecyclePolicy
/// validates the policy as ECR's grammar has it), for the overlay's mirror under a prefix and for
/// a mirror at the registry's root (k8s-image-swapper's default layout, the repositories under
/// the overlay's `sourceHosts`): every repository of the mirror without a lifecycle policy gets
/// `deploy/eks-ecr/aws/lifecycle-policy.json`, one with its own keeps it, one outside the
/// mirror is left alone, one still holding the age-only rule of 0.7.0 gets the file's, and a
/// second run changes nothing.
#[test]
fn the_lifecycle_job_gives_the_fill_jobs_repositories_the_30_day_rule() {
    let eks = rendered_with_component("eks-ecr", "without-creation-template");
    let job = eks
        .iter()
        .find(|d| d["kind"] == "CronJob" && d["metadata"]["name"] == "mirror-lifecycle")
        .expect("the mirror-lifecycle CronJob");
    let pod = &job["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let script = container["command"][2].as_str().expect("bash -c SCRIPT");
    let env = |name: &str| -> String {
        container["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
            .unwrap_or_else(|| panic!("env {name}"))
            .to_string()
    };
    let policy_file = read(&rig::root().join("deploy/eks-ecr/aws/lifecycle-policy.json"));
    let config_map = pod["volumes"][0]["configMap"]["name"]
        .as_str()
        .expect("ConfigMap");
    let data = eks
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == config_map)
        .map(|d| d["data"]["lifecycle-policy.json"].clone())
        .expect("the lifecycle ConfigMap");
    assert_eq!(data.as_str(), Some(policy_file.as_str()));
    let (account, region, prefix) = eks_mirror();
    let host = format!("{account}.dkr.ecr.{region}.amazonaws.com");
    assert_eq!(
        (env("AWS_REGION"), env("MIRROR"), env("SOURCE_HOSTS")),
        (
            region,
            format!("{host}/{prefix}"),
            "docker.io,quay.io,ghcr.io".to_string()
        )
    );
    let dir = std::env::temp_dir().join(format!("image-swapper-lifecycle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("lifecycle-policy.json"), &policy_file).expect("write");
    let script = script.replace("file:///policy/", &format!("file://{}/", dir.display()));
    let own = r#"{"rules":[{"rulePriority":1,"selection":{"tagStatus":"any","countType":"imageCountMoreThan","countNumber":5},"action":{"type":"expire"}}]}"#;
    // (mirror, its repositories without a policy, one with its own, others of the account)
    let under_the_prefix = format!("{prefix}/docker.io/library/nginx");
    let layouts = [
        (
            env("MIRROR"),
            vec![under_the_prefix.clone()],
            format!("{prefix}/docker.io/library/redis"),
            vec![
                "other/app".to_string(),
                "docker.io/library/nginx".to_string(),
            ],
        ),
        (
            host.clone(),
            vec![
                "docker.io/library/nginx".to_string(),
                "ghcr.io/org/app".to_string(),
            ],
            "quay.io/org/app".to_string(),
            vec![
                "other/app".to_string(),
                "gcr.io/org/app".to_string(),
                under_the_prefix,
            ],
        ),
    ];
    for (mirror, new, kept, others) in layouts {
        let moto = rig::ecr::Moto::start().expect("moto");
        for name in new.iter().chain([&kept]).chain(&others) {
            moto.ecr(
                "CreateRepository",
                &serde_json::json!({"repositoryName": name}),
            )
            .expect("CreateRepository");
        }
        moto.ecr(
            "PutLifecyclePolicy",
            &serde_json::json!({"repositoryName": kept, "lifecyclePolicyText": own}),
        )
        .expect("PutLifecyclePolicy");
        // The first of the mirror's repositories still holds the age-only rule 0.7.0's job gave:
        // it is replaced by the file's, which keeps what a cluster anchors.
        moto.ecr(
            "PutLifecyclePolicy",
            &serde_json::json!({"repositoryName": new[0], "lifecyclePolicyText": AGE_ONLY_0_7}),
        )
        .expect("PutLifecyclePolicy");
        let run = || {
            let output = Command::new("bash")
                .args(["-c", &script])
                .envs(moto.environment())
                .env("AWS_DEFAULT_REGION", env("AWS_REGION"))
                .env("MIRROR", &mirror)
                .env("SOURCE_HOSTS", env("SOURCE_HOSTS"))
                .env("AGE_ONLY", env("AGE_ONLY"))
                .output()
                .expect("bash");
            assert!(output.status.success(), "{output:?}");
            String::from_utf8_lossy(&output.stdout).to_string()
        };
        let first = run();
        let second = run();
        let lifecycle = |name: &str| {
            moto.ecr(
                "GetLifecyclePolicy",
                &serde_json::json!({"repositoryName": name}),
            )
            .ok()
            .and_then(|a| a["lifecyclePolicyText"].as_str().map(str::to_string))
        };
        let parsed = |text: Option<String>| {
            text.map(|t| serde_json::from_str::<serde_json::Value>(&t).expect("JSON"))
        };
        let mut set: Vec<&str> = first
            .lines()
            .filter_map(|line| line.strip_prefix("lifecycle policy set on "))
            .collect();
        set.sort();
        assert_eq!(set, new, "{mirror}: {first}");
        assert_eq!(second.trim(), "", "{mirror}: a second run changes nothing");
        for name in &new {
            assert_eq!(
                parsed(lifecycle(name)),
                Some(serde_json::from_str(&policy_file).expect("the policy file is JSON")),
                "{mirror}: {name}"
            );
        }
        assert_eq!(parsed(lifecycle(&kept)), parsed(Some(own.to_string())));
        for name in &others {
            assert_eq!(lifecycle(name), None, "{mirror}: {name}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The roles install-eks.md creates for deploy/eks-ecr are the ones its ServiceAccounts name: each
/// `aws iam create-role --role-name R --assume-role-policy-document file://…/irsa-trust-SA.json`
/// trusts exactly `system:serviceaccount:kubewarden:SA` (for `sts.amazonaws.com`), and the
/// overlay's ServiceAccount SA carries `eks.amazonaws.com/role-arn` of role R; each role made
/// for EKS Pod Identity trusts the agent (`pods.eks.amazonaws.com`, `sts:AssumeRole` and
/// `sts:TagSession`) and is associated with a ServiceAccount the overlay makes.
#[test]
fn the_irsa_roles_are_the_ones_the_service_accounts_name() {
    let install = read(&rig::root().join("docs/install-eks.md")).replace("\\\n", " ");
    let (_, mut eks) = rendered_overlays()
        .into_iter()
        .find(|(place, _)| place == "deploy/eks-ecr")
        .expect("deploy/eks-ecr");
    // The lifecycle CronJob's ServiceAccount comes with the component that runs it.
    eks.extend(
        rendered_with_component("eks-ecr", "without-creation-template")
            .into_iter()
            .filter(|d| {
                d["kind"] == "ServiceAccount" && d["metadata"]["name"] == "mirror-lifecycle"
            }),
    );
    let mut checked = 0;
    let mut pod_identity = 0;
    for command in install
        .lines()
        .filter(|l| l.starts_with("aws iam create-role "))
    {
        let words: Vec<&str> = command.split_whitespace().collect();
        let after = |flag: &str| {
            words
                .iter()
                .position(|w| *w == flag)
                .and_then(|i| words.get(i + 1))
                .unwrap_or_else(|| panic!("{command}: no {flag}"))
                .to_string()
        };
        let role = after("--role-name");
        let trust_path = after("--assume-role-policy-document");
        let trust_path = trust_path.strip_prefix("file://").expect("file://");
        if trust_path.ends_with("pod-identity-trust.json") {
            // EKS Pod Identity: the agent's principal, and an association of this role with a
            // ServiceAccount of the overlay.
            let trust = rig::read_json(&rig::root().join(trust_path));
            assert_eq!(
                trust["Statement"][0]["Principal"]["Service"], "pods.eks.amazonaws.com",
                "{trust_path}"
            );
            assert_eq!(
                trust["Statement"][0]["Action"],
                serde_json::json!(["sts:AssumeRole", "sts:TagSession"]),
                "{trust_path}"
            );
            let association = install
                .lines()
                .filter(|l| l.starts_with("aws eks create-pod-identity-association "))
                .find(|l| l.ends_with(&format!(":role/{role}")))
                .unwrap_or_else(|| panic!("install.md: no Pod Identity association for {role}"));
            let words: Vec<&str> = association.split_whitespace().collect();
            let account = words
                .iter()
                .position(|w| *w == "--service-account")
                .and_then(|i| words.get(i + 1))
                .expect("--service-account");
            assert!(
                eks.iter().any(|d| d["kind"] == "ServiceAccount"
                    && d["metadata"]["name"] == *account
                    && d["metadata"]["namespace"] == "kubewarden"),
                "install.md associates {role} with {account}, which deploy/eks-ecr does not make"
            );
            pod_identity += 1;
            continue;
        }
        let account = trust_path
            .rsplit_once("irsa-trust-")
            .and_then(|(_, name)| name.strip_suffix(".json"))
            .expect("irsa-trust-SA.json");
        let trust = rig::read_json(&rig::root().join(trust_path));
        let conditions = &trust["Statement"][0]["Condition"]["StringEquals"];
        let value = |suffix: &str| -> Vec<String> {
            conditions
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, _)| k.ends_with(suffix))
                .filter_map(|(_, v)| v.as_str().map(str::to_string))
                .collect()
        };
        assert_eq!(
            value(":sub"),
            [format!("system:serviceaccount:kubewarden:{account}")],
            "{trust_path}"
        );
        assert_eq!(value(":aud"), ["sts.amazonaws.com"], "{trust_path}");
        assert_eq!(
            trust["Statement"][0]["Action"], "sts:AssumeRoleWithWebIdentity",
            "{trust_path}"
        );
        let annotation = eks
            .iter()
            .find(|d| d["kind"] == "ServiceAccount" && d["metadata"]["name"] == account)
            .and_then(|d| d["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].as_str())
            .unwrap_or_else(|| panic!("deploy/eks-ecr: no ServiceAccount {account} with a role"));
        assert!(
            annotation.ends_with(&format!(":role/{role}")),
            "deploy/eks-ecr: ServiceAccount {account} names {annotation}, install-eks.md creates {role}"
        );
        checked += 1;
    }
    assert_eq!(
        checked, 4,
        "the read role, the fill job's, the unanchoring CronJob's and the lifecycle CronJob's, by IRSA"
    );
    assert_eq!(
        pod_identity, 4,
        "the read role, the fill job's, the unanchoring CronJob's and the lifecycle CronJob's, by EKS Pod Identity"
    );
}

/// Every overlay that runs the fill controller runs the release's image, by the tag of the
/// crates' version (the release adds the digest: release.yml), as two replicas that elect a
/// copier, with the least privileges its image needs: non-root, a read-only root file system
/// whose only writable place is the `emptyDir` skopeo's TMPDIR names, no capability, the runtime's
/// seccomp profile; its probes and its ServiceMonitor on the port named `metrics`.
#[test]
fn the_fill_controller_runs_the_releases_image_with_least_privileges() {
    let fill_mirror_version = read(&rig::root().join("fill-mirror/Cargo.toml"))
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .map(|v| v.trim_matches('"').to_string())
        .expect("fill-mirror/Cargo.toml: version");
    assert_eq!(
        fill_mirror_version,
        env!("CARGO_PKG_VERSION"),
        "the two crates' versions"
    );
    let image = format!(
        "ghcr.io/image-swapper-policy/fill-mirror:v{}",
        env!("CARGO_PKG_VERSION")
    );
    let mut running = 0;
    for (place, documents) in rendered_overlays() {
        let Some(deployment) = documents
            .iter()
            .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "fill-mirror")
        else {
            continue;
        };
        running += 1;
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(deployment["spec"]["replicas"], 2, "{place}");
        assert_eq!(pod["serviceAccountName"], "fill-mirror", "{place}");
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{place}");
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{place}"
        );
        let containers = pod["containers"].as_array().expect("containers");
        assert_eq!(containers.len(), 1, "{place}: one container");
        let container = &containers[0];
        assert_eq!(container["image"], image.as_str(), "{place}");
        assert_eq!(container["args"][0], "watch", "{place}");
        let security = &container["securityContext"];
        assert_eq!(security["readOnlyRootFilesystem"], true, "{place}");
        assert_eq!(security["allowPrivilegeEscalation"], false, "{place}");
        assert_eq!(
            security["capabilities"]["drop"],
            serde_json::json!(["ALL"]),
            "{place}"
        );
        let env = |name: &str| {
            container["env"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| e["name"] == name)
                .and_then(|e| e["value"].as_str())
        };
        let tmp = env("TMPDIR").unwrap_or_else(|| panic!("{place}: no TMPDIR"));
        let mount = container["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["mountPath"] == tmp)
            .unwrap_or_else(|| panic!("{place}: nothing mounted at TMPDIR {tmp}"));
        let volume = pod["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == mount["name"])
            .unwrap_or_else(|| panic!("{place}: no volume {}", mount["name"]));
        assert!(
            volume.get("emptyDir").is_some(),
            "{place}: TMPDIR on {volume}"
        );
        assert!(
            mount.get("readOnly") != Some(&serde_json::json!(true)),
            "{place}: TMPDIR read-only"
        );
        let port = container["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == "metrics")
            .unwrap_or_else(|| panic!("{place}: no port named metrics"));
        let listen = container["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str())
            .skip_while(|a| *a != "--listen")
            .nth(1)
            .unwrap_or("0.0.0.0:8080");
        assert!(
            listen.ends_with(&format!(":{}", port["containerPort"])),
            "{place}: --listen {listen} is not the metrics port {port}"
        );
        for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
            assert_eq!(
                container[probe]["httpGet"]["path"], path,
                "{place}: {probe}"
            );
            assert_eq!(
                container[probe]["httpGet"]["port"], "metrics",
                "{place}: {probe}"
            );
        }
        let service = documents
            .iter()
            .find(|d| d["kind"] == "Service" && d["metadata"]["name"] == "fill-mirror")
            .unwrap_or_else(|| panic!("{place}: no Service fill-mirror"));
        assert_eq!(
            service["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"],
            "{place}: the Service selects the controller's Pods"
        );
        if let Some(monitor) = documents
            .iter()
            .find(|d| d["kind"] == "ServiceMonitor" && d["metadata"]["name"] == "fill-mirror")
        {
            assert_eq!(
                monitor["spec"]["endpoints"][0]["port"], "metrics",
                "{place}"
            );
            assert_eq!(
                monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"],
                "{place}: the ServiceMonitor selects the Service"
            );
        }
    }
    assert!(running >= 2, "{running} overlays run the fill controller");
}

/// The prune's CronJob, where an overlay renders it: a dry run (no `--delete` until the operator
/// adds it) of the release's image, pruning under the overlay's own mirror, with its own
/// docker-config Secret (a login that may delete, not the fill controller's) and a ServiceAccount
/// that has no token and no binding: it reads everything from the registry.
#[test]
fn the_prune_runs_dry_with_its_own_login_and_no_kubernetes_rights() {
    let image = format!(
        "ghcr.io/image-swapper-policy/fill-mirror:v{}",
        env!("CARGO_PKG_VERSION")
    );
    let mut pruning = 0;
    for (place, documents) in rendered_overlays() {
        let Some(cron) = documents
            .iter()
            .find(|d| d["kind"] == "CronJob" && d["metadata"]["name"] == "mirror-prune")
        else {
            continue;
        };
        pruning += 1;
        let pod = &cron["spec"]["jobTemplate"]["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], "mirror-prune", "{place}");
        assert_eq!(pod["automountServiceAccountToken"], false, "{place}");
        let account = documents
            .iter()
            .find(|d| d["kind"] == "ServiceAccount" && d["metadata"]["name"] == "mirror-prune")
            .unwrap_or_else(|| panic!("{place}: no ServiceAccount mirror-prune"));
        assert_eq!(account["automountServiceAccountToken"], false, "{place}");
        let bound: Vec<&serde_json::Value> = documents
            .iter()
            .filter(|d| {
                d["subjects"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|s| s["name"] == "mirror-prune")
            })
            .collect();
        assert!(bound.is_empty(), "{place}: the prune is bound: {bound:?}");
        let container = &pod["containers"][0];
        assert_eq!(container["image"], image.as_str(), "{place}");
        let args: Vec<&str> = container["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str())
            .collect();
        assert_eq!(args[..2], ["prune", "--mirror"], "{place}");
        assert!(
            !args.contains(&"--delete"),
            "{place}: not a dry run: {args:?}"
        );
        let mirror = documents
            .iter()
            .filter(|d| d["kind"] == "ClusterAdmissionPolicy")
            .find_map(|d| d["spec"]["settings"]["mirrors"][0]["target"].as_str())
            .unwrap_or_else(|| panic!("{place}: no mirror target"));
        assert_eq!(
            args[2], mirror,
            "{place}: the prune's mirror is the swapping's"
        );
        let secret = pod["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|v| v["secret"]["secretName"].as_str());
        assert_eq!(secret, Some("mirror-prune"), "{place}: its own login");
    }
    assert!(pruning >= 1, "no overlay renders the prune");
}

/// The component `deploy/registry/unanchor`, turned on as the overlay's comment says, makes the
/// prune's CronJob remove anchors only: `--unanchor-only` among its arguments, the overlay's
/// mirror still the one it prunes under.
#[test]
fn the_unanchor_component_turns_the_prune_into_anchor_removal_under_the_overlays_mirror() {
    let dir = std::env::temp_dir().join(format!("unanchor-component-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let copy = Command::new("cp")
        .arg("-r")
        .arg(rig::root().join("deploy"))
        .arg(&dir)
        .status()
        .expect("cp");
    assert!(copy.success());
    let overlay = dir.join("deploy/registry");
    let kustomization = std::fs::read_to_string(overlay.join("kustomization.yaml")).expect("read");
    let commented = "# components:\n#   - unanchor ";
    assert!(
        kustomization.contains(commented),
        "deploy/registry/kustomization.yaml no longer shows the component as {commented:?}"
    );
    let on = kustomization
        .replace(commented, "components:\n  - unanchor ")
        .replace(
            "mirror=mirror.example.com/dockerhub",
            "mirror=other.example.org/hub",
        );
    std::fs::write(overlay.join("kustomization.yaml"), on).expect("write");
    let output = Command::new("kubectl")
        .arg("kustomize")
        .arg(&overlay)
        .output()
        .expect("kubectl");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(output.status.success(), "{output:?}");
    let prune = serde_yaml::Deserializer::from_slice(&output.stdout)
        .map(|document| {
            let value: serde_json::Value =
                serde::Deserialize::deserialize(document).expect("rendered YAML");
            value
        })
        .find(|d| d["kind"] == "CronJob" && d["metadata"]["name"] == "mirror-prune")
        .expect("the CronJob mirror-prune");
    let args = &prune["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"];
    let args: Vec<&str> = (args.as_array().expect("args").iter())
        .filter_map(|a| a.as_str())
        .collect();
    assert_eq!(
        &args[..3],
        ["prune", "--mirror", "other.example.org/hub"],
        "{args:?}"
    );
    assert!(args.contains(&"--unanchor-only"), "{args:?}");
    assert!(
        !args.contains(&"--delete"),
        "a dry run until the user adds --delete: {args:?}"
    );
}
