//! `verifiers`: the signature rules of the verifier policies deployed in the cluster, read at
//! every admission through Kubewarden's Kubernetes host capabilities and verified beside the
//! policy's own `signatures`. A verifier that runs after this policy (a validating one, or a
//! namespaced one that sorts later) sees only the mirror's name, which its rules on the sources
//! do not match; taking its rules here means a swap is verified under every rule of every
//! verifier that would have seen the source name, in whatever order or phase they run.
//!
//! Separate from `signatures` because it is the one part of an admission that reads the
//! cluster rather than a registry, through its own small interface ([`Cluster`]).

mod lenient;

use serde_json::Value;

use crate::glob::Glob;
use crate::signatures::SignatureRule;

use lenient::verifier_rules_from;

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

    /// The kind's resource, as RBAC rules and SubjectAccessReviews name it.
    pub fn resource(self) -> &'static str {
        match self {
            PolicyKind::ClusterAdmissionPolicy => "clusteradmissionpolicies",
            PolicyKind::ClusterAdmissionPolicyGroup => "clusteradmissionpolicygroups",
            PolicyKind::AdmissionPolicy => "admissionpolicies",
            PolicyKind::AdmissionPolicyGroup => "admissionpolicygroups",
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

    /// Whether `review.account` may `review.verb` the objects of `review.kind` (the host's
    /// `can_i`: a SubjectAccessReview); the host's words when it cannot answer.
    fn can_i(&mut self, review: &AccessReview<'_>) -> Result<Access, String>;
}

/// A cluster that is never asked: for callers without `verifiers`.
pub struct NoCluster;

impl Cluster for NoCluster {
    fn list(&mut self, kind: PolicyKind, _namespace: Option<&str>) -> Result<Value, String> {
        Err(format!("no cluster to list {} objects from", kind.name()))
    }

    fn can_i(&mut self, review: &AccessReview<'_>) -> Result<Access, String> {
        Err(format!(
            "no cluster to ask whether {} may {} {} objects",
            review.account,
            review.verb,
            review.kind.name()
        ))
    }
}

/// The PolicyServer's ServiceAccount (`policyServerServiceAccount`): the identity the host
/// lists the verifiers as, whose RBAC decides whether those lists answer and stay current.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccount {
    pub namespace: String,
    pub name: String,
}

impl ServiceAccount {
    /// The username the API server gives its tokens.
    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }

    /// The groups the API server puts its tokens in: RBAC bindings to these count for it too.
    pub fn groups(&self) -> Vec<String> {
        vec![
            "system:serviceaccounts".to_string(),
            format!("system:serviceaccounts:{}", self.namespace),
            "system:authenticated".to_string(),
        ]
    }
}

impl std::fmt::Display for ServiceAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One question to the host's `can_i`: may `account` `verb` the objects of `kind` (in
/// `namespace` for a namespaced kind)?
#[derive(Debug, Clone, Copy)]
pub struct AccessReview<'a> {
    pub account: &'a ServiceAccount,
    pub verb: &'a str,
    pub kind: PolicyKind,
    pub namespace: Option<&'a str>,
}

/// The host's answer to an [`AccessReview`]: the SubjectAccessReview's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub allowed: bool,
    /// The authorizer's reason or evaluation error, when it gave one.
    pub reason: String,
}

/// The verbs the host's list of a kind needs from its ServiceAccount, and what it does without
/// each (policy-evaluator 1.35 answers every list from a reflector: a list, then a watch).
const READER_VERBS: [(&str, &str); 2] = [
    (
        "list",
        "the host's list of them never returns, and every admission waits out the webhook's timeout",
    ),
    (
        "watch",
        "the host's list of them is never refreshed, so a verifier created or changed after its first list is never seen",
    ),
];

/// The kinds an admission in `namespace` reads, each with the namespace it is read in (none for
/// a cluster-wide kind); a request without a namespace has no namespaced verifier to read.
fn kinds_read(namespace: &str) -> impl Iterator<Item = (PolicyKind, Option<&str>)> {
    PolicyKind::ALL
        .into_iter()
        .filter_map(move |kind| match (kind.is_namespaced(), namespace) {
            (false, _) => Some((kind, None)),
            (true, "") => None,
            (true, namespace) => Some((kind, Some(namespace))),
        })
}

