//! Which Pods and workload templates the swapping policy sees, so that templates and Pods'
//! records are read only where the policy would swap their Pods: its ClusterAdmissionPolicy's
//! `namespaceSelector` against each namespace's labels (as the watch of namespaces keeps them),
//! its `objectSelector` against the Pod's (a template's Pod) labels, both as the webhook
//! Kubewarden's controller registers carries them (kube's own `Selector` does the matching),
//! and never Kubewarden's own namespace, which the controller leaves out of every policy
//! (policy-server accepts what comes from it unchanged). A record the policy does not see was
//! not written by it, and is ignored.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};
use serde_json::Value;

#[derive(Clone, Debug, Default)]
pub struct Coverage {
    /// None: every namespace (no selector, or settings from a file).
    selector: Option<Selector>,
    /// None: every Pod, whatever its labels.
    object_selector: Option<Selector>,
    /// Kubewarden's own namespace (the controller's `--deployments-namespace`): never covered.
    kubewarden: Option<String>,
    /// Each namespace's labels, as last seen.
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
}

/// The selector at `field` of the policy object: `None` when absent; one that cannot be read
/// says why.
fn selector_at(policy: &Value, field: &str) -> Result<Option<Selector>, String> {
    match policy.pointer(&format!("/spec/{field}")) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => serde_json::from_value::<LabelSelector>(value.clone())
            .map_err(|e| e.to_string())
            .and_then(|written| Selector::try_from(written).map_err(|e| e.to_string()))
            .map(Some)
            .map_err(|error| format!("spec.{field} {value}: {error}")),
    }
}

impl Coverage {
    /// Covers nothing in `namespace`, Kubewarden's own (none: no namespace left out).
    pub fn excluding(namespace: Option<String>) -> Coverage {
        Coverage {
            kubewarden: namespace,
            ..Coverage::default()
        }
    }

    /// Reads the policy object's `spec.namespaceSelector` and `spec.objectSelector`; says
    /// whether either changed. A selector that cannot be read covers nothing, and says why:
    /// filling for Pods the policy may not see costs copies nobody asked for.
    pub fn follow(&mut self, policy: &Value) -> Result<bool, String> {
        let read = selector_at(policy, "namespaceSelector")
            .and_then(|namespaces| Ok((namespaces, selector_at(policy, "objectSelector")?)));
        let (selector, object_selector) = match read {
            Ok(read) => read,
            Err(error) => {
                self.selector = Some(nothing());
                return Err(error);
            }
        };
        let changed = selector != self.selector || object_selector != self.object_selector;
        self.selector = selector;
        self.object_selector = object_selector;
        Ok(changed)
    }

    /// Whether the policy sees a Pod of `namespace` labelled `labels` (a Pod's
    /// `metadata.labels`, or a template's), so would swap it.
    pub fn covers_pod(&self, namespace: &str, labels: Option<&Value>) -> bool {
        let labels: BTreeMap<String, String> = labels
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(key, value)| Some((key.clone(), value.as_str()?.to_string())))
            .collect();
        self.kubewarden.as_deref() != Some(namespace)
            && self.covers(namespace)
            && self
                .object_selector
                .as_ref()
                .is_none_or(|selector| selector.matches(&labels))
    }

    /// A namespace as the watch saw it; says whether its labels changed.
    pub fn namespace_seen(&mut self, name: &str, labels: BTreeMap<String, String>) -> bool {
        self.namespaces.insert(name.to_string(), labels.clone()) != Some(labels)
    }

    pub fn namespace_gone(&mut self, name: &str) {
        self.namespaces.remove(name);
    }

    /// Whether the policy covers `namespace`. Under a selector, a namespace not seen yet is not
    /// covered: its templates are routed again once it is.
    pub fn covers(&self, namespace: &str) -> bool {
        match &self.selector {
            None => true,
            Some(selector) => self
                .namespaces
                .get(namespace)
                .is_some_and(|labels| selector.matches(labels)),
        }
    }
}

