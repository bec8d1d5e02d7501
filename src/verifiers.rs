//! `verifiers`: the signature rules of the verifier policies deployed in the cluster, read at
//! every admission through Kubewarden's Kubernetes host capabilities and verified beside the
//! policy's own `signatures`. A verifier that runs after this policy (a validating one, or a
//! namespaced one that sorts later) sees only the mirror's name, which its rules on the sources
//! do not match; taking its rules here means a swap is verified under every rule of every
//! verifier that would have seen the source name, in whatever order or phase they run.
//!
//! Separate from `signatures` because it is the one part of an admission that reads the
//! cluster rather than a registry, through its own small interface ([`Cluster`]).

use serde_json::Value;

use crate::glob::Glob;
use crate::settings::signature_rules_from;
use crate::signatures::SignatureRule;

/// The API group and version of Kubewarden's policy kinds.
pub const POLICIES_API_VERSION: &str = "policies.kubewarden.io/v1";

/// The kinds a verifier is deployed as, in the order an admission reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    ClusterAdmissionPolicy,
    ClusterAdmissionPolicyGroup,
    AdmissionPolicy,
    AdmissionPolicyGroup,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 4] = [
        PolicyKind::ClusterAdmissionPolicy,
        PolicyKind::ClusterAdmissionPolicyGroup,
        PolicyKind::AdmissionPolicy,
        PolicyKind::AdmissionPolicyGroup,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::ClusterAdmissionPolicy => "ClusterAdmissionPolicy",
            PolicyKind::ClusterAdmissionPolicyGroup => "ClusterAdmissionPolicyGroup",
            PolicyKind::AdmissionPolicy => "AdmissionPolicy",
            PolicyKind::AdmissionPolicyGroup => "AdmissionPolicyGroup",
        }
    }

    /// Read in the Pod's namespace (`list_resources_by_namespace`), not cluster-wide.
    pub fn is_namespaced(self) -> bool {
        matches!(
            self,
            PolicyKind::AdmissionPolicy | PolicyKind::AdmissionPolicyGroup
        )
    }

    /// What the host keeps of each object (its `field_masks`; `metadata` is always kept). A
    /// group's members are a map keyed by their names, which a mask cannot name, so a group is
    /// kept whole under `spec.policies`.
    pub fn field_masks(self) -> &'static [&'static str] {
        match self {
            PolicyKind::ClusterAdmissionPolicy | PolicyKind::AdmissionPolicy => {
                &["spec.module", "spec.settings.signatures"]
            }
            PolicyKind::ClusterAdmissionPolicyGroup | PolicyKind::AdmissionPolicyGroup => {
                &["spec.policies"]
            }
        }
    }
}

/// Kubewarden's Kubernetes host capabilities, as far as this policy reads them: the host in
/// the module (`host`), a table in unit tests.
pub trait Cluster {
    /// The objects of `kind` (in `namespace` for a namespaced kind), as the host's list answer
    /// (`{"items": [...]}`); the host's words when it cannot answer.
    fn list(&mut self, kind: PolicyKind, namespace: Option<&str>) -> Result<Value, String>;
}

/// A cluster that is never asked: for callers without `verifiers`.
pub struct NoCluster;

impl Cluster for NoCluster {
    fn list(&mut self, kind: PolicyKind, _namespace: Option<&str>) -> Result<Value, String> {
        Err(format!("no cluster to list {} objects from", kind.name()))
    }
}

/// The rules of `signatures` of every verifier policy whose module a pattern of `modules`
/// matches: cluster-wide ones, those in `namespace`, and the members of groups of both. Every
/// such policy counts, whatever its mode, rules or selectors say: verifying an image more than a
/// verifier would only keeps it at its source, where that verifier then judges it.
///
/// An error, in words that name the kind, the policy and the field, when a list cannot be read
/// or a matching verifier's `signatures` cannot be: the caller then swaps nothing, since an
/// image could be covered by the rules it could not read.
pub fn verifier_rules(
    modules: &[Glob],
    namespace: &str,
    cluster: &mut impl Cluster,
) -> Result<Vec<SignatureRule>, String> {
    let mut rules = Vec::new();
    for kind in PolicyKind::ALL {
        let namespace = match (kind.is_namespaced(), namespace) {
            (false, _) => None,
            // A request without a namespace has no namespaced verifier to read.
            (true, "") => continue,
            (true, namespace) => Some(namespace),
        };
        let list = cluster.list(kind, namespace).map_err(|why| {
            format!(
                "could not list {} objects{} ({why})",
                kind.name(),
                namespace
                    .map(|ns| format!(" in namespace {ns:?}"))
                    .unwrap_or_default()
            )
        })?;
        let items = list
            .get("items")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("the host's list of {} has no items", kind.name()))?;
        for item in items {
            let name = item
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("(no name)");
            let at = match namespace {
                Some(ns) => format!("{} {ns}/{name}", kind.name()),
                None => format!("{} {name}", kind.name()),
            };
            let spec = item.get("spec").unwrap_or(&Value::Null);
            match kind {
                PolicyKind::ClusterAdmissionPolicy | PolicyKind::AdmissionPolicy => {
                    rules.extend(member_rules(spec, modules, &at)?);
                }
                PolicyKind::ClusterAdmissionPolicyGroup | PolicyKind::AdmissionPolicyGroup => {
                    let members = spec.get("policies").and_then(Value::as_object);
                    for (member, spec) in members.into_iter().flatten() {
                        let at = format!("{at} member {member}");
                        rules.extend(member_rules(spec, modules, &at)?);
                    }
                }
            }
        }
    }
    Ok(rules)
}

