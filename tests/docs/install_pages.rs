//! The install pages against what a real cluster would make of them, where CI cannot run the
//! step itself: the CRDs an overlay's objects need are installed before the page applies it, the
//! OpenTelemetry Operator runs a collector that has the exporter Kubewarden's sidecar uses, every
//! Secret a page tells you to make is one its overlay reads, and the step that makes the
//! missing-images alert fire says the rule's own `for`.

use std::collections::BTreeSet;

use super::{alerts_of, read, rendered_overlays, rendered_with_component};
use crate::rig;

/// The install pages of a platform, with the overlay each applies.
const PLATFORM_PAGES: [(&str, &str); 2] = [
    ("install-eks.md", "eks-ecr"),
    ("install-gke.md", "gke-artifact-registry"),
];

/// The API groups of Kubernetes itself: their kinds need no CRD.
const BUILT_IN_GROUPS: [&str; 7] = [
    "",
    "apps",
    "batch",
    "rbac.authorization.k8s.io",
    "admissionregistration.k8s.io",
    "policy",
    "coordination.k8s.io",
];

/// Each API group of the overlays' objects that a CRD defines, and what an install page types
/// to install that CRD.
const INSTALLERS: [(&str, &str); 3] = [
    ("policies.kubewarden.io", "kubewarden/admission-controller"),
    (
        "monitoring.coreos.com",
        "prometheus-community/kube-prometheus-stack",
    ),
    ("monitoring.googleapis.com", "--enable-managed-prometheus"),
];

/// The commands of a page's console blocks, in order: continued lines joined, a prompt (`$ `)
/// dropped, and in a block that shows output only its `$ ` lines.
fn console_commands(page: &str) -> Vec<String> {
    let text = read(&rig::root().join("docs").join(page));
    let mut commands = Vec::new();
    let mut block: Option<Vec<&str>> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            match block.take() {
                Some(lines) => commands.extend(block_commands(&lines)),
                None if trimmed == "```console" => block = Some(Vec::new()),
                None => {}
            }
            continue;
        }
        if let Some(lines) = block.as_mut() {
            lines.push(trimmed);
        }
    }
    commands
}

fn block_commands(lines: &[&str]) -> Vec<String> {
    let prompted = lines.iter().any(|l| l.starts_with("$ "));
    let mut commands = Vec::new();
    let mut current = String::new();
    let mut taking = !prompted;
    for line in lines {
        if current.is_empty() {
            taking = !prompted || line.starts_with("$ ");
        }
        if !taking {
            continue;
        }
        let line = line.trim_start_matches("$ ");
        match line.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                if !current.trim().is_empty() {
                    commands.push(current.trim().to_string());
                }
                current.clear();
            }
        }
    }
    commands
}

/// The API group of an object's `apiVersion` (`""` for the core group).
fn group_of(object: &serde_json::Value) -> String {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    match api_version.split_once('/') {
        Some((group, _)) => group.to_string(),
        None => String::new(),
    }
}

/// `kubectl apply` resolves every object's kind before it applies any, so an overlay with a kind
/// whose CRD is missing stops both applies of a page (the first after applying part of it): each
/// platform page installs the CRDs of every group its overlays use before its first `kubectl
/// apply -k` of them.
#[test]
fn every_kind_an_install_page_applies_is_installed_before() {
    let rendered = rendered_overlays();
    let mut checked = 0;
    for (page, _) in PLATFORM_PAGES {
        let commands = console_commands(page);
        let mut applied = BTreeSet::new();
        for (at, command) in commands.iter().enumerate() {
            let words: Vec<&str> = command.split_whitespace().collect();
            let Some(folder) = words
                .windows(4)
                .find(|w| w[0] == "kubectl" && w[1] == "apply" && w[2] == "-k")
                .map(|w| w[3])
            else {
                continue;
            };
            if !applied.insert(folder.to_string()) {
                continue;
            }
            let (_, objects) = rendered
                .iter()
                .find(|(name, _)| name == folder)
                .unwrap_or_else(|| panic!("{page}: applies {folder}, which is no overlay"));
            let groups: BTreeSet<String> = objects.iter().map(group_of).collect();
            for group in groups
                .iter()
                .filter(|g| !BUILT_IN_GROUPS.contains(&g.as_str()))
            {
                let (_, installer) = INSTALLERS
                    .iter()
                    .find(|(known, _)| known == group)
                    .unwrap_or_else(|| {
                        panic!(
                            "{folder} makes objects of {group}, whose CRDs nothing here installs: \
                             add to INSTALLERS what {page} types to install them"
                        )
                    });
                assert!(
                    commands[..at].iter().any(|c| c.contains(installer)),
                    "{page}: `{command}` applies objects of {group} before any command with \
                     `{installer}` installs their CRDs"
                );
                checked += 1;
            }
        }
        assert!(!applied.is_empty(), "{page} applies no overlay");
    }
    assert!(checked >= 4, "only {checked} groups checked");
}

