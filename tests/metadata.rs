//! metadata.yml, questions-ui.yml and artifacthub-pkg.yml agree with the code and each other.

mod rig;

use image_swapper_policy::settings::Settings;
use serde_json::{Value, json};

fn metadata() -> Value {
    rig::read_yaml(&rig::root().join("metadata.yml"))
}

fn annotation(metadata: &Value, key: &str) -> String {
    metadata["annotations"][key]
        .as_str()
        .unwrap_or_else(|| panic!("metadata.yml lacks {key}"))
        .to_string()
}

#[test]
fn metadata_declares_a_mutating_wapc_policy_for_pods() {
    let metadata = metadata();
    assert_eq!(metadata["mutating"], json!(true));
    assert_eq!(metadata["executionMode"], json!("kubewarden-wapc"));
    // The verifier policies `verifiers` reads, and nothing else.
    // In the order `kwctl scaffold artifacthub` lists them, so artifacthub-pkg.yml is its output.
    let kinds = [
        "AdmissionPolicy",
        "AdmissionPolicyGroup",
        "ClusterAdmissionPolicy",
        "ClusterAdmissionPolicyGroup",
    ]
    .map(|kind| json!({"apiVersion": "policies.kubewarden.io/v1", "kind": kind}));
    assert_eq!(metadata["contextAwareResources"], json!(kinds));
    let resources: Vec<(String, Value)> = metadata["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .flat_map(|rule| {
            rule["resources"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |r| {
                    (
                        r.as_str().unwrap_or_default().to_string(),
                        rule["operations"].clone(),
                    )
                })
        })
        .collect();
    assert_eq!(
        resources,
        [
            ("pods".to_string(), json!(["CREATE", "UPDATE"])),
            ("pods/ephemeralcontainers".to_string(), json!(["UPDATE"]))
        ]
    );
}