/// A selector no namespace matches.
fn nothing() -> Selector {
    Selector::from(kube::core::Expression::In(
        "image-swapper.kubewarden.io/unreadable-namespace-selector".to_string(),
        Default::default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn coverage(selector: Value) -> Coverage {
        let mut coverage = Coverage::default();
        coverage.namespace_seen(
            "team",
            labels(&[("kubernetes.io/metadata.name", "team"), ("swap", "yes")]),
        );
        coverage.namespace_seen(
            "kube-system",
            labels(&[("kubernetes.io/metadata.name", "kube-system")]),
        );
        let readable = coverage.follow(&json!({"spec": {"namespaceSelector": selector.clone()}}));
        assert_eq!(
            readable.is_ok(),
            selector.pointer("/matchExpressions/0/operator") != Some(&json!("Sometimes")),
            "{readable:?}"
        );
        coverage
    }

    #[rstest::rstest]
    #[case::no_selector(Value::Null, true, true, true)]
    #[case::match_labels(json!({"matchLabels": {"swap": "yes"}}), true, false, false)]
    #[case::not_in(
        json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]}),
        true,
        false,
        false
    )]
    #[case::an_unreadable_selector_covers_nothing(
        json!({"matchExpressions": [{"key": "swap", "operator": "Sometimes"}]}),
        false,
        false,
        false
    )]
    fn templates_are_filled_where_the_policy_swaps(
        #[case] selector: Value,
        #[case] team: bool,
        #[case] kube_system: bool,
        #[case] unseen: bool,
    ) {
        let coverage = coverage(selector);
        assert_eq!(coverage.covers("team"), team);
        assert_eq!(coverage.covers("kube-system"), kube_system);
        assert_eq!(coverage.covers("not-seen-yet"), unseen);
    }

    /// The webhook Kubewarden's controller registers for the policy carries its
    /// `objectSelector` and leaves the controller's namespace out: a Pod there, or whose labels
    /// the selector does not match, is never swapped.
    #[rstest::rstest]
    #[case::labelled_in_team(Some(json!({"matchLabels": {"swap": "yes"}})), "team", json!({"swap": "yes"}), true)]
    #[case::unlabelled_in_team(Some(json!({"matchLabels": {"swap": "yes"}})), "team", json!({"app": "web"}), false)]
    #[case::no_labels(Some(json!({"matchExpressions": [{"key": "swap", "operator": "DoesNotExist"}]})), "team", Value::Null, true)]
    #[case::kubewardens_namespace(None, "kubewarden", json!({"swap": "yes"}), false)]
    #[case::no_object_selector(None, "team", Value::Null, true)]
    fn a_pod_is_covered_as_the_webhook_selects_it(
        #[case] object_selector: Option<Value>,
        #[case] namespace: &str,
        #[case] pod_labels: Value,
        #[case] covered: bool,
    ) {
        let mut coverage = Coverage::excluding(Some("kubewarden".to_string()));
        for name in ["team", "kubewarden"] {
            coverage.namespace_seen(name, labels(&[("kubernetes.io/metadata.name", name)]));
        }
        let mut policy = json!({"spec": {}});
        if let Some(selector) = object_selector {
            policy["spec"]["objectSelector"] = selector;
        }
        assert_eq!(coverage.follow(&policy), Ok(policy["spec"] != json!({})));
        assert_eq!(coverage.covers_pod(namespace, Some(&pod_labels)), covered);
    }

    #[test]
    fn an_unreadable_object_selector_covers_nothing() {
        let mut coverage = Coverage::default();
        let policy = json!({"spec": {"objectSelector": {"matchExpressions": [{"key": "swap", "operator": "Sometimes"}]}}});
        assert!(coverage.follow(&policy).is_err());
        assert!(!coverage.covers_pod("team", None));
    }

    #[test]
    fn a_changed_selector_or_namespace_is_told() {
        let mut coverage = Coverage::default();
        assert_eq!(coverage.follow(&json!({"spec": {}})), Ok(false));
        let selector = json!({"spec": {"namespaceSelector": {"matchLabels": {"swap": "yes"}}}});
        assert_eq!(coverage.follow(&selector), Ok(true));
        assert_eq!(coverage.follow(&selector), Ok(false));
        assert!(coverage.namespace_seen("team", labels(&[("swap", "yes")])));
        assert!(!coverage.namespace_seen("team", labels(&[("swap", "yes")])));
        assert!(coverage.namespace_seen("team", labels(&[("swap", "no")])));
    }
}