/// Kubewarden's sidecar configuration exports policy-server's metrics with the collector's
/// `prometheus` exporter, which the contrib distribution has and the k8s one has not: every
/// install of the OpenTelemetry Operator takes the values file that names the contrib image,
/// and comes before the chart's telemetry values, whose sidecar needs the Operator.
#[test]
fn the_opentelemetry_operator_runs_the_collector_kubewardens_sidecar_needs() {
    let values =
        rig::read_yaml(&rig::root().join("deploy/helm/opentelemetry-operator-values.yaml"));
    assert_eq!(
        values["manager"]["collectorImage"]["repository"], "otel/opentelemetry-collector-contrib",
        "the Operator's collector image"
    );
    let mut installs = 0;
    for (page, _) in PLATFORM_PAGES {
        let commands = console_commands(page);
        let mut operator = false;
        for command in &commands {
            if command.starts_with("helm ")
                && command.contains("open-telemetry/opentelemetry-operator")
            {
                assert!(
                    command.contains("-f deploy/helm/opentelemetry-operator-values.yaml")
                        && !command.contains("collectorImage"),
                    "{page}: `{command}`: the Operator's values are the file's"
                );
                operator = true;
                installs += 1;
            }
            if command.contains("-f deploy/helm/kubewarden-telemetry.yaml") {
                assert!(
                    operator,
                    "{page}: `{command}` turns on the sidecar before the Operator is installed"
                );
            }
        }
    }
    assert_eq!(
        installs,
        PLATFORM_PAGES.len(),
        "one Operator install a page"
    );
}

/// The Secret names an object of `objects` reads: a PolicyServer's `imagePullSecret`, a Pod
/// template's secret volumes, and a swapping rule's `pullSecret`.
fn secrets_read(objects: &[serde_json::Value]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for object in objects {
        if let Some(name) = object["spec"]["imagePullSecret"].as_str() {
            names.insert(name.to_string());
        }
        let template = if object["kind"] == "CronJob" {
            &object["spec"]["jobTemplate"]["spec"]["template"]
        } else {
            &object["spec"]["template"]
        };
        for volume in template["spec"]["volumes"].as_array().into_iter().flatten() {
            if let Some(name) = volume["secret"]["secretName"].as_str() {
                names.insert(name.to_string());
            }
        }
        // A swapping rule's `pullSecret` is appended to every Pod it swaps: the kubelet reads it.
        for rule in object["spec"]["settings"]["mirrors"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let targets = rule["targets"].as_array().into_iter().flatten();
            for target in std::iter::once(rule).chain(targets) {
                if let Some(name) = target["pullSecret"].as_str() {
                    names.insert(name.to_string());
                }
            }
        }
    }
    names
}