#[test]
fn metadata_has_every_annotation_and_the_crate_version() {
    let metadata = metadata();
    for key in [
        "io.artifacthub.displayName",
        "io.artifacthub.resources",
        "io.artifacthub.keywords",
        "io.kubewarden.policy.ociUrl",
        "io.kubewarden.policy.title",
        "io.kubewarden.policy.version",
        "io.kubewarden.policy.description",
        "io.kubewarden.policy.author",
        "io.kubewarden.policy.url",
        "io.kubewarden.policy.source",
        "io.kubewarden.policy.license",
        "io.kubewarden.policy.category",
        "io.kubewarden.policy.severity",
    ] {
        assert!(!annotation(&metadata, key).is_empty(), "{key} is empty");
    }
    assert_eq!(
        annotation(&metadata, "io.kubewarden.policy.version"),
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(
        annotation(&metadata, "io.kubewarden.policy.license"),
        env!("CARGO_PKG_LICENSE")
    );
}

#[test]
fn host_capabilities_are_exactly_the_ones_the_code_calls() {
    let host = ["src/host.rs", "src/host/kubernetes.rs"]
        .map(|file| std::fs::read_to_string(rig::root().join(file)).expect(file))
        .join("\n");
    let called: Vec<&str> = [
        ("oci::get_manifest_digest(", "oci/v1/manifest_digest"),
        ("oci::get_manifest(", "oci/v1/oci_manifest"),
        ("verification::verify_", "oci/v2/verify"),
        (
            "oci::get_manifest_and_config(",
            "oci/v1/oci_manifest_config",
        ),
        ("\"list_resources_all\"", "kubernetes/list_resources_all"),
        (
            "\"list_resources_by_namespace\"",
            "kubernetes/list_resources_by_namespace",
        ),
        ("\"can_i\"", "kubernetes/can_i"),
    ]
    .iter()
    .filter(|(call, _)| host.contains(call))
    .map(|(_, capability)| *capability)
    .collect();
    let metadata = metadata();
    let declared: Vec<&str> = metadata["hostCapabilities"]
        .as_array()
        .expect("hostCapabilities")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(declared, called);
}

/// Every setting, with the default the code has, and nothing else.
#[test]
fn questions_cover_every_setting_with_its_default() {
    let defaults = serde_json::to_value(Settings::default()).expect("settings serialise");
    let questions = rig::read_yaml(&rig::root().join("questions-ui.yml"));
    let questions = questions["questions"].as_array().expect("questions");
    let variables: Vec<&str> = questions
        .iter()
        .filter_map(|q| q["variable"].as_str())
        .collect();
    let settings: Vec<&str> = defaults
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    let mut sorted = variables.clone();
    sorted.sort_unstable();
    let mut expected = settings.clone();
    expected.sort_unstable();
    assert_eq!(sorted, expected, "one question per setting");
    for question in questions {
        let variable = question["variable"].as_str().unwrap_or_default();
        match &defaults[variable] {
            // Unset by default: no default offered, or an empty object (`defaultMirror`).
            Value::Null => assert!(
                question["default"].is_null() || question["default"] == json!({}),
                "default of {variable}: {}",
                question["default"]
            ),
            other => assert_eq!(question["default"], *other, "default of {variable}"),
        }
        assert!(
            question["description"]
                .as_str()
                .is_some_and(|d| d.len() > 20),
            "{variable} needs help text"
        );
    }
    let readme = std::fs::read_to_string(rig::root().join("README.md")).expect("README.md");
    for setting in settings {
        assert!(
            readme.contains(&format!("`{setting}`")),
            "README.md does not document `{setting}`"
        );
    }
}

/// What `kwctl scaffold artifacthub` would write from metadata.yml and questions-ui.yml.
#[test]
fn artifacthub_package_matches_metadata_and_questions() {
    let metadata = metadata();
    let package = rig::read_yaml(&rig::root().join("artifacthub-pkg.yml"));
    let version = annotation(&metadata, "io.kubewarden.policy.version");
    assert_eq!(package["version"], json!(version));
    assert_eq!(
        package["name"],
        json!(annotation(&metadata, "io.kubewarden.policy.title"))
    );
    assert_eq!(
        package["displayName"],
        json!(annotation(&metadata, "io.artifacthub.displayName"))
    );
    assert_eq!(
        package["description"],
        json!(annotation(&metadata, "io.kubewarden.policy.description"))
    );
    assert_eq!(
        package["license"],
        json!(annotation(&metadata, "io.kubewarden.policy.license"))
    );
    assert_eq!(
        package["homeURL"],
        json!(annotation(&metadata, "io.kubewarden.policy.url"))
    );
    assert_eq!(
        package["containersImages"][0]["image"],
        json!(format!(
            "{}:v{version}",
            annotation(&metadata, "io.kubewarden.policy.ociUrl")
        ))
    );
    let keywords: Vec<String> = annotation(&metadata, "io.artifacthub.keywords")
        .split(',')
        .map(|k| k.trim().to_string())
        .collect();
    assert_eq!(package["keywords"], json!(keywords));
    let annotations = &package["annotations"];
    assert_eq!(
        annotations["kubewarden/mutation"],
        json!(metadata["mutating"].to_string())
    );
    assert_eq!(
        annotations["kubewarden/resources"],
        json!(annotation(&metadata, "io.artifacthub.resources"))
    );
    let rules: Value =
        serde_yaml::from_str(annotations["kubewarden/rules"].as_str().expect("rules"))
            .expect("rules YAML");
    assert_eq!(rules, metadata["rules"]);
    let context_aware: Value = serde_yaml::from_str(
        annotations["kubewarden/contextAwareResources"]
            .as_str()
            .expect("contextAwareResources"),
    )
    .expect("contextAwareResources YAML");
    assert_eq!(context_aware, metadata["contextAwareResources"]);
    let questions =
        std::fs::read_to_string(rig::root().join("questions-ui.yml")).expect("questions-ui.yml");
    assert_eq!(
        annotations["kubewarden/questions-ui"],
        json!(questions),
        "questions-ui.yml, verbatim"
    );
}

/// `kwctl scaffold artifacthub` parses the author as RFC 5322 name-addr entries ("name <email>",
/// comma-separated; policy-evaluator's `parse_maintainers`) and refuses the metadata otherwise.
fn maintainers(author: &str) -> Result<Vec<(String, String)>, String> {
    author
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let (name, rest) = entry
                .split_once('<')
                .ok_or(format!("{entry:?} is not \"name <email>\""))?;
            let email = rest
                .strip_suffix('>')
                .ok_or(format!("{entry:?} does not end with '>'"))?;
            let (local, domain) = email
                .split_once('@')
                .ok_or(format!("{email:?} is not an email address"))?;
            let valid = !name.trim().is_empty()
                && !local.is_empty()
                && domain.contains('.')
                && !email.contains(char::is_whitespace)
                && !domain.contains('@');
            if valid {
                Ok((name.trim().to_string(), email.to_string()))
            } else {
                Err(format!("{entry:?} is not \"name <email>\""))
            }
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(|list| {
            if list.is_empty() {
                Err("no author".to_string())
            } else {
                Ok(list)
            }
        })
}

#[test]
fn the_author_is_what_kwctl_scaffold_accepts() {
    for (author, ok) in [
        (
            "Tux Tuxedo <tux@example.com>, Pidgin <pidgin@example.com>",
            true,
        ),
        ("image-swapper-policy developers", false),
        ("Foo foo@example.com", false),
        ("Bar <#$%#$%>", false),
        ("", false),
    ] {
        assert_eq!(maintainers(author).is_ok(), ok, "{author}");
    }
    let metadata = metadata();
    let author = annotation(&metadata, "io.kubewarden.policy.author");
    let parsed = maintainers(&author).unwrap_or_else(|e| panic!("{e}"));
    let package = rig::read_yaml(&rig::root().join("artifacthub-pkg.yml"));
    let listed: Vec<(String, String)> = package["maintainers"]
        .as_array()
        .expect("maintainers")
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap_or_default().to_string(),
                m["email"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        listed, parsed,
        "maintainers as kwctl derives them from the author"
    );
}

/// The rest of what `kwctl scaffold artifacthub` derives: the links from the source URL on
/// GitHub and the fixed provider. The recommendation is ours: kwctl 1.35 names the deprecated
/// `kubewarden-controller` chart, where Kubewarden 1.37 and later install `admission-controller`.
#[test]
fn artifacthub_links_provider_and_recommendations_are_derived() {
    let metadata = metadata();
    let package = rig::read_yaml(&rig::root().join("artifacthub-pkg.yml"));
    let source = annotation(&metadata, "io.kubewarden.policy.source");
    let version = annotation(&metadata, "io.kubewarden.policy.version");
    assert!(source.starts_with("https://github.com/"));
    assert_eq!(
        package["links"],
        json!([
            {"name": "policy", "url": format!("{source}/releases/download/v{version}/policy.wasm")},
            {"name": "source", "url": source},
        ])
    );
    assert_eq!(package["provider"], json!({"name": "kubewarden"}));
    assert_eq!(
        package["recommendations"],
        json!([{"url": "https://artifacthub.io/packages/helm/kubewarden/admission-controller"}])
    );
}

/// artifacthub-pkg.yml is what the real `kwctl scaffold artifacthub` (1.35) writes from
/// metadata.yml and questions-ui.yml, field by field, but for three fields: `createdAt` (the day
/// it is written), and the install text and recommendation, which kwctl writes for the
/// deprecated `kubewarden-controller` chart where ours name the `admission-controller` chart
/// people install from 1.37.
#[test]
fn artifacthub_package_is_what_kwctl_scaffolds() {
    let Some(tools) = rig::tools::RealTools::find("artifacthub_package_is_what_kwctl_scaffolds")
    else {
        return;
    };
    let out = rig::tools::scratch_dir("scaffold").join("artifacthub-pkg.yml");
    let output = std::process::Command::new(tools.bin("kwctl"))
        .args(["scaffold", "artifacthub", "--metadata-path"])
        .arg(rig::root().join("metadata.yml"))
        .arg("--questions-path")
        .arg(rig::root().join("questions-ui.yml"))
        .arg("--output")
        .arg(&out)
        .output()
        .expect("kwctl scaffold artifacthub");
    assert!(output.status.success(), "kwctl scaffold: {output:?}");
    let scaffolded = rig::read_yaml(&out);
    let ours = rig::read_yaml(&rig::root().join("artifacthub-pkg.yml"));
    let ours_differ = ["createdAt", "install", "recommendations"];
    let fields = |package: &Value| -> Vec<String> {
        let mut keys: Vec<String> = package
            .as_object()
            .expect("a mapping")
            .keys()
            .cloned()
            .collect();
        keys.sort();
        keys
    };
    assert_eq!(fields(&ours), fields(&scaffolded), "the same fields");
    for field in fields(&scaffolded) {
        if ours_differ.contains(&field.as_str()) {
            continue;
        }
        assert_eq!(
            ours[&field], scaffolded[&field],
            "artifacthub-pkg.yml `{field}` is not what kwctl scaffold artifacthub writes"
        );
    }
    assert!(
        scaffolded["install"]
            .as_str()
            .is_some_and(|text| text.contains("kwctl pull")),
        "kwctl's install text changed: {}",
        scaffolded["install"]
    );
    let _ = std::fs::remove_dir_all(out.parent().expect("scratch"));
}

/// `kwctl annotate` (1.35) takes the built module with metadata.yml and README.md, and finds
/// the host capabilities the module calls equal to those metadata.yml declares (it warns
/// otherwise).
#[test]
fn kwctl_annotates_the_built_module_without_a_warning() {
    let Some(tools) =
        rig::tools::RealTools::find("kwctl_annotates_the_built_module_without_a_warning")
    else {
        return;
    };
    let _ = rig::policy(); // the freshness check: policy.wasm is newer than src/
    let dir = rig::tools::scratch_dir("annotate");
    let output = std::process::Command::new(tools.bin("kwctl"))
        .args(["annotate", "--metadata-path"])
        .arg(rig::root().join("metadata.yml"))
        .arg("--usage-path")
        .arg(rig::root().join("README.md"))
        .arg("--output-path")
        .arg(dir.join("annotated.wasm"))
        .arg(rig::root().join("policy.wasm"))
        .env("NO_COLOR", "1")
        .output()
        .expect("kwctl annotate");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "kwctl annotate: {stderr}");
    assert!(!stderr.contains("WARN"), "kwctl annotate warned: {stderr}");
    let inspect = std::process::Command::new(tools.bin("kwctl"))
        .args(["inspect", "--output", "yaml"])
        .arg(dir.join("annotated.wasm"))
        .output()
        .expect("kwctl inspect");
    assert!(inspect.status.success(), "kwctl inspect: {inspect:?}");
    let inspected: Value = serde_yaml::from_slice(&inspect.stdout).expect("kwctl inspect's YAML");
    let metadata = metadata();
    for field in [
        "rules",
        "mutating",
        "executionMode",
        "contextAwareResources",
    ] {
        assert_eq!(inspected[field], metadata[field], "kwctl inspect: {field}");
    }
    assert_eq!(
        inspected["annotations"]["io.kubewarden.policy.version"],
        metadata["annotations"]["io.kubewarden.policy.version"],
        "kwctl inspect: the version"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