/// Whether the PolicyServer's ServiceAccount may `list` and `watch` every kind an admission in
/// `namespace` reads, asked before any list: without `list` the host's list never returns, and
/// without `watch` it answers once and then goes stale, silently. An error naming the verb, the
/// kind (and namespace) and the ServiceAccount, and what the host does without that verb, when
/// one is missing or the host cannot say: the caller then treats the verifiers as unreadable.
pub fn reader_may_list(
    account: &ServiceAccount,
    namespace: &str,
    cluster: &mut impl Cluster,
) -> Result<(), String> {
    for (kind, namespace) in kinds_read(namespace) {
        let objects = format!(
            "{} objects{}",
            kind.name(),
            namespace
                .map(|ns| format!(" in namespace {ns:?}"))
                .unwrap_or_default()
        );
        for (verb, without) in READER_VERBS {
            let review = AccessReview {
                account,
                verb,
                kind,
                namespace,
            };
            let access = cluster.can_i(&review).map_err(|why| {
                format!(
                    "could not ask whether the PolicyServer's ServiceAccount {account} may {verb} {objects} ({why}); grant it create on subjectaccessreviews.authorization.k8s.io"
                )
            })?;
            if !access.allowed {
                let reason = match access.reason.as_str() {
                    "" => String::new(),
                    reason => format!(" ({reason})"),
                };
                return Err(format!(
                    "the PolicyServer's ServiceAccount {account} may not {verb} {objects}{reason}: without {verb}, {without}; grant it get, list and watch on {} in policies.kubewarden.io",
                    PolicyKind::ALL.map(PolicyKind::resource).join(", ")
                ));
            }
        }
    }
    Ok(())
}

/// What an admission read of the cluster's verifiers.
#[derive(Debug, Default)]
pub struct VerifierRead {
    /// The rules of every verifier found, read as verify-image-signatures reads them.
    pub rules: Vec<SignatureRule>,
    /// The `module` patterns that matched no policy read.
    pub unmatched: Vec<String>,
    /// Every policy (or group member) read, with its module: what the patterns were tried on.
    pub read: Vec<String>,
    /// The policies (as in `read`) whose settings have verify-image-signatures' `signatures`
    /// but whose module no pattern matched: a team's verifier loaded under another module name,
    /// whose rules are not applied.
    pub left_out: Vec<String>,
}

/// The rules of `signatures` of every verifier policy: those whose module a pattern of
/// `verifiers` matches, and (for an entry without `module`) those whose `settings.signatures`
/// has verify-image-signatures' shape; cluster-wide ones, those in `namespace`, and the members
/// of groups of both. Every such policy counts, whatever its mode, rules or selectors say:
/// verifying an image more than a verifier would only keeps it at its source, where that
/// verifier then judges it. A verifier's rule this policy cannot read covers the images its
/// own `image` pattern matches, and only those (`lenient::verifier_rules_from`).
///
/// An error, in words that name the kind and the namespace, when a list cannot be read: the
/// caller then swaps nothing covered, since any image could be covered by the rules it could
/// not read.
pub fn verifier_rules(
    verifiers: &[Option<Glob>],
    namespace: &str,
    cluster: &mut impl Cluster,
) -> Result<VerifierRead, String> {
    let mut read = VerifierRead::default();
    let mut matched = vec![false; verifiers.len()];
    for (kind, namespace) in kinds_read(namespace) {
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
                    member_rules(spec, verifiers, &at, &mut matched, &mut read);
                }
                PolicyKind::ClusterAdmissionPolicyGroup | PolicyKind::AdmissionPolicyGroup => {
                    let members = spec.get("policies").and_then(Value::as_object);
                    for (member, spec) in members.into_iter().flatten() {
                        let at = format!("{at} member {member}");
                        member_rules(spec, verifiers, &at, &mut matched, &mut read);
                    }
                }
            }
        }
    }
    read.unmatched = verifiers
        .iter()
        .zip(matched)
        .filter_map(|(verifier, matched)| match verifier {
            Some(glob) if !matched => Some(glob.as_str().to_string()),
            _ => None,
        })
        .collect();
    Ok(read)
}

/// The rules of one policy (or group member) that is a verifier; none for any other, and none
/// for a verifier without `signatures`.
fn member_rules(
    spec: &Value,
    verifiers: &[Option<Glob>],
    at: &str,
    matched: &mut [bool],
    read: &mut VerifierRead,
) {
    let module = spec.get("module").and_then(Value::as_str).unwrap_or("");
    read.read.push(format!("{at} ({module})"));
    let signatures = spec
        .pointer("/settings/signatures")
        .filter(|signatures| !signatures.is_null());
    let mut verifier = false;
    for (pattern, matched) in verifiers.iter().zip(matched.iter_mut()) {
        let matches = match pattern {
            Some(glob) => glob.matches(module),
            None => signatures.is_some_and(has_verifier_shape),
        };
        *matched |= matches;
        verifier |= matches;
    }
    match signatures {
        Some(signatures) if verifier => read.rules.extend(verifier_rules_from(signatures, at)),
        Some(signatures) if has_verifier_shape(signatures) => {
            read.left_out.push(format!("{at} ({module})"));
        }
        _ => {}
    }
}