/// A Secret the page makes that nothing mounts is a dead end (the GKE page once made a
/// `mirror-push` its overlay removed): every `kubectl create secret TYPE NAME` of an install
/// page, in a block or a sentence, names a Secret its overlay reads, with the optional
/// component the page tells you to add (a commented line of the overlay's kustomization).
#[test]
fn every_secret_an_install_page_makes_is_one_its_overlay_reads() {
    let cases = [
        ("install.md", "registry", None),
        ("install-eks.md", "eks-ecr", Some("source-credentials")),
        (
            "install-gke.md",
            "gke-artifact-registry",
            Some("../eks-ecr/source-credentials"),
        ),
    ];
    let mut checked = 0;
    for (page, overlay, component) in cases {
        let mut objects = rendered_overlays()
            .into_iter()
            .find(|(name, _)| name == &format!("deploy/{overlay}"))
            .map(|(_, objects)| objects)
            .unwrap_or_else(|| panic!("no deploy/{overlay}"));
        if let Some(component) = component {
            let kustomization =
                read(&rig::root().join(format!("deploy/{overlay}/kustomization.yaml")));
            assert!(
                kustomization.contains(&format!("- {component}")),
                "deploy/{overlay}/kustomization.yaml has no line for the component {component}"
            );
            objects = rendered_with_component(overlay, component);
        }
        let read_here = secrets_read(&objects);
        let text = read(&rig::root().join("docs").join(page)).replace(['\n', '`'], " ");
        let mut made = 0;
        for (at, _) in text.match_indices("kubectl create secret ") {
            let words: Vec<&str> = text[at..].split_whitespace().take(5).collect();
            let name = words.get(4).copied().unwrap_or_default();
            assert!(
                read_here.contains(name),
                "{page}: makes the Secret {name}, which no object of deploy/{overlay} (with \
                 {component:?}) reads; it reads {read_here:?}"
            );
            made += 1;
        }
        assert!(made > 0, "{page} makes no Secret");
        checked += made;
    }
    assert!(checked >= 4, "only {checked} Secrets checked");
}

/// install-eks.md's step that makes `ImageSwapperMirrorLacksImages` fire and clear: it states the
/// rule's own `for`, runs the audit scanner now (a Job from its CronJob) beside a Pod of an image
/// no copy can bring, shows the alert pending, and clears it by deleting that Pod; promtool's
/// course for the alert fires only after that `for` and clears later.
#[test]
fn the_lacks_images_step_says_the_rules_for_and_clears_the_alert() {
    let rule = rig::read_yaml(&rig::root().join("deploy/base/prometheus-rule.yaml"));
    let alert = alerts_of(&rule["spec"])
        .into_iter()
        .find(|a| a["alert"] == "ImageSwapperMirrorLacksImages")
        .expect("the base's ImageSwapperMirrorLacksImages");
    let wait = alert["for"].as_str().expect("its for");
    let text = read(&rig::root().join("docs/install-eks.md"));
    let step = text
        .split("\n\n")
        .find(|p| p.starts_with("**The alert this is for"))
        .expect("install-eks.md: the missing-images alert's step");
    assert!(
        step.contains("`ImageSwapperMirrorLacksImages`")
            && step.contains(&format!("`for: {wait}`")),
        "install-eks.md: the step says the alert's `for: {wait}`:\n{step}"
    );
    let commands = console_commands("install-eks.md");
    let position = |wanted: &str| {
        commands
            .iter()
            .position(|c| c.contains(wanted))
            .unwrap_or_else(|| panic!("install-eks.md types no `{wanted}`"))
    };
    let pod = position("kubectl run smoke-lacks");
    let scan = commands[pod..]
        .iter()
        .position(|c| c.contains("--from=cronjob/audit-scanner"))
        .map(|at| at + pod);
    assert!(
        scan.is_some(),
        "install-eks.md: no scanner run after the Pod"
    );
    assert!(
        position("kubectl delete pod smoke-lacks") > pod,
        "install-eks.md: the Pod is not deleted after it is made"
    );
    assert!(
        text.contains("ImageSwapperMirrorLacksImages\tpending"),
        "install-eks.md shows the alert pending"
    );
    let minutes = |m: &str| m.trim_end_matches('m').parse::<u64>().expect("minutes");
    let tests = rig::read_yaml(&rig::root().join("tests/alerts/image-swapper.test.yaml"));
    let cases: Vec<&serde_json::Value> = tests["tests"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
        .filter(|c| c["alertname"] == "ImageSwapperMirrorLacksImages")
        .collect();
    let firing: Vec<u64> = cases
        .iter()
        .filter(|c| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()))
        .filter_map(|c| c["eval_time"].as_str().map(minutes))
        .collect();
    let first = *firing.iter().min().expect("a case where it fires");
    assert!(
        first > minutes(wait),
        "promtool expects it firing at {first}m, before its for"
    );
    assert!(
        cases
            .iter()
            .any(|c| c["exp_alerts"].as_array().is_some_and(|a| a.is_empty())
                && c["eval_time"]
                    .as_str()
                    .map(minutes)
                    .is_some_and(|t| t > first)),
        "promtool has no case where it has cleared after firing"
    );
}