/// The rules of one policy (or group member) whose `module` a pattern matches; none for any
/// other, and none for a verifier without `signatures`.
fn member_rules(spec: &Value, modules: &[Glob], at: &str) -> Result<Vec<SignatureRule>, String> {
    let Some(module) = spec.get("module").and_then(Value::as_str) else {
        return Ok(Vec::new());
    };
    if !modules.iter().any(|pattern| pattern.matches(module)) {
        return Ok(Vec::new());
    }
    match spec.pointer("/settings/signatures") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(signatures) => signature_rules_from(signatures)
            .map(|rules| {
                rules
                    .into_iter()
                    .map(|mut rule| {
                        rule.origin = format!("{at} settings.{}", rule.origin);
                        rule
                    })
                    .collect()
            })
            .map_err(|why| format!("{at} (module {module}): settings.{why}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    const KEY: &str = "-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----";

    /// The cluster as a table of lists by kind, recording what was asked.
    #[derive(Default)]
    struct Table {
        lists: BTreeMap<&'static str, Result<Value, String>>,
        asked: Vec<String>,
    }

    impl Cluster for Table {
        fn list(&mut self, kind: PolicyKind, namespace: Option<&str>) -> Result<Value, String> {
            self.asked
                .push(format!("{} {}", kind.name(), namespace.unwrap_or("*")));
            self.lists
                .get(kind.name())
                .cloned()
                .unwrap_or_else(|| Ok(json!({"items": []})))
        }
    }

    fn verifier(name: &str, module: &str, image: &str) -> Value {
        json!({"metadata": {"name": name}, "spec": {"module": module,
            "settings": {"signatures": [{"image": image, "pubKeys": [KEY]}]}}})
    }

    fn patterns(patterns: &[&str]) -> Vec<Glob> {
        patterns
            .iter()
            .map(|p| Glob::new(p).expect("valid pattern"))
            .collect()
    }

    const VERIFY: &str = "registry://ghcr.io/kubewarden/policies/verify-image-signatures:v1.0.11";

    #[test]
    fn every_kind_is_read_and_only_matching_modules_count() {
        let mut cluster = Table::default();
        cluster.lists.insert(
            "ClusterAdmissionPolicy",
            Ok(
                json!({"items": [verifier("verify", VERIFY, "ghcr.io/org/*"),
                verifier("other", "registry://ghcr.io/x/other:v1", "*")]}),
            ),
        );
        cluster.lists.insert(
            "AdmissionPolicyGroup",
            Ok(
                json!({"items": [{"metadata": {"name": "g"}, "spec": {"policies": {
                "signed": verifier("", VERIFY, "registry.example.com/*")["spec"].clone()}}}]}),
            ),
        );
        let rules = verifier_rules(
            &patterns(&["*/verify-image-signatures:*"]),
            "team",
            &mut cluster,
        )
        .expect("read");
        let images: Vec<bool> = rules
            .iter()
            .map(|r| r.image.matches("ghcr.io/org/app:1"))
            .collect();
        assert_eq!(images, [true, false], "{rules:?}");
        assert!(rules[1].image.matches("registry.example.com/app:1"));
        assert_eq!(
            cluster.asked,
            [
                "ClusterAdmissionPolicy *",
                "ClusterAdmissionPolicyGroup *",
                "AdmissionPolicy team",
                "AdmissionPolicyGroup team"
            ]
        );
    }

    #[test]
    fn a_list_the_host_refuses_is_an_error_naming_the_kind() {
        let mut cluster = Table::default();
        cluster.lists.insert(
            "AdmissionPolicy",
            Err("Policy has not been granted access to Kubernetes policies.kubewarden.io/v1/AdmissionPolicy resources. The violation has been reported.".to_string()),
        );
        let error = verifier_rules(&patterns(&["*"]), "team", &mut cluster).expect_err("refused");
        assert_eq!(
            error,
            "could not list AdmissionPolicy objects in namespace \"team\" (Policy has not been granted access to Kubernetes policies.kubewarden.io/v1/AdmissionPolicy resources. The violation has been reported.)"
        );
    }

    #[test]
    fn a_verifier_whose_signatures_cannot_be_read_is_an_error_naming_it() {
        let mut cluster = Table::default();
        let mut bad = verifier("verify", VERIFY, "*");
        bad["spec"]["settings"]["signatures"][0]["pubKeys"] = json!(["not a key"]);
        cluster
            .lists
            .insert("ClusterAdmissionPolicy", Ok(json!({"items": [bad]})));
        let error =
            verifier_rules(&patterns(&["*verify*"]), "team", &mut cluster).expect_err("refused");
        assert!(
            error.starts_with("ClusterAdmissionPolicy verify (module registry://ghcr.io/kubewarden/policies/verify-image-signatures:v1.0.11): settings.signatures[0].pubKeys[0]: \"not a key\" is not a PEM PUBLIC KEY"),
            "{error}"
        );
    }

    #[test]
    fn verifiers_without_signatures_and_requests_without_a_namespace_add_nothing() {
        let mut cluster = Table::default();
        cluster.lists.insert(
            "ClusterAdmissionPolicy",
            Ok(json!({"items": [{"metadata": {"name": "v"}, "spec": {"module": VERIFY, "settings": {}}}]})),
        );
        let rules = verifier_rules(&patterns(&["*"]), "", &mut cluster).expect("read");
        assert!(rules.is_empty());
        assert_eq!(
            cluster.asked,
            ["ClusterAdmissionPolicy *", "ClusterAdmissionPolicyGroup *"]
        );
    }
}