/// verify-image-signatures' `settings.signatures`: a list of entries, each an object. Read
/// leniently, since stricter is safe: a policy whose rules this policy cannot read is still a
/// verifier, whose unreadable rules then hold up the images they could match.
fn has_verifier_shape(signatures: &Value) -> bool {
    signatures
        .as_array()
        .is_some_and(|entries| !entries.is_empty() && entries.iter().all(Value::is_object))
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
        /// (kind, verb) the ServiceAccount is not granted.
        denied: Vec<(&'static str, &'static str)>,
        /// The host's words for every `can_i`, when it cannot answer.
        can_i_fails: Option<String>,
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

        fn can_i(&mut self, review: &AccessReview<'_>) -> Result<Access, String> {
            self.asked.push(format!(
                "may {} {} {} {}",
                review.account.username(),
                review.verb,
                review.kind.resource(),
                review.namespace.unwrap_or("*")
            ));
            if let Some(why) = &self.can_i_fails {
                return Err(why.clone());
            }
            let allowed = !self.denied.contains(&(review.kind.name(), review.verb));
            Ok(Access {
                allowed,
                reason: String::new(),
            })
        }
    }

    fn policy_server() -> ServiceAccount {
        ServiceAccount {
            namespace: "kubewarden".to_string(),
            name: "policy-server".to_string(),
        }
    }

    #[test]
    fn the_reader_is_asked_list_and_watch_on_every_kind_read_before_any_list() {
        let mut cluster = Table::default();
        reader_may_list(&policy_server(), "team", &mut cluster).expect("granted");
        let user = "system:serviceaccount:kubewarden:policy-server";
        let expected: Vec<String> = [
            ("clusteradmissionpolicies", "*"),
            ("clusteradmissionpolicygroups", "*"),
            ("admissionpolicies", "team"),
            ("admissionpolicygroups", "team"),
        ]
        .iter()
        .flat_map(|(resource, ns)| {
            ["list", "watch"].map(|verb| format!("may {user} {verb} {resource} {ns}"))
        })
        .collect();
        assert_eq!(cluster.asked, expected);
        // Without a namespace, no namespaced kind is read, so none is asked about.
        let mut cluster = Table::default();
        reader_may_list(&policy_server(), "", &mut cluster).expect("granted");
        assert_eq!(cluster.asked.len(), 4, "{:?}", cluster.asked);
    }

    #[rstest::rstest]
    #[case::no_watch_on_a_namespaced_kind(
        ("AdmissionPolicy", "watch"),
        "the PolicyServer's ServiceAccount kubewarden/policy-server may not watch AdmissionPolicy objects in namespace \"team\": without watch, the host's list of them is never refreshed, so a verifier created or changed after its first list is never seen; grant it get, list and watch on clusteradmissionpolicies, clusteradmissionpolicygroups, admissionpolicies, admissionpolicygroups in policies.kubewarden.io"
    )]
    #[case::no_list_on_a_cluster_wide_kind(
        ("ClusterAdmissionPolicyGroup", "list"),
        "the PolicyServer's ServiceAccount kubewarden/policy-server may not list ClusterAdmissionPolicyGroup objects: without list, the host's list of them never returns, and every admission waits out the webhook's timeout; grant it"
    )]
    fn a_verb_not_granted_names_the_verb_the_kind_and_the_service_account(
        #[case] denied: (&'static str, &'static str),
        #[case] expected: &str,
    ) {
        let mut cluster = Table {
            denied: vec![denied],
            ..Table::default()
        };
        let error = reader_may_list(&policy_server(), "team", &mut cluster).expect_err("denied");
        assert!(error.starts_with(expected), "{error}");
    }

    #[test]
    fn a_can_i_the_host_cannot_answer_says_what_to_grant() {
        let mut cluster = Table {
            can_i_fails: Some("subjectaccessreviews.authorization.k8s.io is forbidden".to_string()),
            ..Table::default()
        };
        let error = reader_may_list(&policy_server(), "team", &mut cluster).expect_err("failed");
        assert_eq!(
            error,
            "could not ask whether the PolicyServer's ServiceAccount kubewarden/policy-server may list ClusterAdmissionPolicy objects (subjectaccessreviews.authorization.k8s.io is forbidden); grant it create on subjectaccessreviews.authorization.k8s.io"
        );
    }

    fn verifier(name: &str, module: &str, image: &str) -> Value {
        json!({"metadata": {"name": name}, "spec": {"module": module,
            "settings": {"signatures": [{"image": image, "pubKeys": [KEY]}]}}})
    }

    fn patterns(patterns: &[&str]) -> Vec<Option<Glob>> {
        patterns
            .iter()
            .map(|p| Some(Glob::new(p).expect("valid pattern")))
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
        .expect("read")
        .rules;
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

    /// A team's verifier loaded under another module name (a fork, a copy in the company's
    /// registry) beside the cluster-wide verifier the pattern matches: its rules are not
    /// applied, and the read names it so the admission can say so.
    #[test]
    fn a_verifier_no_pattern_matches_is_named_as_left_out() {
        let mut cluster = Table::default();
        cluster.lists.insert(
            "ClusterAdmissionPolicy",
            Ok(
                json!({"items": [verifier("verify", VERIFY, "ghcr.io/org/*"),
                {"metadata": {"name": "psa"}, "spec": {"module": "registry://x/psa:v1",
                    "settings": {"signatures": "none"}}}]}),
            ),
        );
        cluster.lists.insert(
            "AdmissionPolicy",
            Ok(json!({"items": [verifier("team-verify",
                "registry://registry.example.com/forks/verify-images:v2", "registry.example.com/*")]})),
        );
        let read = verifier_rules(
            &patterns(&["*/verify-image-signatures:*"]),
            "team",
            &mut cluster,
        )
        .expect("read");
        assert_eq!(read.rules.len(), 1, "{:?}", read.rules);
        assert_eq!(
            read.left_out,
            [
                "AdmissionPolicy team/team-verify (registry://registry.example.com/forks/verify-images:v2)"
            ]
        );
        assert!(read.unmatched.is_empty());
        // Found by its settings when an entry has no module: nothing left out.
        let read = verifier_rules(&[None], "team", &mut cluster).expect("read");
        assert_eq!(read.rules.len(), 2);
        assert!(read.left_out.is_empty(), "{:?}", read.left_out);
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
    fn verifiers_without_signatures_and_requests_without_a_namespace_add_nothing() {
        let mut cluster = Table::default();
        cluster.lists.insert(
            "ClusterAdmissionPolicy",
            Ok(json!({"items": [{"metadata": {"name": "v"}, "spec": {"module": VERIFY, "settings": {}}}]})),
        );
        let read = verifier_rules(&patterns(&["*"]), "", &mut cluster).expect("read");
        assert!(read.rules.is_empty());
        assert_eq!(
            cluster.asked,
            ["ClusterAdmissionPolicy *", "ClusterAdmissionPolicyGroup *"]
        );
    }

    /// `verifiers: [{}]`: every policy whose `settings.signatures` has verify-image-signatures'
    /// shape, whatever its module is called (a digest, an https URL, a renamed copy); a rule it
    /// cannot read still makes its policy a verifier.
    #[test]
    fn without_module_verifiers_are_found_by_their_settings() {
        let mut cluster = Table::default();
        let pinned = "registry://ghcr.io/kubewarden/policies/verify-image-signatures@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        let mut unreadable = verifier("copy", "https://internal.example.com/verify.wasm", "x/*");
        unreadable["spec"]["settings"]["signatures"][0] =
            json!({"image": "internal.example.com/*"});
        cluster.lists.insert(
            "ClusterAdmissionPolicy",
            Ok(json!({"items": [
                verifier("pinned", pinned, "ghcr.io/org/*"),
                unreadable,
                {"metadata": {"name": "psa"}, "spec": {"module": "registry://x/psa:v1", "settings": {"signatures": "none"}}},
                {"metadata": {"name": "other"}, "spec": {"module": "registry://x/other:v1", "settings": {}}}
            ]})),
        );
        let read = verifier_rules(&[None], "team", &mut cluster).expect("read");
        let origins: Vec<&str> = read.rules.iter().map(|r| r.origin.as_str()).collect();
        assert_eq!(
            origins,
            [
                "ClusterAdmissionPolicy pinned settings.signatures[0] (image \"ghcr.io/org/*\")",
                "ClusterAdmissionPolicy copy settings.signatures[0] (image \"internal.example.com/*\")"
            ]
        );
        assert!(read.unmatched.is_empty());
        // The same policies behind the documented module pattern: the pinned one and the copy
        // are missed, and the pattern is named as matching nothing.
        let read = verifier_rules(
            &patterns(&["*/verify-image-signatures:*"]),
            "team",
            &mut cluster,
        )
        .expect("read");
        assert!(read.rules.is_empty());
        assert_eq!(read.unmatched, ["*/verify-image-signatures:*"]);
        assert_eq!(read.read.len(), 4, "{:?}", read.read);
        assert!(
            read.read[0].ends_with(&format!("({pinned})")),
            "{:?}",
            read.read
        );
    }
}
